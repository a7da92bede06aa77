"""The agent in a real container (scripts/ci-host-setup.sh: a real Docker engine, the product
image, the stub NVIDIA hook): stats from the agent on the host's loopback, and the container
stopping itself when idle, not while a cell runs, and with the notebook side killed."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from gpusession.core.errors import SessionEnded
from gpusession.core.models import State
from gpusession.core.protocol import Marker, StopKind, StopReason, find_markers
from gpusession.words.stops import ended_message
from support.hosts import docker_available, product_image

pytestmark = [
    pytest.mark.docker,
    pytest.mark.skipif(
        not docker_available(), reason="no Docker engine answers (run scripts/ci-host-setup.sh)"
    ),
]
IDLE_S = 5.0
CHECK_S = 1.0
# the container's exit after the runtime's (docker-init, then the engine noticing) and this
# test's polling of the engine
TEARDOWN_SLACK_S = 3.0


@pytest.fixture
def docker_manager(manager, monkeypatch):
    monkeypatch.setenv("GPUSESSION_IMAGE", product_image())
    manager.backend("docker").settings_section().image = product_image()
    return manager


def _container(engine, record):
    return engine.containers.get(record.resource["container_id"])


def _wait_exited(engine, container_id: str, timeout: float) -> float:
    deadline = time.time() + timeout
    while time.time() < deadline:
        c = engine.containers.get(container_id)
        if c.status != "running":
            return time.time()
        time.sleep(0.1)
    raise AssertionError(f"container {container_id[:12]} still running after {timeout}s")


def test_stats_and_idle_stop(docker_manager, engine):
    m = docker_manager
    session = m.start(m.make_spec("t4", backend="docker", idle="5s", name="dock1"))
    agent_url = session.link.endpoint.agent_url
    assert agent_url and agent_url.startswith("http://127.0.0.1:")
    stats = session.stats()
    assert stats["session_id"] == session.id
    # the stub hook grants the GPU request, but there is no GPU: said plainly, no numbers
    assert stats["gpus_visible"] is False and stats["message"].startswith("no NVIDIA GPU visible")
    latest = stats["samples"][-1]
    assert latest["gpus"] == [] and latest["memory_used"] > 0 and latest["memory_total"] > 0
    assert stats["idle"]["timeout_s"] == IDLE_S

    session.run("x = 1")
    last = time.time()  # the cell's end, within a few ms
    container_id = session.record.resource["container_id"]
    exited = _wait_exited(engine, container_id, IDLE_S + 20)
    took = exited - last
    print(f"docker idle stop: container not running {took:.2f}s after the last activity")
    assert IDLE_S - 0.5 <= took <= IDLE_S + CHECK_S + TEARDOWN_SLACK_S
    logs = engine.containers.get(container_id).logs().decode()
    (stopped,) = find_markers(logs, Marker.STOPPED)
    assert (
        StopReason.from_dict(stopped).kind == StopKind.IDLE and stopped["idle_timeout_s"] == IDLE_S
    )
    assert isinstance(find_markers(logs, Marker.SUMMARY)[-1], dict)

    record = m.refresh_state(session.id)
    assert record.state == State.STOPPED
    # the idle it says is what the watchdog saw: its timeout, or a check later on a busy machine
    said = ended_message(record)
    idle = re.match(r"session dock1 was stopped by its idle watchdog after (\d+)s idle", said)
    assert idle and IDLE_S <= int(idle.group(1)) <= IDLE_S + CHECK_S + TEARDOWN_SLACK_S, said


@pytest.mark.slow
def test_a_long_cell_keeps_the_container(docker_manager, engine):
    m = docker_manager
    session = m.start(m.make_spec("t4", backend="docker", idle="5s"))
    container_id = session.record.resource["container_id"]
    assert session.run("import time\ntime.sleep(12)")["status"] == "ok"
    assert engine.containers.get(container_id).status == "running"
    _wait_exited(engine, container_id, IDLE_S + CHECK_S + 15)
    with pytest.raises(SessionEnded) as ended:
        session.run("1 + 1")
    assert ended.value.record.stop_reason.kind == StopKind.IDLE
    assert m.get(session.id).state == State.STOPPED


def test_container_stops_itself_with_the_notebook_killed(docker_manager, gs_home, tmp_path, engine):
    starter = tmp_path / "starter.py"
    starter.write_text(
        textwrap.dedent("""
        import time
        from gpusession.session import SessionManager
        m = SessionManager()
        s = m.start(m.make_spec("t4", backend="docker", idle="5s", name="orphan"))
        s.run("y = 2")
        print(s.id, s.record.resource["container_id"], flush=True)
        time.sleep(3600)
    """)
    )
    env = dict(os.environ, GPUSESSION_HOME=str(gs_home), GPUSESSION_IMAGE=product_image())
    proc = subprocess.Popen(
        [sys.executable, str(starter)], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        sid, container_id = proc.stdout.readline().split()
        killed = time.time()
        proc.send_signal(signal.SIGKILL)  # the notebook kernel dies and its tunnel with it
        proc.wait(10)
        exited = _wait_exited(engine, container_id, IDLE_S + 20)
        assert exited - killed <= IDLE_S + CHECK_S + TEARDOWN_SLACK_S
    finally:
        if proc.poll() is None:
            proc.kill()
    record = docker_manager.refresh_state(sid)
    assert record.state == State.STOPPED and record.stop_reason.kind == StopKind.IDLE
