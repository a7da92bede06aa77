"""Is a process of this machine alive, and is it still the one we knew? (/proc, Linux)"""

from __future__ import annotations

import os


def stat_fields(pid: int | str) -> list[str] | None:
    """/proc/PID/stat after the command name (which may hold spaces and parentheses); a thread's
    with "PID/task/TID"."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def threads_asleep(pid: int) -> bool:
    """Every thread of the process asleep (S): none running or waiting for a CPU (R), none in
    I/O (D). /proc/PID/stat's state is its first thread's alone."""
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return False
    for tid in threads:
        fields = stat_fields(f"{pid}/task/{tid}")
        if fields is not None and fields[0] != "S":  # None: that thread ended meanwhile
            return False
    return True


def start_ticks(pid: int) -> int | None:
    """When the process started, in clock ticks since boot: with the pid, it names one process
    (a reused pid has another start time). None where /proc cannot tell."""
    fields = stat_fields(pid)
    try:
        return int(fields[19]) if fields else None  # field 22 of stat; fields start at field 3
    except (ValueError, IndexError):
        return None


def alive(pid: int, started: int | None = None) -> bool:
    """True while `pid` runs and is not a zombie; with `started`, only if it is still the process
    that started then (not a later one that got the same pid)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process: it exists
    fields = stat_fields(pid)
    if fields is None:
        return True  # no /proc (not Linux): the signal check is all we have
    if fields[0] == "Z":
        return False  # exited, not yet reaped: dead for our purposes
    return started is None or start_ticks(pid) == started
