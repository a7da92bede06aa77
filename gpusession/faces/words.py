"""The one formatter: every sentence, number and table a user reads is made here, from data.

The magics, the CLI, the widgets and the REST API call these functions, so the notebook, the
terminal, the ipywidgets card and the sidebar show the same numbers the same way. Nothing below
the faces imports this module; nothing parses what it returns.
"""

from __future__ import annotations

import re
import time
from typing import Any, Iterable

from ..configuration.cost import CONFIGURED, OWN_HARDWARE, cost_of, never_ran, uptime_seconds
from ..configuration.metrics import METRICS, metric_of, metric_text, metrics, nvml_error_text
from ..core.durations import format_bound, format_duration, format_money
from ..core.errors import SessionEnded
from ..core.models import SessionRecord, State
from ..core.protocol import StopKind, StopReason, Warning, WarningKind

# a process's GPU memory reads as the GPU's memory does
_PROCESS_MEMORY = next(m for m in METRICS if m.scope == "gpu" and m.name == "memory_used")
_SPARK = " ▁▂▃▄▅▆▇█"

__all__ = [
    "format_duration",
    "format_money",
    "gpu_label",
    "kernel_display_name",
    "describe_stop",
    "describe_warning",
    "warning_texts",
    "format_summary",
    "summary_line",
    "ended_message",
    "keepalive_line",
    "status_lines",
    "session_table",
    "timeline",
    "error_text",
    "gc_line",
    "rest_view",
    "ended_line",
    "unverified_text",
    "start_log_lines",
    "idle_setting",
    "usage_error",
    "advice_line",
    "advice_lines",
    "report_lines",
    "budget_line",
    "report_rest",
    "price_sources_text",
    "budget_warning",
    "policy_bound_text",
    "start_notes",
    "live_price_lines",
    "rate_text",
    "ran_text",
    "status_heading",
]


def gpu_label(gpu_type: str, gpu_count: int) -> str:
    """'1 x t4', '8 x a100': how a session's GPUs are named everywhere."""
    return f"{gpu_count} x {gpu_type}"


def kernel_display_name(
    gpu_type: str,
    gpu_count: int,
    backend: str | None = None,
    image: str | None = None,
    price_per_hour: float | None = None,
    note: str | None = None,
) -> str:
    """A GPU kernelspec's name in JupyterLab's launcher and kernel picker: 'Python 3 (GPU · T4)',
    'Python 3 (GPU · 8 x A100 · docker · my/image:1)' (backend and image only when chosen), with
    the price when known and where it comes from (`price_note`) as the cards say it:
    'Python 3 (GPU · T4 · $0.5260/h · cloud rate, own hardware)'."""
    gpus = gpu_type.upper() if gpu_count == 1 else f"{gpu_count} x {gpu_type.upper()}"
    price = f"{format_money(price_per_hour)}/h" if price_per_hour is not None else None
    parts = ["GPU", gpus, *(part for part in (backend, image, price, price and note) if part)]
    return "Python 3 (" + " · ".join(parts) + ")"


# -- why a session ended ----------------------------------------------------------------------

_STOPPED_BY = {
    StopKind.IDLE: "was stopped by its idle watchdog",
    StopKind.MAX_RUNTIME: "was stopped by its max-runtime limit",
    StopKind.MAX_COST: "was stopped by its cost cap",
}


def stop_reason_text(reason: StopReason | None) -> str:
    """The reason alone: 'after 5s idle', 'spent $5.00 of the $5.00 cap', 'stopped by user'."""
    if reason is None:
        return "its remote side is gone"
    k = reason.kind
    if k is StopKind.IDLE:
        return f"after {format_duration(reason.idle_for_s or 0)} idle"
    if k is StopKind.MAX_RUNTIME:
        return f"after {format_duration(reason.elapsed_s or 0)}"
    if k is StopKind.MAX_COST:
        return f"spent ${reason.spent or 0:.2f} of the ${reason.max_cost or 0:.2f} cap"
    if k in (StopKind.USER, StopKind.GC):
        return f"stopped by {reason.by or ('gc' if k is StopKind.GC else 'user')}"
    if k is StopKind.SIGNAL:
        return f"its runtime got signal {reason.signal}"
    if k is StopKind.KERNEL_EXIT:
        return f"its kernel exited with code {reason.exit_code}"
    if k is StopKind.CONTAINER_EXIT:
        return f"its container exited with code {reason.exit_code}"
    if k is StopKind.START_FAILED:
        return f"its start failed: {reason.detail or 'no detail'}"
    if k is StopKind.SPOT_INTERRUPTION:
        return "AWS took the spot instance back" + (f" ({reason.detail})" if reason.detail else "")
    if k is StopKind.INSTANCE_ENDED:
        return f"its instance ended: {reason.detail or 'no reason given'}"
    if k is StopKind.TIME_LIMIT:
        limit = f" ({format_duration(reason.max_runtime_s)})" if reason.max_runtime_s else ""
        return f"the cluster ended its job at the job's time limit{limit}"
    if k is StopKind.PREEMPTED:
        return "the cluster preempted its job" + (f" ({reason.detail})" if reason.detail else "")
    if k is StopKind.JOB_ENDED:
        return f"the cluster ended its job: {reason.detail or 'no reason given'}"
    return reason.detail or "its remote side is gone"


