"""Any image with a python3 is a session: the foreign images of scripts/ci-images.sh (Debian 12 and
13 with python3 only, Python only under /opt/conda/bin, a non-root USER, the default image's
shape), none with sshd, ipykernel or gpusession, on this machine's engine and through ssh:// to
the namespace host; an image without Python fails in one line and leaves nothing. The EC2 path:
tests/test_aws_e2e.py."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from gpusession.core.errors import StageError
from gpusession.core.models import State
from gpusession.core.protocol import StopKind
from gpusession.session.store import Store
from support.hosts import REMOTE_HOST_SIDE, REMOTE_NETNS, docker_available
from support.images import (
    FOREIGN,
    NO_PYTHON,
    WHEEL_NAME,
    foreign_params,
    serve_folder,
    serve_registry,
    start_pulled,
    tiny_wheel,
)

LABEL = "gpusession.session"
IDLE_S = 4
REMOTE_LINK = REMOTE_HOST_SIDE  # this machine's address on the namespace host's link


def _engine_ready() -> bool:
    if not docker_available():
        return False
    import docker

    from support.images import foreign_available

    client = docker.from_env()
    try:
        return foreign_available(client)
    finally:
        client.close()


pytestmark = [
    pytest.mark.docker,
    pytest.mark.skipif(
        not _engine_ready(), reason="no Docker engine with the images of scripts/ci-images.sh"
    ),
]


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory):
    """A tiny wheel served on this machine's loopback, which sessions of its engine share."""
    folder = tmp_path_factory.mktemp("wheelhouse")
    tiny_wheel(folder)
    served = serve_folder(folder)
    yield f"http://127.0.0.1:{served.port}/"
    served.close()


def _ours(client, store_id: str | None = None) -> list:
    """Every container of gpusession's on the engine (sessions, probes, volume helpers)."""
    labels = [LABEL] + ([f"gpusession.session.store={store_id}"] if store_id else [])
    return client.containers.list(all=True, ignore_removed=True, filters={"label": labels})


