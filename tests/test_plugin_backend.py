"""A backend registered through the entry-point group by a package of its own (no edit in
gpusession): its start option shows on every face - `%gpu help start`, `gpusession start
--help`, REST `GET options` (what the sidebar's form is built from) and the %gpu panel's form."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpusession.configuration import options

DATA = Path(__file__).parent / "data" / "plugin_backend"
REPO = Path(__file__).resolve().parent.parent


def install_plugin(where: Path) -> Path:
    """The package and its dist-info (entry_points.txt), as `pip install` would leave them."""
    shutil.copytree(DATA / "gpusession_demo_backend", where / "gpusession_demo_backend")
    info = where / "gpusession_demo_backend-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: gpusession-demo-backend\nVersion: 0.1\n"
    )
    (info / "entry_points.txt").write_text(
        "[gpusession.backends]\ndemo = gpusession_demo_backend:DemoBackend\n"
    )
    return where


@pytest.fixture
def plugin_path(tmp_path, monkeypatch):
    path = install_plugin(tmp_path / "site")
    monkeypatch.syspath_prepend(str(path))
    yield path


def run_python(code: str, path: Path, home: Path) -> str:
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(path), str(REPO)]), GPUSESSION_HOME=str(home)
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_the_table_gathers_the_plugins_option(plugin_path):
    row = options.table().by_name["demo_zone"]
    assert row.backends == ("demo",) and row.flag == "--demo-zone"


@pytest.mark.integration
def test_cli_and_magic_help_show_it(plugin_path, tmp_path):
    cli = run_python(
        "from gpusession.faces.cli import main; main(['start', '--help'])", plugin_path, tmp_path
    )
    assert "--demo-zone" in cli and "demo: the zone its machines are in" in cli
    magic = run_python(
        "from IPython.core.interactiveshell import InteractiveShell\n"
        "ip = InteractiveShell.instance()\n"
        "ip.run_line_magic('load_ext', 'gpusession')\n"
        "ip.run_line_magic('gpu', 'help start')\n",
        plugin_path,
        tmp_path,
    )
    assert "--demo-zone" in magic and "demo: the zone its machines are in" in magic


async def test_rest_options_document_has_it(plugin_path, jp_fetch):
    import json

    r = await jp_fetch("gpusession", "api", "options")
    doc = json.loads(r.body)
    row = next(o for o in doc["options"] if o["name"] == "demo_zone")
    assert row["backends"] == ["demo"] and row["form"] is True and row["label"] == "Demo zone"
    assert "demo" in next(o for o in doc["options"] if o["name"] == "backend")["choices"]


def test_the_panel_form_has_it(plugin_path, manager):
    from gpusession.widgets.panel import StartForm

    form = StartForm(manager, lambda values: None)
    assert "demo_zone" in form.fields
    spec = manager.make_spec("t4", backend="demo", demo_zone="eu-1")
    assert spec.backend == "demo" and spec.extra["demo_zone"] == "eu-1"
