"""After the laptop sleeps (issue 32 §4): the notebook's kernel is frozen (SIGSTOP, as a
sleeping laptop freezes every process) while its session on an `ssh://` engine goes on, and
woken (SIGCONT). Across an idle stop, the first cell after waking says the stop once and how to
go on, never an exception of ours or a library's (it said `AssertionError:` from
jupyter_client: the cell sent on channels the notifier had just closed). A busy cell across a
freeze, and a cut of the tunnel while frozen, keep every line in order.

The session runs on this worker's own remote engine (scripts/ci-remote-host.sh), reached through
our tunnel to its sshd, as a GPU box over SSH is."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from gpusession.core.models import State
from gpusession.session import SessionManager
from gpusession.session.store import Store
from support.hosts import docker_available, product_image

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import bench_faults  # noqa: E402

ENGINE = docker_available()
ROOT_ONLY = os.geteuid() == 0  # the remote engine's host, and `ss -K` for the cut

pytestmark = [
    pytest.mark.docker,
    pytest.mark.skipif(
        not ENGINE, reason="no Docker engine answers (run scripts/ci-host-setup.sh)"
    ),
    pytest.mark.skipif(not ROOT_ONLY, reason="the remote engine's host needs root"),
]

# what a library or our own code would show if the cell were sent on closed channels
NOT_SHOWN = ("AssertionError", "Traceback", "could not run in session", "socket")


@pytest.fixture
def docker_env(nb_env, monkeypatch) -> dict[str, str]:
    monkeypatch.setenv("GPUSESSION_IMAGE", product_image())
    nb_env["GPUSESSION_IMAGE"] = product_image()
    return nb_env


@pytest.fixture
def remote(docker_env, monkeypatch, tmp_path) -> dict:
    """The remote engine, and HOME pointing at an ~/.ssh that reaches it (here and in docker_env)."""
    monkeypatch.setenv("HOME", os.environ["HOME"])  # restored afterwards; remote_engine changes it
    host = bench_faults.remote_engine(tmp_path / "home")
    if host is None:
        pytest.skip("the remote engine cannot run here (scripts/ci-remote-host.sh needs root)")
    docker_env["HOME"] = os.environ["HOME"]
    return host


@pytest.fixture
def notebook(docker_env, remote, tmp_path):
    from support.notebook_kernel import NotebookKernel

    nk = NotebookKernel(docker_env, cwd=str(tmp_path))
    assert nk.run("%load_ext gpusession").status == "ok"
    yield nk
    nk.close()


def _store(env: dict) -> Store:
    return Store(Path(env["GPUSESSION_HOME"]) / "sessions.sqlite3")


def _wait_remote_gone(record, timeout: float = 120.0) -> None:
    """Until the session's container is gone from the engine (its watchdog stopped it), asked
    from this process: the notebook's is frozen."""
    manager = SessionManager()
    try:
        backend, deadline = manager.backend(record.backend), time.monotonic() + timeout
        while backend.is_alive(record):
            assert time.monotonic() < deadline, f"{record.name} still runs after {timeout:.0f}s"
            time.sleep(1.0)
    finally:
        manager.close()


def test_first_cell_after_a_freeze_across_an_idle_stop_says_the_stop_once(
    notebook, docker_env, remote
):
    """Frozen while the session idles out; the cell typed before the laptop slept runs first
    when it wakes, racing the notifier that wakes with it."""
    start = notebook.run(
        f"%gpu start --backend docker --idle 6s --name sleepy --host {remote['url']}"
    )
    assert start.status == "ok", start.text
    record = _store(docker_env).get("sleepy")
    os.kill(notebook.pid, signal.SIGSTOP)
    try:
        _wait_remote_gone(record)
        cell = notebook.send("%%gpu\nprint('after waking')")
    finally:
        os.kill(notebook.pid, signal.SIGCONT)
    woke = notebook.wait(cell, timeout=90)
    text = woke.text
    assert woke.status == "error" and woke.error["ename"] == "UsageError", text
    assert text.count("stopped by its idle watchdog") == 1, text
    assert "%gpu start" in text, text  # how to go on
    assert not any(word in text for word in NOT_SHOWN), text
    assert "after waking" not in text
    assert _store(docker_env).get("sleepy").state == State.STOPPED
    # and the next cell says it again, in one line (the session is gone, not broken)
    again = notebook.run("%%gpu\nprint('again')", timeout=60)
    assert again.status == "error" and again.error["ename"] == "UsageError", again.text
    assert not any(word in again.text for word in NOT_SHOWN), again.text
    # nothing was said under an older cell (where a thread's print lands while no cell runs)
    assert not [c for _, c in notebook.elsewhere if "[gpusession]" in str(c)], notebook.elsewhere
    print(woke.text, again.text, sep="\n---\n")


def test_a_busy_cell_across_a_freeze_and_a_cut_while_frozen_keeps_every_line(
    notebook, docker_env, remote
):
    """A cell printing at 10 Hz, its notebook frozen for 8 s twice: once as is, once with the
    tunnel cut while frozen (the laptop's network went away with it). No line lost, none out of
    order, and the session still runs."""
    start = notebook.run(
        f"%gpu start --backend docker --idle off --name busy --host {remote['url']}"
    )
    assert start.status == "ok", start.text
    end = _tunnel_end(notebook)
    lines = 60
    for cut in (False, True):
        cell = notebook.send(
            "%%gpu\nimport time\n"
            f"for i in range({lines}):\n    print(f'line {{i}}', flush=True)\n    time.sleep(0.1)"
        )

        def freeze(cut: bool = cut) -> None:
            os.kill(notebook.pid, signal.SIGSTOP)
            try:
                time.sleep(4.0)
                if cut:
                    bench_faults.cut(end)
                time.sleep(4.0)
            finally:
                os.kill(notebook.pid, signal.SIGCONT)

        sleeper = threading.Timer(1.5, freeze)
        sleeper.start()
        busy = notebook.wait(cell, timeout=90)
        sleeper.join()
        assert busy.status == "ok", busy.text
        got = [x for x in busy.text.splitlines() if x]
        assert got == [f"line {i}" for i in range(lines)], got
    assert _store(docker_env).get("busy").state == State.RUNNING


def _tunnel_end(notebook) -> tuple[str, int]:
    """The (address, port) the notebook's current session's tunnel connects to."""
    r = notebook.run(
        "_t = get_ipython().magics_manager.registry['GpuMagics'].current.link.tunnel\n"
        "print((_t.jump or _t.target).host, (_t.jump or _t.target).port)"
    )
    assert r.status == "ok", r.text
    host, port = r.text.split()
    return host, int(port)