def describe_stop(name: str, reason: StopReason | None) -> str:
    """'session t4-1 was stopped by its idle watchdog after 5s idle'."""
    if reason is None:
        return f"session {name} ended (its remote side is gone)"
    if reason.kind in _STOPPED_BY:
        text = stop_reason_text(reason)
        joiner = " " if text.startswith("after") else ": "
        return f"session {name} {_STOPPED_BY[reason.kind]}{joiner}{text}"
    return f"session {name} ended: {stop_reason_text(reason)}"


# -- warnings ---------------------------------------------------------------------------------


def describe_warning(w: Warning, *, hint: bool = True) -> str:
    """One warning as the notebook prints it. hint=False leaves out the `%gpu keepalive` hint
    (for a panel that has a Keep alive button next to it)."""
    left = format_duration(w.remaining_s) if w.remaining_s is not None else "soon"
    if w.kind is WarningKind.IDLE:
        text = f"idle for {format_duration(w.idle_for_s or 0)}: the session stops in {left} unless it is used"
        return text + (" (`%gpu keepalive 1h` postpones)" if hint else "")
    if w.kind is WarningKind.MAX_RUNTIME:
        return f"max runtime {format_duration(w.limit_s)} reached in {left}: the session stops then"
    if w.kind is WarningKind.MAX_COST:
        eta = f" in about {left}" if w.remaining_s is not None else ""
        return f"spent ${w.spent or 0:.2f} of the ${w.max_cost or 0:.2f} cap: the session stops at the cap{eta}"
    if w.kind is WarningKind.BUDGET:
        return budget_running_text(w)
    return (
        f"spot interruption notice: AWS will {w.action or 'stop'} this instance at "
        f"{w.time or 'any moment'}; save your work"
    )


def budget_running_text(w: Warning) -> str:
    """A running session's budget warning: what the month spent against the budget, and what
    happens to the session (it keeps running, unless a policy stops sessions at its cap)."""
    spent, budget = w.spent or 0.0, w.budget or 0.0
    share = f"{100 * spent / budget:.0f}%" if budget else "all"
    figure = f"this month's GPU spend {format_money(spent)} is {share} of the {format_money(budget)} monthly budget"
    if w.action == "stop":
        return (
            f"{figure}: your policy stops sessions at its cap ({w.source}); this one is stopped now"
        )
    if spent >= budget:
        return f"{figure}: this session keeps running, new starts are refused; stop it when you can (`%gpu stop`)"
    return f"{figure}: this session keeps running; at 100% new starts are refused"


def warning_texts(warnings: Iterable[Any], *, hint: bool = True) -> list[str]:
    """The texts of a stats document's warnings (dicts or Warning), unknown kinds skipped."""
    out = []
    for item in warnings or []:
        w = Warning.from_dict(item)
        if w is not None:
            out.append(describe_warning(w, hint=hint))
    return out


# -- summaries and messages -----------------------------------------------------------------


def format_summary(summary: dict) -> str:
    """One line: duration, cost, GPU-hours, mean GPU utilization, minutes idle."""
    mean = summary.get("mean_gpu_utilization")
    parts = [
        f"ran {format_duration(summary.get('duration_s') or 0)}",
        f"cost {format_money(summary.get('cost') or 0.0)}",
        f"{summary.get('gpu_hours') or 0:.3f} GPU-hours",
        "mean GPU utilization " + (f"{mean:.0f}%" if mean is not None else "n/a (no GPU visible)"),
        f"{summary.get('idle_minutes') or 0:.1f} min idle",
    ]
    return ", ".join(parts)


def summary_line(record: SessionRecord) -> str:
    """From the agent's summary when one was saved, else from the store's transitions."""
    summary = record.resource.get("agent_summary")
    if summary:
        return format_summary(summary)
    if never_ran(record):
        return f"{NEVER_RAN}, cost {format_money(0.0)}"
    return f"ran {format_duration(uptime_seconds(record))}, cost {format_money(cost_of(record))}"


#: an ended session that never got a billed resource (gpusession.configuration.cost.never_ran)
NEVER_RAN = "never ran"

# what a price is, where it is not what a cloud bills (gpusession.configuration.cost's price bases)
_PRICE_NOTES = {OWN_HARDWARE: "cloud rate, own hardware", CONFIGURED: "configured price"}


def price_note(basis: str | None) -> str | None:
    """'cloud rate, own hardware' for the catalog's rate applied to the user's own machine,
    'configured price' for a price the user set; None for what a cloud bills."""
    return _PRICE_NOTES.get(basis or "")


def rate_text(view: dict) -> str:
    """A session view's price: '$0.5260/h (cloud rate, own hardware)', '$3.0600/h'."""
    note = price_note(view.get("price_basis"))
    rate = f"{format_money(view.get('price_per_hour') or 0.0)}/h"
    return f"{rate} ({note})" if note else rate


def image_text(image: Any) -> str:
    """An image a start form offers (backends.base.LocalImage): its size, and whether a session
    started from it here before: 'pytorch/pytorch:2.5 · 3.2 GB · runtime cached'."""
    from ..transport.pulls import format_bytes

    size = format_bytes(image.size_bytes) if image.size_bytes is not None else "size unknown"
    runtime = "runtime cached" if image.runtime_cached else "runtime copied at its first start"
    return f"{image.reference} · {size} · {runtime}"


