"""The README's quickstart, as written, from a wheel: build it, install it in a fresh virtualenv
outside the checkout (no Dockerfile.cuda, no source tree), and run the README's first cells in a
kernel of that environment against this machine's Docker engine, with the default image replaced
by a local stand-in of its shape (gpusession-ci/pytorch-standin: /opt/conda Python, a `torch`
module, no ipykernel, no sshd, no gpusession). Needs PyPI for the wheel's dependencies."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from support.hosts import docker_available
from support.images import STANDIN

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [
    pytest.mark.docker,
    pytest.mark.slow,
    pytest.mark.skipif(
        not docker_available(), reason="no Docker engine answers (scripts/ci-host-setup.sh)"
    ),
]


def readme_cells() -> list[str]:
    """The README's first two ```python blocks, the quickstart, character for character."""
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)
    return [block.rstrip("\n") for block in blocks[:2]]


@pytest.fixture(scope="module")
def fresh_python(tmp_path_factory) -> str:
    """A virtualenv outside the checkout with the wheel built from it, and nothing else of ours."""
    work = tmp_path_factory.mktemp("wheel")
    env = dict(os.environ)
    if (ROOT / "gpusession" / "labextension" / "package.json").is_file():
        env["SKIP_JUPYTER_BUILDER"] = "1"  # built already (pip install -e .): no Node build again
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            str(ROOT),
            "--no-deps",
            "-q",
            "-w",
            str(work / "dist"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = (work / "dist").glob("gpusession-*.whl")
    subprocess.run([sys.executable, "-m", "venv", str(work / "venv")], check=True, timeout=120)
    python = str(work / "venv" / "bin" / "python")
    installed = subprocess.run(
        # --no-compile: pip would byte-compile all of jupyterlab's tree on 2 cores; the modules
        # this test imports compile as they are imported instead
        [python, "-m", "pip", "install", "-q", "--no-compile", str(wheel)],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert installed.returncode == 0, installed.stdout + installed.stderr
    where = subprocess.run(
        [python, "-c", "import gpusession; print(gpusession.__file__)"],
        cwd=work,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert where.startswith(str(work / "venv")) and not where.startswith(str(ROOT)), where
    return python


def test_the_readme_quickstart_works_from_a_wheel(fresh_python, gs_home, tmp_path, engine):
    from support.notebook_kernel import NotebookKernel

    cells = readme_cells()
    assert cells[0].startswith("%load_ext gpusession\n%gpu start --type t4") and cells[
        1
    ].startswith("%%gpu\nimport torch")
    venv_bin = str(Path(fresh_python).parent)
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("GPUSESSION_", "VIRTUAL_ENV", "PYTHON"))
    }
    # `gpusession setup`'s choice, as the README says to make it on first use: this machine's
    # engine (its GPU request is CI's stand-in hook, which `docker info` cannot show)
    settings = tmp_path / "settings.json"
    settings.write_text(json.dumps({"default_backend": "docker"}))
    env.update(
        GPUSESSION_HOME=str(gs_home),
        GPUSESSION_IMAGE=STANDIN,
        GPUSESSION_SETTINGS=str(settings),
        PATH=f"{venv_bin}:/usr/bin:/bin",
        PYTHONUNBUFFERED="1",
    )  # no GPUSESSION_BACKEND: the default the user chose
    nk = NotebookKernel(env, cwd=str(tmp_path), python=fresh_python)
    try:
        start = nk.run(cells[0], timeout=600)
        assert start.status == "ok", start.text
        assert "on docker" in start.text and "is ready" in start.text, start.text
        first = nk.run(cells[1])
        assert first.status == "ok", first.text
        assert first.text.strip() == "stand-in GPU (no NVIDIA driver here)", first.text
        where = nk.run("%%gpu\nimport gpusession, sys\nprint(sys.executable, gpusession.__file__)")
        assert where.text.split() == [
            "/opt/conda/bin/python3",
            "/opt/gpusession-runtime/code/lib/gpusession/__init__.py",
        ]
        assert nk.run("%gpu stop").status == "ok"
    finally:
        nk.close()
    label = {"label": ["gpusession.session", f"gpusession.session.store={_store_id(gs_home)}"]}
    assert engine.containers.list(all=True, filters=label) == []


def _store_id(home: Path) -> str:
    from gpusession.session.store import Store

    return Store(home / "sessions.sqlite3").store_id
