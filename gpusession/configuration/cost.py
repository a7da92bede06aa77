"""Billed time and cost from a session's recorded transitions.

Billing runs while the backend may hold a paid resource (provisioning .. stopping), per second
with a 60-second minimum, like EC2's per-second billing.
"""

from __future__ import annotations

from ..core.models import BILLED_STATES, Event, SessionRecord, now

MINIMUM_BILLED_S = 60.0

#: a record's resource key set by a backend that bills from a later point than its record's
#: creation: a Slurm job is billed from its start, not while it waits in the queue. None: not
#: started yet (nothing billed); a unix time: billed from then on.
BILLED_FROM = "billed_from"


def billed_seconds(
    events: list[Event], at: float | None = None, not_before: float | None = None
) -> float:
    """Seconds spent in billed states, from the event list, up to `at` (default: now), counting
    none before `not_before`."""
    at = now() if at is None else at
    floor = float("-inf") if not_before is None else not_before
    total, since = 0.0, None
    for e in events:
        if e.state in BILLED_STATES:
            if since is None:
                since = e.at
        elif since is not None:
            total += max(0.0, e.at - max(since, floor))
            since = None
    if since is not None:
        total += max(0.0, at - max(since, floor))
    return total


def record_billed_seconds(record: SessionRecord, at: float | None = None) -> float:
    """Billed seconds of a session: its billed states, from the job's start where the backend
    says billing starts later than the record (BILLED_FROM)."""
    if BILLED_FROM in record.resource:
        start = record.resource[BILLED_FROM]
        return 0.0 if start is None else billed_seconds(record.events, at, not_before=float(start))
    return billed_seconds(record.events, at)


def cost_for_seconds(price_per_hour: float, seconds: float) -> float:
    """Dollars for `seconds` of billed time: per second, at least one minute once billing
    started. The one formula: the store's numbers and the agent's live meter both use it."""
    if seconds <= 0:
        return 0.0
    return price_per_hour * max(seconds, MINIMUM_BILLED_S) / 3600.0


def seconds_until_cost(
    price_per_hour: float, dollars: float, seconds_so_far: float
) -> float | None:
    """Billed seconds still to go until spending reaches `dollars` (None when free)."""
    if price_per_hour <= 0:
        return None
    return max(0.0, dollars * 3600.0 / price_per_hour - max(seconds_so_far, 0.0))


def cost_of(record: SessionRecord, at: float | None = None) -> float:
    """Dollars so far: price x billed time, at least one minute once billing started."""
    return cost_for_seconds(record.price_per_hour, record_billed_seconds(record, at))


def billing_started_at(record: SessionRecord) -> float | None:
    """When the session first entered a billed state (what the agent's live meter counts from)."""
    if BILLED_FROM in record.resource:
        return record.resource[BILLED_FROM]
    return next((e.at for e in record.events if e.state in BILLED_STATES), None)


def uptime_seconds(record: SessionRecord, at: float | None = None) -> float:
    """Seconds since the session first ran, until it stopped (or now)."""
    at = now() if at is None else at
    started = next((e.at for e in record.events if e.state.value == "running"), None)
    if started is None:
        return 0.0
    ended = next((e.at for e in record.events if not e.state.active and e.at >= started), None)
    return max(0.0, (ended or at) - started)
