"""Sessions their driving process left behind: a record in a driven state (requested,
provisioning, starting, stopping) whose driver (the process that moved it there: a notebook, the
CLI, the server) has died. Nothing would ever move such a record on, and where its container,
instance or job did start it bills while the list says "starting".

The next process that reads it (`gpusession list` and `status`, `%gpu list`, the sidebar's poll
through REST, gc) settles it with its backend, once (the store hands the record over to one
process: `Store.take_over`):

- a stop that was cut is finished (stopped);
- a start that was cut is cleaned up and recorded failed (billed nothing when it never ran) -
  unless a switch made it and it answers: a switch's new session that runs becomes running, and
  the switch is recorded as cut (`resource["switch"]["cut"]`), so every face can say in one line
  what happened and what to do (gpusession.words.switches `cut_switch_line`);
- an administrator's `GpuSessionConfig.cut_switch = "keep-old"` makes that automatic: the new
  session is stopped and the old one, which still holds the variables, keeps running.

A switch records its intent on the new record before it starts anything (session/switch.py):
`resource["switch"] = {"old": id, "old_name": name, "step": ..., "cut": ...}`, with the step it
reached (`SwitchStep`).
"""

from __future__ import annotations

import dataclasses
import enum
import time
from typing import TYPE_CHECKING, Callable

from ..configuration.cost import billing_started_at
from ..core.errors import GpuSessionError
from ..core.models import SessionRecord, State
from ..core.protocol import StopKind
from .store import DRIVEN_STATES, Store, driver_of, owner_is_dead

if TYPE_CHECKING:
    from ..backends import Backend


class SwitchStep(str, enum.Enum):
    """The steps of a switch, in order, as its new record keeps them."""

    SAVE = "save"  # the old session saves its variables into the workspace
    MOVE = "move"  # the workspace moves to where the new session mounts it
    START = "start"  # the new session starts on it and restores the variables
    STOP_OLD = "stop-old"  # the new one answered: the old one is stopped
    DONE = "done"  # the switch finished
    FAILED = "failed"  # the switch failed and said so; the old session kept running

    @property
    def open(self) -> bool:
        """Still under way (a switch whose driver dies in such a step was cut)."""
        return self not in (SwitchStep.DONE, SwitchStep.FAILED)


Answers = Callable[[SessionRecord], bool]  # does a started session's kernel answer (connect)?
BackendOf = Callable[[str], "Backend"]


@dataclasses.dataclass(frozen=True)
class Settled:
    """What settling one record did."""

    record: SessionRecord  # as it is stored now
    outcome: str  # "running" | "failed" | "stopped"
    was: State  # the driven state it was left in


def orphaned(record: SessionRecord) -> bool:
    """Left by a process of this machine that is gone: in a driven state, or running as the new
    session of a switch that had not finished (the old one not yet stopped)."""
    if record.state in DRIVEN_STATES:
        return owner_is_dead(driver_of(record))
    return (
        record.state == State.RUNNING
        and _open(switch_of(record))
        and owner_is_dead(driver_of(record))
    )


def _open(switch: dict | None) -> bool:
    """A switch still under way: neither done nor failed, and not found cut yet."""
    if not switch or switch.get("cut"):
        return False
    try:
        return SwitchStep(switch.get("step")).open
    except ValueError:
        return False


def switch_of(record: SessionRecord) -> dict | None:
    """The switch that made this session (its intent and step), or None."""
    switch = record.resource.get("switch")
    return switch if isinstance(switch, dict) and switch.get("old") else None


def settle(
    store: Store,
    backend_of: BackendOf,
    record: SessionRecord,
    *,
    answers: Answers,
    stop: Callable[..., SessionRecord],
    choice: str = "ask",
) -> Settled | None:
    """Settle `record`, left in a driven state by a dead driver (`orphaned`); None when another
    process took it over first or it moved on meanwhile. `answers`: does a started session's
    kernel answer; `stop`: SessionManager.stop (for keep-old); `choice`: `cut_switch`."""
    was, dead = record.state, driver_of(record)
    taken = store.take_over(record.id, dead, was)
    if taken is None:
        return None
    try:
        return _settle(store, backend_of(taken.backend), taken, was, answers, stop, choice)
    except BaseException:
        if store.get(taken.id).state == was:  # not settled: the next reader retries
            store.update_resource(taken.id, driver=dead)
        raise


def _settle(
    store: Store,
    backend: "Backend",
    taken: SessionRecord,
    was: State,
    answers: Answers,
    stop: Callable[..., SessionRecord],
    choice: str,
) -> Settled:
    switch = switch_of(taken)
    if was == State.RUNNING and switch is not None:  # the new one answered; the old one stays
        return Settled(_ran_on(store, taken, switch, stop, choice), "running", was)
    if was == State.STOPPING:
        backend.stop(taken)  # raises when something may still be held: it stays stopping
        done = store.transition(taken.id, State.STOPPED, "stopped: its stop was finished here")
        return Settled(done, "stopped", was)
    # a switch's new session whose resource is made (starting: it waits for its kernel) is kept
    # when its kernel answers; one still provisioning never got that far (on aws, the old
    # session's volume may not even have moved to it yet)
    if switch is not None and was == State.STARTING and answers(taken):
        started = next(
            (e.at for e in reversed(taken.events) if e.state == State.STARTING), time.time()
        )
        done = store.transition(
            taken.id,
            State.RUNNING,
            f"running: started by a switch from {switch.get('old_name')} that did not finish",
            at=started,  # billed since its resource was made, as when it is recorded running
        )
        done = _ran_on(store, done, switch, stop, choice)
        return Settled(done, store.get(done.id).state.value, was)
    try:
        backend.stop(taken)
    except Exception as exc:  # noqa: BLE001 - recorded failed all the same; gc retries the teardown
        store.note(taken.id, f"teardown after its starter died failed: {exc}")
    why = (
        f"switch from {switch.get('old_name')} cut at {switch.get('step')}: its driver died"
        if switch is not None
        else "starter process died"
    )
    done = store.transition(
        taken.id, State.FAILED, f"cleaned up: left {was.value} by a dead process", error=why
    )
    if switch is not None:
        done = _cut(store, done, switch, both_run=False)
    return Settled(done, "failed", was)


