"""The session view: the one JSON shape every face shows (REST `SessionView`), as data."""

from __future__ import annotations

from typing import Any

from ..configuration import options
from ..configuration.advice import advice_document
from ..configuration.catalog import load_catalog
from ..configuration.cost import (
    PRICE_BASIS,
    cost_of,
    never_ran,
    record_billed_seconds,
    uptime_seconds,
)
from ..core.durations import exact_decimal
from ..core.models import LaunchSpec, SessionRecord, State
from .workspace_ops import workspace_claim


def session_view(
    record: SessionRecord,
    live: dict | None = None,
    *,
    verified: bool = True,
    last_seen: float | None = None,
    cut_switch: dict | None = None,
) -> dict[str, Any]:
    """`live`: a recent stats document of the running session (its idle countdown and warnings).
    verified: False for a running session nobody could check just now; last_seen: when it was
    last known alive (session/liveness.py); cut_switch: the cut switch it took part in, as data
    (session/orphans.py `cut_switch`)."""
    started = next((e.at for e in record.events if e.state == State.RUNNING), None)
    stopped = next((e.at for e in reversed(record.events) if not e.state.active), None)
    idle = {"timeout_s": record.spec.idle, "remaining_s": None}
    if live is not None:
        idle = {k: v for k, v in (live.get("idle") or {}).items() if k != "warning"}
    reason = record.stop_reason
    return {
        "id": record.id,
        "name": record.name,
        "backend": record.backend,
        "gpu_type": record.spec.gpu_type,
        "gpu_count": record.spec.gpu_count,
        "state": record.state.value,
        "created_at": record.created_at,
        "started_at": started,
        "stopped_at": stopped if not record.state.active else None,
        "uptime_s": round(uptime_seconds(record), 1),
        "price_per_hour": record.price_per_hour,
        "cost_so_far": round(cost_of(record), 6),
        "billed_s": round(record_billed_seconds(record), 1),  # under a minute: a minute's cost
        "never_ran": never_ran(record),  # ended without a billed resource: cost nothing
        "price_basis": record.resource.get(PRICE_BASIS),  # configuration/cost.py's CLOUD...
        "spot": bool(record.spec.extra.get("spot")),
        "host": record.spec.extra.get("host"),
        "image": record.resource.get("image")
        or record.spec.extra.get("image"),  # what it runs (or asked)
        "error": record.error,
        "idle": idle,
        "warnings": list((live or {}).get("warnings") or []),  # protocol.Warning dicts
        "stop_reason": reason.to_dict() if reason is not None and not record.state.active else None,
        "max_cost": record.spec.max_cost,
        "owner": record.owner,
        "verified": verified,
        "last_seen": last_seen,
        "workspace": _workspace(record),
        "restart": restart_body(record.spec, workspace=_workspace(record)),
        "resume": restart_body(record.spec, resume=saved)
        if (saved := _saved_workspace(record))
        else None,
        "advice": _advice(record),
        # the bounds an administrator's policy put in at its start ({"field", "limit", "policy"})
        "policy_bounds": list(record.spec.extra.get("policy_bounds") or []),
        # the month's spend against the budget when it was past 80% at the start (cost.py)
        "budget": record.resource.get("budget"),
        # a switch it took part in was cut by its driver's death (session/orphans.py)
        "cut_switch": cut_switch,
        **_placement(record),
    }


def _placement(record: SessionRecord) -> dict[str, Any]:
    """How it was placed (issue 34): a fallback list's types and those passed over, with why
    (session/fallback.py); the GPUs of a shared box it holds (backends/docker/gpus.py); which box
    of a pool, and why."""
    return {
        "types": list(record.spec.extra.get("types") or []),
        "passed_over": list(record.spec.extra.get("passed_over") or []),
        "gpu_indices": record.resource.get("gpu_indices"),
        "pool_choice": record.spec.extra.get("pool_choice"),
    }


