"""Your work survives: a workspace that outlives the session (a named volume on the Docker engine,
a folder for the local backend), the kernel's variables saved into it before an idle stop (and on
`stop --save`) within a time bound and a size cap, and `--resume` bringing them back; `gpusession
workspaces` lists them, gc reports the orphaned ones and never deletes one.

The real Docker engine with the non-root image of scripts/ci-images.sh, real kernels, a real
notebook kernel for the magic's words, the CLI as a subprocess."""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from gpusession.agent import checkpoint
from gpusession.core.models import State
from gpusession.session.store import Store
from gpusession.words.stops import ended_message
from support.images import image_ready

NONROOT = "gpusession-ci/py-nonroot"  # USER 1000: the workspace must be writable by it
IDLE_S = 3


def _image_ready() -> bool:
    return image_ready(NONROOT)


def _cli(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gpusession", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _wait_ended(store: Store, name: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while store.get(name).state.active:
        assert time.monotonic() < deadline, [
            (e.state.value, e.detail) for e in store.get(name).events
        ]
        time.sleep(0.3)


def _remove_volumes(engine, *names: str) -> None:
    """This store's workspace volumes of those names (found by label: the volume's name has the store's id)."""
    store_id = Store(Path(os.environ["GPUSESSION_HOME"]) / "sessions.sqlite3").store_id
    for volume in engine.volumes.list(filters={"label": f"gpusession.session.store={store_id}"}):
        if volume.attrs.get("Labels", {}).get("gpusession.workspace") in names:
            volume.remove(force=True)


def _volume(nb_env: dict, name: str) -> str:
    return f"gpusession-ws-{Store(Path(nb_env['GPUSESSION_HOME']) / 'sessions.sqlite3').store_id[:8]}-{name}"


# -- the checkpoint itself (no session) ------------------------------------------------------------


def test_a_save_past_its_bound_keeps_the_previous_checkpoint_and_a_bad_variable_is_one_line(
    tmp_path,
):
    ws = str(tmp_path)
    first = checkpoint.save({"a": 1, "os": os}, ws, deadline=time.time() + 30, cap_bytes=None)
    assert first["committed"] and first["saved"] == 1 and first["imports"] == 1
    late = checkpoint.save({"a": 2}, ws, deadline=time.time() - 1, cap_bytes=None)
    assert not late["committed"] and late["error"] == "time bound"
    # another Python's or package's pickle that does not load: one line for it, the rest comes back
    checkpoint.tidied(timeout=30)  # the save's after-answer work writes checkpoint.json: done
    # before the test writes its own (a loaded run's tidy replaced the test's edit)
    manifest = checkpoint.read_manifest(ws)
    folder = Path(ws, ".gpusession", "checkpoints", manifest["folder"])
    broken = b"\x80\x05cno_such_module\nThing\n."
    (folder / "broken.pkl").write_bytes(broken)
    manifest["variables"].append(
        {"name": "thing", "file": "broken.pkl", "bytes": len(broken), "type": "Thing"}
    )
    Path(ws, ".gpusession", "checkpoint.json").write_text(__import__("json").dumps(manifest))
    ns: dict = {}
    report = checkpoint.restore(ns, ws)
    assert ns["a"] == 1 and ns["os"] is os, "the previous checkpoint, whole"
    assert report["restored"] == ["a"] and report["imports"] == ["os"]
    assert [f["name"] for f in report["failed"]] == ["thing"] and "no_such_module" in report[
        "failed"
    ][0]["error"]
    assert checkpoint.restore({}, str(tmp_path / "empty"))["found"] is False
    pickle.dumps(report)


# -- the Docker engine: volume, idle save, resume, cap, workspaces, gc -------------------------


@pytest.mark.docker
def test_idle_stop_saves_and_resume_brings_back_files_and_variables(nb_env, engine, tmp_path):
    if not _image_ready():
        pytest.skip(f"no Docker engine with {NONROOT}")
    from support.notebook_kernel import NotebookKernel

    store = Store(Path(nb_env["GPUSESSION_HOME"]) / "sessions.sqlite3")
    w1 = _volume(nb_env, "w1")
    nk = NotebookKernel(nb_env, cwd=str(tmp_path))
    try:
        assert nk.run("%load_ext gpusession").status == "ok"
        start = nk.run(f"%gpu start --backend docker --image {NONROOT} --idle {IDLE_S}s --name w1")
        assert start.status == "ok" and f"workspace w1: new volume {w1}" in start.text, start.text
        cell = nk.run(
            "%%gpu\nimport os, json as js\nx = 42\nd = {'a': [1, 2]}\nb = b'z' * 3_000_000\n"
            "g = (i for i in range(3))\nopen('x.txt', 'w').write('hello')\n"
            # defined in cells, on an image without cloudpickle: saved by value (the bundle's)
            "def f(v):\n    return v + x\nclass C:\n    def twice(self, v):\n        return 2 * v\n"
            "sq = lambda v: v * v\n"
            "print(os.getcwd(), os.getuid(), __import__('importlib.util').util.find_spec('cloudpickle'))"
        )
        assert cell.status == "ok" and cell.text.split() == ["/workspace", "1000", "None"], (
            cell.text
        )
        _wait_ended(store, "w1", IDLE_S + 60)  # its own watchdog saves, then stops
        said = ended_message(store.get("w1"))
        assert "stopped by its idle watchdog" in said, said
        assert (
            "saved 6 variables and 2 imports, 3.0 MB; skipped: g (a generator); resume with "
            "`%gpu start --resume w1`" in said
        ), said

        # a new session on the same workspace, with a cap the bytes are over
        again = nk.run(
            f"%gpu start --backend docker --image {NONROOT} --resume w1 --name w2 --idle {IDLE_S}s "
            "--save-cap 1MB --save-timeout 20s"
        )
        assert again.status == "ok", again.text
        assert f"workspace w1: volume {w1}, kept from an earlier session" in again.text
        assert (
            "workspace w1: restored 8 name(s)" in again.text
            and ": C, b, d, f, sq, x, js, os" in again.text
        ), again.text
        assert "not restored: g (a generator), not saved" in again.text, again.text
        back = nk.run("%%gpu\nprint(x, d, len(b), js.dumps(d), open('x.txt').read())")
        assert back.text.strip() == "42 {'a': [1, 2]} 3000000 {\"a\": [1, 2]} hello", back.text
        made = nk.run("%%gpu\nprint(f(1), C().twice(3), sq(4))")
        assert made.text.strip() == "43 6 16", made.text
        _wait_ended(store, "w2", IDLE_S + 60)
        record = store.get("w2")
        result = record.resource["agent_summary"]["checkpoint"]
        assert result["committed"] and result["seconds"] < 20, result  # on time
        said = ended_message(record)
        assert "b (bytes over the 1.0 MB cap per variable (--save-cap))" in said, said
        assert record.resource["workspace"] == "w1"
    finally:
        nk.close()

    listed = _cli(nb_env, "workspaces")
    assert listed.returncode == 0, listed.stderr
    (row,) = [line for line in listed.stdout.splitlines() if line.startswith("w1 ")]
    assert "docker" in row and "none left" in row and f"volume {w1} on the local engine" in row, row
    try:
        gc = _cli(nb_env, "gc")
        assert gc.returncode == 0, gc.stderr
        assert f"kept workspace w1 (volume {w1} on the local engine" in gc.stdout, gc.stdout
        assert engine.volumes.get(w1), "gc never deletes a workspace"
        refused = _cli(nb_env, "workspaces", "rm", "w1")
        assert refused.returncode == 1 and "add --yes" in refused.stderr, refused.stderr
        assert engine.volumes.get(w1)
        deleted = _cli(nb_env, "workspaces", "rm", "w1", "--yes")
        assert deleted.returncode == 0 and "deleted workspace w1" in deleted.stdout, deleted.stderr
        assert "w1 " not in _cli(nb_env, "workspaces").stdout
    finally:
        _remove_volumes(engine, "w1")


SLOW_SAVE = """
import os, sys, time
from gpusession.session import SessionManager
m = SessionManager()
s = m.start(m.make_spec("t4", backend="docker", image=sys.argv[1], idle="2s", name="k1", workspace="k",
                        save_timeout="3s"))
assert s.run("a = 1")["status"] == "ok"
from gpusession.session.agentclient import AgentClient
first = AgentClient.for_endpoint(s.link.endpoint, timeout=30).save()  # the checkpoint a later save must not spoil
assert first["committed"], first
code = '''
import time
class Slow:
    def __reduce__(self):
        time.sleep(60)
        return (int, ())
a = 2
s = Slow()
'''
assert s.run(code)["status"] == "ok"
print("SAVING SOON", flush=True)
time.sleep(600)
"""


@pytest.mark.docker
def test_killing_our_process_during_a_save_still_stops_and_keeps_the_checkpoint(
    gs_home, nb_env, engine, manager
):
    """The save outlasts its bound (a variable takes a minute to pickle) and the notebook side is
    killed meanwhile: the remote watchdog stops the session after the bound anyway, and the
    workspace keeps its previous checkpoint, whole."""
    if not _image_ready():
        pytest.skip(f"no Docker engine with {NONROOT}")
    child = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(SLOW_SAVE), NONROOT],
        env=nb_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        line = ""
        deadline = time.monotonic() + 120
        while "SAVING SOON" not in line:
            line = child.stdout.readline()
            assert line or child.poll() is None, "the child ended before its save"
            assert time.monotonic() < deadline
        time.sleep(2 + 1.5)  # idle 2s: the save is under way (a is written; s takes a minute)
        child.send_signal(signal.SIGKILL)
        child.wait(10)
        record = manager.get("k1")
        container = engine.containers.get(record.resource["container_id"])
        t0 = time.monotonic()
        while container.status == "running":
            assert time.monotonic() - t0 < 30, "the remote watchdog stops it after the 3s bound"
            time.sleep(0.3)
            container.reload()
        ended = manager.refresh_state("k1")
        assert ended.state == State.STOPPED
        said = ended_message(ended)
        assert "variables not saved: the save time bound (3s) passed first" in said, said

        resumed = manager.start(
            manager.make_spec(
                "t4", backend="docker", image=NONROOT, idle="off", name="k2", resume="k"
            )
        )
        assert resumed.record.resource["restored"]["restored"] == ["a"]
        out = resumed.run("print(a, 's' in dir())")
        assert out["status"] == "ok"
        manager.stop(resumed.id)
    finally:
        if child.poll() is None:
            child.kill()
        _remove_volumes(engine, "k")