def _ran_on(
    store: Store, new: SessionRecord, switch: dict, stop: Callable[..., SessionRecord], choice: str
) -> SessionRecord:
    """The new session of a cut switch runs: with the old one still running the switch is cut
    (both run: said, or the new one stopped by keep-old); else the old one ended (its stop was
    under way, or finished by whoever found it) and the switch is done."""
    try:
        old_running = store.get(switch["old"]).state == State.RUNNING
    except GpuSessionError:
        old_running = False
    if not old_running:
        _forget_cut(store, switch["old"])
        return store.update_resource(new.id, switch=dict(switch, step=SwitchStep.DONE.value))
    done = _cut(store, new, switch, both_run=True)
    if choice == "keep-old":
        done = _keep_old(store, done, store.get(done.id).resource["switch"], stop)
    return done


def _forget_cut(store: Store, old_id: str) -> None:
    """An earlier cut the old session took part in asks nothing more (a later switch of it
    finished, or another began)."""
    try:
        if store.get(old_id).resource.get("cut_switch"):
            store.update_resource(old_id, cut_switch=None)
    except GpuSessionError:
        pass


def _cut(store: Store, record: SessionRecord, switch: dict, *, both_run: bool) -> SessionRecord:
    """Record the cut on the new session (the step it reached, what was left) and a pointer to
    it on the old one, so the view of either says it (`cut_switch`)."""
    cut = {"step": switch.get("step"), "at": time.time(), "both_run": both_run}
    try:
        store.update_resource(switch["old"], cut_switch=record.id)
    except GpuSessionError:  # the old record is gone (forgotten): the new one says it alone
        pass
    return store.update_resource(record.id, switch=dict(switch, cut=cut))


def _keep_old(
    store: Store, record: SessionRecord, switch: dict, stop: Callable[..., SessionRecord]
) -> SessionRecord:
    """`cut_switch = "keep-old"`: the old session keeps the variables and runs on; the new one is
    stopped, and notebooks that followed the switch are pointed back (no `switched_to`)."""
    try:
        old = store.get(switch["old"])
    except GpuSessionError:
        return record
    if old.state != State.RUNNING:  # nothing to keep: the new one is all there is
        return record
    if old.resource.get("switched_to"):
        store.update_resource(old.id, switched_to=None)
    stopped = stop(record.id, by="GpuSessionConfig.cut_switch = keep-old", kind=StopKind.USER)
    cut = dict((switch.get("cut") or {}), kept="old")
    store.update_resource(record.id, switch=dict(store.get(record.id).resource["switch"], cut=cut))
    return store.get(stopped.id)


def cut_switch(store: Store, record: SessionRecord) -> dict | None:
    """The cut switch `record` took part in (as its old or its new session), as data for the
    faces, while it still asks something of the user: its old session is active. Keys: old, new
    (names), step (SwitchStep value), old_state, new_state, old_price, new_price (per hour),
    kept ("old" when cut_switch = keep-old stopped the new one, else None), new_ran (the new
    one's resource was made: it billed while it existed), saved (the workspace
    holding the variables when neither session runs, else None)."""
    switch = switch_of(record)
    if switch is not None and switch.get("cut"):
        new = record
        try:
            old = store.get(switch["old"])
        except GpuSessionError:
            return None
        if old.resource.get("cut_switch") != new.id:
            return None  # a later switch of the old session made this cut moot
    elif record.resource.get("cut_switch"):
        old = record
        try:
            new = store.get(record.resource["cut_switch"])
        except GpuSessionError:
            return None
        switch = switch_of(new)
        if switch is None or not switch.get("cut"):
            return None
    else:
        return None
    cut = switch["cut"]
    saved = None
    if not old.state.active:
        checkpoint = old.resource.get("checkpoint") or {}
        if new.state.active or not checkpoint.get("committed"):
            return None  # the new one is the session now (or nothing was kept to say)
        saved = old.resource.get("workspace") or new.spec.extra.get("resume")
    elif cut.get("both_run") and not new.state.active and not cut.get("kept"):
        return None  # both ran, and the new one was stopped since: answered
    return {
        "old": old.name,
        "new": new.name,
        "step": switch["cut"].get("step"),
        "old_state": old.state.value,
        "new_state": new.state.value,
        "old_price": old.price_per_hour,
        "new_price": new.price_per_hour,
        "kept": switch["cut"].get("kept"),
        "new_ran": billing_started_at(new) is not None,  # its resource was made (it billed)
        # neither runs: the old one saved the variables into this workspace before it stopped
        "saved": saved,
    }


def forget_cut(store: Store, old_id: str) -> None:
    """A switch of `old_id` begins: what an earlier cut of it left is answered or moot."""
    _forget_cut(store, old_id)


__all__ = [
    "forget_cut",
    "Settled",
    "SwitchStep",
    "cut_switch",
    "orphaned",
    "settle",
    "switch_of",
]
