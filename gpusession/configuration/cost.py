"""Billed time and cost from a session's recorded transitions.

Billing runs from when a billed resource exists (the container or the job started, the instance
runs) until the session ends, per second with a 60-second minimum, like EC2's per-second billing.
A backend that knows that moment saves it (BILLED_FROM); otherwise it is when provisioning
returned (the session reached `starting`). A record that never got a billed resource (a start that
failed before anything was created) costs nothing: it "never ran".
"""

from __future__ import annotations

from typing import Any

from ..core.durations import REPORT_SINCE
from ..core.errors import BadInput
from ..core.models import BILLED_STATES, Event, SessionRecord, State, now

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
PRICE_LIST = "price_list"  # the backend's own price list (Backend.price_list: a site's rates)


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


# -- the spend report (`gpusession report`, `%gpu report`, REST `GET report`) -----------------

#: what a report can be broken down by
REPORT_BY = ("type", "backend", "day", "workspace")


def add_report_arguments(parser) -> None:
    """--since and --by, for `gpusession report` and `%gpu report` alike (an argparse parser)."""
    parser.add_argument(
        "--since",
        default="30d",
        help="the period, back from now: 7d, 30d, 12h (a bare number means minutes), or month: "
        "this calendar month (UTC), as the monthly budget counts it (default 30d)",
    )
    parser.add_argument(
        "--by",
        default="type",
        choices=REPORT_BY,
        help="a row per GPU type, backend, day (UTC, when billing began) or workspace "
        "(default type)",
    )


def _report_key(record: SessionRecord, by: str, since: float) -> str:
    import time

    if by == "type":
        return record.spec.gpu_type
    if by == "backend":
        return record.backend
    if by == "day":  # the UTC day its billing began in the period (a session is not split)
        start = billing_started_at(record) or record.created_at
        return time.strftime("%Y-%m-%d", time.gmtime(max(start, since)))
    return str(record.resource.get("workspace") or record.spec.extra.get("workspace") or "-")


def price_source(record: SessionRecord, catalog_prices: tuple[float, ...]) -> str:
    """Which price a session's cost uses: "paid" (what the backend learnt at launch: the zone's
    spot price, a fallback's price), "catalog" (the catalog's rate for its GPUs), "configured"
    (GpuSessionConfig.price_per_hour, a cluster's --price-per-gpu-hour), or "free"."""
    if record.price_per_hour <= 0:
        return "free"
    if "market" in record.resource or record.resource.get("price_per_hour") is not None:
        return "paid"
    if any(abs(record.price_per_hour - p) < 1e-9 for p in catalog_prices):
        return "catalog"
    return "configured"


def _blank(key: str) -> dict:
    return {
        "key": key,
        "sessions": 0,
        "cost": 0.0,
        "gpu_hours": 0.0,
        "idle_cost": 0.0,
        "could_save": 0.0,
        "mean_utilization": None,
        "running": 0,
        "failed": 0,
        "prices": {},  # price source (price_source) -> sessions priced from it
        "_util_weight": 0.0,
        "_util_sum": 0.0,
    }


def _add(row: dict, item: dict) -> None:
    for name in ("sessions", "cost", "gpu_hours", "idle_cost", "could_save", "running", "failed"):
        row[name] += item[name]
    row["prices"][item["price_source"]] = row["prices"].get(item["price_source"], 0) + 1
    if item["mean_utilization"] is not None and item["gpu_hours"] > 0:
        row["_util_weight"] += item["gpu_hours"]
        row["_util_sum"] += item["mean_utilization"] * item["gpu_hours"]


def _finish(row: dict) -> dict:
    weight, total = row.pop("_util_weight"), row.pop("_util_sum")
    row["mean_utilization"] = round(total / weight, 1) if weight else None
    for name in ("cost", "idle_cost", "could_save"):
        row[name] = round(row[name], 6)
    row["gpu_hours"] = round(row["gpu_hours"], 4)
    if "split" in row:  # the second breakdown: its parts in the order of their keys
        row["split"] = [_finish(part) for _, part in sorted(row["split"].items())]
    return row


