"""Process checks for tests: is a pid alive (a zombie counts as dead)."""

from __future__ import annotations

import os
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
