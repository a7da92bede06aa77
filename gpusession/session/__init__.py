"""The session core: orchestration (manager: the lifecycle), what sessions cost (spend:
`manager.spend`), what their agents say (stats: `manager.stats`), the connected-session handle
(handle: `Session`), the agent client, the view shape, gc, and the recorder the backends report
through. Data in, data out: the faces make the words (gpusession/words/).

Only the manager is imported here: `gpusession list` needs it, not the kernel client (jupyter_client,
zmq) a connected `Session` brings; import the rest from its module."""

from __future__ import annotations

from .manager import SessionManager, default_backend_name

__all__ = ["SessionManager", "default_backend_name"]
