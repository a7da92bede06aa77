"""Process checks for tests: is a pid alive (a zombie counts as dead)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_dead(pid: int, timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        time.sleep(0.1)
    return False


def start_runtime(state, session_id: str, *extra: str):
    """A real session runtime (python -m gpusession.agent run) on 127.0.0.1, until ready:
    (its kernel.json, the process). The caller terminates it."""
    import json
    import subprocess
    import sys

    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpusession.agent",
            "run",
            "--session-id",
            session_id,
            "--state-dir",
            str(state),
            *extra,
        ],
        env=dict(os.environ, GPUSESSION_SESSION_ID=session_id),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 60
    while not (state / "runtime.json").exists() or not json.loads(
        (state / "runtime.json").read_text()
    ).get("ready"):
        assert proc.poll() is None and time.monotonic() < deadline, (
            "the agent runtime did not start"
        )
        time.sleep(0.05)
    return json.loads((state / "kernel.json").read_text()), proc


def start_interrupted(args: list[str], env: dict, interrupt) -> str:
    """`gpusession start ARGS` in its own process, SIGINT when `interrupt(running, press)` presses:
    it must exit 130 saying `gpusession start: interrupted` last. Returns all it printed."""
    out: list[str] = []
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpusession", "start", *args],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    reader = threading.Thread(target=lambda: out.extend(proc.stdout), daemon=True)
    reader.start()
    try:
        interrupt(lambda: proc.poll() is None, lambda: proc.send_signal(signal.SIGINT))
        assert proc.wait(timeout=60) == 130, out
        reader.join(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = "".join(out)
    assert text.strip().splitlines()[-1] == "gpusession start: interrupted", text
    return text
