"""Typed data passed between layers. Plain dataclasses; JSON-able through `to_dict`."""

from __future__ import annotations

import dataclasses
import enum
import time
from typing import Any

from .protocol import DEFAULT_IDLE_S, StopReason


class State(str, enum.Enum):
    """Life cycle of a session. Every transition is recorded with its time in the store."""

    REQUESTED = "requested"  # a record exists; nothing paid for yet
    PROVISIONING = "provisioning"  # the backend is creating the paid resource
    STARTING = "starting"  # resource exists; waiting for the kernel and connecting
    RUNNING = "running"  # kernel answers; the session is usable
    STOPPING = "stopping"  # teardown under way
    STOPPED = "stopped"  # resource gone
    FAILED = "failed"  # start or run failed; `error` says at which stage

    @property
    def active(self) -> bool:
        return self not in (State.STOPPED, State.FAILED)


#: states in which the backend may hold a paid resource (billing runs)
BILLED_STATES = (State.PROVISIONING, State.STARTING, State.RUNNING, State.STOPPING)


#: LaunchSpec fields earlier versions had, which are their backends' options now (spec.extra)
_NOW_BACKENDS = ("image", "host", "spot", "region")
#: LaunchSpec fields under the names earlier versions stored them
_EARLIER_NAMES = {
    "gpu_only_idle": "gpu_only",
    "idle_timeout_s": "idle",
    "max_runtime_s": "max_runtime",
}


@dataclasses.dataclass
class LaunchSpec:
    """What the user asked for. Options a backend does not use are still recorded."""

    gpu_type: str  # catalog name, lower case (e.g. "t4")
    gpu_count: int = 1  # GPUs requested (from "a100:8")
    backend: str = "local"  # entry-point name of the backend
    name: str | None = None  # user-facing name; generated when None
    idle: float | None = DEFAULT_IDLE_S  # seconds idle before it stops; None: never
    max_cost: float | None = None  # dollars; stop when reached
    max_runtime: float | None = None  # seconds: hard stop after this long; None: none
    gpu_only: bool = False  # count only GPU utilization as activity (--gpu-only)
    # the backend's own options, by the names its start options give them: where it runs (a
    # Docker engine's --host, an aws --region), what (--image), how (--spot)... and what a Python
    # caller passes on (boot_timeout)
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "LaunchSpec":
        data = dict(data)
        for old, new in _EARLIER_NAMES.items():  # names in store rows written by earlier versions
            if old in data:
                data.setdefault(new, data.pop(old))
        extra = dict(data.get("extra") or {})
        for name in _NOW_BACKENDS:  # fields earlier versions had: a backend's options now
            value = data.pop(name, None)
            if value not in (None, False, ""):
                extra.setdefault(name, value)
        data["extra"] = extra
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in fields})


@dataclasses.dataclass
class Event:
    """One recorded state transition."""

    session_id: str
    state: State
    at: float  # unix seconds
    detail: str = ""


@dataclasses.dataclass
class SessionRecord:
    """A row of the session store: the durable truth any process can read."""

    id: str  # uuid hex; also the label/tag put on remote resources
    name: str
    spec: LaunchSpec
    state: State
    created_at: float
    updated_at: float
    owner: str  # "user@host:pid" of the process that started it
    price_per_hour: float = 0.0  # dollars for the whole session (all GPUs)
    resource: dict[str, Any] = dataclasses.field(default_factory=dict)  # backend's saved state
    error: str | None = None
    events: list[Event] = dataclasses.field(default_factory=list)

    @property
    def backend(self) -> str:
        return self.spec.backend

    @property
    def stop_reason(self) -> StopReason | None:
        """Why it ended, as recorded when the session stopped (None while it runs, or unknown)."""
        return StopReason.from_dict(self.resource.get("stop_reason"))

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["state"] = self.state.value
        d["events"] = [
            {"state": e.state.value, "at": e.at, "detail": e.detail} for e in self.events
        ]
        return d


@dataclasses.dataclass
class KernelEndpoint:
    """Where a session kernel can be reached from this process (after any tunnel)."""

    connection_info: dict[str, Any]  # jupyter connection dict: ip, ports, key, transport, ...
    agent_url: str | None = None  # http://127.0.0.1:PORT of the agent, if reachable


def now() -> float:
    return time.time()