# -- the local backend: a folder ---------------------------------------------------------------------


@pytest.mark.integration
def test_the_local_workspace_is_a_folder_listed_and_reported_by_gc(gs_home, nb_env, manager):
    # --save-timeout off: no save before a watchdog stop, but `stop --save` asks for one all the same
    session = manager.start(
        manager.make_spec("t4", backend="local", idle="off", name="l1", save_timeout="off")
    )
    folder = gs_home / "workspaces" / "l1"
    out = session.kernel.execute(
        "import os\nopen('x.txt', 'w').write('hi')\nn = 7\nprint(os.getcwd())"
    )
    assert out["status"] == "ok"
    assert (folder / "x.txt").read_text() == "hi"
    listed = _cli(nb_env, "workspaces")
    (row,) = [line for line in listed.stdout.splitlines() if line.startswith("l1 ")]
    assert "local" in row and "l1 (active)" in row and str(folder) in row, listed.stdout
    stopped = manager.stop(session.id, save=True)
    assert stopped.resource["checkpoint"]["saved"] == 1
    assert checkpoint.read_manifest(str(folder))["variables"][0]["name"] == "n"
    gc = _cli(nb_env, "gc")
    assert f"kept workspace l1 ({folder}" in gc.stdout and (folder / "x.txt").exists(), gc.stdout
    again = manager.start(
        manager.make_spec("t4", backend="local", idle="off", name="l2", resume="l1")
    )
    assert again.run("print(n, open('x.txt').read())")["status"] == "ok"
    assert again.record.resource["restored"]["restored"] == ["n"]
    busy = _cli(nb_env, "workspaces", "rm", "l1", "--yes")
    assert busy.returncode == 1 and "in use by session l2" in busy.stderr, busy.stderr
    manager.stop(again.id)
    assert _cli(nb_env, "workspaces", "rm", "l1", "--yes").returncode == 0
    assert not folder.exists()
    missing = manager.make_spec("t4", backend="local", idle="off", name="l3", resume="nope")
    with pytest.raises(Exception, match="no workspace nope to resume"):
        manager.start(missing)


