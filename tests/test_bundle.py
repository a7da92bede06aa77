"""The runtime bundle without an engine: what goes in it, that it runs on Python 3.9, how the
image's Python is read, how the kernel is started in someone else's image, and pull progress."""

from __future__ import annotations

import ast
import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from gpusession.agent import kernelenv
from gpusession.core.protocol import ENV_RUNTIME_ROOT
from gpusession.transport import bundle
from gpusession.transport.bundle import ImagePython, parse_probe
from gpusession.transport.pulls import PullProgress, format_bytes

PKG = bundle.PACKAGE


def _members(archive: bundle.Archive) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(archive.data), mode="r:gz") as tar:
        return {m.name: m for m in tar.getmembers()}


def test_the_code_is_the_agent_and_what_it_imports_and_nothing_of_the_faces():
    modules = bundle.agent_modules()
    for needed in (
        "agent/kernel_runtime.py",
        "agent/kernelboot.py",
        "core/__init__.py",
        "core/protocol.py",
        "core/durations.py",
        "core/errors.py",
        "configuration/cost.py",
    ):
        assert needed in modules
    for face in (
        "faces/magics.py",
        "session/manager.py",
        "backends/docker/backend.py",
        "transport/tunnel.py",
        "transport/bundle.py",
    ):
        assert face not in modules
    members = _members(bundle.code_archive())
    assert (
        members["boot.sh"].mode == 0o755
        and members["lib/gpusession/agent/kernel_runtime.py"].mode == 0o644
    )
    assert "lib/pynvml.py" in members  # nvidia-ml-py: the agent's one dependency
    assert {m.uid for m in members.values()} == {0}


def test_the_code_runs_on_python_3_9():
    """Images bring their own Python, as old as 3.9: syntax the bundle's code may not use."""
    for rel in bundle.agent_modules():
        ast.parse((PKG / rel).read_text(), filename=rel, feature_version=(3, 9))


def test_archives_are_reproducible_and_named_by_their_digest():
    bundle.code_archive.cache_clear()
    first = bundle.code_archive()
    bundle.code_archive.cache_clear()
    again = bundle.code_archive()
    assert (
        first.digest == again.digest
        and first.copy_name == f"gpusession-runtime-code-{first.digest[:12]}"
    )


