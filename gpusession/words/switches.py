"""A switch and a recovery in words: the line a switch ends with, what a notebook says when it
follows its session to the one a switch made elsewhere, a recovery's lines (and the cell its
interruption cut), and what a switch cut by its driver's death left (session/orphans.py
`cut_switch`)."""

from __future__ import annotations

import time

from ..core.durations import format_duration, format_money
from ..core.models import SessionRecord
from .common import size_text
from .workspaces import skipped_text


def switch_line(report: dict) -> str:
    """The one line a switch ends with (`SwitchReport.to_dict()`): what moved (variables, files),
    what did not and why (as a resume says), the new rate, the time taken.

    'switched t4-1 in 14.2s: moved 3 name(s) (x, df, np) and the files of workspace
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
    old, new = report.get("old"), report.get("new")
    line = (
        f"switched {old if old == new else f'{old} -> {new}'} in "
        f"{format_duration(report.get('seconds') or 0.0)}: {moved} and {files}{not_moved}; {rate}"
    )
    if not report.get("old_stopped", True):
        former = report.get("former") or old
        line += (
            f"; its former capacity ({former}) did not stop ({report.get('stop_error')}): "
            f"`gpusession stop {former}`"
        )
    return line


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


def followed_line(old: SessionRecord, new: SessionRecord) -> str:
    """What a notebook says when it follows its session to the one a switch made elsewhere (the
    sidebar, the CLI, REST): 'session r1 was switched to 1 x A100 on docker ($2.75/h) by
    gpusession switch; this notebook follows it: the next cell runs there' (a switch named the
    new session: 'session r1 was switched to r2 (...); this notebook now uses r2: ...')."""
    by = old.resource.get("switched_by") or "a switch"
    what = (
        f"{new.spec.gpu_count} x {new.spec.gpu_type.upper()} on {new.backend}, "
        f"{format_money(new.price_per_hour)}/h"
    )
    if old.name.startswith(f"{new.name}~"):  # the successor took the name over (a retired one)
        return (
            f"session {new.name} was switched to {what.replace(', ', ' (', 1)}) by {by}; "
            "this notebook follows it: the next cell runs there"
        )
    return (
        f"session {old.name} was switched to {new.name} ({what}) "
        f"by {by}; this notebook now uses {new.name}: the next cell runs there"
    )


def recovering_line(record: SessionRecord) -> str:
    return f"recovering session {record.name}: a replacement restores its saved state (--recover)"


def recovered_line(old: SessionRecord, new: SessionRecord) -> str:
    """'session sp1 is back: 1 x T4 on aws (spot, $0.53/h), down 1m05s; the next cell runs there'."""
    down = max(0.0, time.time() - max((e.at for e in old.events), default=old.created_at))
    market = "spot, " if new.spec.extra.get("spot") else ""
    return (
        f"session {new.name} is back: {new.spec.gpu_count} x {new.spec.gpu_type.upper()} on "
        f"{new.backend} ({market}{format_money(new.price_per_hour)}/h), down "
        f"{format_duration(down)}; the next cell runs there"
    )


def recovery_failed_line(record: SessionRecord, error: str, workspace: str | None) -> str:
    again = f"`%gpu start --resume {workspace}`" if workspace else "`%gpu start`"
    return f"could not recover session {record.name}: {error}; its state is saved: {again}"


def cell_cut_line(record: SessionRecord) -> str:
    """What the notebook says of the cell that was running when its session's capacity went away
    (a spot notice, a time limit, a preemption): it is never run again by itself."""
    return (
        f"this cell was interrupted when session {record.name} ended: it is not re-run; "
        "run it again once the session is back"
    )