@pytest.mark.docker
def test_a_listing_sizes_volumes_only_where_it_has_some_and_a_delete_asks_only_its_backend(
    gs_home, manager, monkeypatch
):
    """The engine's df sizes all it holds (seconds on a busy engine, one at a time on Docker
    20.10): a listing with none of this store's volumes there does not ask it; deleting a local
    workspace, as the sidebar does (naming its backend), asks no other backend."""
    import docker

    from gpusession.backends.docker.backend import DockerBackend
    from gpusession.session.workspace_ops import list_all, remove

    sized = []
    real_df = docker.DockerClient.df
    monkeypatch.setattr(docker.DockerClient, "df", lambda self: sized.append(1) or real_df(self))
    assert manager.backend("docker").list_workspaces() == []
    assert sized == []
    (gs_home / "workspaces" / "w1").mkdir(parents=True)
    assert [v.workspace.name for v in list_all(manager.store, manager.backend)] == ["w1"]

    def asked(self):
        raise AssertionError("the docker backend was asked for a local workspace's delete")

    monkeypatch.setattr(DockerBackend, "list_workspaces", asked)
    assert remove(manager.store, manager.backend, "w1", "local").name == "w1"
    assert not (gs_home / "workspaces" / "w1").exists()


# -- an ssh:// engine: the same volume, through the Docker API over SSH ---------------------------


