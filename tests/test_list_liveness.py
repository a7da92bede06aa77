"""`gpusession list` / `status`, `%gpu list` and REST `GET sessions` never show a dead session as
running with its cost still rising (issue 10 item 6): what can be seen cheaply is checked and
reconciled; what cannot is marked unverified, with when it was last seen alive."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpusession.core.models import LaunchSpec, State
from gpusession.core.protocol import StopKind
from gpusession.session.store import Store
from support.procs import wait_dead

# integration: starts kernels, the agent or servers (tests/conftest.py: the fast tier starts none)
pytestmark = pytest.mark.integration


def cli(env, *args, timeout=120):
    return subprocess.run(
        [sys.executable, "-m", "gpusession", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def row(listing: str, name: str) -> list[str]:
    return next(line.split() for line in listing.splitlines() if line.split()[:1] == [name])


def test_list_and_status_show_a_session_its_watchdog_stopped_as_stopped(nb_env):
    """The issue's case: an idle stop with the notebook gone; nobody ran gc or stats."""
    r = cli(nb_env, "start", "--backend", "local", "--idle", "2s", "--name", "napper")
    assert r.returncode == 0, r.stderr
    store = Store(Path(nb_env["GPUSESSION_HOME"]) / "sessions.sqlite3")
    pid = store.get("napper").resource["pid"]
    assert wait_dead(pid, timeout=60), "the idle watchdog did not stop the session"
    assert store.get("napper").state == State.RUNNING  # nobody has looked yet
    listing = cli(nb_env, "list")
    assert listing.returncode == 0, listing.stderr
    assert row(listing.stdout, "napper")[3] == "stopped", listing.stdout
    record = store.get("napper")
    assert record.state == State.STOPPED and record.stop_reason.kind is StopKind.IDLE
    cost = row(cli(nb_env, "list", "--all").stdout, "napper")[-1]
    time.sleep(1.5)
    assert row(cli(nb_env, "list", "--all").stdout, "napper")[-1] == cost, (
        "the cost of a stopped session rises"
    )
    assert "no active sessions" in cli(nb_env, "list").stdout
    status = cli(nb_env, "status", "napper").stdout
    assert "- stopped" in status and "idle watchdog" in status, status


def test_status_reconciles_too(nb_env):
    assert (
        cli(nb_env, "start", "--backend", "local", "--idle", "off", "--name", "shot").returncode
        == 0
    )
    store = Store(Path(nb_env["GPUSESSION_HOME"]) / "sessions.sqlite3")
    pid = store.get("shot").resource["pid"]
    os.killpg(pid, signal.SIGKILL)
    assert wait_dead(pid)
    status = cli(nb_env, "status", "shot").stdout
    assert "- failed" in status and "ended by itself" in status, status
    # the kernel (in a session of its own, for interrupts) ends with its runtime: nothing is left
    sid = store.get("shot").id
    deadline = time.monotonic() + 10
    while (left := session_processes(sid)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, f"processes of the killed session still run: {left}"


def session_processes(session_id: str) -> list[int]:
    """Pids whose environment carries this session's id (the local backend's label)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if f"GPUSESSION_SESSION_ID={session_id}".encode() in (
                    entry / "environ"
                ).read_bytes().split(b"\0"):
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


def _aws_record(home: Path, seen_ago: float):
    store = Store(home / "sessions.sqlite3")
    record = store.create(
        LaunchSpec(gpu_type="t4", backend="aws", name="cloudy"), price_per_hour=0.526
    )
    for state in (
        State.PROVISIONING,
        State.STARTING,
        State.RUNNING,
    ):  # started a while before it was last seen
        store.transition(record.id, state, at=time.time() - seen_ago - 60)
    store.update_resource(
        record.id,
        instance_id="i-0123456789abcdef0",
        region="us-east-1",
        last_seen=time.time() - seen_ago,
    )
    return store.get(record.id)


def test_a_session_that_cannot_be_checked_cheaply_is_marked_unverified(nb_env, gs_home):
    _aws_record(gs_home, seen_ago=300)
    code = (
        "import sys; from gpusession.faces import cli; cli.main(['list']); "
        "print('imported:', [m for m in ('boto3', 'botocore', 'docker') if m in sys.modules])"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], env=nb_env, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr
    assert row(r.stdout, "cloudy")[3] == "running?", r.stdout
    assert (
        "? cloudy: unverified (aws is not asked when listing), last seen alive 5m0" in r.stdout
    ), r.stdout
    assert "imported: []" in r.stdout, "listing imported a cloud or engine SDK"
    status = cli(nb_env, "status", "cloudy").stdout
    assert "unverified (aws is not asked when listing), last seen alive 5m0" in status, status
    assert Store(gs_home / "sessions.sqlite3").get("cloudy").state == State.RUNNING, (
        "unverified is not ended"
    )


async def test_rest_listing_reconciles_and_marks_unverified(jp_fetch, manager, gs_home):
    session = manager.start(manager.make_spec("t4", backend="local", idle="off", name="rest-gone"))
    pid = session.record.resource["pid"]
    manager.close()  # as if the notebook that started it were gone
    _aws_record(gs_home, seen_ago=90)
    os.killpg(pid, signal.SIGKILL)
    assert wait_dead(pid)
    r = await jp_fetch("gpusession", "api", "sessions")
    views = {v["name"]: v for v in json.loads(r.body)["sessions"]}
    assert views["rest-gone"]["state"] == "failed" and views["rest-gone"]["verified"] is True
    cloudy = views["cloudy"]
    assert cloudy["state"] == "running" and cloudy["verified"] is False
    assert time.time() - 100 < cloudy["last_seen"] < time.time() - 80
    assert cloudy["unverified"].startswith(
        "unverified (aws is not asked when listing), last seen alive 1m"
    )
    r = await jp_fetch("gpusession", "api", "sessions")
    assert [v["name"] for v in json.loads(r.body)["sessions"]] == ["cloudy"]


def test_a_live_session_is_verified_and_its_last_seen_is_kept(manager):
    session = manager.start(manager.make_spec("t4", backend="local", idle="off", name="alive"))
    [record] = manager.list(check=True)
    view = manager.view(record)
    assert view["state"] == "running" and view["verified"] is True
    assert abs(view["last_seen"] - time.time()) < 5
    assert abs(manager.get(session.id).resource["last_seen"] - time.time()) < 5


def test_the_magic_list_reconciles_too(manager, capsys):
    from gpusession.faces.magics import GpuMagics

    session = manager.start(manager.make_spec("t4", backend="local", idle="off", name="mg"))
    pid = session.record.resource["pid"]
    os.killpg(pid, signal.SIGKILL)
    assert wait_dead(pid)
    capsys.readouterr()
    GpuMagics(None, manager=manager).gpu("list")
    assert row(capsys.readouterr().out, "mg")[3] == "failed"
    assert manager.get("mg").error == "the session ended by itself (gone)"