def _gc(env: dict) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "gpusession", "gc"],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def _wait_stopped(store: Store, name: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while store.get(name).state != State.STOPPED:
        assert time.monotonic() < deadline, [
            (e.state.value, e.detail) for e in store.get(name).events
        ]
        time.sleep(0.5)


@pytest.mark.parametrize("foreign", FOREIGN, ids=[f.image.split("/")[-1] for f in FOREIGN])
def test_a_foreign_image_is_a_session(foreign, nb_env, engine, tmp_path, wheelhouse):
    """`%gpu start --image`, a cell run by the image's own Python, `%pip install` that imports in
    the next cell, the idle stop, and gc leaving nothing."""
    from support.notebook_kernel import NotebookKernel

    nk = NotebookKernel(nb_env, cwd=str(tmp_path))
    store = Store(Path(nb_env["GPUSESSION_HOME"]) / "sessions.sqlite3")
    try:
        assert nk.run("%load_ext gpusession").status == "ok"
        start = nk.run(
            f"%gpu start --backend docker --image {foreign.image} --idle {IDLE_S}s --name f"
        )
        assert start.status == "ok", start.text
        assert "running: session f is ready" in start.text
        cell = nk.run(
            "%%gpu\nimport os, sys, IPython\nprint(sys.version)\nprint(sys.executable, os.getuid())\n"
            "print(IPython.__file__, open(IPython.__cached__, 'rb').read(8)[4])"
        )
        assert cell.status == "ok", cell.text
        version, where, ipython = cell.text.strip().splitlines()[:3]
        assert version.startswith(foreign.version), cell.text
        assert where.split() == [foreign.executable, str(foreign.uid)]
        # the runtime's IPython, compiled ahead here when this Python's version is the image's
        # (unchecked-hash .pyc, flags 1), else by the image's Python on the engine (flags 0)
        ahead = foreign.version == "%d.%d." % sys.version_info[:2]
        assert ipython.split() == [
            "/opt/gpusession-runtime/site/deps/IPython/__init__.py",
            "1" if ahead else "0",
        ], cell.text

        pip = nk.run(
            f"%%gpu\n%pip install --no-index --find-links {wheelhouse} {WHEEL_NAME}", timeout=120
        )
        assert pip.status == "ok" and f"Successfully installed {WHEEL_NAME}-1.0" in pip.text, (
            pip.text
        )
        used = nk.run(f"%%gpu\nimport {WHEEL_NAME}\nprint({WHEEL_NAME}.ANSWER)")
        assert used.status == "ok" and used.text.strip() == "42", used.text

        record = store.get("f")
        (container,) = [c for c in _ours(engine) if c.labels[LABEL] == record.id]
        _wait_stopped(
            store, "f", timeout=IDLE_S + 60
        )  # its own watchdog; the notebook only notices
    finally:
        nk.close()
    record = store.get("f")
    assert record.stop_reason.kind == StopKind.IDLE, record.stop_reason
    _gc(nb_env)
    assert _ours(engine, store.store_id) == [], "gc leaves nothing of this store's"


def test_an_image_without_python_fails_in_seconds_in_one_line(nb_env, engine, tmp_path):
    from support.notebook_kernel import NotebookKernel

    nk = NotebookKernel(nb_env, cwd=str(tmp_path))
    store = Store(Path(nb_env["GPUSESSION_HOME"]) / "sessions.sqlite3")
    try:
        assert nk.run("%load_ext gpusession").status == "ok"
        t0 = time.monotonic()
        start = nk.run(f"%gpu start --backend docker --image {NO_PYTHON} --name np")
        took = time.monotonic() - t0
    finally:
        nk.close()
    assert start.status == "error" or "UsageError" in start.text
    (line,) = [line for line in start.text.splitlines() if "has no Python" in line]
    assert f"image {NO_PYTHON}" in line and "use an image with python3 3.9 or newer" in line, (
        start.text
    )
    assert took < 15, took
    assert store.get("np").state == State.FAILED
    assert _ours(engine, store.store_id) == [], "no probe, no session container left"
    assert "nothing to clean up" in _gc(nb_env)


# the flags of the .pyc files matching a glob (argv[1]), distinct and sorted
PYC_FLAGS = (
    "import glob, sys; print(sorted({open(p, 'rb').read(8)[4] for p in glob.glob(sys.argv[1])}))"
)


def test_the_runtime_is_copied_once_per_engine_and_then_cached(manager, engine, monkeypatch):
    """A gpusession build new to the engine copies its runtime into a volume, once; the next
    session mounts it as it is. (A changed build is simulated: its digest names the volume.)"""
    from gpusession.transport import bundle

    with tarfile.open(fileobj=io.BytesIO(bundle.code_archive().data), mode="r:gz") as tar:
        members = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}
    new = bundle._archive(
        "code", {**members, "lib/gpusession-test-build": f"{time.time()}".encode()}
    )
    monkeypatch.setattr(bundle, "code_archive", lambda: new)
    monkeypatch.setattr(bundle, "_CODE_FOR", {})  # what was compiled ahead for the real build
    image = FOREIGN[0].image
    volume = f"{new.copy_name}-cp311"  # one copy per Python version: compiled by it
    cold: list[str] = []
    warm: list[str] = []
    try:
        first = manager.start(
            manager.make_spec("t4", backend="docker", idle="off", image=image), report=cold.append
        )
        assert first.run("1 + 1")["status"] == "ok"
        second = manager.start(
            manager.make_spec("t4", backend="docker", idle="off", image=image), report=warm.append
        )
        assert second.run("1 + 1")["status"] == "ok"
        flags = engine.containers.run(
            image,
            ["python3", "-c", PYC_FLAGS, "/c/lib/gpusession/agent/__pycache__/*.cpython-311.pyc"],
            volumes={volume: {"bind": "/c", "mode": "ro"}},
            remove=True,
        )
    finally:
        for r in manager.list(active_only=True):
            manager.stop(r.id)
        for name in (volume, volume + "-ok"):
            try:
                engine.volumes.get(name).remove(force=True)
            except Exception:  # noqa: BLE001 - not made when the start failed early
                pass
    assert any(
        "copying gpusession's agent" in line and volume in line and "once" in line for line in cold
    ), cold
    # compiled ahead here, as the site is (this machine's Python is the image's 3.11): nothing
    # is compiled on the engine, and the agent's modules are unchecked-hash .pyc (flags 1)
    assert flags.decode().strip() == "[1]", flags
    assert not any("compiling it with the image's Python" in line for line in cold), cold
    assert any(f"cached on the engine (volume {volume})" in line for line in warm), warm
    assert not any("copying" in line for line in warm), warm


