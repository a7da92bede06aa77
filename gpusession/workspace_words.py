"""The one formatter's words for workspaces and checkpoints (what a save kept, what a resume
brought back, the workspaces table, gc's report). Part of gpusession.words, in a file of its own
so neither grows past the size limit; the faces call these, nothing below them does.
"""

from __future__ import annotations

from typing import Any, Iterable

from .durations import format_duration, format_money

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
