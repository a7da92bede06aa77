"""How a session ends, in words: its stop reason, the ended message with its summary, how it
ended for a history list, the warnings before a stop (idle, max runtime, cost cap, budget, a spot
notice), the idle setting and a keepalive, an interrupted cell, gc's lines, and our errors as a
face shows them."""

from __future__ import annotations

import re
from typing import Any, Iterable

from ..configuration.cost import cost_of, never_ran, uptime_seconds
from ..configuration.registry import load_backend_class
from ..core.durations import format_duration, format_money
from ..core.errors import GpuSessionError, SessionEnded, UnknownSession
from ..core.models import SessionRecord, State
from ..core.protocol import StopKind, StopReason, Warning, WarningKind
from .common import NEVER_RAN
from .workspaces import record_checkpoint_line

_STOPPED_BY = {
    StopKind.IDLE: "was stopped by its idle watchdog",
    StopKind.MAX_RUNTIME: "was stopped by its max-runtime limit",
    StopKind.MAX_COST: "was stopped by its cost cap",
}


def _own_words(backend: str | None, key: str) -> str | None:
    """A backend's own phrase for a stop kind or warning of its capacity (`Backend.stop_words`):
    a cloud says who took a spot instance back; None when it has none (the core's words)."""
    if not backend:
        return None
    try:
        return getattr(load_backend_class(backend), "stop_words", {}).get(key)
    except GpuSessionError:  # a backend not installed here any more
        return None


def stop_reason_text(reason: StopReason | None, backend: str | None = None) -> str:
    """The reason alone: 'after 5s idle', 'spent $5.00 of the $5.00 cap', 'stopped by user'.
    `backend`: the session's, whose own words (if any) say how its capacity ended."""
    if reason is None:
        return "its remote side is gone"
    k = reason.kind
    own = _own_words(backend, k.value)
    if own is not None and "{detail}" in own:
        return own.format(detail=reason.detail or "no reason given")
    if own is not None:
        return own + (f" ({reason.detail})" if reason.detail else "")
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
        detail = f" ({reason.detail})" if reason.detail else ""
        return "its cloud took the spot capacity back" + detail
    if k is StopKind.INSTANCE_ENDED:
        return f"its machine ended: {reason.detail or 'no reason given'}"
    if k is StopKind.TIME_LIMIT:
        limit = f" ({format_duration(reason.max_runtime_s)})" if reason.max_runtime_s else ""
        return f"the cluster ended its job at the job's time limit{limit}"
    if k is StopKind.PREEMPTED:
        return "the cluster preempted its job" + (f" ({reason.detail})" if reason.detail else "")
    if k is StopKind.JOB_ENDED:
        return f"the cluster ended its job: {reason.detail or 'no reason given'}"
    return reason.detail or "its remote side is gone"


def describe_stop(name: str, reason: StopReason | None, backend: str | None = None) -> str:
    """'session t4-1 was stopped by its idle watchdog after 5s idle'."""
    if reason is None:
        return f"session {name} ended (its remote side is gone)"
    if reason.kind in _STOPPED_BY:
        text = stop_reason_text(reason, backend)
        joiner = " " if text.startswith("after") else ": "
        return f"session {name} {_STOPPED_BY[reason.kind]}{joiner}{text}"
    return f"session {name} ended: {stop_reason_text(reason, backend)}"


def ended_line(
    state: str | None, reason: StopReason | None, error: str | None, backend: str | None = None
) -> str | None:
    """How an ended session ended, for a history list: 'stopped by its idle watchdog after 5s
    idle', 'stopped by the JupyterLab sidebar', 'failed: connect: ...'. None while it is active."""
    if state not in (State.STOPPED.value, State.FAILED.value):
        return None
    if state == State.FAILED.value and error:
        return f"failed: {error}"
    if reason is None:
        return state
    if reason.kind in _STOPPED_BY:
        text = stop_reason_text(reason, backend)
        joiner = " " if text.startswith("after") else ": "
        return _STOPPED_BY[reason.kind].removeprefix("was ") + joiner + text
    if reason.kind in (StopKind.USER, StopKind.GC):
        return stop_reason_text(reason, backend)
    if reason.kind.interruption:  # the table's word ("interrupted, state saved") goes first
        return f"interrupted: {stop_reason_text(reason, backend)}"
    return f"{state}: {stop_reason_text(reason, backend)}"


