"""Billed time and cost from a session's recorded transitions.

Billing runs from when a billed resource exists (the container or the job started, the instance
runs) until the session ends, per second with a 60-second minimum, like EC2's per-second billing.
A backend that knows that moment saves it (BILLED_FROM); otherwise it is when provisioning
returned (the session reached `starting`). A record that never got a billed resource (a start that
failed before anything was created) costs nothing: it "never ran".
"""

from __future__ import annotations

from .models import BILLED_STATES, Event, SessionRecord, State, now

MINIMUM_BILLED_S = 60.0

#: a record's resource key a backend sets when its billed resource exists: a container started,
#: an instance running, a Slurm job started (not while it waits in the queue). None: not started
#: yet (nothing billed); a unix time: billed from then on. Absent: from the `starting` state.
BILLED_FROM = "billed_from"

#: the states that say provisioning returned, so the backend's resource exists
_PROVISIONED = (State.STARTING, State.RUNNING)

#: where a session's price comes from (record.resource[PRICE_BASIS]; the faces say it in words)
PRICE_BASIS = "price_basis"
CLOUD = "cloud"  # what the cloud bills for the resource (aws)
OWN_HARDWARE = "own_hardware"  # the catalog's cloud rate, applied to the user's own machine
CONFIGURED = "configured"  # the price the user configured (GpuSessionConfig.price_per_hour...)


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
    """Billed seconds of a session: its billed states from when its billed resource existed
    (`billing_started_at`); none when it never got one."""
    start = billing_started_at(record)
    return 0.0 if start is None else billed_seconds(record.events, at, not_before=float(start))


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
    """When the session's billed resource came to exist (what the agent's live meter counts
    from): the backend's BILLED_FROM, else when provisioning returned; None: not (yet)."""
    if BILLED_FROM in record.resource:
        return record.resource[BILLED_FROM]
    return next((e.at for e in record.events if e.state in _PROVISIONED), None)


def never_ran(record: SessionRecord) -> bool:
    """An ended session that never got a billed resource (its start failed before one existed,
    or it was stopped while provisioning): it cost nothing."""
    return not record.state.active and billing_started_at(record) is None


def uptime_seconds(record: SessionRecord, at: float | None = None) -> float:
    """Seconds since the session first ran, until it stopped (or now)."""
    at = now() if at is None else at
    started = next((e.at for e in record.events if e.state.value == "running"), None)
    if started is None:
        return 0.0
    ended = next((e.at for e in record.events if not e.state.active and e.at >= started), None)
    return max(0.0, (ended or at) - started)