def status_heading(view: dict) -> str:
    """The first line of `%gpu status` and `gpusession status`: 't4-1: 1 x t4 on docker
    (image python:3.12-slim) - running'."""
    image = f" (image {view['image']})" if view.get("image") else ""
    return (
        f"{view['name']}: {view['gpu_count']} x {view['gpu_type']} on {view['backend']}{image}"
        f" - {view['state']}"
    )


def ran_text(view: dict) -> str:
    """How long a session view ran: 'ran 1m05s', or 'never ran' (it cost nothing)."""
    return NEVER_RAN if view.get("never_ran") else f"ran {format_duration(view.get('uptime_s'))}"


def ended_message(record: SessionRecord) -> str:
    """'session t4-1 was stopped by its idle watchdog after 5s idle (ran 1m05s, cost ...)'."""
    reason = record.stop_reason
    if reason is not None and reason.kind not in (StopKind.USER, StopKind.GC):
        text = describe_stop(record.name, reason)
    elif record.state == State.FAILED:
        text = f"session {record.name} failed: {record.error}"
    elif reason is not None:
        text = f"session {record.name} was {stop_reason_text(reason)}"
    else:
        text = f"session {record.name} is {record.state.value}"
    if record.state.active:
        return text
    saved = record_checkpoint_line(record)  # what its stop saved into the workspace, when it tried
    return f"{text} ({summary_line(record)})" + (f"; {saved}" if saved else "")


def cell_cut_line(record: SessionRecord) -> str:
    """What the notebook says of the cell that was running when its session's capacity went away
    (a spot notice, a time limit, a preemption): it is never run again by itself."""
    return (
        f"this cell was interrupted when session {record.name} ended: it is not re-run; "
        "run it again once the session is back"
    )


def recovering_line(record: SessionRecord) -> str:
    return f"recovering session {record.name}: a replacement restores its saved state (--recover)"


def followed_line(old: SessionRecord, new: SessionRecord) -> str:
    """What a notebook says when it follows its session to the one a switch made elsewhere (the
    sidebar, the CLI, REST): 'session r1 was switched to r1-2 (1 x A100 on docker, $2.75/h) by
    gpusession switch; this notebook now uses r1-2: the next cell runs there'."""
    by = old.resource.get("switched_by") or "a switch"
    return (
        f"session {old.name} was switched to {new.name} ({new.spec.gpu_count} x "
        f"{new.spec.gpu_type.upper()} on {new.backend}, {format_money(new.price_per_hour)}/h) "
        f"by {by}; this notebook now uses {new.name}: the next cell runs there"
    )


def recovered_line(old: SessionRecord, new: SessionRecord) -> str:
    """'session sp1 is back: 1 x T4 on aws (spot, $0.53/h), down 1m05s; the next cell runs there'."""
    down = max(0.0, time.time() - max((e.at for e in old.events), default=old.created_at))
    market = "spot, " if new.spec.spot else ""
    return (
        f"session {new.name} is back: {new.spec.gpu_count} x {new.spec.gpu_type.upper()} on "
        f"{new.backend} ({market}{format_money(new.price_per_hour)}/h), down "
        f"{format_duration(down)}; the next cell runs there"
    )


def recovery_failed_line(record: SessionRecord, error: str, workspace: str | None) -> str:
    again = f"`%gpu start --resume {workspace}`" if workspace else "`%gpu start`"
    return f"could not recover session {record.name}: {error}; its state is saved: {again}"


def usage_error(message: str) -> str:
    """An argument parser's complaint, with what to write when a value starts with '-' (which
    argparse takes for a flag): 'argument --idle: expected one argument' -> ... --idle=-5m."""
    if message.startswith("argument --") and message.endswith("expected one argument"):
        flag = message.split()[1].rstrip(":").split("/")[0]
        return f"{message} (a value that starts with '-' is written {flag}=VALUE)"
    return message


def idle_setting(timeout_s: float | None) -> str:
    """A session's idle stop as the start says it: 'idle stop after 30m00s', 'idle stop: off'
    (`--idle off`, or 0, which means off too)."""
    return f"idle stop after {format_duration(timeout_s)}" if timeout_s else "idle stop: off"


def keepalive_line(name: str, granted: dict, asked_s: float) -> str:
    line = f"{name}: idle stop postponed by {format_duration(granted['granted_s'])}"
    if granted.get("capped"):
        line += (
            f" (capped at {format_duration(granted['limit_s'])}, asked {format_duration(asked_s)})"
        )
    idle = granted.get("idle") or {}
    if idle.get("remaining_s") is not None:
        line += f"; stops in {format_duration(idle['remaining_s'])} unless used"
    elif idle.get("timeout_s") is None:
        line += "; its idle stop is off anyway"
    return line


def error_text(exc: BaseException) -> str:
    """What a face shows for one of our errors (a session that ended says how)."""
    if isinstance(exc, SessionEnded):
        cut = getattr(exc, "during", "")
        return f"{cut}\n{ended_message(exc.record)}" if cut else ended_message(exc.record)
    return str(exc)


