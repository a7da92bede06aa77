"""Money in words: right-sizing advice (gpusession/configuration/advice.py), the spend report
(gpusession/configuration/cost.py spend_report), the monthly budget, the bounds a policy put in,
live spot prices and the catalog's refresh."""

from __future__ import annotations

import time

from ..core.durations import format_bound, format_money
from ..core.models import SessionRecord
from .common import gpu_label, memory_text
from .workspaces import resumed_where_line


def _on(gpu_type: str, gpu_count: int, price: float) -> str:
    return f"{gpu_label(gpu_type, gpu_count)} ({format_money(price)}/h)"


def usage_figures_text(figures: dict) -> str:
    """'peak 3.1 GiB (95th percentile 3.1 GiB) of 39.6 GiB, utilization mean 3%, 95th percentile 12%'."""
    mean, p95 = figures.get("utilization_mean"), figures.get("utilization_p95")
    text = (
        f"peak {memory_text(figures['memory_peak'])} (95th percentile {memory_text(figures['memory_p95'])})"
        f" of {memory_text(figures['memory_total'])}"
    )
    if mean is not None:
        text += f", utilization mean {mean:.0f}%, 95th percentile {p95}%"
    if figures["busy_gpus"] < figures["gpus"]:
        text += f", {figures['busy_gpus']} of {figures['gpus']} GPUs used"
    if figures.get("oom_errors"):
        text += f", {figures['oom_errors']} cell(s) failed out of GPU memory"
    return text


def _difference(advice: dict) -> str:
    hourly, total = advice["hourly_difference"], advice["session_difference"]
    word = "less" if hourly < 0 else "more"
    text = f"{format_money(abs(hourly))}/h {word}"
    if total:
        text += f" ({format_money(abs(total))} {word} over this session)"
    return text


def advice_line(doc: dict) -> str | None:
    """The one line a stop and the card show; None when there is no advice."""
    a, f = doc.get("advice"), doc.get("figures")
    if not a or not f:
        return None
    now = _on(a["gpu_type"], a["gpu_count"], a["price_per_hour"])
    then = _on(a["suggested_type"], a["suggested_count"], a["suggested_price"])
    flag = a["suggested_type"] + (f":{a['suggested_count']}" if a["suggested_count"] != 1 else "")
    hint = f"`%gpu start --type {flag}` next time"
    mean = f.get("utilization_mean")
    use = f"peak {memory_text(f['memory_peak'])}" + (
        f" and {mean:.0f}% mean utilization" if mean is not None else ""
    )
    kind = a["kind"]
    if kind == "smaller":
        return f"advice: {use} on {now}: {then} would have held it: {_difference(a)}. {hint}"
    if kind == "fewer":
        return (
            f"advice: {f['busy_gpus']} of {f['gpus']} GPUs used ({use}) on {now}: "
            f"{then} would have done: {_difference(a)}. {hint}"
        )
    if kind == "bigger":
        why = (
            f"{f['oom_errors']} cell(s) ran out of GPU memory"
            if f.get("oom_errors")
            else f"memory reached {memory_text(f['memory_peak'])} of {memory_text(f['memory_total'])}"
        )
        return f"advice: {why} on {now}: the next size up is {then}: {_difference(a)}. {hint}"
    speed = f", {a['speedup']:g}x the FP16 throughput" if a.get("speedup") else ""
    return (
        f"advice: utilization stayed at {f['utilization_p50']}% on {now}, the GPU was the limit: "
        f"{then}{speed}, would have needed less time: {_difference(a)}. {hint}"
    )


def advice_lines(name: str, doc: dict) -> list[str]:
    """`%gpu advice` / `gpusession advice`: the figures, then the advice or why there is none."""
    f = doc.get("figures")
    if not f:
        return [
            f"{name}: no advice yet: {doc.get('samples', 0)} GPU sample(s), "
            f"at least {doc.get('min_samples')} needed (one a second while a GPU is visible)"
        ]
    line = advice_line(doc)
    return [
        f"{name}: {usage_figures_text(f)}",
        line or "no advice: no cheaper type would have held it, and memory never ran short",
        "(only advice: nothing changes by itself; prices from the catalog, docs/cost.md)",
    ]


