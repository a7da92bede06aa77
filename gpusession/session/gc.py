"""`gpusession gc`: find and stop what crashed processes left behind.

- a labelled resource whose session is stopped, failed or unknown to the store: removed (a
  start's helper container counts as the session it serves; the store is read after the
  listing, so a session being started is known: tests/test_gc_race.py)
- an active record whose remote side is gone: recorded as stopped
- a record left requested, provisioning, starting or stopping by a process that died: settled
  as every face settles it (session/orphans.py): a cut stop finished, a cut start stopped and
  recorded failed, a cut switch's session that answers recorded running
- with orphans=True, also running sessions whose owner process is dead

Returns one `GcAction` (data) per thing done; the faces put them into words.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Callable

from ..configuration.registry import backend_names
from ..core.errors import GpuSessionError
from ..core.models import SessionRecord, State
from ..core.protocol import StopKind
from .orphans import orphaned, switch_of
from .store import Store, owner_is_dead

if TYPE_CHECKING:
    from ..backends import Backend

BackendOf = Callable[[str], "Backend"]  # a backend by name (SessionManager.backend)
Reconcile = Callable[[SessionRecord, "Backend"], SessionRecord]  # record a gone session's end
Settle = Callable[[SessionRecord], "SessionRecord | None"]  # a dead driver's record (orphans.py)
Stop = Callable[..., SessionRecord]  # stop a running session: (key, by=..., kind=...)


@dataclasses.dataclass(frozen=True)
class GcAction:
    """One thing gc did (or would do, on a dry run)."""

    verb: str  # "remove" | "stop" | "record-stopped" | "record-running" | "settle" | "stop-orphan"
    target: str  # what: a resource's description or a session name
    why: str  # "unknown to the store", "session x is stopped", "left starting by a dead process"...
    done: bool  # False on a dry run


def collect(
    store: Store,
    backend_of: BackendOf,
    *,
    reconcile: Reconcile,
    settle: Settle,
    stop: Stop,
    dry_run: bool = False,
    backends: list[str] | None = None,
    orphans: bool = False,
    skipped: list[str] | None = None,
    volumes: bool = False,
) -> list[GcAction]:
    """What gc does (SessionManager.gc passes its store, backends, reconcile and stop)."""
    actions: list[GcAction] = []
    names = backends or backend_names()
    # records first: a start its dead starter left is recorded failed, so what else it made (a
    # helper container the starter never removed) is removed below, in the same run
    for rec in store.list(active_only=True):
        try:
            actions += _check_record(
                backend_of, reconcile, settle, stop, rec, dry_run=dry_run, orphans=orphans
            )
        except Exception as exc:  # noqa: BLE001 - one bad record or host must never stop gc
            if skipped is not None:
                skipped.append(f"{rec.name}: not checked ({type(exc).__name__}: {exc})")
    for name in names:
        try:
            backend = backend_of(name)
            resources = backend.list_resources()
        except Exception as exc:  # noqa: BLE001 - an SDK or engine that fails oddly is reported, not fatal
            if skipped is not None:
                skipped.append(
                    f"{name}: not checked ({exc if isinstance(exc, GpuSessionError) else repr(exc)})"
                )
            continue
        # the store is read after the backend answered, never before: a start records its session
        # before it asks a backend for anything (SessionManager.create), so every resource listed
        # has its record in this read, and one unknown to it has none (a start that began after an
        # earlier read would have its new container taken for a leftover)
        records = {r.id: r for r in store.list()} if resources else {}
        for res in resources:
            rec = records.get(res.session_id)
            if rec is not None and rec.state.active:
                continue
            why = (
                "unknown to the store"
                if rec is None
                else f"session {rec.name} is {rec.state.value}"
            )
            actions += _remove(backend, res, why, dry_run=dry_run, notes=skipped)
        actions += _runtime_copies(backend, dry_run=dry_run, remove=volumes, notes=skipped)
    return actions


def _runtime_copies(
    backend, *, dry_run: bool, remove: bool, notes: list[str] | None
) -> list[GcAction]:
    """The runtime copies (Docker volumes) of other gpusession builds that nothing uses: removed
    with `remove` (gc --volumes), else one note saying how many. Not removed by default: they
    cost disk, not money, and a client of that build sharing the engine would copy them again."""
    copies = backend.runtime_copies(remote=remove)  # the note: this machine's only
    if not remove:
        if copies and notes is not None:
            notes.append(
                f"{len(copies)} runtime volume(s) of other gpusession builds are used by no container: "
                "`gpusession gc --volumes` removes them"
            )
        return []
    actions = []
    for res in copies:
        actions += _remove(backend, res, res.details["why"], dry_run=dry_run, notes=notes)
    return actions


def _remove(backend, res, why: str, *, dry_run: bool, notes: list[str] | None) -> list[GcAction]:
    """Remove one leftover (unless `dry_run`): its action, or none and a note when removing failed."""
    if not dry_run:
        try:
            backend.remove_resource(res)
        except Exception as exc:  # noqa: BLE001 - report it, go on with the rest
            if notes is not None:
                notes.append(f"{res.description}: not removed ({type(exc).__name__}: {exc})")
            return []
    return [GcAction("remove", res.description, why, not dry_run)]


def _check_record(
    backend_of: BackendOf,
    reconcile: Reconcile,
    settle: Settle,
    stop: Stop,
    rec: SessionRecord,
    *,
    dry_run: bool,
    orphans: bool,
) -> list[GcAction]:
    actions: list[GcAction] = []
    try:
        backend = backend_of(rec.backend)
    except GpuSessionError:
        return actions
    if orphaned(rec):  # left starting or stopping by a dead process: settled (orphans.py)
        left = (
            "a switch to it was cut: its driver died"
            if rec.state == State.RUNNING
            else f"left {rec.state.value} by a dead process"
        )
        if dry_run:  # a cut switch's session is kept when it answers: which, settling finds
            verb = "settle" if switch_of(rec) else "stop"
            return [GcAction(verb, rec.name, left, False)]
        done = settle(rec)
        if done is not None and done.state == State.RUNNING:  # a cut switch's session answered
            actions.append(GcAction("record-running", rec.name, left, True))
        elif done is not None:
            actions.append(GcAction("stop", rec.name, left, True))
    elif rec.state == State.RUNNING and not backend.is_alive(rec):
        if dry_run or _found(reconcile(rec, backend)):
            actions.append(GcAction("record-stopped", rec.name, "remote side gone", not dry_run))
    elif rec.state == State.RUNNING and orphans and owner_is_dead(rec.owner):
        actions.append(
            GcAction("stop-orphan", rec.name, "its notebook process is gone", not dry_run)
        )
        if not dry_run:
            stop(rec.id, by="gc (owner process gone)", kind=StopKind.GC)
    return actions


def _found(done: SessionRecord) -> bool:
    """Did reconcile record the end it found ("found ...", SessionManager.reconcile), rather than
    yield to a stop another process began meanwhile (whose end is that stop's to record and say)?"""
    return bool(done.events) and done.events[-1].detail.startswith("found ")
