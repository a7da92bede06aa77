"""One keep-alive HTTP connection to a session's agent, through the session's tunnel.

The agent's endpoint wants a token derived from the kernel's connection key, which every
process connected to the session holds (`AgentClient.for_endpoint`).
"""

from __future__ import annotations

import json
import threading
import urllib.parse
from typing import TYPE_CHECKING, Any

from ..core.errors import GpuSessionError
from ..core.models import KernelEndpoint
from ..core.protocol import agent_token

if TYPE_CHECKING:  # http.client (with ssl, email) loads when a client is made: not for `list`
    import http.client


class AgentUnavailable(GpuSessionError):
    """The session's agent did not answer (tunnel down, session stopping, old image).
    `refused`: the connection was refused, so the request never reached the agent (one that is
    still starting: the runtime starts the kernel before the agent's HTTP side)."""

    refused = False


class AgentClient:
    """Through the tunnel, each new connection is a new SSH channel: a poll a second should not
    open 3600 of them an hour, so one connection is kept. Thread-safe."""

    def __init__(self, url: str, token: str | None, *, timeout: float = 5.0):
        self.url = url.rstrip("/")
        self.token = token
        self.timeout = timeout
        parts = urllib.parse.urlsplit(self.url)
        self._host, self._port = parts.hostname or "127.0.0.1", parts.port or 80
        self._conn: http.client.HTTPConnection | None = None
        self._lock = threading.Lock()

    @classmethod
    def for_endpoint(cls, endpoint: KernelEndpoint, **kw: Any) -> "AgentClient":
        if not endpoint.agent_url:
            raise AgentUnavailable("this session has no stats agent (it was started without one)")
        key = (endpoint.connection_info or {}).get("key")
        return cls(endpoint.agent_url, agent_token(key) if key else None, **kw)

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def _request(self, method: str, path: str, body: dict | None = None) -> dict:
        import http.client

        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"} if data is not None else {}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        with self._lock:
            for attempt in (1, 2):
                reused = self._conn is not None
                conn = self._conn or http.client.HTTPConnection(
                    self._host, self._port, timeout=self.timeout
                )
                try:
                    conn.request(method, path, body=data, headers=headers)
                    resp = conn.getresponse()
                    payload = resp.read()
                except (OSError, http.client.HTTPException) as exc:  # refused, reset, timeout
                    conn.close()
                    self._conn = None
                    if reused and attempt == 1:
                        continue  # the agent closed an idle connection: once more on a new one
                    error = AgentUnavailable(
                        f"the session's agent did not answer ({type(exc).__name__}: {exc})"
                    )
                    error.refused = isinstance(exc, ConnectionRefusedError)
                    raise error from None
                if resp.will_close:
                    conn.close()
                    self._conn = None
                else:
                    self._conn = conn
                break
        try:
            doc = json.loads(payload)
        except ValueError:
            raise AgentUnavailable(
                f"the session's agent sent no JSON (HTTP {resp.status})"
            ) from None
        if resp.status >= 400:
            raise AgentUnavailable(
                f"the session's agent answered {resp.status}: {doc.get('error', '')}"
            )
        return doc

    def stats(self, since: float | None = None, limit: int | None = None) -> dict:
        query = "&".join(
            f"{k}={v}" for k, v in (("since", since), ("limit", limit)) if v is not None
        )
        return self._request("GET", "/stats" + (f"?{query}" if query else ""))

    def summary(self) -> dict:
        return self._request("GET", "/summary")

    def keepalive(self, seconds: float) -> dict:
        return self._request("POST", "/keepalive", {"seconds": seconds})

    def health(self) -> dict:
        return self._request("GET", "/health")

    def restart_kernel(self) -> dict:
        """POST /restart: the runtime ends the running kernel and starts a fresh one."""
        return self._request("POST", "/restart", {})

    def save(self) -> dict:
        """POST /save: the kernel's namespace into the workspace; waits up to the save bound."""
        return self._request("POST", "/save", {})

    def restored(self) -> dict:
        """GET /restored: what a resumed session's first kernel restored."""
        return self._request("GET", "/restored")