def describe_warning(w: Warning, *, hint: bool = True, backend: str | None = None) -> str:
    """One warning as the notebook prints it. hint=False leaves out the `%gpu keepalive` hint
    (for a panel that has a Keep alive button next to it); `backend`: the session's, whose own
    words (if any) say a notice of its capacity."""
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
    own = _own_words(backend, f"warning:{w.kind.value}")
    return (
        own or "spot interruption notice: its cloud will {action} this machine at {time}"
    ).format(action=w.action or "stop", time=w.time or "any moment") + "; save your work"


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


def budget_level(w: Warning) -> str:
    """'warn' (80% of the budget spent) or 'over' (all of it): a budget warning is said once
    per level."""
    return "over" if (w.spent or 0.0) >= (w.budget or 0.0) else "warn"


def warning_texts(warnings: Iterable[Any], *, hint: bool = True) -> list[str]:
    """The texts of a stats document's warnings (dicts or Warning), unknown kinds skipped."""
    out = []
    for item in warnings or []:
        w = Warning.from_dict(item)
        if w is not None:
            out.append(describe_warning(w, hint=hint))
    return out


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


def ended_message(record: SessionRecord) -> str:
    """'session t4-1 was stopped by its idle watchdog after 5s idle (ran 1m05s, cost ...)'."""
    reason = record.stop_reason
    if reason is not None and reason.kind not in (StopKind.USER, StopKind.GC):
        text = describe_stop(record.name, reason, record.backend)
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


def error_text(exc: BaseException) -> str:
    """What a face shows for one of our errors (a session that ended says how)."""
    if isinstance(exc, SessionEnded):
        cut = getattr(exc, "during", "")
        return f"{cut}\n{ended_message(exc.record)}" if cut else ended_message(exc.record)
    if isinstance(exc, UnknownSession) and exc.key is not None:
        return no_session_text(f"no session named {exc.key!r}", exc.active)
    return str(exc)


def no_session_after_end(
    ended: str, *, said_above: bool = False, active: Iterable[tuple[str, str]] = ()
) -> str:
    """A cell that finds the current session ended: how it ended (its ended line, which says how
    to resume when it saved), unless that line was just said in this same cell; and the sessions
    that are active (`active`: (name, state)), which `%gpu use NAME` connects to."""
    head = "no GPU session: it ended (said above)" if said_above else f"no GPU session: {ended}"
    return after_end(head, active)


def after_end(head: str, active: Iterable[tuple[str, str]] = ()) -> str:
    """A cell's words for a session that ended (`head`), however the notebook learnt of it: the
    sessions active now and `%gpu use NAME`, or, with none, `%gpu start` a new one."""
    active = list(active)
    if not active:
        return f"{head}; `%gpu start` a new one"
    return no_session_text(head, active)


#: how many sessions a "no session" message names
NAMED_AT_MOST = 6


def no_session_text(head: str, active: Iterable[tuple[str, str]]) -> str:
    """Every "no session" message (the magic, the CLI, REST): `head`, the sessions that exist
    (`active`: (name, state), newest first) and `%gpu use NAME`, or how to start one."""
    active = list(active)
    if not active:
        return f"{head}; no session is active: `%gpu start` starts one"
    named = ", ".join(f"{name} ({state})" for name, state in active[:NAMED_AT_MOST])
    more = f" and {len(active) - NAMED_AT_MOST} more" if len(active) > NAMED_AT_MOST else ""
    return (
        f"{head}; active now: {named}{more}: `%gpu use NAME` connects this notebook to one "
        "(`%gpu list` shows them)"
    )


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
