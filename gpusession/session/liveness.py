"""Is a running session still alive, asked when sessions are listed (`gpusession list` and
`status`, `%gpu list`, REST `GET sessions`), so a session whose remote side ended (its idle
watchdog, a crash, `docker stop`) is not shown running with its cost still rising.

Each backend answers for all its running sessions at once, from what it sees cheaply
(`Backend.check_alive`: local reads /proc, docker asks each engine it can reach without a new
login, once; aws is not asked - a cloud API call is no cheap question). A session found gone is
reconciled (recorded as stopped or failed, with why, as gc would); one found alive, or whose agent
answered, gets `last_seen` in its record (written at most once a minute); one nobody could ask is
shown as unverified, with when it was last seen alive (`seen`).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, Callable

from ..core.models import SessionRecord, State
from ..core.protocol import StopKind, StopReason
from .orphans import orphaned
from .store import Store

if TYPE_CHECKING:
    from ..backends import Backend

log = logging.getLogger(__name__)

FRESH_S = 15.0  # a session seen alive this recently by this process counts as verified
SAVE_EVERY_S = 60.0  # how often `last_seen` is written to a record, at most


def ended_state(reason: StopReason) -> State:
    """The one rule for how an ended session is recorded, however it was found (mid-cell, by a poll, by
    gc): stopped when someone or something decided it (its watchdog, a user, gc, a signal such as `docker
    stop`, the cloud taking a spot instance back), failed when the kernel or the runtime ended by itself
    or nobody can say why."""
    failed = (StopKind.KERNEL_EXIT, StopKind.START_FAILED, StopKind.CONTAINER_EXIT, StopKind.GONE)
    return State.FAILED if reason.kind in failed else State.STOPPED


class Liveness:
    """What this process knows of its sessions' liveness; one per SessionManager (`.liveness`).
    store: where records are read and `last_seen` written; backend: a backend by name;
    reconcile: records a gone session's end (SessionManager.reconcile)."""

    def __init__(
        self,
        store: Store,
        backend: Callable[[str], "Backend"],
        reconcile: Callable[[SessionRecord, "Backend"], SessionRecord],
        settle: Callable[[SessionRecord], SessionRecord | None] | None = None,
    ):
        self.store, self.backend, self.reconcile = store, backend, reconcile
        self.settle = settle  # a record its dead driver left in a driven state (orphans.py)
        self._seen: dict[str, tuple[float, float]] = {}  # id -> (seen alive at, last_seen saved at)

    def check(self, records: list[SessionRecord]) -> list[SessionRecord]:
        """`records` with their running sessions checked: the gone ones reconciled (their
        records as now stored), the alive ones marked seen, those a dead process left starting
        or stopping settled, the rest as they were. Never raises for one backend or record: what
        cannot be checked stays unverified."""
        if self.settle is not None:
            records = [self._settled(r) if orphaned(r) else r for r in records]
        by_backend: dict[str, list[SessionRecord]] = {}
        for record in records:
            if record.state == State.RUNNING:
                by_backend.setdefault(record.backend, []).append(record)
        answers: dict[str, bool] = {}
        for name, group in by_backend.items():
            try:
                answers.update(self.backend(name).check_alive(group))
            except Exception as exc:  # noqa: BLE001 - a backend that cannot answer leaves its rows unverified
                log.debug("could not check the %s sessions: %s", name, exc)
        out = []
        for record in records:
            alive = answers.get(record.id)
            if alive is True:
                self.saw(record.id, record)
            elif alive is False:
                record = self._reconciled(record)
            out.append(record)
        return out

    def _settled(self, record: SessionRecord) -> SessionRecord:
        try:
            self.settle(record)  # type: ignore[misc]
        except Exception as exc:  # noqa: BLE001 - the listing goes on; the next reader retries
            log.warning("session %s was left %s: not settled: %s", record.name, record.state, exc)
        return self.store.get(record.id)

    def _reconciled(self, record: SessionRecord) -> SessionRecord:
        fresh = self.store.get(record.id)
        if fresh.state != State.RUNNING:  # another process recorded its end (or a stop) meanwhile
            return fresh
        try:
            return self.reconcile(fresh, self.backend(fresh.backend))
        except Exception as exc:  # noqa: BLE001 - the listing goes on; gc retries the teardown
            log.warning("session %s is gone but could not be recorded so: %s", fresh.name, exc)
            return self.store.get(record.id)

    def saw(self, session_id: str, record: SessionRecord | None = None) -> None:
        """This process just found the session alive (its backend or its agent said so)."""
        now = time.time()
        stored = (record.resource.get("last_seen") or 0.0) if record is not None else 0.0
        _, saved = self._seen.get(session_id, (0.0, stored))
        if now - saved >= SAVE_EVERY_S:
            try:
                self.store.update_resource(session_id, last_seen=now)
                saved = now
            except Exception as exc:  # noqa: BLE001 - a busy or read-only store costs only the note
                log.debug("could not record last_seen of %s: %s", session_id, exc)
        self._seen[session_id] = (now, saved)

    def seen(self, record: SessionRecord) -> dict[str, Any]:
        """The view's `verified` (false only for a running session nobody could check just now)
        and `last_seen` (unix seconds it was last known alive: a check, its agent, its start)."""
        if record.state != State.RUNNING:
            return {"verified": True, "last_seen": None}
        checked, _ = self._seen.get(record.id, (0.0, 0.0))
        started = next((e.at for e in reversed(record.events) if e.state == State.RUNNING), None)
        known = [t for t in (checked, record.resource.get("last_seen"), started) if t]
        return {
            "verified": time.time() - checked <= FRESH_S,
            "last_seen": max(known) if known else None,
        }
