"""Docker faults of issue 10 (items 1, 6, 9) on a real engine: a bad host never stops gc from
removing a real leftover container; `gpusession list` sees a container that died without asking
the SDK; `gpusession stop` keeps the agent's summary; a failed start keeps the container's log in
the store; and a READY marker that lands mid-line (another process of the container writing half
a line at that moment) is still found."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpusession.backends.docker.engine import wait_for_marker
from gpusession.core.models import LaunchSpec, State
from gpusession.core.protocol import Marker
from gpusession.session.store import Store
from support.hosts import docker_available, product_image

LABEL = "gpusession.session"
ENGINE = docker_available()
pytestmark = [pytest.mark.docker, pytest.mark.skipif(not ENGINE, reason="no Docker engine answers")]


@pytest.fixture
def docker_env(nb_env, monkeypatch) -> dict[str, str]:
    monkeypatch.setenv("GPUSESSION_IMAGE", product_image())
    nb_env["GPUSESSION_IMAGE"] = product_image()
    return nb_env


def cli(env, *args, timeout=180):
    return subprocess.run(
        [sys.executable, "-m", "gpusession", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _ours(client, session_id: str) -> list:
    return client.containers.list(
        all=True, ignore_removed=True, filters={"label": f"{LABEL}={session_id}"}
    )


def test_a_record_with_a_bad_host_does_not_stop_gc_removing_containers(docker_env, engine, manager):
    """A record of an old version whose host IDNA cannot encode sits beside a real leftover."""
    bad = manager.store.create(
        LaunchSpec(gpu_type="t4", backend="docker", extra={"host": "ssh://" + "a" * 64}),
        price_per_hour=1,
    )
    for state in (State.PROVISIONING, State.STARTING, State.RUNNING):
        manager.store.transition(bad.id, state)
    env = {"GPUSESSION_SESSION_ID": "2" * 32, "GPUSESSION_AUTHORIZED_KEY": "none"}
    stray = engine.containers.create(
        product_image(),
        labels={LABEL: "2" * 32, "gpusession.session.store": manager.store.store_id},
        environment=env,
    )
    try:
        gc = cli(docker_env, "gc")
        assert gc.returncode == 0 and "Traceback" not in gc.stdout + gc.stderr, (
            gc.stdout + gc.stderr
        )
        assert f"removed container {stray.name}" in gc.stdout, gc.stdout
        assert _ours(engine, "2" * 32) == []
        assert (
            "skipping Docker engine ssh://aaaa" in gc.stderr and "no valid DNS name" in gc.stderr
        ), gc.stderr
        assert (
            bad.name
        )  # its record is left as it is: an engine that cannot be asked is no proof of an end
    finally:
        for c in _ours(engine, "2" * 32):
            c.remove(force=True)


def test_list_sees_a_dead_container_without_the_sdk_and_stop_keeps_the_summary(docker_env, engine):
    try:
        r = cli(docker_env, "start", "--backend", "docker", "--idle", "off", "--name", "box")
        assert r.returncode == 0, r.stdout + r.stderr
        r = cli(docker_env, "start", "--backend", "docker", "--idle", "0", "--name", "box2")
        assert r.returncode == 0, r.stdout + r.stderr
        assert "idle stop: off" in r.stdout, r.stdout
        store = Store(Path(docker_env["GPUSESSION_HOME"]) / "sessions.sqlite3")
        # `gpusession stop` from another process keeps the agent's summary, as the notebook's stop does
        stop = cli(docker_env, "stop", "box2")
        assert stop.returncode == 0, stop.stderr
        assert "GPU-hours" in stop.stdout and "mean GPU utilization" in stop.stdout, stop.stdout
        assert store.get("box2").resource.get("agent_summary"), "no agent summary kept"

        code = (
            "import sys, time; from gpusession.faces import cli; t = time.perf_counter(); cli.main(['list', '--all']); "
            "print('took %.2fs' % (time.perf_counter() - t), 'sdk imported:', 'docker' in sys.modules)"
        )

        def listing() -> tuple[str, str]:
            r = subprocess.run(
                [sys.executable, "-c", code],
                env=docker_env,
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert r.returncode == 0, r.stderr
            print(r.stdout.strip().splitlines()[-1])
            return next(li for li in r.stdout.splitlines() if li.split()[:1] == ["box"]).split()[
                3
            ], r.stdout

        state, out = listing()  # alive: checked over the engine's socket, without the SDK
        assert state == "running" and "sdk imported: False" in out, out
        container = engine.containers.get(store.get("box").resource["container_id"])
        container.kill()  # the container dies; nobody runs gc or stats
        state, out = listing()
        assert state in ("stopped", "failed"), out
        assert store.get("box").state in (State.STOPPED, State.FAILED)
        assert _ours(engine, store.get("box").id) == [], (
            "the dead container is removed when it is recorded so"
        )
    finally:  # nothing left running, whatever failed
        cli(docker_env, "stop", "--all")


def test_a_failed_start_keeps_the_containers_log(docker_env, manager, engine):
    """A start torn down half-way (here: its starter died, and gc cleans up) keeps the end of the
    container's log in the record, bounded, and `gpusession status` shows it."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    owner = f"me@{socket.gethostname()}:{dead.pid}"
    record = manager.store.create(
        LaunchSpec(gpu_type="t4", backend="docker", name="broke"), price_per_hour=1, owner=owner
    )
    script = (
        "for i in $(seq 1 400); do echo line $i of a long start; done; sleep 1; "
        "echo agent cannot start >&2; sleep 120"
    )
    container = engine.containers.run(
        product_image(),
        entrypoint=["/bin/sh", "-c", script],
        detach=True,
        labels={LABEL: record.id, "gpusession.session.store": manager.store.store_id},
    )
    try:
        deadline = time.monotonic() + 30
        while b"agent cannot start" not in container.logs():
            assert time.monotonic() < deadline
            time.sleep(0.2)
        manager.store.update_resource(record.id, engine="", container_id=container.id)
        manager.store.transition(record.id, State.PROVISIONING)
        manager.store.transition(record.id, State.STARTING)
        manager.store.update_resource(record.id, driver=owner)  # it was the dead one moving it
        gc = cli(docker_env, "gc")
        assert "stopped broke (left starting by a dead process)" in gc.stdout, gc.stdout + gc.stderr
        record = manager.get("broke")
        assert record.state == State.FAILED and _ours(engine, record.id) == []
        kept = record.resource.get("start_log") or ""
        assert "agent cannot start" in kept and "line 400 of a long start" in kept, kept[-300:]
        assert len(kept.encode()) <= 4096 and "line 1 of" not in kept, "the kept log is bounded"
        status = cli(docker_env, "status", "broke")
        assert "start log" in status.stdout and "| agent cannot start" in status.stdout, (
            status.stdout
        )
    finally:
        for c in _ours(engine, record.id):
            c.remove(force=True)


