"""`%gpu switch`: a running session moves to other capacity keeping its variables and files
(saved into its workspace, the workspace moved through this machine where the new session
cannot mount it, restored there), and the old one stops only once the new one answered; a
refused or failed switch leaves the old session running untouched.

Real parts: the local engine and the ssh:// namespace engine (scripts/ci-remote-host.sh) with
the test images of scripts/ci-images.sh, real kernels, a real notebook kernel for the magic's
words, the CLI as a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from gpusession.core.models import State
from gpusession.session.store import Store
from gpusession.words.switches import switch_line
from support.images import image_ready

NUMPY = "gpusession-ci/py-numpy"  # USER 1000, with numpy
NONROOT = "gpusession-ci/py-nonroot"
NO_PYTHON = "gpusession-ci/no-python"


def _remove_volumes(client, *names: str) -> None:
    store_id = Store(Path(os.environ["GPUSESSION_HOME"]) / "sessions.sqlite3").store_id
    for volume in client.volumes.list(filters={"label": f"gpusession.session.store={store_id}"}):
        if volume.attrs.get("Labels", {}).get("gpusession.workspace") in names:
            volume.remove(force=True)


# -- between this machine's engine and an ssh:// engine, and back -------------------------------

ARRAYS = (
    "import numpy as np, os, hashlib\n"
    "a = np.arange(200_000, dtype='float64')\n"
    "m = {'w': np.ones((300, 300), dtype='float32')}\n"
    "blob = os.urandom(1 << 20)\n"
    "open('data.bin', 'wb').write(blob)\n"
    "os.makedirs('out', exist_ok=True); open('out/notes.txt', 'w').write('kept')\n"
    "digest = hashlib.sha256(blob).hexdigest()\n"
    "g = (i for i in range(3))\n"
)
CHECK = (
    "import hashlib\n"
    "assert float(a.sum()) == 19999900000.0 and m['w'].shape == (300, 300)\n"
    "assert hashlib.sha256(open('data.bin', 'rb').read()).hexdigest() == digest\n"
    "assert open('out/notes.txt').read() == 'kept' and os.getuid() == 1000\n"
)


@pytest.mark.docker
def test_a_switch_between_this_engine_and_an_ssh_engine_keeps_arrays_and_files(
    manager, engine, remote
):
    if not image_ready(NUMPY):
        pytest.skip(f"no Docker engine with {NUMPY}")
    import docker

    far = docker.DockerClient(base_url=remote["docker_host_env"])
    try:
        first = manager.start(
            manager.make_spec("t4", backend="docker", image=NUMPY, idle="off", name="sw1")
        )
        assert first.run(ARRAYS)["status"] == "ok"
        lines: list[str] = []
        there, report = manager.switch(
            first,
            manager.switch_spec(first.id, {"host": remote["url"], "type": "a100"}),
            lines.append,
        )
        said = "\n".join(lines)
        assert "save: saved 4 variable(s)" in said, said
        assert "move: workspace from docker (this machine's engine) to docker ssh://" in said, said
        assert "sw1-2" not in said, said  # the new record's name until the hand-over is ours
        assert " to move, through this machine" in said and "move: moved " in said, said
        assert (
            there.record.spec.extra.get("host") == remote["url"]
            and there.record.spec.gpu_type == "a100"
        )
        line = switch_line(report.to_dict())
        assert there.name == "sw1", "a switched session keeps its name"
        assert line.startswith("switched sw1 in "), line
        for name in ("a", "m", "blob", "digest", "np", "os", "hashlib"):
            assert name in report.restored["restored"] + report.restored["imports"], report.restored
        assert "the files of workspace sw1 (" in line and "to docker ssh://root@" in line, line
        assert "not moved: g (a generator), not saved" in line, line
        assert "now $2.7" in line and "(was $0.5" in line, line  # a100's rate, t4's before
        assert report.moved_bytes > 3 << 20  # the file, the checkpoint
        assert there.run(CHECK)["status"] == "ok"
        ended = manager.get(first.id)
        assert ended.name == "sw1~1" and manager.get("sw1").id == there.id
        assert ended.state == State.STOPPED and "switch to 1 x a100 on docker" in str(
            [e.detail for e in ended.events]
        ), ended.events
        assert not engine.containers.list(filters={"label": f"gpusession.session={first.id}"})

        # and back: the older copy on this engine is replaced by what moved there
        assert (
            there.run("a[:5] = -1\nopen('out/notes.txt', 'w').write('changed there')")["status"]
            == "ok"
        )
        back, report = manager.switch(
            there, manager.switch_spec(there.id, {"host": ""}), lines.append
        )
        assert back.record.spec.extra.get("host") in (None, "") and report.moved_bytes > 3 << 20
        assert "replacing the older copy of workspace sw1 there" in "\n".join(lines)
        assert (
            back.run(
                "assert a[:5].tolist() == [-1.0] * 5 and open('out/notes.txt').read() == 'changed there'"
            )["status"]
            == "ok"
        )
        assert manager.get(there.id).state == State.STOPPED
        manager.stop(back.id)
    finally:
        manager.stop_all()
        _remove_volumes(far, "sw1")
        far.close()


# -- the magic: refused while a cell runs, a failed start, local -> docker -------------------------


@pytest.mark.docker
def test_the_magic_refuses_while_a_cell_runs_keeps_the_old_session_on_a_failed_start_then_moves_local_to_docker(
    notebook, nb_env, engine
):
    if not (image_ready(NONROOT) and image_ready(NO_PYTHON)):
        pytest.skip(f"no Docker engine with {NONROOT} and {NO_PYTHON}")
    from gpusession.session import SessionManager

    try:
        start = notebook.run("%gpu start --backend local --idle off --name lw")
        assert start.status == "ok", start.text
        cell = notebook.run("%%gpu\nx = 41\nopen('notes.txt', 'w').write('kept')")
        assert cell.status == "ok", cell.text

        # another client of the same kernel runs a cell: the switch is refused, nothing changes
        other = SessionManager()
        busy = other.attach("lw")
        running = threading.Thread(target=busy.run, args=("import time; time.sleep(6)",))
        running.start()
        time.sleep(1.5)
        refused = notebook.run(f"%gpu switch --backend docker --image {NONROOT}")
        running.join()
        other.close()
        assert refused.status == "error", refused.text
        assert "session lw is running a cell; switch once it has finished" in refused.text
        assert "Traceback" not in refused.text, refused.text

        failed = notebook.run(f"%gpu switch --backend docker --image {NO_PYTHON}")
        assert failed.status == "error", failed.text
        assert "session lw keeps running untouched" in failed.text, failed.text
        assert "Traceback" not in failed.text, failed.text
        still = notebook.run("%%gpu\nprint(x, open('notes.txt').read())")
        assert still.text.strip() == "41 kept", still.text
        assert Store(Path(nb_env["GPUSESSION_HOME"]) / "sessions.sqlite3").get("lw").state == (
            State.RUNNING
        )

        moved = notebook.run(f"%gpu switch --backend docker --image {NONROOT} --type a100")
        assert moved.status == "ok", moved.text
        text = moved.text
        assert "save: saving the variables of lw into workspace lw" in text, text
        assert (
            "move: workspace from this machine's folder to docker (this machine's engine)" in text
        )
        (line,) = [ln for ln in text.splitlines() if ln.startswith("switched lw in ")]
        assert "moved 2 name(s) (x, time) and the files of workspace lw (" in line, line
        assert "now $2.7" in line and "(was $0.5" in line, line
        after = notebook.run("%%gpu\nimport os\nprint(x, open('notes.txt').read(), os.getuid())")
        assert after.text.strip() == "41 kept 1000", after.text
        status = notebook.run("%gpu status")
        assert "1 x a100 on docker (image " in status.text and " - running" in status.text, (
            status.text
        )
        store = Store(Path(nb_env["GPUSESSION_HOME"]) / "sessions.sqlite3")
        ended = store.get("lw~1")  # the former capacity's record, under a retired name
        assert ended.state == State.STOPPED, ended.events
        assert store.get("lw").state == State.RUNNING, "the switched session keeps its name"
        assert "stop requested by %gpu switch to 1 x a100 on docker" in [
            e.detail for e in ended.events
        ]
    finally:
        notebook.run("%gpu stop --all")
        _remove_volumes(engine, "lw")


# -- the CLI and the REST API (the local backend: seconds) --------------------------------------


def _cli_switch(env: dict, *args: str) -> subprocess.CompletedProcess:
    """`gpusession switch ARGS` in a process of its own."""
    return subprocess.run(
        [sys.executable, "-m", "gpusession", "switch", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.integration
def test_the_cli_switches_a_session_another_process_started(gs_home, manager):
    session = manager.start(manager.make_spec("t4", backend="local", idle="off", name="c1"))
    assert session.run("y = [1, 2, 3]")["status"] == "ok"
    env = dict(os.environ, GPUSESSION_HOME=str(gs_home))
    done = _cli_switch(env, "c1", "--type", "l4", "--name", "c2")
    assert done.returncode == 0, done.stderr
    (line,) = [ln for ln in done.stdout.splitlines() if ln.startswith("switched c1 -> c2 in ")]
    assert "moved 1 name(s) (y) and the files of workspace c1, where they were" in line, line
    assert manager.get("c1").state == State.STOPPED
    assert manager.get("c2").state == State.RUNNING and manager.get("c2").spec.gpu_type == "l4"
    again = manager.attach("c2")
    assert again.run("assert y == [1, 2, 3]")["status"] == "ok"

    ended = _cli_switch(env, "c1", "--resume", "c1")
    assert ended.returncode == 2, ended.stdout  # a switch keeps its workspace: no --resume
    assert "unrecognized arguments: --resume c1" in ended.stderr, ended.stderr
    assert "Traceback" not in ended.stderr


async def _post_switch(jp_fetch, key: str, body: dict):
    import json

    return await jp_fetch(
        "gpusession", "api", "sessions", key, "switch", method="POST", body=json.dumps(body)
    )


@pytest.mark.integration
async def test_the_rest_api_switches_a_session_and_says_what_is_wrong_with_a_body(
    jp_fetch, manager
):
    import json

    from tornado.httpclient import HTTPClientError

    session = manager.start(manager.make_spec("t4", backend="local", idle="off", name="r1"))
    assert session.run("z = 'here'")["status"] == "ok"
    for key, body, status, words in (
        ("r1", {"resume": "x"}, 400, "'resume': a switch keeps the session's workspace"),
        ("r1", {"on_demand": "yes"}, 400, "'on_demand': wrong type"),
        ("r1", {"typo": 1}, 400, "unknown field"),
        ("nope", {}, 404, "nope"),
    ):
        with pytest.raises(HTTPClientError) as err:
            await _post_switch(jp_fetch, key, body)
        assert err.value.code == status
        assert words in json.loads(err.value.response.body)["message"]
    doc = json.loads((await _post_switch(jp_fetch, "r1", {"type": "a100"})).body)
    assert doc["session"]["name"] == "r1", "a switched session keeps its name"
    assert doc["session"]["gpu_type"] == "a100" and doc["session"]["state"] == "running"
    assert doc["line"].startswith("switched r1 in ") and "(z)" in doc["line"]
    assert doc["report"]["restored"]["restored"] == ["z"]
    assert manager.get("r1~1").state == State.STOPPED and manager.get("r1").id != session.id


# -- a notebook follows a switch made elsewhere -----------------------------------------------------


@pytest.mark.integration
def test_a_notebook_follows_its_session_switched_by_the_cli_and_keeps_gpu_on(notebook, nb_env):
    """Switched by another face (the CLI here; REST and the sidebar record the same): the
    notebook's next cell, in `%gpu on` mode, runs on the new session with one line saying so,
    not "stopped by ... switch"; `%gpu status` names the new one."""
    try:
        start = notebook.run("%gpu start --backend local --idle off --name fw")
        assert start.status == "ok", start.text
        assert notebook.run("%%gpu\nx = 41").status == "ok"
        on = notebook.run("%gpu on")
        assert "every cell now runs in fw" in on.text, on.text
        done = _cli_switch(nb_env, "fw", "--type", "l4", "--name", "fw-l4")
        assert done.returncode == 0, done.stderr
        cell = notebook.run("print(x + 1)")
        assert cell.status == "ok", cell.text
        lines = cell.text.strip().splitlines()
        assert lines[0] == (
            "session fw was switched to fw-l4 (1 x L4 on local, $0.8048/h) by gpusession switch; "
            "this notebook now uses fw-l4: the next cell runs there"
        ), cell.text
        assert lines[1:] == ["42"], cell.text
        again = notebook.run("print(x)")  # said once
        assert again.text.strip() == "41", again.text
        status = notebook.run("%gpu status")
        assert "fw-l4" in status.text and "%gpu on: every cell runs in this session" in (
            status.text
        ), status.text
    finally:
        notebook.run("%gpu off")
        notebook.run("%gpu stop --all")


def test_the_old_place_stays_behind_when_the_backend_changes():
    """A Slurm session's login node is no Docker engine: switching it to docker starts on this
    machine's engine unless a --host is given; the image and the other options carry over."""
    from gpusession.core.models import LaunchSpec, SessionRecord
    from gpusession.session.switch import switch_values

    old = SessionRecord(
        id="x" * 32,
        name="old",
        spec=LaunchSpec(
            "t4",
            backend="slurm",
            max_cost=5.0,
            extra={"host": "ssh://me@login", "image": "ghcr.io/me/img:1"},
        ),
        state=State.RUNNING,
        created_at=0.0,
        updated_at=0.0,
        owner="me",
    )
    values = switch_values(old, {"backend": "docker"})
    assert "host" not in values and values["image"] == "ghcr.io/me/img:1", values
    assert values["max_cost"] == "5", values  # as restart_body writes it
    given = switch_values(old, {"backend": "docker", "host": "ssh://me@gpubox"})
    assert given["host"] == "ssh://me@gpubox"
    assert switch_values(old, {"type": "a100"})["host"] == "ssh://me@login"  # same backend