# "Cell In[6], line 3" as IPython writes it, colours (ANSI escapes) between the words or not
_CELL_REF = re.compile(r"(Cell(?:\x1b\[[\d;]*m)*\s(?:\x1b\[[\d;]*m)*)In\[(\d+)\]")


def renumber_cells(traceback: list[str], numbers: dict[int, int], session: str) -> list[str]:
    """A remote traceback with its cells named as this notebook numbers them: `numbers` maps the
    session kernel's execution count to the notebook's ("Cell In[6]" of the session is the
    notebook's "Cell In[9]"); a cell this notebook did not send says whose it is."""

    def name(match: re.Match) -> str:
        remote = int(match.group(2))
        local = numbers.get(remote)
        where = f"In[{local}]" if local is not None else f"In[{remote} of session {session}]"
        return match.group(1) + where

    return [_CELL_REF.sub(name, line) for line in traceback]


def interrupt_line(name: str, stopped: bool, why: str) -> str:
    """The one line of ours under an interrupted %%gpu cell's remote traceback: it stopped, or
    `why` it did not."""
    if stopped:
        return f"[gpusession] interrupted the cell in session {name}; its variables are kept"
    return f"[gpusession] {why}"


_GC_VERBS = {  # verb -> (done, dry run)
    "remove": ("removed", "would remove"),
    "stop": ("stopped", "would stop"),
    "record-stopped": ("recorded {} as stopped", "would record {} as stopped"),
    "record-running": ("recorded {} as running", "would record {} as running"),
    "settle": ("settled {}", "would stop {} unless it answers"),
    "stop-orphan": ("stopped", "would stop"),
}


def gc_line(action: Any) -> str:
    """One line of `gpusession gc` (a session.gc.GcAction)."""
    done, dry = _GC_VERBS.get(action.verb, (action.verb, "would " + action.verb))
    verb = done if action.done else dry
    if "{}" in verb:
        return f"{verb.format(action.target)} ({action.why})"
    return f"{verb} {action.target} ({action.why})"


# -- right-sizing advice (gpusession/configuration/advice.py) ------------------------------------------------


def _on(gpu_type: str, gpu_count: int, price: float) -> str:
    return f"{gpu_label(gpu_type, gpu_count)} ({format_money(price)}/h)"