def test_the_ready_marker_is_found_when_another_write_shares_its_line(engine):
    """The kernel prints 'To connect another client to this kernel, use:' as two writes (text,
    then newline) to the stdout it shares with the runtime; READY can land in between."""
    script = (
        "printf 'To connect another client to this kernel, use:'; echo GPUSESSION_READY; echo; "
        "echo '    --existing kernel.json'; sleep 60"
    )
    container = engine.containers.run(
        product_image(), entrypoint=["/bin/sh", "-c", script], detach=True, labels={LABEL: "3" * 32}
    )
    try:
        t0 = time.monotonic()
        assert wait_for_marker(container, Marker.READY, 20, stage="connect") is None
        assert time.monotonic() - t0 < 19  # found, not the 20 s wait run out
    finally:
        container.remove(force=True)


_SOCKETS_LATE = """
import json, os, socket, sys, time
d = sys.argv[1]
ports = {n: 40000 + i for i, n in enumerate(("shell_port", "iopub_port", "stdin_port", "control_port", "hb_port"))}
print("GPUSESSION_KERNEL " + json.dumps({"ports": ports, "agent_port": None, "transport": "ipc", "ip": d + "/k"}), flush=True)
if sys.argv[2] == "fail":
    time.sleep(0.5)
    print('GPUSESSION_FAILED {"stage": "kernel", "error": "the kernel ended"}', flush=True)
    time.sleep(60)
time.sleep(1.0)  # the kernel boots
held = []
for port in ports.values():
    s = socket.socket(socket.AF_UNIX)
    s.bind(f"{d}/k-{port}")
    os.chmod(f"{d}/k-{port}", 0o666)
    s.listen(8)
    held.append(s)
time.sleep(60)  # and READY never comes through the log
"""


@pytest.mark.parametrize("end", ["listens", "fail"])
def test_a_kernel_whose_sockets_listen_is_reached_before_its_ready_line(engine, tmp_path, end):
    """This machine's engine: once KERNEL named the kernel's unix sockets, they are looked at here
    (container_setup.sockets_listen) while the log is followed, and a start goes on when all five
    take a connection, not when READY has come through the engine's log copier; before that it
    waits, and a FAILED line still ends the wait with its cause."""
    from gpusession.backends.docker.container_setup import sockets_listen
    from gpusession.core.errors import StageError

    folder = tmp_path / "sockets"
    folder.mkdir()
    container = engine.containers.run(
        product_image(),
        entrypoint=["python3", "-c", _SOCKETS_LATE, str(folder), end],
        volumes={str(folder): {"bind": str(folder), "mode": "rw"}},
        detach=True,
        labels={LABEL: ("5" if end == "listens" else "6") * 32},  # each case its own
    )
    try:
        t0 = time.monotonic()
        if end == "fail":
            with pytest.raises(StageError) as err:
                wait_for_marker(container, Marker.READY, 20, stage="connect", sooner=sockets_listen)
            assert "the kernel ended" in str(err.value)
            return
        said = wait_for_marker(container, Marker.READY, 20, stage="connect", sooner=sockets_listen)
        waited = time.monotonic() - t0
        assert said["ip"] == f"{folder}/k" and said["ports"]["hb_port"] == 40004
        assert 0.8 <= waited < 10, waited  # after the sockets listen (1 s), without the READY line
        assert sockets_listen(said)
        with pytest.raises(StageError):  # without the look here, READY is what is waited for
            wait_for_marker(container, Marker.READY, 1, stage="connect")
    finally:
        container.remove(force=True)


def test_a_start_that_never_says_ready_names_the_last_log_lines(engine):
    from gpusession.core.errors import StageError

    container = engine.containers.run(
        product_image(),
        entrypoint=["/bin/sh", "-c", "echo stuck importing torch; sleep 60"],
        detach=True,
        labels={LABEL: "4" * 32},
    )
    try:
        with pytest.raises(StageError) as err:
            wait_for_marker(container, Marker.READY, 2, stage="connect")
        assert (
            "no GPUSESSION_READY line from the container within 2s; last log lines: stuck importing torch"
            in str(err.value)
        )
    finally:
        container.remove(force=True)