def test_a_docker_workspace_stream_cut_short_lands_nowhere_and_a_whole_one_replaces_the_copy(
    manager, engine
):
    """What a switch into the docker backend asks of it, without a container: a stream whose
    source fails midway raises the source's error, and the older copy of the workspace on the
    engine stays as it was, with no staging volume left beside it; a whole stream replaces the
    copy (said), owned by the image's USER."""
    import io
    import tarfile

    from gpusession.configuration.agentargs import workspace_volume
    from gpusession.core.progress import Progress
    from support.streams import workspace_chunks

    if not image_ready(NONROOT):
        pytest.skip(f"no Docker engine with {NONROOT}")
    backend = manager.backend("docker")
    store_id = manager.store.store_id
    volume = workspace_volume("cut", store_id)
    spec = manager.make_spec("t4", backend="docker", image=NONROOT, name="cut-2", workspace="cut")
    record = manager.store.create(spec, price_per_hour=0.0)

    def listing() -> str:  # what is in the volume, and who owns it
        return engine.containers.run(
            NONROOT,
            ["sh", "-c", "cd /w && ls -n | awk 'NR > 1 {print $3, $9}'"],
            volumes={volume: {"bind": "/w", "mode": "ro"}},
            remove=True,
        ).decode()

    chunks = workspace_chunks()

    try:
        older = io.BytesIO()
        with tarfile.open(fileobj=older, mode="w") as tar:
            info = tarfile.TarInfo("workspace/old.txt")
            info.size = 10
            tar.addfile(info, io.BytesIO(b"older copy"))
        lines: list[str] = []
        backend.import_workspace(record, iter([older.getvalue()]), Progress(lines.append))
        assert listing() == "1000 old.txt\n"
        with pytest.raises(OSError, match="cannot read big: Input/output error"):
            backend.import_workspace(record, chunks(fail_at=2 << 20), Progress(lines.append))
        assert listing() == "1000 old.txt\n"  # the older copy, as it was
        ours = {v.name for v in engine.volumes.list(filters={"label": f"{STORE}={store_id}"})}
        assert ours == {volume}, ours  # no staging volume left

        backend.import_workspace(record, chunks(), Progress(lines.append))
        assert listing() == "1000 big\n1000 new.txt\n"
        assert "replacing the older copy of workspace cut there" in "\n".join(lines), lines
        ours = {v.name for v in engine.volumes.list(filters={"label": f"{STORE}={store_id}"})}
        assert ours == {volume}, ours
    finally:
        _remove_volumes(engine, "cut")


STORE = "gpusession.session.store"
