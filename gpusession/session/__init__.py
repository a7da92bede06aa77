"""The session core: orchestration (manager: the lifecycle), what sessions cost (spend:
`manager.spend`), what their agents say (stats: `manager.stats`), the connected-session handle,
the agent client, the view shape, gc, and the recorder the backends report through. Data in, data out: the faces
make the words (gpusession/words/).

Imported on first use (PEP 562): `gpusession list` needs the manager, not the kernel client
(jupyter_client, zmq) a connected Session brings."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .manager import SessionManager, default_backend_name

if TYPE_CHECKING:
    from .agentclient import AgentClient, AgentUnavailable
    from .gc import GcAction
    from .handle import Session
    from .recorder import StoreRecorder

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
    if name in ("AgentClient", "AgentUnavailable"):
        from . import agentclient

        return getattr(agentclient, name)
    if name == "GcAction":
        from .gc import GcAction

        return GcAction
    if name == "Session":
        from .handle import Session

        return Session
    if name == "StoreRecorder":
        from .recorder import StoreRecorder

        return StoreRecorder
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