@pytest.mark.integration
def test_the_code_runs_the_agent_from_the_bundle_alone(tmp_path):
    """Unpacked, with nothing else of gpusession on the path: `python -m gpusession.agent --help`."""
    with tarfile.open(fileobj=io.BytesIO(bundle.code_archive().data), mode="r:gz") as tar:
        tar.extractall(tmp_path, filter="data")
    out = subprocess.run(
        [
            sys.executable,
            "-I",
            "-c",
            "import sys; sys.path.insert(0, sys.argv[1]); "
            "sys.argv = ['agent', 'run', '--help']; import runpy; runpy.run_module('gpusession.agent', "
            "run_name='__main__')",
            str(tmp_path / "lib"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0 and "--session-id" in out.stdout, out.stderr


def test_boot_sh_probes_this_machines_python(tmp_path):
    out = subprocess.run(
        ["sh", str(PKG / "agent" / "boot.sh"), "probe"], capture_output=True, text=True, timeout=60
    )
    python = parse_probe(out.stdout)
    assert isinstance(python, ImagePython), out
    assert python.version[:2] == sys.version_info[:2] and python.machine
    assert python.libc[0] == "glibc" and python.platforms[0].startswith("manylinux_2_")
    subprocess.run(["sh", "-n", str(PKG / "agent" / "boot.sh")], check=True)


def test_the_probe_says_what_the_image_lacks():
    payload = {
        "executable": "/opt/conda/bin/python3",
        "version": [3, 13, 5],
        "machine": "aarch64",
        "libc": ["glibc", "2.36"],
        "ipykernel": None,
        "pip": "24.0",
        "uid": 1000,
        "venv": False,
    }
    python = parse_probe("noise\nGPUSESSION_PYTHON " + json.dumps(payload) + "\n")
    assert (
        python.needs_site
        and not python.has_ipykernel
        and python.site_tag == "cp313-manylinux_2_28_aarch64"
    )
    assert (
        "manylinux2014_aarch64" in python.platforms and python.platforms[-1] == "manylinux1_aarch64"
    )
    assert not ImagePython.from_payload({**payload, "ipykernel": "6.29.5"}).needs_site
    assert ImagePython.from_payload(
        {**payload, "ipykernel": "5.5.6"}
    ).needs_site  # too old for the agent's hooks
    assert (
        ImagePython.from_payload({**payload, "libc": ["", ""]}).platforms[0]
        == "musllinux_1_2_aarch64"
    )
    old_glibc = ImagePython.from_payload({**payload, "libc": ["glibc", "2.17"]})
    assert old_glibc.platforms[0] == "manylinux_2_17_aarch64" and old_glibc.site_tag.endswith(
        "manylinux_2_17_aarch64"
    )
    failed = 'GPUSESSION_FAILED {"stage":"python","error":"no python3 (3.9 or newer) on PATH"}'
    assert parse_probe(failed) == "no python3 (3.9 or newer) on PATH"
    assert parse_probe("sh: 1: exec: boom\n").startswith(
        "the probe printed nothing: sh: 1: exec: boom"
    )


@pytest.mark.integration
def test_a_site_is_made_once_and_then_read_from_the_cache(tmp_path, monkeypatch):
    python = ImagePython(
        "/usr/bin/python3", (3, 11, 2), "x86_64", ("glibc", "2.36"), None, None, 0, False
    )
    calls = []

    def download(python_, into: Path) -> None:  # what pip download leaves: wheels, one with .data
        calls.append(python_.site_tag)
        import zipfile

        with zipfile.ZipFile(into / "pip-24.0-py3-none-any.whl", "w") as zf:
            zf.writestr("pip/__init__.py", "")
        with zipfile.ZipFile(into / "ipykernel-7.0-py3-none-any.whl", "w") as zf:
            zf.writestr("ipykernel/__init__.py", "")
            zf.writestr("ipykernel-7.0.data/purelib/ipykernel_launcher.py", "")
            zf.writestr("ipykernel-7.0.data/data/share/jupyter/kernels/python3/kernel.json", "{}")

    monkeypatch.setattr(bundle, "_download", download)
    said: list[str] = []
    first = bundle.site_archive(python, tmp_path, said.append)
    again = bundle.site_archive(python, tmp_path, said.append)
    assert calls == ["cp311-manylinux_2_28_x86_64"] and "once" in said[0]
    assert (first.digest, first.size, first.files, first.bytecode) == (
        again.digest,
        again.size,
        again.files,
        again.bytecode,
    ) and again.data == first.data
    assert sorted(
        n for n, m in _members(first).items() if m.isfile() and "__pycache__" not in n
    ) == [
        ".bytecode",  # this machine's Python is 3.11: compiled ahead (the next test)
        "deps/ipykernel/__init__.py",
        "deps/ipykernel_launcher.py",
        "pip/pip/__init__.py",
    ]


@pytest.mark.integration
@pytest.mark.skipif(sys.version_info[:2] != (3, 11), reason="the site is made for Python 3.11")
def test_a_site_comes_compiled_for_its_python_so_a_new_engine_only_unpacks_it(
    tmp_path, monkeypatch
):
    """Made where a Python of the image's version runs (here: this one), the site carries its
    bytecode: unchecked-hash .pyc (the copy is read-only and named by its digest), which that
    Python imports as they are, without compiling anything and without reading the sources."""
    python = ImagePython(
        "/usr/bin/python3", (3, 11, 2), "x86_64", ("glibc", "2.36"), None, None, 0, False
    )

    def download(python_, into: Path) -> None:
        import zipfile

        with zipfile.ZipFile(into / "ipykernel-7.0-py3-none-any.whl", "w") as zf:
            zf.writestr("ipykernel/__init__.py", "WHERE = 'compiled ahead'\n")

    monkeypatch.setattr(bundle, "_download", download)
    said: list[str] = []
    site = bundle.site_archive(python, tmp_path / "cache", said.append)
    assert site.bytecode == "cp311", said
    assert any("compiling it for Python 3.11 here, once" in line for line in said), said
    copy = tmp_path / "copy"
    with tarfile.open(fileobj=io.BytesIO(site.data), mode="r:gz") as tar:
        tar.extractall(copy)
    pyc = copy / "deps/ipykernel/__pycache__/__init__.cpython-311.pyc"
    assert int.from_bytes(pyc.read_bytes()[4:8], "little") == 1  # flags: unchecked hash
    # what the image's Python would compile from the source now differs: the .pyc is what runs
    (copy / "deps/ipykernel/__init__.py").write_text("WHERE = 'compiled from the source'\n")
    for path in [copy, *copy.rglob("*")]:
        path.chmod(0o555 if path.is_dir() else 0o444)  # as the read-only volume
    try:
        ran = subprocess.run(
            [sys.executable, "-c", "import ipykernel; print(ipykernel.WHERE)"],
            env={"PYTHONPATH": str(copy / "deps")},
            capture_output=True,
            text=True,
        )
    finally:
        for path in [copy, *copy.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
    assert ran.stdout.strip() == "compiled ahead", ran
    # kept: the next start (any engine) reads it from the cache, compiled
    again = bundle.site_archive(python, tmp_path / "cache", said.append)
    assert (again.digest, again.bytecode) == (site.digest, "cp311")


@pytest.mark.integration
def test_the_code_comes_compiled_for_the_images_python_where_this_machine_has_it(monkeypatch):
    """The agent's code, compiled here for the image's Python version (unchecked-hash .pyc): its
    copy is named as the one an engine compiles (the source's digest), its digest is its data's
    (the instance checks it); for a version this machine has no Python of, it is the code as is."""
    monkeypatch.setattr(bundle, "_CODE_FOR", {})
    here = ImagePython(
        "/usr/bin/python3", sys.version_info[:3], "x86_64", ("glibc", "2.36"), None, None, 0, False
    )
    base = bundle.code_archive()
    ahead = bundle.code_archive_for(here)
    tag = f"cp{sys.version_info[0]}{sys.version_info[1]}"
    assert (ahead.bytecode, ahead.source, ahead.copy_name) == (tag, base.digest, base.copy_name)
    assert ahead.digest == __import__("hashlib").sha256(ahead.data).hexdigest() != base.digest
    with tarfile.open(fileobj=io.BytesIO(ahead.data), mode="r:gz") as tar:
        pyc = tar.extractfile(f"lib/gpusession/agent/__pycache__/service.cpython-{tag[2:]}.pyc")
        assert pyc.read(8)[4] == 1  # unchecked hash: the read-only copy is never rewritten
    assert bundle.code_archive_for(here) is ahead  # once per version
    nowhere = ImagePython(
        "/usr/bin/python3", (3, 99, 0), "x86_64", ("glibc", "2.36"), None, None, 0, False
    )
    assert (bundle.code_archive_for(nowhere).digest, bundle.code_archive_for(nowhere).bytecode) == (
        base.digest,
        None,
    )


@pytest.mark.integration
def test_a_later_process_finds_the_code_packed_and_compiled_in_the_cache(monkeypatch, tmp_path):
    """A notebook process's first start packed and compiled the agent's code (a Python started
    to compile it: ~0.3 s quiet, over 1 s on a busy machine); the next process's first start
    reads both from the cache, the same bytes; a damaged copy there is made again."""
    monkeypatch.setenv(bundle.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(bundle, "_CODE_FOR", {})
    bundle.code_archive.cache_clear()  # (once per process)
    here = ImagePython(
        "/usr/bin/python3", sys.version_info[:3], "x86_64", ("glibc", "2.36"), None, None, 0, False
    )
    first = bundle.code_archive_for(here)
    kept = sorted(p.name for p in (tmp_path / "cache" / "runtime" / "archives").iterdir())
    assert [k.rsplit(".", 1)[1] for k in kept] == ["json", "tgz", "json", "tgz", "json"], kept

    def never(*args, **kwargs):
        raise AssertionError("made again, not read from the cache")

    monkeypatch.setattr(bundle, "_CODE_FOR", {})  # as in a new process
    bundle.code_archive.cache_clear()
    for name in ("_archive", "_compile_ahead", "_follow_imports"):
        monkeypatch.setattr(bundle, name, never)
    again = bundle.code_archive_for(here)
    assert (again.data, again.digest, again.source, again.bytecode, again.copy_name) == (
        first.data,
        first.digest,
        first.source,
        first.bytecode,
        first.copy_name,
    )
    monkeypatch.undo()
    monkeypatch.setenv(bundle.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(bundle, "_CODE_FOR", {})
    bundle.code_archive.cache_clear()
    tgz = next((tmp_path / "cache" / "runtime" / "archives").glob(f"code-*-{first.bytecode}.tgz"))
    tgz.write_bytes(tgz.read_bytes()[:1000])  # cut short
    remade = bundle.code_archive_for(here)  # (compiling again makes other .pyc bytes: marshal)
    assert (remade.copy_name, remade.bytecode) == (first.copy_name, first.bytecode)
    assert tgz.read_bytes() == remade.data and len(remade.data) > 1000


def test_runtime_cache_is_per_user_not_per_store(monkeypatch, tmp_path):
    monkeypatch.setenv(bundle.CACHE_ENV, str(tmp_path / "cache"))
    assert bundle.cache_dir() == tmp_path / "cache" / "runtime"
    monkeypatch.delenv(bundle.CACHE_ENV)
    assert bundle.cache_dir().parts[-2:] == ("gpusession", "runtime")


# -- the kernel in someone else's image -----------------------------------------------------------


def test_outside_a_bundle_the_kernel_starts_as_always(monkeypatch):
    monkeypatch.delenv(ENV_RUNTIME_ROOT, raising=False)
    assert kernelenv.kernel_environment() == {}
    cmd = kernelenv.kernel_command("/s/kernel.json", ["gpusession.agent.activity"])
    assert cmd == [
        sys.executable,
        "-m",
        "ipykernel_launcher",
        "-f",
        "/s/kernel.json",
        "--IPKernelApp.extensions=['gpusession.agent.activity']",
    ]


def test_in_a_bundle_ipykernel_comes_from_it_only_when_the_image_has_none(monkeypatch, tmp_path):
    (tmp_path / "site" / "deps").mkdir(parents=True)
    (tmp_path / "site" / "pip").mkdir(parents=True)
    monkeypatch.setenv(ENV_RUNTIME_ROOT, str(tmp_path))
    monkeypatch.setattr(kernelenv, "_dist_version", lambda name: None)  # an image with neither
    cmd = kernelenv.kernel_command("/s/kernel.json", ["x"])
    assert cmd[:4] == [
        sys.executable,
        "-m",
        "gpusession.agent.kernelboot",
        str(tmp_path / "site" / "deps"),
    ]
    env = kernelenv.kernel_environment()
    assert env["PYTHONPATH"].split(":")[-1] == str(tmp_path / "site" / "pip")
    assert env["PIP_BREAK_SYSTEM_PACKAGES"] == "1"
    monkeypatch.setattr(kernelenv, "_dist_version", lambda name: "6.29.5")  # an image with both
    assert kernelenv.kernel_command("/s/kernel.json", ["x"])[2] == "ipykernel_launcher"
    assert str(tmp_path / "site" / "pip") not in kernelenv.kernel_environment()["PYTHONPATH"]


def test_pip_installs_where_the_kernel_looks_when_site_packages_is_read_only(monkeypatch, tmp_path):
    import site
    import sysconfig

    monkeypatch.setenv(ENV_RUNTIME_ROOT, str(tmp_path / "bundle"))
    monkeypatch.setattr(kernelenv, "_dist_version", lambda name: "1.0")
    real = sysconfig.get_paths
    monkeypatch.setattr(
        sysconfig,
        "get_paths",
        lambda *a, **k: real(*a, **k) if a or k else {"purelib": "/nonexistent/ro"},
    )
    monkeypatch.setattr(kernelenv, "_writable", lambda path: not path.startswith("/nonexistent"))
    monkeypatch.setattr(site, "getuserbase", lambda: str(tmp_path / "home" / ".local"))
    monkeypatch.setattr(site, "ENABLE_USER_SITE", True)
    monkeypatch.setattr(sys, "base_prefix", sys.prefix)  # not a venv
    env = kernelenv.kernel_environment()
    assert env["PIP_USER"] == "1" and "PYTHONUSERBASE" not in env
    assert list(
        (tmp_path / "home" / ".local" / "lib").glob("python3.*/site-packages")
    )  # made before the kernel starts
    monkeypatch.setattr(sys, "base_prefix", "/elsewhere")  # a venv this user cannot write to
    env = kernelenv.kernel_environment()
    assert env["PIP_TARGET"] == env["PYTHONPATH"].split(":")[0] and Path(env["PIP_TARGET"]).is_dir()


# -- pull progress ----------------------------------------------------------------------------------


def test_pull_progress_counts_bytes_and_layers():
    now = [0.0]
    pull = PullProgress("img:1", every_s=5, clock=lambda: now[0])
    events = [
        {"status": "Pulling from library/img", "id": "1"},
        {"status": "Pulling fs layer", "id": "a"},
        {"status": "Already exists", "id": "b"},
        {"status": "Pulling fs layer", "id": "c"},
        {
            "status": "Downloading",
            "id": "a",
            "progressDetail": {"current": 500_000_000, "total": 2_000_000_000},
        },
        {"status": "Downloading", "id": "c", "progressDetail": {"current": 10, "total": 1_000_000}},
    ]
    for event in events:
        pull.feed(event)
    assert (pull.bytes_done, pull.bytes_total, pull.layers_done, len(pull.layers)) == (
        500_000_010,
        2_001_000_000,
        1,
        3,
    )
    assert pull.line() == "pulling img:1: 500 MB of 2.00 GB, 1 of 3 layers done"
    assert not pull.due()
    now[0] = 5.1
    assert pull.due() and not pull.due()
    for event in (
        {"status": "Download complete", "id": "a"},
        {"status": "Pull complete", "id": "a"},
        {"status": "Extracting", "id": "c", "progressDetail": {"current": 5, "total": 1_000_000}},
    ):
        pull.feed(event)
    assert pull.line() == "pulling img:1: 2.00 GB downloaded, unpacking, 2 of 3 layers done"
    pull.feed({"status": "Pull complete", "id": "c"})
    now[0] = 60
    assert pull.finished_line() == (
        "pulled img:1 (2.00 GB downloaded, 3 layers, 1 of them already on the host) in 60s; "
        "it stays on the host for the next session"
    )
    pull.feed({"error": "manifest unknown", "errorDetail": {}})
    assert pull.error == "manifest unknown"


@pytest.mark.parametrize(
    "n, text", [(0, "0 B"), (999, "999 B"), (1500, "2 kB"), (2_500_000, "2 MB"), (7.9e9, "7.90 GB")]
)
def test_format_bytes(n, text):
    assert format_bytes(n) == text
