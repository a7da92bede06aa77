"""The local side of the agent: fetch stats through the session's tunnel, postpone the idle
stop, and put it all into words for `%gpu status`, `%gpu watch` and the stop summary.

The agent's endpoint wants a token derived from the kernel's connection key, which every
process connected to the session holds (`AgentClient.for_endpoint`).
"""

from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.parse
from typing import Any, Callable

from .agent.endpoint import agent_token
from .durations import format_duration, parse_duration
from .errors import GpuSessionError, NoSession
from .models import KernelEndpoint, SessionRecord, State
from .statsview import describe_stop, format_summary, is_watchdog_stop

FRESH_S = 15.0  # how long a fetched stats document may fill in SessionView's idle countdown


class AgentUnavailable(GpuSessionError):
    """The session's agent did not answer (tunnel down, session stopping, old image)."""


class AgentClient:
    """One keep-alive HTTP connection to an agent (through the tunnel, each new connection is a
    new SSH channel; a poll a second should not open 3600 of them an hour). Thread-safe."""

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
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"} if data is not None else {}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        with self._lock:
            for attempt in (1, 2):
                reused = self._conn is not None
                conn = self._conn or http.client.HTTPConnection(self._host, self._port, timeout=self.timeout)
                try:
                    conn.request(method, path, body=data, headers=headers)
                    resp = conn.getresponse()
                    payload = resp.read()
                except (OSError, http.client.HTTPException) as exc:  # refused, reset, timeout
                    conn.close()
                    self._conn = None
                    if reused and attempt == 1:
                        continue  # the agent closed an idle connection: once more on a new one
                    raise AgentUnavailable(f"the session's agent did not answer ({type(exc).__name__}: {exc})") from None
                if resp.will_close:
                    conn.close()
                    self._conn = None
                else:
                    self._conn = conn
                break
        try:
            doc = json.loads(payload)
        except ValueError:
            raise AgentUnavailable(f"the session's agent sent no JSON (HTTP {resp.status})") from None
        if resp.status >= 400:
            raise AgentUnavailable(f"the session's agent answered {resp.status}: {doc.get('error', '')}")
        return doc

    def health(self) -> dict:
        return self._request("GET", "/health")

    def stats(self, since: float | None = None, limit: int | None = None) -> dict:
        query = "&".join(f"{k}={v}" for k, v in (("since", since), ("limit", limit)) if v is not None)
        return self._request("GET", "/stats" + (f"?{query}" if query else ""))

    def summary(self) -> dict:
        return self._request("GET", "/summary")

    def keepalive(self, seconds: float) -> dict:
        return self._request("POST", "/keepalive", {"seconds": seconds})




# -- what SessionManager does with the agent (mixed into it; session.py stays small) ---------


