"""The session core: orchestration (manager: the lifecycle), what sessions cost (spend:
`manager.spend`), what their agents say (stats: `manager.stats`), the connected-session handle,
the agent client, the view shape, gc, and the recorder the backends report through. Data in, data out: the faces
make the words (gpusession/words/).

`Session` is imported on first use (PEP 562): `gpusession list` needs the manager, not the kernel
client (jupyter_client, zmq) a connected Session brings."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .agentclient import AgentClient, AgentUnavailable
from .gc import GcAction
from .manager import SessionManager, default_backend_name
from .recorder import StoreRecorder

if TYPE_CHECKING:
    from .handle import Session

__all__ = [
    "AgentClient",
    "AgentUnavailable",
    "GcAction",
    "Session",
    "SessionManager",
    "StoreRecorder",
    "default_backend_name",
]


def __getattr__(name: str):
    if name == "Session":
        # lazy: docs/architecture.md#imports-kept-inside-functions
        from .handle import Session

        return Session
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
