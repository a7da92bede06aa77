"""A session as the faces show it: the sessions table, `status`'s heading and live lines (GPUs,
their processes, the host, sparklines, cost, idle, runtime), a failed start's log, the timeline,
and a session view with its words added, as the REST API sends it (rest_view)."""

from __future__ import annotations

import time
from typing import Any

from ..configuration.cost import MINIMUM_BILLED_S
from ..configuration.metrics import metric_of, metrics, nvml_error_text
from ..core.durations import format_duration, format_money
from ..core.models import SessionRecord
from ..core.protocol import StopReason, Warning, WarningKind
from .common import NEVER_RAN, memory_text, price_note
from .spend import advice_line, budget_warning, policy_bound_text
from .stops import budget_level, describe_warning, ended_line, stop_reason_text, warning_texts
from .switches import cut_switch_line


def status_heading(view: dict) -> str:
    """The first line of `%gpu status` and `gpusession status`: 't4-1: 1 x t4 on docker
    (image python:3.12-slim) - running'."""
    image = f" (image {view['image']})" if view.get("image") else ""
    return (
        f"{view['name']}: {view['gpu_count']} x {view['gpu_type']} on {view['backend']}{image}"
        f" - {view['state']}"
    )


def placement_line(view: dict) -> str | None:
    """How a session was placed, for `status` (both faces) and the REST view: the type a
    fallback list took and why the earlier ones were passed over; the GPUs of its box it holds.
    None when there is nothing to say."""
    parts = []
    if view.get("passed_over"):
        passed = "; ".join(f"{p['type']}: {p['why']}" for p in view["passed_over"])
        parts.append(
            f"took {view['gpu_type']}:{view['gpu_count']} of {', '.join(view.get('types') or [])} "
            f"(passed over {passed})"
        )
    elif view.get("types"):
        parts.append(
            f"{view['gpu_type']}:{view['gpu_count']}, the first of {', '.join(view['types'])}"
        )
    if view.get("pool_choice"):
        parts.append(view["pool_choice"])
    if view.get("gpu_indices"):
        held = ", ".join(str(i) for i in view["gpu_indices"])
        parts.append(f"holds GPU {held} of {view.get('host') or 'this machine'}")
    return "; ".join(parts) or None


def rate_text(view: dict) -> str:
    """A session view's price: '$0.5260/h (cloud rate, own hardware)', '$3.0600/h'."""
    note = price_note(view.get("price_basis"))
    rate = f"{format_money(view.get('price_per_hour') or 0.0)}/h"
    return f"{rate} ({note})" if note else rate


def still_billing_line(view: dict) -> str:
    """A second `%gpu start` in a notebook whose session still runs: the first one keeps
    billing, at what rate, and how to stop it (or move it instead of starting another)."""
    return (
        f"note: {view['name']} ({view['gpu_count']} x {view['gpu_type']} on {view['backend']}), "
        f"this notebook's session until now, is still {view['state']} and billing "
        f"{rate_text(view)}: `%gpu stop {view['name']}` stops it; this notebook moves to the "
        "new session (`%gpu switch` moves a session to another GPU instead of starting a second)"
    )


def connected_line(record: SessionRecord) -> str:
    """A notebook connected to a session from the sidebar, at its next `%%gpu` cell."""
    return (
        f"[gpusession] this notebook now uses {record.name} ({record.spec.gpu_count} x "
        f"{record.spec.gpu_type} on {record.backend}): connected from the sidebar"
    )


def waiting_connected_line(record: SessionRecord) -> str:
    """The session a notebook was connected to is still starting: the cell waits for it."""
    return (
        f"[gpusession] waiting for {record.name}, which this notebook was connected to, "
        f"to start ({record.state.value})"
    )


def ran_text(view: dict) -> str:
    """How long a session view ran: 'ran 1m05s', or 'never ran' (it cost nothing)."""
    return NEVER_RAN if view.get("never_ran") else f"ran {format_duration(view.get('uptime_s'))}"


def image_text(image: Any) -> str:
    """An image a start form offers (backends.base.LocalImage): its size, and whether a session
    started from it here before: 'pytorch/pytorch:2.5 · 3.2 GB · runtime cached'."""
    # lazy: docs/architecture.md#imports-kept-inside-functions
    from ..transport.pulls import format_bytes

    size = format_bytes(image.size_bytes) if image.size_bytes is not None else "size unknown"
    runtime = "runtime cached" if image.runtime_cached else "runtime copied at its first start"
    return f"{image.reference} · {size} · {runtime}"


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


