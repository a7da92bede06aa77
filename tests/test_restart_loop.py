"""Restart holds (issue 19 item 5): a restart's fresh kernel is never ended while it boots, so a
restart never costs the session; and a bounded slice of bench/bench_restart.py's loop."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import pytest

from gpusession.core.models import State

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


def test_a_restart_asked_while_the_fresh_kernel_boots_keeps_the_session(manager, monkeypatch):
    """JupyterLab's restart: the kernel exits on its shutdown_request and the runtime boots the
    next; the provisioner, seeing the kernel count not moved on yet and a kernel running, asks
    the agent to end "the old one" (POST /restart). That must not end the fresh kernel (it did:
    SIGTERM while booting, "kernel exited during start with code -15", the session failed)."""
    monkeypatch.setenv("GPUSESSION_PRICE_PER_HOUR", "0")
    session = manager.start(manager.make_spec("t4", backend="local", idle="10m"))
    session.run("x = 1")
    before = session.kernel_state()
    session.kernel.client.shutdown(restart=True)  # what the kernel manager sends first
    deadline = time.monotonic() + 30
    state = before
    while not (state["running"] and not state["ready"]):  # the fresh kernel boots
        assert time.monotonic() < deadline, f"never saw the fresh kernel booting: {state}"
        state = session.kernel_state()
    assert state["generation"] == before["generation"]  # what makes the provisioner ask for an end
    session.agent.restart_kernel()
    generation = session.restart_kernel(before["generation"], timeout=60)
    assert generation == before["generation"] + 1
    assert session.kernel.evaluate("'x' in globals()") == "False"
    record = manager.get(session.id)
    assert record.state == State.RUNNING, (record.state, record.error)


def test_restart_in_a_loop_loses_no_session(gs_home, tmp_path, monkeypatch, capsys):
    """bench/bench_restart.py, 4 restarts plain and 4 after an interrupt, without its floor."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    import bench_restart

    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "jupyter"))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    monkeypatch.setenv("GPUSESSION_PRICE_PER_HOUR", "0")
    ours = asyncio.run(bench_restart.measure(4, "local", floor=False))
    print(bench_restart.report(ours, None, 4, "local"))
    assert ours.failures == [], ours.failures
    assert ours.lost == dict.fromkeys(bench_restart.MODES, 0)
    assert ours.ok == dict.fromkeys(bench_restart.MODES, 4)
