"""The one formatter: every sentence, number and table a user reads is made here, from data.

The magics, the CLI, the widgets and the REST API call these functions, so the notebook, the
terminal, the ipywidgets card and the sidebar show the same numbers the same way. Nothing below
the faces imports this module; nothing parses what it returns.
"""

from __future__ import annotations

import time
from typing import Any, Iterable

from .cost import cost_of, uptime_seconds
from .durations import format_duration, format_money
from .errors import SessionEnded
from .metrics import METRICS, metric_of, metric_text, metrics
from .models import SessionRecord, State
from .protocol import StopKind, StopReason, Warning, WarningKind
from .workspace_words import record_checkpoint_line

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
]


def gpu_label(gpu_type: str, gpu_count: int) -> str:
    """'1 x t4', '8 x a100': how a session's GPUs are named everywhere."""
    return f"{gpu_count} x {gpu_type}"


def kernel_display_name(
    gpu_type: str, gpu_count: int, backend: str | None = None, image: str | None = None
) -> str:
    """A GPU kernelspec's name in JupyterLab's launcher and kernel picker: 'Python 3 (GPU · T4)',
    'Python 3 (GPU · 8 x A100 · docker · my/image:1)' (backend and image only when chosen)."""
    gpus = gpu_type.upper() if gpu_count == 1 else f"{gpu_count} x {gpu_type.upper()}"
    return (
        "Python 3 (" + " · ".join(["GPU", gpus, *(part for part in (backend, image) if part)]) + ")"
    )


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
    return (
        f"spot interruption notice: AWS will {w.action or 'stop'} this instance at "
        f"{w.time or 'any moment'}; save your work"
    )


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
    return f"ran {format_duration(uptime_seconds(record))}, cost {format_money(cost_of(record))}"


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
        return ended_message(exc.record)
    return str(exc)


_GC_VERBS = {  # verb -> (done, dry run)
    "remove": ("removed", "would remove"),
    "stop": ("stopped", "would stop"),
    "record-stopped": ("recorded {} as stopped", "would record {} as stopped"),
    "stop-orphan": ("stopped", "would stop"),
}


def gc_line(action: Any) -> str:
    """One line of `gpusession gc` (a session.gc.GcAction)."""
    done, dry = _GC_VERBS.get(action.verb, (action.verb, "would " + action.verb))
    verb = done if action.done else dry
    if "{}" in verb:
        return f"{verb.format(action.target)} ({action.why})"
    return f"{verb} {action.target} ({action.why})"


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
        values = ", ".join(f"{m.short} {metric_of(m, g)}" for m in metrics("gpu"))
        lines.append(f"  GPU {g['index']} {g.get('name') or '?'}: {values}")
        for p in g.get("processes", []):
            lines.append(
                f"      pid {p['pid']} {p.get('name') or '?'}: {_bytes(p.get('memory_used'))}"
            )
    return lines


def status_lines(stats: dict, *, history: bool = False) -> list[str]:
    """The live part of `%gpu status` / `%gpu watch` / `gpusession stats`."""
    samples = stats.get("samples") or []
    latest = samples[-1] if samples else None
    lines: list[str] = []
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


def session_table(views: list[dict], current: str | None = None) -> str:
    """`%gpu list` / `gpusession list`: one row per session view (SessionManager.view)."""
    rows = [("", "NAME", "TYPE", "BACKEND", "STATE", "UPTIME", "$/H", "COST")]
    for v in views:
        rows.append(
            (
                "*" if v["id"] == current else "",
                v["name"],
                f"{v['gpu_count']}x{v['gpu_type']}",
                v["backend"],
                state_word(v) + ("" if v.get("verified", True) else "?"),
                format_duration(v["uptime_s"]),
                f"{v['price_per_hour']:.3f}",
                format_money(v["cost_so_far"]),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    lines += [f"? {v['name']}: {unverified_text(v)}" for v in views if not v.get("verified", True)]
    return "\n".join(lines)


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
    out["unverified"] = None if out.get("verified", True) else unverified_text(out)
    return out


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
    from .pulls import format_bytes

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
    from .pulls import format_bytes

    refused = result.get("refused") or []  # each by name: the rest was written
    line = f"{verb} {what} ({result.get('files', 0)} files, {format_bytes(result.get('bytes', 0))}) {where}"
    return line + (
        f"; not written, {len(refused)} refused: " + "; ".join(refused) if refused else ""
    )
