"""What the JupyterLab front end needs beyond a session's view: the start progress of the
sessions this server starts, which notebook kernel started a session (for the status bar), and
the list of live sessions with the most recent ended ones (the sidebar's history)."""

from __future__ import annotations

import collections
import socket
import threading
from typing import Any

from ..core.models import SessionRecord
from ..core.progress import Reporter
from ..session import SessionManager
from ..words.status import rest_view
from ..words.workspaces import record_checkpoint_line, restore_lines

#: how many progress lines of one start are kept, and of how many starts
KEEP_LINES = 20
KEEP_STARTS = 200
#: the most ended sessions `GET sessions?history=N` may ask for
MAX_HISTORY = 100


class StartProgress:
    """The latest progress lines ("[  0.4s] provision: ...", what `%gpu start` prints) of the
    starts this server runs, by session id; kept after the start so a failed one can say where
    it stopped. Bounded: the oldest starts are forgotten."""

    def __init__(self) -> None:
        self._lines: collections.OrderedDict[str, collections.deque[str]] = (
            collections.OrderedDict()
        )
        self._lock = threading.Lock()

    def reporter(self, session_id: str) -> Reporter:
        with self._lock:
            self._lines[session_id] = collections.deque(maxlen=KEEP_LINES)
            while len(self._lines) > KEEP_STARTS:
                self._lines.popitem(last=False)

        def report(line: str) -> None:
            with self._lock:
                lines = self._lines.get(session_id)
                if lines is not None:
                    lines.append(line.strip())

        return report

    def lines(self, session_id: str) -> list[str] | None:
        with self._lock:
            lines = self._lines.get(session_id)
            return list(lines) if lines is not None else None


def owner_pid(owner: str) -> int | None:
    """The pid in a record's owner ("user@host:pid:start"), when that process ran on this host."""
    who, _, rest = owner.partition(":")
    host = who.partition("@")[2]
    pid_text = rest.partition(":")[0]
    if host != socket.gethostname() or not pid_text.isdigit():
        return None
    return int(pid_text)


def kernel_ids_by_pid(kernel_manager: Any) -> dict[int | str, str]:
    """pid -> kernel id of the kernels this Jupyter server runs in local processes (a session
    started by `%gpu start` in a notebook has that notebook's kernel process as its owner), and
    session id -> kernel id of the GPU kernels (a notebook on a GPU kernelspec: its provisioner
    holds the session)."""
    found: dict[int | str, str] = {}
    if kernel_manager is None:
        return found
    for kernel_id in list(kernel_manager.list_kernel_ids()):
        try:
            provisioner = kernel_manager.get_kernel(kernel_id).provisioner
        except (KeyError, AttributeError):  # shut down meanwhile, or no provisioner
            continue
        pid = getattr(provisioner, "pid", None)
        if isinstance(pid, int):
            found[pid] = kernel_id
        session_id = getattr(provisioner, "session_id", None)
        if isinstance(session_id, str):
            found[session_id] = kernel_id
    return found


def kernel_pid(kernel_manager: Any, kernel_id: str) -> int | None:
    """The process of a kernel this Jupyter server runs locally (a notebook's), or None."""
    if kernel_manager is None or kernel_id not in list(kernel_manager.list_kernel_ids()):
        return None
    try:
        pid = kernel_manager.get_kernel(kernel_id).provisioner.pid
    except (KeyError, AttributeError):  # shut down meanwhile, or no provisioner
        return None
    return pid if isinstance(pid, int) else None


def panel_view(
    manager: SessionManager,
    record: SessionRecord,
    progress: StartProgress,
    kernels: dict[int | str, str] | None = None,
) -> dict[str, Any]:
    """The REST view plus `progress` (the start's latest lines, or null when this server did not
    start it), `kernel_id` (the Jupyter kernel that started it, or null) and `saved` (what an
    ended session's stop saved into its workspace, or why not; null when no save was tried) and
    `restored` (what a resumed session's kernel brought back, lines; null otherwise)."""
    view = rest_view(manager.view(record))
    view["progress"] = progress.lines(record.id)
    view["saved"] = None if record.state.active else record_checkpoint_line(record)
    restored = restore_lines(record.resource.get("restored"), record.resource.get("workspace"))
    view["restored"] = "\n".join(restored) if restored and record.state.active else None
    pid = owner_pid(record.owner)
    kernels = kernels or {}
    view["kernel_id"] = kernels.get(record.id) or (kernels.get(pid) if pid is not None else None)
    # every kernel of this server that uses it, with when it took it up (the newest one a
    # notebook took is the one its status bar shows): its starter, `%gpu use`rs
    taken = {view["kernel_id"]: record.created_at} if view["kernel_id"] else {}
    for owner, at in (record.resource.get("users") or {}).items():
        user_pid = owner_pid(owner)
        if user_pid is not None and user_pid in kernels:
            taken[kernels[user_pid]] = at
    view["kernels"] = taken
    return view


def with_history(records: list[SessionRecord], history: int) -> list[SessionRecord]:
    """The active sessions and the `history` most recently ended ones."""
    active = [r for r in records if r.state.active]
    ended = sorted(
        (r for r in records if not r.state.active), key=lambda r: r.updated_at, reverse=True
    )
    return active + ended[:history]