def _advice(record: SessionRecord) -> dict[str, Any] | None:
    """An ended session's right-sizing advice (gpusession/configuration/advice.py), from the summary kept at
    its stop; None while it runs (`%gpu advice` asks the agent) or when it has none."""
    summary = record.resource.get("agent_summary")
    if record.state.active or not summary:
        return None
    doc = advice_document(
        summary,
        gpu_type=record.spec.gpu_type,
        gpu_count=record.spec.gpu_count,
        spot=record.spec.extra.get("spot"),
        catalog=load_catalog(),
        backend=record.spec.backend,
    )
    return doc if doc["advice"] else None


def _workspace(record: SessionRecord) -> str | None:
    """The workspace the session used (its backend keeps them), else None."""
    claim = workspace_claim(record.spec, record.name)
    return claim[-1] if claim else None


def _saved_workspace(record: SessionRecord) -> str | None:
    """The workspace an ended session saved its variables into (its stop --save, or its
    watchdog's save before an idle, cost or runtime stop), else None."""
    saves = (  # an asked save (stop --save) and the agent's own (a watchdog's, a notice's)
        record.resource.get("checkpoint"),
        (record.resource.get("agent_summary") or {}).get("checkpoint"),
    )
    saved = any(isinstance(s, dict) and s.get("committed") for s in saves)
    return record.resource.get("workspace") if saved and not record.state.active else None


def interrupted_to_resume(records: list[SessionRecord]) -> list[SessionRecord]:
    """The ended sessions whose capacity went away (a spot interruption, a time limit, a
    preemption) after their agent saved the namespace, and whose workspace no later session has
    used: what `gpusession list` shows beside the active ones, so "interrupted, state saved" is
    seen without `--all`. `records`: the store's, newest first."""
    used: set[str] = set()
    out = []
    for record in records:
        workspace = record.resource.get("workspace") or _workspace(record)
        reason = record.stop_reason
        if (
            not record.state.active
            and reason is not None
            and reason.kind.interruption
            and _saved_workspace(record)
            and workspace not in used
        ):
            out.append(record)
        if workspace:
            used.add(workspace)
    return out


def restart_body(
    spec: LaunchSpec, resume: str | None = None, workspace: str | None = None
) -> dict[str, Any]:
    """A `POST sessions` body that starts the same kind of session again (a new name): the
    spec's start options as text the option table reads back exactly (durations in seconds
    with their unit: a bare number would mean minutes), true for a flag that is on. `resume`:
    the workspace whose saved variables the new session restores (the view's `resume`: the
    history card's "Resume" after a save); `workspace`: the one a fresh kernel starts on (the
    view's `restart`, the card's "Start again": the same files, no variables restored)."""
    body: dict[str, Any] = {
        "type": spec.gpu_type if spec.gpu_count == 1 else f"{spec.gpu_type}:{spec.gpu_count}",
        "backend": spec.backend,
        "idle": f"{exact_decimal(spec.idle)}s" if spec.idle else "off",
    }
    if spec.max_runtime:
        body["max_runtime"] = f"{exact_decimal(spec.max_runtime)}s"
    if spec.max_cost:
        body["max_cost"] = exact_decimal(spec.max_cost)
    if spec.gpu_only:
        body["gpu_only"] = True
    for option in (
        options.table().options if spec.extra else ()
    ):  # the options kept in spec.extra (docker's --gpus, aws's --fallback...)
        value = spec.extra.get(option.name) if option.spec_field is None else None
        if option.kind == "duration" and option.name in spec.extra and option.spec_field is None:
            value = f"{exact_decimal(value)}s" if value else "off"  # None: off, as it was given
        elif option.name == "save_cap" and value is not None:
            value = (
                f"{int(value)}b" if value else "off"
            )  # exact bytes (a bare number would mean MB)
        if value is not None:  # as text, as a form sends it ("2", "0.5"), but a bool stays one
            body[option.name] = (
                value
                if isinstance(value, bool)
                else (exact_decimal(value) if isinstance(value, float) else str(value))
            )
    if resume or workspace:
        body.pop("resume", None)
        body.pop("workspace", None)
    if resume:
        body["resume"] = resume
    elif workspace:
        body["workspace"] = workspace
    return body
