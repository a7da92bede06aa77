"""Workspaces and checkpoints in words: what a save kept, what a resume brought back, the
workspaces table and its REST view, gc's report of a workspace no session uses; and a transfer's
progress and result lines."""

from __future__ import annotations

from typing import Any, Iterable

from ..core.durations import format_duration, format_money
from .common import size_text


def transfer_line(verb: str, done: int, total: int | None, elapsed: float) -> str:
    """`upload  45% |#########-----------| 45 MB / 100 MB  210 MB/s  ETA 0.3s` (a bar while bytes
    move; without a known total: bytes and rate)."""
    # lazy: docs/architecture.md#imports-kept-inside-functions
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
    # lazy: docs/architecture.md#imports-kept-inside-functions
    from ..transport.pulls import format_bytes

    refused = result.get("refused") or []  # each by name: the rest was written
    line = f"{verb} {what} ({result.get('files', 0)} files, {format_bytes(result.get('bytes', 0))}) {where}"
    return line + (
        f"; not written, {len(refused)} refused: " + "; ".join(refused) if refused else ""
    )


_WHY = {
    "generator": "a generator",
    "open file": "an open file",
    "socket": "a socket",
    "thread": "a thread",
    "does not pickle": "does not pickle",
    "time bound": "the save time bound passed first",
    "reserved": "IPython's own name: never saved, it would replace IPython's",
}


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
    if report.get("on_cpu"):
        lines.append(
            f"  on the CPU: {', '.join(report['on_cpu'])}: saved on a GPU, and no GPU is visible "
            "here (move them back with .to('cuda') where one is)"
        )
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


def host_failed_line(item: dict, command: str = "gpusession workspaces") -> str:
    """A host a workspace listing could not reach, said once: it is remembered and not asked
    again (so no later listing waits on it) until forgotten with --retry-hosts."""
    return (
        f"skipped {item['backend']} host {item['host']}: {item['error']}; its workspaces are not "
        f"listed, and later listings do not ask it again until `{command} --retry-hosts`"
    )


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
        "last_type": view.last_type,
        "saved_at": view.saved_at,
        "pick_text": pick_text(view),
    }


def pick_text(view: Any) -> str:
    """A workspace in the start form's Resume pick list: what it was, where, when, how big.
    't4-3 · T4 on local · saved 5m ago · 1.0 kB'."""
    ws = view.workspace
    what = f"{view.last_type.upper()} on {ws.backend}" if view.last_type else ws.backend
    parts = [ws.name, what]
    if view.saved_at:
        parts.append(f"saved {format_duration(max(0.0, _now() - view.saved_at))} ago")
    parts.append(size_text(ws.size_bytes))
    return " · ".join(parts)


def resumed_where_line(record) -> str | None:
    """A --resume start sent where its workspace lives (spec.extra["resumed_where"]): where,
    and how to choose otherwise; None for any other start."""
    taken = record.spec.extra.get("resumed_where")
    if not taken:
        return None
    where = taken["backend"] + (f" on {taken['place']}" if taken.get("place") else "")
    image = f", image {taken['image']}" if taken.get("image") else ""
    return (
        f"resuming workspace {record.spec.extra.get('resume')} where it lives: {where}{image} "
        f"(as session {taken['session']} ran; name --backend, its place or --image to choose otherwise)"
    )
