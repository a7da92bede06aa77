"""The agent's side of a checkpoint: ask the kernel to save its namespace into the workspace
(gpusession.agent.checkpoint runs in the kernel), and wait at most the time bound for it.

The watchdog's stops (idle, max cost, max runtime) and POST /save go through `save_kernel`; the
stop goes on when the bound passes, whatever the kernel does, so a save never extends billing
beyond the bound. Standard library only.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import uuid

from ..core.envnames import RESTORE_RESULT, SAVE_READY, SAVE_REQUEST, SAVE_RESULT

GRACE_S = 2.0  # after the bound: the kernel's last write (it commits only before the bound)
STARTING = "the kernel was still starting (nothing to save yet)"
_one_at_a_time = threading.Lock()  # POST /save and the watchdog's save share the request files


def _read(path: str) -> dict | None:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def save_kernel(
    state_dir: str,
    kernel_pid: int | None,
    *,
    timeout_s: float,
    cap_bytes: int | None,
    cause: str | None = None,
    clock=time.time,
    sleep=time.sleep,
) -> dict:
    """Ask the kernel to save; its result (`saved`, `bytes`, `imports`, `skipped`, `committed`),
    or {"committed": False, "error": why} when there is no kernel or the bound passed. `cause`:
    what the save is for (a protocol.Notice value), kept in the checkpoint's manifest."""
    started = clock()
    if not kernel_pid:
        return {"committed": False, "error": "no kernel"}
    if not _handler_ready(
        state_dir, kernel_pid
    ):  # a signal now would be dropped: no wait for an answer
        return {"committed": False, "error": STARTING}
    if not _one_at_a_time.acquire(timeout=timeout_s):
        return {"committed": False, "error": "another save was under way", "timeout_s": timeout_s}
    try:
        return _save(
            state_dir, kernel_pid, started + timeout_s, timeout_s, cap_bytes, cause, clock, sleep
        )
    finally:
        _one_at_a_time.release()


def _handler_ready(state_dir: str, kernel_pid: int) -> bool:
    """Has this kernel (not an earlier one of the session) installed its save handler?"""
    try:
        with open(os.path.join(state_dir, SAVE_READY)) as f:
            return f.read().strip() == str(kernel_pid)
    except OSError:
        return False


def _save(
    state_dir: str,
    kernel_pid: int,
    deadline: float,
    timeout_s: float,
    cap_bytes: int | None,
    cause: str | None,
    clock,
    sleep,
) -> dict:
    request_id = uuid.uuid4().hex
    path = os.path.join(state_dir, SAVE_REQUEST)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"id": request_id, "deadline": deadline, "cap_bytes": cap_bytes, "for": cause}, f)
    os.replace(tmp, path)
    try:
        os.kill(kernel_pid, signal.SIGUSR1)
    except ProcessLookupError:
        return {"committed": False, "error": "no kernel"}
    result_path = os.path.join(state_dir, SAVE_RESULT)
    while clock() < deadline + GRACE_S:
        result = _read(result_path)
        if result is not None and result.get("id") == request_id:
            result.setdefault("timeout_s", timeout_s)
            return result
        sleep(0.05)
    return {"committed": False, "error": "time bound", "timeout_s": timeout_s}


def restore_report(state_dir: str) -> dict | None:
    """What the session's first kernel restored from the workspace (None: it was not asked to)."""
    return _read(os.path.join(state_dir, RESTORE_RESULT))