_PRICE_WORDS = {
    "paid": "at the price paid (learnt at launch: the zone's spot price)",
    "catalog": "at the catalog's rate (snapshot {date})",
    "configured": "at the configured price (price_per_hour, --price-per-gpu-hour)",
    "free": "free (no price known: GPU-hours only)",
}


_PRICE_SHORT = {
    "paid": "price paid",
    "catalog": "catalog rate",
    "configured": "configured price",
    "free": "free",
}


def price_sources_text(prices: dict, catalog_date: str | None, *, short: bool = False) -> str:
    """Which prices a report's (or a row's) sessions were costed at: '5 at the catalog's rate
    (snapshot 2025-11-01); 1 at the price paid (...)'; short: '5 catalog rate, 1 price paid'."""
    if short:
        return ", ".join(f"{n} {_PRICE_SHORT[kind]}" for kind, n in sorted(prices.items()))
    return "; ".join(
        f"{n} {_PRICE_WORDS[kind].format(date=catalog_date)}" for kind, n in sorted(prices.items())
    )


def report_rest(doc: dict) -> dict:
    """The spend report as REST sends it (the Spend view): the data, `lines` (what `gpusession
    report` prints), the words of its price sources (whole and per row) and of the budget."""
    date = doc.get("catalog_date")
    rows = [
        dict(r, prices_text=price_sources_text(r["prices"], date, short=True)) for r in doc["rows"]
    ]
    return dict(
        doc,
        rows=rows,
        lines=report_lines(doc),
        prices_text=price_sources_text(doc.get("prices", {}), date),
        budget_line=budget_line(doc["budget"]) if doc.get("budget") else None,
    )


def _report_row(row: dict) -> tuple[str, ...]:
    mean = row.get("mean_utilization")
    return (
        str(row["key"]),
        str(row["sessions"]),
        f"{row['gpu_hours']:.2f}",
        format_money(row["cost"]),
        "n/a" if mean is None else f"{mean:.0f}%",
        format_money(row["idle_cost"]),
        format_money(row["could_save"]),
    )


def report_lines(doc: dict) -> list[str]:
    """`gpusession report` / `%gpu report`: a row per key, the total, and where the numbers
    come from (docs/cost.md)."""
    day = lambda t: time.strftime("%Y-%m-%d %H:%M", time.gmtime(t))  # noqa: E731
    head = f"spend {day(doc['since'])} .. {day(doc['until'])} UTC, by {doc['by']}"
    if not doc["rows"]:
        return [head, "  no session was billed in this period"]
    rows = [
        (doc["by"].upper(), "SESSIONS", "GPU-HOURS", "COST", "MEAN UTIL", "IDLE COST", "COULD SAVE")
    ]
    rows += [_report_row(r) for r in doc["rows"]] + [_report_row(doc["total"])]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [head] + [
        "  "
        + "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
        for r in rows
    ]
    lines.insert(len(lines) - 1, "  " + "-" * (sum(widths) + 2 * (len(widths) - 1)))
    total = doc["total"]
    lines.append(f"  prices: {price_sources_text(doc.get('prices', {}), doc.get('catalog_date'))}")
    if total["running"] or total["failed"]:
        lines.append(
            f"  {total['running']} still running (counted up to now), "
            f"{total['failed']} failed (billed until they failed)"
        )
    if doc.get("budget"):
        lines.append("  " + budget_line(doc["budget"]))
    return lines


def budget_line(status: dict) -> str:
    """'this month: $41.20 of the $50.00 monthly budget (82%)'."""
    return (
        f"this month: {format_money(status['spent'])} of the {format_money(status['budget'])} "
        f"monthly budget ({100 * status['fraction']:.0f}%)"
    )


