"""The error tree. Every error a user can cause or meet says what was wrong and what to do.

The faces (magics, CLI, REST) turn these into a `UsageError`, a one-line exit, or a 4xx body;
they never show a traceback for anything below.
"""

from __future__ import annotations


class GpuSessionError(Exception):
    """Base of every error gpusession raises on purpose."""


class BadInput(GpuSessionError, ValueError):
    """The user asked for something invalid (unknown GPU type, bad duration, ...)."""


class WorkspaceInUse(BadInput):
    """A session still uses the workspace: another may not start on it, nor may it be removed (REST: 409)."""


class SessionBusy(BadInput):
    """The session is running a cell: what needs it idle (a switch) is refused (REST: 409)."""


class UnknownSession(GpuSessionError, LookupError):
    """No session by that id or name in the store. `key`: the name asked for; `active`: the
    (name, state) of the sessions that do exist, active ones (the faces name them, and how to
    use one: gpusession.words.stops.error_text)."""

    def __init__(self, message: str, key: str | None = None, active: tuple = ()):
        super().__init__(message)
        self.key = key
        self.active = tuple(active)


class OverBudget(BadInput):
    """A start refused because this month's spend reached the monthly budget (or a policy's cap)."""


class NoSession(GpuSessionError):
    """An operation needs a running session and there is none."""


class SessionEnded(NoSession):
    """The session is no longer running. `record` (a SessionRecord) says how it ended: its
    state, its recorded stop reason; the faces put that into words (gpusession.words.stops)."""

    def __init__(self, record, during: str = ""):
        self.record = record
        self.during = during  # what it cut, in words (a transfer: where it stopped)
        super().__init__(f"session {record.name} is {record.state.value}")


class BackendUnavailable(GpuSessionError):
    """A backend's SDK, daemon or credentials are missing; the message says how to get them."""


class StageError(GpuSessionError):
    """A long operation failed; `stage` names the step that failed (provision, connect, ...)."""

    def __init__(self, stage: str, message: str):
        self.stage = stage
        self.message = message
        super().__init__(f"{stage}: {message}")


class NoCapacity(StageError):
    """A start found no capacity for its type where it looked (a box whose GPUs are all held, a
    cloud's insufficient capacity); a fallback list (`--type l4,a10g,t4`) tries its next type.
    `where`: the box, pool or region it looked in."""

    def __init__(self, message: str, where: str = ""):
        super().__init__("provision", message)
        self.where = where


class RemoteInterrupt(KeyboardInterrupt):
    """A local interrupt, forwarded to the session kernel. `stopped`: the remote cell ended
    (`traceback` is where it was then); otherwise the message says why it did not, or never
    started. `execution_count` is the session kernel's number of the cell, when it is known."""

    def __init__(
        self,
        message: str,
        traceback: list[str] | None = None,
        execution_count: int | None = None,
        *,
        stopped: bool = False,
    ):
        self.stopped = stopped
        self.traceback = list(traceback or [])
        self.execution_count = execution_count
        super().__init__(message)


class KernelDied(GpuSessionError):
    """The session kernel stopped answering while it ran a cell."""


class CellLost(GpuSessionError):
    """The connection dropped as a cell was sent: it did not run, the kernel is fine."""


class LinkLost(GpuSessionError):
    """The connection to a session that still runs is gone for good, or has been down longer than
    the reconnect give-up time (a changed host key, a refused login, an unreachable host); the
    message says which, and what became of the cell that was waiting."""


class TransferStopped(GpuSessionError):
    """A transfer ended before it was whole (interrupted, or it got no answer); the message says
    where it stopped, and that nothing of it stays under a final name."""


class RemoteError(GpuSessionError):
    """An exception raised by code running in the session kernel.

    IPython shows `_render_traceback_` instead of a local traceback (the ipyparallel habit),
    so the notebook displays the remote traceback, and the cell still counts as failed.
    """

    def __init__(
        self, ename: str, evalue: str, traceback: list[str], execution_count: int | None = None
    ):
        self.ename = ename
        self.evalue = evalue
        self.traceback = traceback
        self.execution_count = execution_count  # the session kernel's number of the cell
        super().__init__(f"{ename}: {evalue}")

    def _render_traceback_(self) -> list[str]:
        return list(self.traceback) or [f"{self.ename}: {self.evalue}"]
