"""The session view: the one JSON shape every face shows (REST `SessionView`), as data."""

from __future__ import annotations

from typing import Any

from ..cost import cost_of, uptime_seconds
from ..models import SessionRecord, State


def session_view(record: SessionRecord, live: dict | None = None) -> dict[str, Any]:
    """`live`: a recent stats document of the running session (its idle countdown and warnings)."""
    started = next((e.at for e in record.events if e.state == State.RUNNING), None)
    stopped = next((e.at for e in reversed(record.events) if not e.state.active), None)
    idle = {"timeout_s": record.spec.idle_timeout_s, "remaining_s": None}
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
        "spot": bool(record.spec.spot),
        "host": record.spec.host,
        "error": record.error,
        "idle": idle,
        "warnings": list((live or {}).get("warnings") or []),  # protocol.Warning dicts
        "stop_reason": reason.to_dict() if reason is not None and not record.state.active else None,
        "max_cost": record.spec.max_cost,
        "owner": record.owner,
    }