def test_a_pull_shows_bytes_and_layers_and_what_stays(manager, engine):
    """From a registry on this machine (a real pull by the engine): the image's layers and a
    new 60 MB one."""
    image = FOREIGN[0].image
    registry = serve_registry(engine, image, "ci/pulled", "v1", extra_layers=(60_000_000,))
    name = f"127.0.0.1:{registry.port}/ci/pulled:v1"
    try:
        lines = start_pulled(manager, name)
    finally:
        registry.close()
        try:
            engine.images.remove(name, force=True)
        except Exception:  # noqa: BLE001 - the pull may have failed
            pass
    assert any(f"pulling {name}: it is not on the engine yet" in line for line in lines), lines
    (done,) = [line for line in lines if f"pulled {name} (" in line]
    assert f"{registry.layers} layers" in done and " MB downloaded" in done, done
    assert "it stays on the host for the next session" in done


# -- the same through ssh:// ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def remote_wheelhouse(tmp_path_factory):
    """The tiny wheel served on this machine's side of the namespace host's link (10.200.0.1),
    which the remote engine's sessions (its host network) reach."""
    folder = tmp_path_factory.mktemp("remote-wheelhouse")
    tiny_wheel(folder)
    served = serve_folder(folder, address=REMOTE_LINK)
    yield f"http://{REMOTE_LINK}:{served.port}/"
    served.close()


# On the ssh:// engine the path is the same for every image but for the user and the layout:
# CI runs the non-root USER and the default image's shape (conda under /opt); this machine's
# engine runs every image; GPUSESSION_FOREIGN_MATRIX=full (scripts/foreign-matrix.sh) runs all.
@pytest.mark.parametrize(
    "foreign", foreign_params(("gpusession-ci/py-nonroot", "gpusession-ci/pytorch-standin"))
)
def test_a_foreign_image_on_a_remote_engine(foreign, remote, manager, nb_env, remote_wheelhouse):
    """As on the local engine, through ssh://: the image's Python, `%pip install` importing in the
    next cell (root, the non-root USER's user site), the idle stop, gc leaving nothing."""
    import docker

    from gpusession.transport.kernel.sink import OutputSink

    class Collect(OutputSink):
        text = ""

        def stream(self, name, text):
            self.text += text

    session = manager.start(
        manager.make_spec(
            "t4", backend="docker", idle=f"{IDLE_S}s", image=foreign.image, host=remote["url"]
        )
    )
    out = Collect()
    assert (
        session.run(
            "import os, sys\nprint(sys.version)\nprint(sys.executable, os.getuid())", sink=out
        )["status"]
        == "ok"
    )
    version, where = out.text.strip().splitlines()[:2]
    assert version.startswith(foreign.version) and where.split() == [
        foreign.executable,
        str(foreign.uid),
    ]
    here = (
        session.link.endpoint.connection_info
    )  # the tunnel's end here: unix sockets in a 0700 folder of ours
    assert (
        here["transport"] == "ipc" and os.stat(os.path.dirname(here["ip"])).st_mode & 0o777 == 0o700
    )
    pip = Collect()
    code = f"%pip install --no-index --trusted-host {REMOTE_LINK} --find-links {remote_wheelhouse} {WHEEL_NAME}"
    assert session.run(code, sink=pip)["status"] == "ok", pip.text
    assert f"Successfully installed {WHEEL_NAME}-1.0" in pip.text, pip.text
    used = Collect()
    assert (
        session.run(f"import {WHEEL_NAME}, os\nprint({WHEEL_NAME}.ANSWER, os.getuid())", sink=used)[
            "status"
        ]
        == "ok"
    )
    assert used.text.split() == ["42", str(foreign.uid)], used.text
    deadline = time.monotonic() + IDLE_S + 60
    while manager.refresh_state(session.id).state != State.STOPPED:
        assert time.monotonic() < deadline
        time.sleep(0.5)
    assert manager.get(session.id).stop_reason.kind == StopKind.IDLE
    _gc({**nb_env, "HOME": os.environ["HOME"]})  # the HOME whose ~/.ssh reaches the remote engine
    far = docker.DockerClient(base_url=remote["docker_host_env"])
    try:
        assert _ours(far, manager.store.store_id) == []
    finally:
        far.close()