_SPARK = " ▁▂▃▄▅▆▇█"


def sparkline(values: list[float | None], width: int = 40) -> str:
    vals = values[-width:]
    return "".join(
        " " if v is None else _SPARK[min(8, max(0, int(round(v / 100 * 8))))] for v in vals
    )


MIG_UTILIZATION = "n/a (MIG)"  # NVML reports no utilization for a MIG slice: never 0


def gpu_metric_text(metric, gpu: dict) -> str:
    """A GPU's metric in words; a MIG slice's utilization is 'n/a (MIG)', not 0 or '-'."""
    if gpu.get("mig") and metric.name == "utilization" and gpu.get("utilization") is None:
        return MIG_UTILIZATION
    return metric_of(metric, gpu)


def gpu_lines(sample: dict) -> list[str]:
    lines = []
    for g in sample.get("gpus", []):
        if g.get("error"):
            values = nvml_error_text(g["error"])
        else:
            values = ", ".join(f"{m.short} {gpu_metric_text(m, g)}" for m in metrics("gpu"))
        where = f"GPU {g['index']}" + (f" slice {g['slot']}" if g.get("mig") else "")
        lines.append(f"  {where} {g.get('name') or '?'}: {values}")
        for p in g.get("processes", []):
            lines.append(
                f"      pid {p['pid']} {p.get('name') or '?'}: {memory_text(p.get('memory_used'))}"
            )
    return lines


# the label of replayed GPU values (the agent's --nvml-replay, GPUSESSION_NVML_REPLAY) in words
RECORDED_WORDS = (
    "GPU values: recorded (a replay of values recorded from a driver, not this session's GPUs)"
)


def recorded_words(stats: dict) -> str | None:
    """Where replayed GPU values come from, for a stats document: None when they are live; a
    recording of another type of GPU than the session's says so (issue 32 §5)."""
    if stats.get("source") != "recorded":
        return None
    recording = stats.get("recording") or {}
    if recording.get("of_this_type") is False:
        return (
            f"GPU values: recorded on another machine ({recording.get('gpu_count')} x "
            f"{recording.get('gpu_name')}), replayed as this session's GPUs; not this session's "
            "GPUs nor their type"
        )
    return RECORDED_WORDS


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
    recorded = recorded_words(stats)
    if recorded:
        lines.append(f"  {recorded}")
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


def start_log_lines(text: str, lines: int = 20) -> str:
    """The end of a failed start's log (kept in the record), indented under a heading."""
    tail = text.rstrip().splitlines()[-lines:]
    return "\n".join(["  start log (its last lines):", *(f"    | {line}" for line in tail)])


def timeline(record: SessionRecord) -> str:
    t0 = record.events[0].at if record.events else 0.0
    return "\n".join(
        f"    +{e.at - t0:7.2f}s  {e.state.value:<12} {e.detail}".rstrip() for e in record.events
    )


MINIMUM_CHARGE = f"{MINIMUM_BILLED_S:.0f}-second minimum"


def minimum_charge_note(view: dict) -> str | None:
    """Said with the cost while less than a minute is billed: the first minute costs in full
    ('the first minute is billed in full (60-second minimum)' at uptime 0s), else None."""
    billed = view.get("billed_s")
    if billed is None or not 0 < billed < MINIMUM_BILLED_S or not view.get("price_per_hour"):
        return None
    return f"the first minute is billed in full ({MINIMUM_CHARGE})"


def cost_text(view: dict) -> str:
    """The cost so far, with the minimum charge while it applies, and the --max-cost bound:
    '$0.0088 (60-second minimum) of $5.00'."""
    cost = format_money(view["cost_so_far"])
    cost += f" ({MINIMUM_CHARGE})" if minimum_charge_note(view) else ""
    return cost if not view.get("max_cost") else f"{cost} of {format_money(view['max_cost'])}"


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
        out["stop_reason"] = dict(
            reason.to_dict(), text=stop_reason_text(reason, out.get("backend"))
        )
    out["ended"] = ended_line(out.get("state"), reason, out.get("error"), out.get("backend"))
    out["ran"] = ran_text(out)
    out["placement"] = placement_line(out)
    out["price_note"] = price_note(out.get("price_basis"))
    out["cost_note"] = minimum_charge_note(out)
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
        else {
            "level": budget_level(running),
            "text": describe_warning(running, backend=out.get("backend")),
        }
    )
    return out
