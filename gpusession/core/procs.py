"""Is a process of this machine alive, and is it still the one we knew? (/proc, Linux)"""

from __future__ import annotations

import os


def stat_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat after the command name (which may hold spaces and parentheses)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


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