_BOUND_WORDS = {"idle": "idle stop", "max_runtime": "max runtime", "max_cost": "max cost"}


def policy_bound_text(bound: dict) -> str:
    """'idle stop 30m: the most your policy allows (/etc/jupyter/gpusession_policy.json)'."""
    limit = bound["limit"]
    value = format_money(limit) if bound["field"] == "max_cost" else format_bound(limit)
    words = _BOUND_WORDS.get(bound["field"], bound["field"])
    return f"{words} {value}: the most your policy allows ({bound['policy']})"


def start_notes(record: SessionRecord) -> list[str]:
    """What a start says before it begins: where a resume goes, the bounds a policy put in, a
    budget near its end."""
    resumed = resumed_where_line(record)
    notes = [resumed] if resumed else []
    notes += [policy_bound_text(b) for b in record.spec.extra.get("policy_bounds") or []]
    warning = budget_warning(record.resource.get("budget"))
    return notes + ([warning] if warning else [])


def budget_warning(status: dict | None) -> str | None:
    """What a start says when the month's spend passed 80% of the budget (None otherwise)."""
    if not status:
        return None
    return (
        f"WARNING: {budget_line(status)}; at 100% starts are refused (raise it: {status['source']})"
    )


def catalog_refresh_line(doc: dict) -> str:
    """`gpusession catalog refresh`: what was written, in one line."""
    changed = len(doc["changed"])
    missing = (
        f"; {len(doc['missing'])} unpriced kept the package's price ({', '.join(doc['missing'])})"
        if doc["missing"]
        else ""
    )
    return (
        f"catalog refreshed: on-demand prices of {doc['priced']} of {doc['of']} {doc['rows']} "
        f"({changed} changed), dated {doc['date']} (was {doc['was']}), in {doc['path']}{missing}"
    )


def live_price_lines(rows: list[dict], prices_line: str) -> list[str]:
    """`%gpu types --live`: the current spot price per zone beside the catalog's on-demand."""
    if not rows:
        return ["no live prices: no cloud backend answered (own hardware has none)"]
    table = [("TYPE", "INSTANCE", "ZONE", "SPOT $/H", "ON-DEMAND $/H", "SPOT SAVES")]
    for r in rows:
        spot = r.get("spot")
        saves = "-" if spot is None else f"{100 * (1 - spot / r['on_demand']):.0f}%"
        table.append(
            (
                r["type"],
                r["instance"],
                r.get("zone") or f"{r['region']}: no spot price",
                "-" if spot is None else (f"{spot:.4f}" if spot >= 0.001 else f"{spot:.2g}"),
                f"{r['on_demand']:.4f}",
                saves,
            )
        )
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in table]
    sources = ", ".join(dict.fromkeys(r.get("source") or "its cloud" for r in rows))
    lines.append(
        f"Spot: now, from {sources}; {prices_line} (`gpusession catalog refresh` renews them)."
    )
    return lines


def live_spot_line(rows: list[dict], gpu_type: str) -> str:
    """The start forms' line under the GPU type when spot is asked for: the current spot price
    of its instance in the cheapest zone of the allowed regions (`live_prices` rows), beside the
    catalog's on-demand price: 'spot now $0.1578/h for g4dn.xlarge in us-east-1c, the cheapest
    of 5 zones (on demand $0.5260/h)'."""
    mine = [r for r in rows if r["type"] == gpu_type and r.get("spot") is not None]
    if not mine:
        return f"no current spot price for {gpu_type} in the allowed regions"
    best = min(mine, key=lambda r: (r["spot"], r["zone"]))
    zones = f"the cheapest of {len(mine)} zones" if len(mine) > 1 else "the one zone with a price"
    return (
        f"spot now {format_money(best['spot'])}/h for {best['instance']} in {best['zone']}, "
        f"{zones} (on demand {format_money(best['on_demand'])}/h)"
    )