@pytest.mark.docker
def test_a_workspace_on_a_remote_engine_survives_and_resumes(
    tmp_path, monkeypatch, manager, nb_env
):
    import docker

    from support.hosts import ensure_remote_host, ssh_home

    host = ensure_remote_host()
    if host is None:
        pytest.skip(
            "the namespace Docker host cannot run here (needs root; scripts/ci-remote-host.sh)"
        )
    monkeypatch.setenv("HOME", ssh_home(host, tmp_path / "home"))
    far = docker.DockerClient(base_url=host["docker_host_env"])
    try:
        session = manager.start(
            manager.make_spec(
                "t4",
                backend="docker",
                idle=f"{IDLE_S}s",
                image=NONROOT,
                host=host["url"],
                name="r1",
            )
        )
        assert session.run("n = 7\nopen('x.txt', 'w').write('far')")["status"] == "ok"
        deadline = time.monotonic() + IDLE_S + 60
        while manager.refresh_state(session.id).state.active:
            assert time.monotonic() < deadline
            time.sleep(0.5)
        said = ended_message(manager.get("r1"))
        assert "saved 1 variable," in said and "resume with `%gpu start --resume r1`" in said, said
        listed = _cli({**nb_env, "HOME": os.environ["HOME"]}, "workspaces")
        (row,) = [line for line in listed.stdout.splitlines() if line.startswith("r1 ")]
        assert f"volume {_volume(nb_env, 'r1')} on {host['url']}" in row, listed.stdout
        # no --backend, --host nor --image: the resume goes where r1 lives, with r1's image
        again = manager.start(manager.make_spec("t4", idle="off", name="r2", resume="r1"))
        assert (again.record.backend, again.record.spec.extra["host"]) == ("docker", host["url"])
        assert again.record.spec.extra["image"] == NONROOT
        assert again.record.resource["restored"]["restored"] == ["n"]
        assert again.run("assert n == 7 and open('x.txt').read() == 'far'")["status"] == "ok"
        manager.stop(again.id)
    finally:
        _remove_volumes(far, "r1")
        far.close()


@pytest.mark.integration
def test_a_max_runtime_stop_saves_too(gs_home, manager):
    """Every watchdog stop saves (idle above; here the hard runtime limit, with a cell still running)."""
    session = manager.start(
        manager.make_spec("t4", backend="local", idle="off", max_runtime="4s", name="mr")
    )
    assert session.run("kept = {'k': 1}")["status"] == "ok"
    session.kernel.client.execute(
        "import time\nfor _ in range(100): time.sleep(0.1)"
    )  # busy when the limit comes
    deadline = time.monotonic() + 60
    while manager.refresh_state("mr").state.active:
        assert time.monotonic() < deadline
        time.sleep(0.3)
    said = ended_message(manager.get("mr"))
    assert "was stopped by its max-runtime limit" in said, said
    assert (
        "saved 1 variable and 1 import" in said and "resume with `%gpu start --resume mr`" in said
    ), said
    # following that advice, with docker the default backend here: it starts on local, where mr lives
    again = manager.start(manager.make_spec("t4", idle="off", resume="mr"))
    assert again.record.backend == "local"
    assert again.run("assert kept == {'k': 1}")["status"] == "ok"
    manager.stop(again.id)