def usage_figures_text(figures: dict) -> str:
    """'peak 3.1 GiB (95th percentile 3.1 GiB) of 39.6 GiB, utilization mean 3%, 95th percentile 12%'."""
    mean, p95 = figures.get("utilization_mean"), figures.get("utilization_p95")
    text = (
        f"peak {_bytes(figures['memory_peak'])} (95th percentile {_bytes(figures['memory_p95'])})"
        f" of {_bytes(figures['memory_total'])}"
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
    use = f"peak {_bytes(f['memory_peak'])}" + (
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
            else f"memory reached {_bytes(f['memory_peak'])} of {_bytes(f['memory_total'])}"
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


# -- the spend report (gpusession/configuration/cost.py spend_report) ----------------------------------------

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
    """What a start says before it begins: the bounds a policy put in, a budget near its end."""
    notes = [policy_bound_text(b) for b in record.spec.extra.get("policy_bounds") or []]
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
        f"catalog refreshed: on-demand prices of {doc['priced']} of {doc['of']} instance types "
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
    lines.append(
        "Spot: now, from AWS (DescribeSpotPriceHistory, asked at most every 5 minutes); "
        f"{prices_line} (`gpusession catalog refresh` renews them)."
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


# -- live stats -------------------------------------------------------------------------------


def _bytes(n: int | None) -> str:
    return "?" if n is None else metric_text(_PROCESS_MEMORY, n)


def sparkline(values: list[float | None], width: int = 40) -> str:
    vals = values[-width:]
    return "".join(
        " " if v is None else _SPARK[min(8, max(0, int(round(v / 100 * 8))))] for v in vals
    )


def gpu_lines(sample: dict) -> list[str]:
    lines = []
    for g in sample.get("gpus", []):
        if g.get("error"):
            values = nvml_error_text(g["error"])
        else:
            values = ", ".join(f"{m.short} {metric_of(m, g)}" for m in metrics("gpu"))
        lines.append(f"  GPU {g['index']} {g.get('name') or '?'}: {values}")
        for p in g.get("processes", []):
            lines.append(
                f"      pid {p['pid']} {p.get('name') or '?'}: {_bytes(p.get('memory_used'))}"
            )
    return lines


# the label of replayed GPU values (the agent's --nvml-replay, GPUSESSION_NVML_REPLAY) in words
RECORDED_WORDS = (
    "GPU values: recorded (a replay of values recorded from a driver, not this session's GPUs)"
)


def with_error_texts(sample: dict) -> dict:
    """A stats sample as the REST API serves it: each lost GPU's `error` (an NVML kind) said in
    words too, as `error_text`, so that the JupyterLab faces say what the others do."""
    gpus = sample.get("gpus") or []
    if not any(g.get("error") for g in gpus):
        return sample
    return dict(
        sample,
        gpus=[
            dict(g, error_text=nvml_error_text(g["error"])) if g.get("error") else g for g in gpus
        ],
    )


def status_lines(stats: dict, *, history: bool = False) -> list[str]:
    """The live part of `%gpu status` / `%gpu watch` / `gpusession stats`."""
    samples = stats.get("samples") or []
    latest = samples[-1] if samples else None
    lines: list[str] = []
    if stats.get("source") == "recorded":
        lines.append(f"  {RECORDED_WORDS}")
    if not stats.get("gpus_visible"):
        lines.append(f"  {stats.get('message') or 'no NVIDIA GPU visible'}")
    if latest is not None:
        lines += gpu_lines(latest)
        host = [f"{m.short} {metric_of(m, latest)}" for m in metrics("host")]
        lines.append(
            f"  {', '.join(host)}, kernel {'busy' if latest.get('kernel_busy') else 'idle'}"
        )
        if history and len(samples) > 1:
            if stats.get("gpus_visible"):
                for i in range(len(latest.get("gpus", []))):
                    utils = [
                        next((g.get("utilization") for g in s["gpus"] if g["index"] == i), None)
                        for s in samples
                    ]
                    lines.append(f"  GPU {i} util |{sparkline(utils)}|")
            lines.append(
                f"  CPU      |{sparkline([min(100.0, s.get('cpu_percent') or 0.0) for s in samples])}|"
            )
    else:
        lines.append("  no sample yet")
    cost, idle, runtime = (
        stats.get("cost") or {},
        stats.get("idle") or {},
        stats.get("runtime") or {},
    )
    money = f"  cost {format_money(cost.get('so_far') or 0.0)} at {format_money(cost.get('price_per_hour') or 0.0)}/h"
    if cost.get("max_cost"):
        money += f" (cap {format_money(cost['max_cost'])})"
    lines.append(money)
    if idle.get("timeout_s"):
        line = (
            f"  idle {format_duration(idle.get('idle_for_s'))} of {format_duration(idle['timeout_s'])}"
            f"{' (GPU only)' if idle.get('gpu_only') else ''}: stops in {format_duration(idle.get('remaining_s'))}"
        )
        if idle.get("keepalive_until"):
            line += f", kept alive until {time.strftime('%H:%M:%S', time.localtime(idle['keepalive_until']))}"
        lines.append(line)
    else:
        lines.append("  idle stop: off")
    if runtime.get("max_runtime_s"):
        lines.append(
            f"  max runtime {format_duration(runtime['max_runtime_s'])}: {format_duration(runtime.get('remaining_s'))} left"
        )
    lines += [f"  WARNING: {w}" for w in warning_texts(stats.get("warnings"))]
    return lines


# -- tables -----------------------------------------------------------------------------------


def session_table(
    views: list[dict], current: str | None = None, *, command: str = "gpusession"
) -> str:
    """`%gpu list` / `gpusession list`: one row per session view (SessionManager.view), then a
    line per cut switch among them (`command`: how the lines name the face's commands)."""
    rows = [("", "NAME", "TYPE", "BACKEND", "STATE", "UPTIME", "$/H", "COST")]
    for v in views:
        rows.append(
            (
                "*" if v["id"] == current else "",
                v["name"],
                f"{v['gpu_count']}x{v['gpu_type']}",
                v["backend"],
                state_word(v) + ("" if v.get("verified", True) else "?"),
                NEVER_RAN if v.get("never_ran") else format_duration(v["uptime_s"]),
                f"{v['price_per_hour']:.3f}"
                + (f" ({note})" if (note := price_note(v.get("price_basis"))) else ""),
                format_money(v["cost_so_far"]),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    lines += [f"? {v['name']}: {unverified_text(v)}" for v in views if not v.get("verified", True)]
    cuts = [cut_switch_line(v["cut_switch"], command) for v in views if v.get("cut_switch")]
    lines += [f"! {line}" for line in dict.fromkeys(cuts)]  # the old and the new say the same
    return "\n".join(lines)


_CUT_AT = {
    "save": "while {old} saved its variables",
    "move": "while the workspace moved",
    "start": "while {new} started",
    "stop-old": "as {old} was to stop",
}


def cut_switch_line(cut: dict, command: str = "gpusession") -> str:
    """What a switch cut by its driver's death left, and what to do, in one line
    (session/orphans.py `cut_switch`: the data; `command`: "gpusession" or "%gpu").

    'switch t4-1 -> a100-1 was cut while a100-1 started (the process running it died): both run
    (t4-1 at $0.5260/h, a100-1 at $2.75/h); your variables are in t4-1: `%gpu stop a100-1`, or
    `%gpu switch` again'"""
    old, new = cut["old"], cut["new"]
    at = _CUT_AT.get(cut.get("step") or "", "at {step}").format(
        old=old, new=new, step=cut.get("step")
    )
    head = f"switch {old} -> {new} was cut {at} (the process running it died)"
    again = "`%gpu switch` again" if command == "%gpu" else f"`{command} switch {old}` again"
    if cut.get("saved"):
        resume = "`%gpu start --resume" if command == "%gpu" else f"`{command} start --resume"
        return (
            f"{head}: neither runs; your variables are saved in workspace {cut['saved']}: "
            f"{resume} {cut['saved']}` brings them back"
        )
    if cut.get("kept") == "old":
        return (
            f"{head}: {new} was stopped (GpuSessionConfig.cut_switch = keep-old); {old} runs on "
            "with your variables"
        )
    old_state, new_state = cut.get("old_state"), cut.get("new_state")
    if old_state == "running" and new_state == "running":
        rates = (
            f"{old} at {format_money(cut.get('old_price') or 0.0)}/h, "
            f"{new} at {format_money(cut.get('new_price') or 0.0)}/h"
        )
        if cut.get("step") == "stop-old":
            return (
                f"{head}: both run ({rates}); {new} has your variables (restored from what {old} "
                f"saved): `{command} stop {old}` finishes the switch"
            )
        return (
            f"{head}: both run ({rates}); your variables are in {old}: `{command} stop {new}`, "
            f"or {again}"
        )
    if old_state == "running":
        ended = (
            f"{new} did not answer and was removed"
            if cut.get("new_ran")
            else f"{new} never started (billed nothing)"
        )
        return f"{head}: {ended}; {old} runs on with your variables: {again}"
    return f"{head}: {old} is {old_state}, {new} is {new_state}"


def state_word(view: dict) -> str:
    """A view's state for a table: 'interrupted, state saved' for a session whose capacity went
    away (a spot interruption, a time limit, a preemption) after its agent saved the namespace
    (`--resume` picks it up), 'interrupted' when nothing was saved, else the state itself."""
    reason = StopReason.from_dict(view.get("stop_reason"))
    if reason is None or not reason.kind.interruption:
        return view["state"]
    return "interrupted, state saved" if view.get("resume") else "interrupted"


def unverified_text(view: dict) -> str:
    """Why a running row carries '?': its backend is not asked when listing (aws; a remote
    Docker engine this process has no connection to), and when it was last known alive."""
    seen = view.get("last_seen")
    ago = (
        f"last seen alive {format_duration(time.time() - seen)} ago" if seen else "never seen alive"
    )
    where = f"its engine {view['host'][:60]}" if view.get("host") else view["backend"]
    return f"unverified ({where} is not asked when listing), {ago}"


def start_log_lines(text: str, lines: int = 20) -> str:
    """The end of a failed start's log (kept in the record), indented under a heading."""
    tail = text.rstrip().splitlines()[-lines:]
    return "\n".join(["  start log (its last lines):", *(f"    | {line}" for line in tail)])


def timeline(record: SessionRecord) -> str:
    t0 = record.events[0].at if record.events else 0.0
    return "\n".join(
        f"    +{e.at - t0:7.2f}s  {e.state.value:<12} {e.detail}".rstrip() for e in record.events
    )


# -- REST -------------------------------------------------------------------------------------


def rest_view(view: dict) -> dict:
    """A session view with its words added (what the sidebar shows): `idle.warning` (the joined
    warnings, without the keepalive hint: the card has a button), `stop_reason.text`."""
    out = dict(view)
    idle = dict(out.get("idle") or {})
    texts = warning_texts(out.get("warnings") or [], hint=False)
    idle["warning"] = "; ".join(texts) or None
    out["idle"] = idle
    reason = StopReason.from_dict(out.get("stop_reason"))
    if reason is not None:
        out["stop_reason"] = dict(reason.to_dict(), text=stop_reason_text(reason))
    out["ended"] = ended_line(out.get("state"), reason, out.get("error"))
    out["ran"] = ran_text(out)
    out["price_note"] = price_note(out.get("price_basis"))
    out["unverified"] = None if out.get("verified", True) else unverified_text(out)
    if out.get("advice"):
        out["advice"] = dict(out["advice"], text=advice_line(out["advice"]))
    out["policy"] = [policy_bound_text(b) for b in out.get("policy_bounds") or []]
    out["budget_warning"] = budget_warning(out.get("budget"))
    # a switch it took part in was cut: the same line on the old card and the new one
    out["cut_switch_text"] = (
        cut_switch_line(out["cut_switch"], "%gpu") if out.get("cut_switch") else None
    )
    running = next(
        (
            w
            for w in map(Warning.from_dict, out.get("warnings") or [])
            if w and w.kind is WarningKind.BUDGET
        ),
        None,
    )  # the month ran out of budget while it runs: the sidebar notifies once per level
    out["budget_alert"] = (
        None
        if running is None
        else {"level": budget_level(running), "text": describe_warning(running)}
    )
    return out


def budget_level(w: Warning) -> str:
    """'warn' (80% of the budget spent) or 'over' (all of it): a budget warning is said once
    per level."""
    return "over" if (w.spent or 0.0) >= (w.budget or 0.0) else "warn"


def ended_line(state: str | None, reason: StopReason | None, error: str | None) -> str | None:
    """How an ended session ended, for a history list: 'stopped by its idle watchdog after 5s
    idle', 'stopped by the JupyterLab sidebar', 'failed: connect: ...'. None while it is active."""
    if state not in (State.STOPPED.value, State.FAILED.value):
        return None
    if state == State.FAILED.value and error:
        return f"failed: {error}"
    if reason is None:
        return state
    if reason.kind in _STOPPED_BY:
        text = stop_reason_text(reason)
        joiner = " " if text.startswith("after") else ": "
        return _STOPPED_BY[reason.kind].removeprefix("was ") + joiner + text
    if reason.kind in (StopKind.USER, StopKind.GC):
        return stop_reason_text(reason)
    if reason.kind.interruption:  # the table's word ("interrupted, state saved") goes first
        return f"interrupted: {stop_reason_text(reason)}"
    return f"{state}: {stop_reason_text(reason)}"


def transfer_line(verb: str, done: int, total: int | None, elapsed: float) -> str:
    """`upload  45% |#########-----------| 45 MB / 100 MB  210 MB/s  ETA 0.3s` (a bar while bytes
    move; without a known total: bytes and rate)."""
    from ..transport.pulls import format_bytes

    rate = done / elapsed if elapsed > 0 else 0.0
    speed = f"{format_bytes(rate)}/s" if elapsed > 0 else ""
    if not total:
        return f"{verb}  {format_bytes(done)}  {speed}"
    part = min(done / total, 1.0)
    eta = (
        f"ETA {format_duration((total - done) / rate)}"
        if 0 < rate and done < total
        else f"in {elapsed:.1f}s"
    )
    bar = "#" * round(part * 20) + "-" * (20 - round(part * 20))
    return f"{verb} {part * 100:3.0f}% |{bar}| {format_bytes(done)} / {format_bytes(total)}  {speed}  {eta}"


def transfer_done(verb: str, what: str, result: dict, where: str) -> str:
    """`uploaded 12 files (3 MB) to /workspace in session t4-1`."""
    from ..transport.pulls import format_bytes

    refused = result.get("refused") or []  # each by name: the rest was written
    line = f"{verb} {what} ({result.get('files', 0)} files, {format_bytes(result.get('bytes', 0))}) {where}"
    return line + (
        f"; not written, {len(refused)} refused: " + "; ".join(refused) if refused else ""
    )


# Workspaces and checkpoints: what a save kept, what a resume brought back, the workspaces
# table, gc's report.

_WHY = {
    "generator": "a generator",
    "open file": "an open file",
    "socket": "a socket",
    "thread": "a thread",
    "does not pickle": "does not pickle",
    "time bound": "the save time bound passed first",
    "reserved": "IPython's own name: never saved, it would replace IPython's",
}


def size_text(n: int | None) -> str:
    """1.2 GB, 340 MB, 12 kB, 512 bytes; '?' when unknown."""
    if n is None:
        return "?"
    for unit, size in (("TB", 1000**4), ("GB", 1000**3), ("MB", 1000**2), ("kB", 1000)):
        if n >= size:
            return f"{n / size:.1f} {unit}" if n < 10 * size else f"{n / size:.0f} {unit}"
    return f"{n} bytes"


def skipped_text(item: dict) -> str:
    """'g (a generator)', 'blob (bytes over the 1.0 MB cap)'."""
    why = item.get("why", "")
    if why == "over cap":
        text = f"{item.get('type', 'value')} over the {size_text(item.get('cap_bytes'))} cap per variable (--save-cap)"
    elif why == "does not pickle" and item.get("error"):
        text = f"does not pickle: {item['error']}"
    else:
        text = _WHY.get(why, why)
    return f"{item.get('name', '?')} ({text})"


def checkpoint_line(result: dict | None, workspace: str | None) -> str | None:
    """'saved 12 variables and 2 imports, 340 MB; skipped: g (a generator); resume with `%gpu
    start --resume ws`', or why nothing was saved; None when no save was tried."""
    if not result:
        return None
    skipped = result.get("skipped") or []
    tail = f"; skipped: {', '.join(skipped_text(s) for s in skipped)}" if skipped else ""
    if not result.get("committed"):
        why = result.get("error") or "unknown"
        if why == "time bound":
            why = f"the save time bound ({format_duration(result.get('timeout_s') or 0)}) passed first"
        kept = (
            f"; the workspace keeps its files{' and its previous checkpoint' if workspace else ''}"
        )
        return f"variables not saved: {why}{kept}{tail}"
    imports, count = result.get("imports") or 0, result.get("saved", 0)
    saved = f"saved {_many(count, 'variable')}" + (
        f" and {_many(imports, 'import')}" if imports else ""
    )
    resume = f"; resume with `%gpu start --resume {workspace}`" if workspace else ""
    return f"{saved}, {size_text(result.get('bytes'))}{tail}{resume}"


def record_checkpoint_line(record) -> str | None:
    """The checkpoint line of an ended session: its `stop --save`, or its watchdog's save."""
    result = record.resource.get("checkpoint") or (record.resource.get("agent_summary") or {}).get(
        "checkpoint"
    )
    return checkpoint_line(result, record.resource.get("workspace"))


def restore_lines(report: dict | None, workspace: str | None) -> list[str]:
    """What a resumed start brought back: one line for what came back, one per variable that
    did not (failed to load, or skipped when it was saved)."""
    if report is None:
        return []
    damage = _damage_line(report, workspace)
    if not report.get("found"):
        why = report.get("error") or (
            "its checkpoint is damaged" if damage else "it has no saved variables"
        )
        return [f"workspace {workspace}: nothing restored ({why}); its files are there"] + damage
    names = list(report.get("restored") or []) + list(report.get("imports") or [])
    when = (
        f" from {format_duration(max(0.0, _now() - report['at']))} ago" if report.get("at") else ""
    )
    lines = [
        f"workspace {workspace}: restored {len(names)} name(s){when}: {', '.join(names) or 'none'}"
    ]
    for item in report.get("failed") or []:
        lines.append(f"  not restored: {item.get('name', '?')}: {item.get('error', '')}")
    for item in report.get("skipped") or []:
        lines.append(f"  not restored: {skipped_text(item)}, not saved")
    return lines + damage


def _damage_line(report: dict, workspace: str | None) -> list[str]:
    """'  its checkpoint is damaged (its manifest: empty); kept aside as .gpusession/...' or nothing."""
    if not report.get("damaged"):
        return []
    kept = report.get("kept_aside") or []
    aside = f"; kept aside in the workspace as {', '.join(kept)}" if kept else ""
    return [
        f"  workspace {workspace}: its checkpoint is damaged ({'; '.join(report['damaged'])}){aside}; "
        "what could be read was restored"
    ]


def _many(n: int, what: str) -> str:
    return f"{n} {what}" + ("" if n == 1 else "s")


def _now() -> float:
    import time

    return time.time()


def workspace_table(views: Iterable[Any]) -> str:
    """`gpusession workspaces`: name, backend, size, monthly cost, sessions, where."""
    rows = [("NAME", "BACKEND", "SIZE", "COST/MONTH", "SESSIONS", "WHERE")]
    for v in views:
        ws = v.workspace
        users = ", ".join(v.active) + (" (active)" if v.active else "")
        if not v.active:
            users = "in use" if ws.in_use_by else ("none left" if v.sessions else "none known")
        cost = format_money(ws.monthly_cost) if ws.monthly_cost is not None else "-"
        rows.append((ws.name, ws.backend, size_text(ws.size_bytes), cost, users, ws.where))
    if len(rows) == 1:
        return "no workspaces. A session's workspace is made at its start (--workspace NAME; default: its name)."
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1] for r in rows)


def orphaned_line(view: Any) -> str:
    """gc's report of a workspace whose sessions are all gone (it never deletes one)."""
    ws = view.workspace
    return (
        f"kept workspace {ws.name} ({ws.where}, {size_text(ws.size_bytes)}): no session uses it; "
        f"`gpusession workspaces rm {ws.name} --yes` deletes it"
    )


def print_checkpoint(record, emit) -> None:
    """A stopped session's checkpoint line, when a save was tried (`emit`: the face's print)."""
    line = record_checkpoint_line(record)
    if line:
        emit(line)


def print_restored(record, emit) -> None:
    """A resumed start's restore lines (`emit`: the face's print)."""
    for line in restore_lines(record.resource.get("restored"), record.resource.get("workspace")):
        emit(line)


def workspace_rest_view(view: Any) -> dict[str, Any]:
    """A workspace as REST `GET workspaces` shows it: the table's columns as data, with their
    words (`size`, `cost_per_month`, `used_by`) beside the numbers."""
    ws = view.workspace
    if view.active:
        used_by = ", ".join(view.active) + " (active)"
    else:
        used_by = "in use" if ws.in_use_by else ("none left" if view.sessions else "none known")
    return {
        "name": ws.name,
        "backend": ws.backend,
        "where": ws.where,
        "size_bytes": ws.size_bytes,
        "size": size_text(ws.size_bytes),
        "monthly_cost": ws.monthly_cost,
        "cost_per_month": format_money(ws.monthly_cost) if ws.monthly_cost is not None else None,
        "sessions": list(view.sessions),
        "active": list(view.active),
        "in_use": not view.orphaned,
        "used_by": used_by,
    }


def switch_line(report: dict) -> str:
    """The one line a switch ends with (`SwitchReport.to_dict()`): what moved (variables, files),
    what did not and why (as a resume says), the new rate, the time taken.

    'switched t4-1 -> a100-1 in 14.2s: moved 3 name(s) (x, df, np) and the files of workspace
    t4-1 (210 MB, from docker (this machine's engine) to docker ssh://gpu1); not moved: g (a
    generator); now $2.75/h (was $0.5260/h)'"""
    restored = report.get("restored") or {}
    names = list(restored.get("restored") or []) + list(restored.get("imports") or [])
    if restored.get("found"):
        moved = f"moved {len(names)} name(s) ({', '.join(names) or 'none'})"
    else:
        moved = f"no variables moved ({restored.get('error') or 'nothing was restored'})"
    ws = report.get("workspace")
    if report.get("moved_bytes") is None:
        files = f"the files of workspace {ws}, where they were"
    else:
        files = (
            f"the files of workspace {ws} ({size_text(report['moved_bytes'])}, from "
            f"{report.get('moved_from')} to {report.get('moved_to')})"
        )
    missing = [
        f"{item.get('name', '?')}: {item.get('error', '')}" for item in restored.get("failed") or []
    ] + [f"{skipped_text(item)}, not saved" for item in restored.get("skipped") or []]
    not_moved = f"; not moved: {'; '.join(missing)}" if missing else ""
    rate = (
        f"now {format_money(report.get('price_per_hour') or 0.0)}/h "
        f"(was {format_money(report.get('old_price_per_hour') or 0.0)}/h)"
    )
    line = (
        f"switched {report.get('old')} -> {report.get('new')} in "
        f"{format_duration(report.get('seconds') or 0.0)}: {moved} and {files}{not_moved}; {rate}"
    )
    if not report.get("old_stopped", True):
        line += (
            f"; {report.get('old')} did not stop ({report.get('stop_error')}): "
            f"`gpusession stop {report.get('old')}`"
        )
    return line