def session_spend(
    record: SessionRecord,
    *,
    since: float,
    at: float,
    catalog_prices: tuple[float, ...],
    could_save: float,
) -> dict:
    """One session's part of a report: billed time from `since` to `at` (a running session up
    to `at`, an ended one until it ended, a failed one until it failed), priced as recorded."""
    start = billing_started_at(record)
    if start is None:
        seconds = 0.0  # never got a billed resource (a job still queued, a start that failed)
    else:
        seconds = billed_seconds(record.events, at, not_before=max(float(start), since))
    whole = record_billed_seconds(record, at)
    share = seconds / whole if whole > 0 else 0.0  # the part of the session inside the period
    summary = record.resource.get("agent_summary") or {}
    mean = summary.get("mean_gpu_utilization")
    idle_s = float(summary.get("idle_minutes") or 0.0) * 60.0
    return {
        "sessions": 1,
        "cost": cost_for_seconds(record.price_per_hour, seconds),
        "gpu_hours": record.spec.gpu_count * seconds / 3600.0,
        "idle_cost": record.price_per_hour * min(idle_s, whole) / 3600.0 * share,
        "could_save": could_save * share,
        "mean_utilization": mean,
        "running": int(record.state.active),
        "failed": int(record.state.value == "failed"),
        "price_source": price_source(record, catalog_prices),
        "billed_s": seconds,
    }


def spend_report(
    records: list[SessionRecord],
    *,
    since: float,
    by: str,
    at: float | None = None,
    catalog_prices=lambda record: (),
    could_save=lambda record: 0.0,
    split: str | None = None,
) -> dict[str, Any]:
    """Spend from `since` to `at` (default now), a row per `by` key (REPORT_BY) and a total;
    with `split` (another REPORT_BY key), each row's `split` lists its parts by that key (the
    Spend view's bars: a day's cost per GPU type). Each row's `prices` counts its sessions per
    price source (`price_source`).
    `catalog_prices(record)`: the table prices of its GPUs (Backend.catalog_prices);
    `could_save(record)`: the advice's saving for the whole session (gpusession/configuration/advice.py)."""
    for key in (by, split or by):
        if key not in REPORT_BY:
            raise BadInput(
                f"cannot break a report down by {key!r}; choose one of {', '.join(REPORT_BY)}"
            )
    at = now() if at is None else at
    rows: dict[str, dict] = {}
    total = _blank("total")
    for record in records:
        item = session_spend(
            record,
            since=since,
            at=at,
            catalog_prices=catalog_prices(record),
            could_save=could_save(record),
        )
        if item["billed_s"] <= 0:
            continue  # nothing billed in the period (never provisioned, or all before it)
        key = _report_key(record, by, since)
        row = rows.setdefault(key, _blank(key))
        _add(row, item)
        _add(total, item)
        if split is not None:
            part = _report_key(record, split, since)
            _add(row.setdefault("split", {}).setdefault(part, _blank(part)), item)
    ordered = sorted(rows.values(), key=lambda r: r["key"] if by == "day" else -r["cost"])
    return {
        "since": since,
        "until": at,
        "by": by,
        "rows": [_finish(r) for r in ordered],
        "total": _finish(total),
        "prices": total["prices"],  # the whole report's price sources (each row has its own)
    }


# -- the monthly budget (GpuSessionConfig.monthly_budget) -------------------------------------

BUDGET_WARN = 0.8  # from this fraction of the budget on, every start warns


#: `--since month`: the calendar month so far (UTC), the period the budget and the header count
SINCE_MONTH = "month"


def report_start(since: str | float | None, at: float) -> float:
    """When a report of period `since` begins, read at `at`: "month" is the first second of the
    calendar month (UTC); anything else the duration grammar (BadInput when it is none)."""
    if isinstance(since, str) and since.strip().lower() == SINCE_MONTH:
        return month_start(at)
    try:
        seconds = REPORT_SINCE.parse("30d" if since is None else since)
    except BadInput as exc:
        raise BadInput(f"{exc}; or month: this calendar month") from None
    return at - float(seconds or 0.0)


def month_start(at: float) -> float:
    """The first second of `at`'s calendar month, UTC."""
    import calendar
    import time

    t = time.gmtime(at)
    return float(calendar.timegm((t.tm_year, t.tm_mon, 1, 0, 0, 0)))


def budget_status(spent: float, budget: float, *, month: float, source: str) -> dict | None:
    """The month's spend against a budget, as data (None without a budget). `state`: ok, warn
    (BUDGET_WARN reached) or over (all of it spent); `source`: where the budget is set."""
    if budget <= 0:
        return None
    fraction = spent / budget
    state = "over" if fraction >= 1.0 else "warn" if fraction >= BUDGET_WARN else "ok"
    return {
        "budget": budget,
        "spent": round(spent, 6),
        "fraction": round(fraction, 4),
        "month_start": month,
        "state": state,
        "source": source,
    }
