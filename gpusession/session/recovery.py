"""A replacement for a session whose capacity was taken back (a spot interruption, a cluster's
time limit or preemption) after its agent saved the namespace: the same kind of session, on the
same workspace, restoring it (`--resume`). The side that watches the session (the notebook's
magics, on the cell that was cut or through its notifier) asks for one with
`SessionManager.recover`; with no watcher alive the checkpoint waits for `--resume NAME`.

The old session is gone already, so this is `%gpu switch` without its first half (save, then stop
the old one): when that lands (`SessionManager.switch`), a rebalance recommendation (the capacity
is still there) is where a switch would move the session before the interruption comes.
"""

from __future__ import annotations

from typing import Any

from ..core.models import SessionRecord
from ..core.protocol import StopKind
from .views import restart_body, session_view


def wants_recovery(record: SessionRecord) -> bool:
    """Did the session end by an interruption after a save, and does it ask to be recovered
    (`--recover`: on; auto: a spot session, or a cluster job preempted for another job - not one
    that reached its time limit, which a resubmission would only go around)?"""
    reason = record.stop_reason
    if reason is None or not reason.kind.interruption or record.state.active:
        return False
    choice = record.spec.extra.get("recover") or "auto"
    taken = bool(record.spec.extra.get("spot")) or reason.kind is StopKind.PREEMPTED
    wanted = choice == "on" or (choice == "auto" and taken)
    return wanted and session_view(record)["resume"] is not None


def replacement_values(record: SessionRecord) -> dict[str, Any] | None:
    """The start options (a REST body, as the history card's Resume sends) of the replacement:
    the same backend, type, limits and options (aws's --fallback among them: spot first,
    on-demand when it allows), resuming the workspace. The name is handed over once it runs
    (`Store.hand_name_over`: a name stays with one record). None when no recovery is wanted."""
    if not wants_recovery(record):
        return None
    return restart_body(record.spec, resume=record.resource.get("workspace"))


def avoid_zone(record: SessionRecord) -> str:
    """The zone a spot session was interrupted in ("" for none): its replacement tries the other
    zones first and that one last (the capacity just went there)."""
    kind = record.stop_reason.kind if record.stop_reason else None
    return (record.resource.get("zone") or "") if kind == StopKind.SPOT_INTERRUPTION else ""
