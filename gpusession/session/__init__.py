"""The session core: orchestration (manager), the connected-session handle, the agent client,
the view shape, gc, and the recorder the backends report through. Data in, data out: the faces
make the words (gpusession/words.py)."""

from .agentclient import AgentClient, AgentUnavailable
from .gc import GcAction
from .handle import Session
from .manager import SessionManager, default_backend_name
from .recorder import StoreRecorder

__all__ = ["AgentClient", "AgentUnavailable", "GcAction", "Session", "SessionManager", "StoreRecorder",
           "default_backend_name"]
