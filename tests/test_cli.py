"""The `gpusession` command line, run as a user runs it (subprocesses, real session kernels)."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpusession.core.models import State
from gpusession.core.protocol import StopKind, StopReason
from gpusession.session.store import Store
from support.procs import alive, wait_dead

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


def test_demo_runs_the_quickstart_and_prints_the_timeline(nb_env):
    r = cli(nb_env, "demo", timeout=300)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "computed remotely: 385" in out
    assert "session t4-1 (local, 1 x t4): stopped" in out
    for state in ("requested", "provisioning", "starting", "running", "stopping", "stopped"):
        assert f" {state} " in out or out.count(state) > 0


def test_types_list_start_status_stop(nb_env):
    assert "h200" in cli(nb_env, "types").stdout
    assert "no active sessions" in cli(nb_env, "list").stdout
    # every start option of the table is here too (gpusession/configuration/options.py)
    r = cli(
        nb_env,
        "start",
        "--type",
        "l4",
        "--backend",
        "local",
        "--idle",
        "off",
        "--name",
        "bg",
        "--gpu-only",
        "--max-runtime",
        "8h",
        "--max-cost",
        "5",
    )
    assert r.returncode == 0, r.stderr
    assert "bg is running" in r.stdout
    listing = cli(nb_env, "list").stdout
    assert "bg" in listing and "running" in listing and "1xl4" in listing
    # the local backend runs on this machine: its price is the catalog's cloud rate, and says so
    assert "(cloud rate, own hardware)" in listing, listing
    # printing a table, its running session checked alive, loads no kernel client or Jupyter app
    # (IPython, jupyter_client, zmq, traitlets.config): they were most of the command's time
    probe = (
        "import sys; from gpusession.faces.cli import main; rc = main(['list']); heavy = ('IPython', 'jupyter_client', "
        "'zmq', 'traitlets.config', 'docker', 'paramiko'); print('HEAVY', sorted(m for m in sys.modules "
        "if m in heavy or m.startswith(tuple(h + '.' for h in heavy))))"
    )
    r = subprocess.run(
        [sys.executable, "-c", probe], env=nb_env, capture_output=True, text=True, timeout=60
    )
    assert "bg" in r.stdout and r.stdout.strip().endswith("HEAVY []"), r.stdout + r.stderr
    record = Store(Path(nb_env["GPUSESSION_HOME"]) / "sessions.sqlite3").get("bg")
    spec = record.spec
    assert (spec.idle, spec.gpu_only, spec.max_runtime, spec.max_cost) == (
        None,
        True,
        8 * 3600.0,
        5.0,
    )
    pid = record.resource["pid"]
    assert alive(pid), "the session outlives the command that started it"
    status = cli(nb_env, "status", "bg").stdout
    assert "running" in status and "timeline" in status
    assert "/h (cloud rate, own hardware)" in status, status
    stop = cli(nb_env, "stop", "bg")
    assert stop.returncode == 0 and "stopped bg" in stop.stdout
    assert wait_dead(pid)


@pytest.mark.parametrize(
    "args, needle",
    [
        (("stop", "ghost"), "no session named 'ghost'"),
        (("start", "--type", "t5", "--backend", "local"), "unknown GPU type 't5'"),
        (("start", "--idle", "abc", "--backend", "local"), "--idle: bad idle timeout 'abc'"),
        (("stop",), "name a session to stop"),
    ],
)
def test_bad_input_is_one_line_and_non_zero(nb_env, args, needle):
    r = cli(nb_env, *args)
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], r.stderr


def test_gc_cleans_up_after_a_starter_killed_mid_start(nb_env, tmp_path):
    # make the session kernel slow to come up, so the starter can be killed while it waits
    slow = tmp_path / "slow"
    slow.mkdir()
    (slow / "sitecustomize.py").write_text(
        "import sys, time\nif 'ipykernel_launcher' in sys.argv[0] or any('ipykernel_launcher' in a for a in sys.argv):\n    time.sleep(4)\n"
    )
    env = dict(nb_env, PYTHONPATH=str(slow))
    starter = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from gpusession.session import SessionManager as M; m=M(); m.start(m.make_spec('t4', backend='local', idle='off', name='crashy'))",
        ],
        env=env,
    )
    store = Store(Path(nb_env["GPUSESSION_HOME"]) / "sessions.sqlite3")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if store.get("crashy").state == State.STARTING:
                break
        except Exception:  # noqa: BLE001 - not recorded yet
            pass
        time.sleep(0.02)
    starter.send_signal(signal.SIGKILL)
    starter.wait()
    record = store.get("crashy")
    assert record.state == State.STARTING
    pid = record.resource["pid"]
    assert alive(pid), "the half-started session is still there, findable"

    dry = cli(nb_env, "gc", "--dry-run")
    assert "would stop crashy (left starting by a dead process)" in dry.stdout
    assert alive(pid)
    r = cli(nb_env, "gc")
    assert r.returncode == 0
    assert "stopped crashy (left starting by a dead process)" in r.stdout
    assert wait_dead(pid)
    assert store.get("crashy").state == State.FAILED
    assert "nothing to clean up" in cli(nb_env, "gc").stdout


def test_gc_removes_labelled_processes_unknown_to_the_store(nb_env):
    r = cli(nb_env, "start", "--backend", "local", "--idle", "off", "--name", "lost")
    assert r.returncode == 0, r.stderr
    home = Path(nb_env["GPUSESSION_HOME"])
    pid = Store(home / "sessions.sqlite3").get("lost").resource["pid"]
    for f in home.glob("sessions.sqlite3*"):
        f.unlink()  # the store is lost; the labelled process is not
    r = cli(nb_env, "gc")
    assert "unknown to the store" in r.stdout
    assert wait_dead(pid)


def test_gc_records_sessions_whose_remote_side_ended(nb_env):
    cli(nb_env, "start", "--backend", "local", "--idle", "off", "--name", "gone")
    store = Store(Path(nb_env["GPUSESSION_HOME"]) / "sessions.sqlite3")
    pid = store.get("gone").resource["pid"]
    os.kill(pid, signal.SIGTERM)
    assert wait_dead(pid)
    r = cli(nb_env, "gc")
    assert "recorded gone as stopped (remote side gone)" in r.stdout
    rec = store.get("gone")
    assert rec.state == State.STOPPED and rec.stop_reason == StopReason(StopKind.SIGNAL, signal=15)
    status = cli(nb_env, "status", "gone").stdout
    assert "session gone ended: its runtime got signal 15" in status, status


def test_stats_and_keepalive_of_a_running_session(nb_env):
    assert (
        cli(nb_env, "start", "--backend", "local", "--idle", "10m", "--name", "st").returncode == 0
    )
    try:
        time.sleep(1.5)  # at least one sample
        r = cli(nb_env, "stats", "st")
        assert r.returncode == 0, r.stderr
        assert "no NVIDIA GPU visible" in r.stdout or "GPU 0" in r.stdout
        assert "idle" in r.stdout
        k = cli(nb_env, "keepalive", "st", "1h")
        assert k.returncode == 0 and "postponed by 1h" in k.stdout, k.stderr
        bad = cli(nb_env, "keepalive", "st", "abc")
        assert bad.returncode == 1 and len(bad.stderr.strip().splitlines()) == 1
    finally:
        cli(nb_env, "stop", "st")


def test_list_into_a_closed_pipe_prints_no_traceback(nb_env):
    """`gpusession list | head -1`: the reader leaves early; no BrokenPipeError traceback."""
    store = Store(Path(nb_env["GPUSESSION_HOME"]) / "sessions.sqlite3")
    from gpusession.core.models import LaunchSpec

    for i in range(300):  # more rows than one pipe buffer holds
        rec = store.create(
            LaunchSpec(gpu_type="t4", backend="local", name=f"row{i}"), price_per_hour=0.0
        )
        store.transition(rec.id, State.FAILED, "made for this test", error="test")
    r = subprocess.run(
        f"'{sys.executable}' -m gpusession list --all | head -1",
        shell=True,
        env=nb_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "NAME" in r.stdout and "Traceback" not in r.stderr and "BrokenPipe" not in r.stderr, (
        r.stderr
    )