class AgentOps:
    """Stats, keepalive, stop summaries and finding watchdog stops, for SessionManager.

    Needs from its host: store, backend(name), connected(key), attach(key), _connected, _lock,
    _reconcile(record, backend)."""

    _stats_cache: dict[str, tuple[float, dict]]

    def _agent_for(self, key: str):
        """(record, session) of a running session, attaching when this process is not connected:
        the server and other processes ask about sessions they did not start."""
        record = self.refresh_state(key)
        if record.state != State.RUNNING:
            raise NoSession(self.ended_message(record))
        session = self.connected(record.id) or self.attach(record.id)
        return record, session

    @staticmethod
    def _client(session) -> AgentClient:
        """The session's agent client, kept on the session (one keep-alive connection)."""
        if session.agent_client is None:
            session.agent_client = AgentClient.for_endpoint(session.link.endpoint)
        return session.agent_client

    def stats(self, key: str, since: float | None = None, limit: int | None = None, *, check_alive: bool = True) -> dict:
        """The agent's stats document for a running session (docs/gpu-agent.md). Raises
        NoSession, saying why, when the session turns out to have stopped. check_alive=False
        only asks the agent of a session this process is connected to, and never tears down
        connections (for a background poll while a cell runs)."""
        if not check_alive:
            session = self.connected(key)
            if session is None:
                raise AgentUnavailable("not connected to this session")
            return self._with_notices(session.id, self._client(session).stats(since, limit))
        record, session = self._agent_for(key)
        try:
            doc = self._client(session).stats(since, limit)
        except AgentUnavailable:
            record = self.refresh_state(record.id)
            if record.state != State.RUNNING:
                raise NoSession(self.ended_message(record)) from None
            raise
        doc = self._with_notices(record.id, doc)
        with self._lock:
            self._stats_cache[record.id] = (time.time(), doc)
        return doc

    def _with_notices(self, session_id: str, doc: dict) -> dict:
        """Add what the backend learnt outside the agent (a spot interruption notice, seen by the
        link and recorded in the store) to the warnings the notebook and the panels show."""
        interrupted = self.store.get(session_id).resource.get("interrupted")
        if not interrupted:
            return doc
        notice = interrupted.get("notice") or {}
        warning = (f"spot interruption notice: AWS will {notice.get('action', 'stop')} this instance at "
                   f"{notice.get('time', 'any moment')}; save your work")
        return dict(doc, warnings=[*(doc.get("warnings") or []), warning])

    def keepalive(self, key: str, duration: str | float, report: Callable[[str], None] | None = None) -> SessionRecord:
        """Postpone the session's idle stop by `duration` ("1h", or seconds as a number); the
        agent caps it (default 4 h ahead). Returns the record; `report` gets one line."""
        seconds = float(duration) if isinstance(duration, (int, float)) else parse_duration(
            duration, what="keepalive duration", allow_off=False
        )
        record, session = self._agent_for(key)
        granted = self._client(session).keepalive(seconds)
        line = f"{record.name}: idle stop postponed by {format_duration(granted['granted_s'])}"
        if granted.get("capped"):
            line += f" (capped at {format_duration(granted['limit_s'])}, asked {format_duration(seconds)})"
        remaining = (granted.get("idle") or {}).get("remaining_s")
        if remaining is not None:
            line += f"; stops in {format_duration(remaining)} unless used"
        elif (granted.get("idle") or {}).get("timeout_s") is None:
            line += "; its idle stop is off anyway"
        self.store.note(record.id, f"keepalive {format_duration(granted['granted_s'])}")
        if report:
            report(line)
        return self.store.get(record.id)

    def refresh_state(self, key: str) -> SessionRecord:
        """The record, after checking that a running session's remote side still exists; when
        it is gone (its watchdog stopped it, say) the store records why."""
        record = self.store.get(key)
        if record.state != State.RUNNING:
            return record
        backend = self.backend(record.backend)
        if backend.is_alive(record):
            return record
        with self._lock:
            session = self._connected.pop(record.id, None)
        if session is not None:
            session.close_connections()
        return self._reconcile(record, backend)

    def ended_message(self, record: SessionRecord) -> str:
        """'session t4-1 was stopped by its idle watchdog after 5s idle' and its summary."""
        found = next((e.detail for e in reversed(record.events) if e.detail.startswith("found stopped: ")), None)
        if found is not None:
            text = describe_stop(record.name, found.removeprefix("found stopped: "))
        elif record.state == State.FAILED:
            text = f"session {record.name} failed: {record.error}"
        else:
            text = f"session {record.name} is {record.state.value}"
        return f"{text} ({self.summary_line(record)})" if not record.state.active else text

    def summary_line(self, record: SessionRecord) -> str:
        """Duration, GPU-hours, cost, mean GPU utilization, idle minutes: from the agent's
        summary when one was saved, else from the store's transitions."""
        summary = record.resource.get("agent_summary")
        if summary:
            return format_summary(summary)
        from .cost import cost_of, uptime_seconds

        return f"ran {uptime_seconds(record):.0f}s, cost ${cost_of(record):.4f}"

    def _save_summary(self, record: SessionRecord, session=None, backend=None) -> None:
        """Keep the agent's summary in the record: asked of the agent while it still runs, or
        what it left behind (`stop_details`, where the backend offers it)."""
        summary = None
        if session is not None:
            try:
                summary = self._client(session).summary()
            except AgentUnavailable:
                summary = None
        if summary is None and backend is not None:
            details = getattr(backend, "stop_details", lambda r: None)(record) or {}
            summary = details.get("summary")
        if summary:
            self.store.update_resource(record.id, agent_summary=summary)

    def live_idle(self, record: SessionRecord) -> dict | None:
        """The idle countdown from recently fetched stats (for SessionView), if any."""
        with self._lock:
            at, doc = self._stats_cache.get(record.id, (0.0, None))
        if doc is None or time.time() - at > FRESH_S or record.state != State.RUNNING:
            return None
        idle = dict(doc.get("idle") or {})
        if idle.get("remaining_s") is not None:  # it has been counting down since
            idle["remaining_s"] = round(max(0.0, idle["remaining_s"] - (time.time() - at)), 1)
        idle["warning"] = "; ".join(doc.get("warnings") or []) or None
        return idle


__all__ = ["AgentClient", "AgentOps", "AgentUnavailable", "is_watchdog_stop"]