def test_an_image_without_python_on_a_remote_engine(remote, manager):
    t0 = time.monotonic()
    with pytest.raises(StageError) as err:
        manager.start(
            manager.make_spec("t4", backend="docker", image=NO_PYTHON, host=remote["url"])
        )
    assert time.monotonic() - t0 < 80  # found by the image probe, not after the kernel's 120 s wait
    assert (
        err.value.stage == "image"
        and f"image {NO_PYTHON}" in err.value.message
        and "has no Python" in err.value.message
    )


@pytest.mark.xdist_group("slurm")  # the Slurm cluster's registry: one cluster per machine
def test_a_private_registry_image_on_a_remote_engine(remote, manager, tmp_path, monkeypatch):
    """The Slurm cluster's registry (TLS, htpasswd; scripts/ci-slurm.sh) reached from the
    namespace host's engine: without a login, and with a wrong password, the start fails in one
    line naming the registry and `docker login`; with the user's login the remote engine pulls
    it (the login goes with the pull request, the remote host keeps no copy) and the kernel runs
    in the image's Python."""
    import base64
    import json

    from support.slurm import REGISTRY, ensure_cluster, registry_image, registry_login

    if ensure_cluster() is None:
        pytest.skip("the cluster's registry needs root (scripts/ci-slurm.sh)")
    # the namespace host reaches the cluster's network through this machine
    subprocess.run(
        [
            "ip",
            "netns",
            "exec",
            REMOTE_NETNS,
            "ip",
            "route",
            "replace",
            "10.210.0.0/24",
            "via",
            REMOTE_HOST_SIDE,
        ],
        check=True,
    )
    ref = registry_image("gpusession-ci/py-trixie", "ci/py-trixie:latest", tmp_path / "pusher")
    subprocess.run(
        ["docker", "-H", remote["docker_host_env"], "rmi", "-f", ref], capture_output=True
    )
    home = Path(os.environ["HOME"])
    monkeypatch.setenv("GPUSESSION_CACHE", "/var/lib/gpusession-ci/slurm/runtime-cache")

    def failure(name: str) -> str:
        with pytest.raises(StageError) as err:
            manager.start(
                manager.make_spec("t4", backend="docker", image=ref, host=remote["url"], name=name)
            )
        (line,) = str(err.value).splitlines()
        return line

    line = failure("nologin")
    assert (
        f"{REGISTRY} wants a login to pull {ref}" in line
        and f"run `docker login {REGISTRY}` here" in line
    ), line
    (home / ".docker").mkdir(exist_ok=True)
    wrong = base64.b64encode(b"ci:wrong-password").decode()
    (home / ".docker" / "config.json").write_text(
        json.dumps({"auths": {REGISTRY: {"auth": wrong}}})
    )
    line = failure("badlogin")
    assert f"{REGISTRY} refused the pull of {ref} with your docker login as ci" in line, line
    assert f"run `docker login {REGISTRY}` again" in line

    registry_login(home)
    steps: list[str] = []
    session = manager.start(
        manager.make_spec("t4", backend="docker", image=ref, host=remote["url"], name="private"),
        report=steps.append,
    )
    assert any(f"pulling {ref}" in s for s in steps), steps
    from support.sinks import Collect

    sink = Collect()
    session.run("import sys; print(sys.version_info[:2])", sink=sink)
    assert sink.text.strip() == "(3, 13)"
    manager.stop(session.id)
