"""A session this process is connected to: run cells, move variables, stop."""

from __future__ import annotations

import contextlib
import queue
import time
from typing import Any, Iterator, Protocol

from ..backends import Backend, Link
from ..core.errors import KernelDied, LinkLost, SessionEnded
from ..core.models import SessionRecord
from ..transport.kernel import files, transfer_client
from ..transport.kernel.client import KernelClient
from ..transport.kernel.sink import OutputSink
from ..transport.kernel.transfer_client import Progress
from .agentclient import AgentClient, AgentUnavailable
from .store import Store


class AgentAsker(Protocol):
    """What a Session asks of its manager's `stats` (session/stats.py `Stats`): the agent's
    stats document and a keepalive, for any running session by key."""

    def fetch(self, key: str, since: float | None = None, limit: int | None = None) -> dict: ...

    def keepalive(self, key: str, duration: str | float) -> dict: ...


class Owner(Protocol):
    """What a Session asks of the SessionManager that made it (and nothing more): the store, the
    operations that record what happened to the session, and its agent's stats (`stats`)."""

    store: Store

    @property
    def stats(self) -> AgentAsker: ...

    def mark_gone(self, session: "Session", why: str) -> SessionRecord | None: ...

    def stop(self, key: str) -> SessionRecord: ...

    def refresh_state(self, key: str) -> SessionRecord: ...


class Session:
    """Made by `SessionManager.launch` / `attach`; the faces hold it as the current session."""

    def __init__(self, manager: Owner, record: SessionRecord, backend: Backend, link: Link):
        self.manager = manager
        self.record = record
        self.backend = backend
        self.link = link
        self.kernel = KernelClient(
            link.endpoint.connection_info,
            healthy=self.healthy,
            reconnects=lambda: link.reconnects,
            open_stream=link.open_stream if getattr(link, "streams", False) else None,
        )
        self._alive_checked = (0.0, True)
        self._reconnects_seen = 0  # link.reconnects when iopub was last known to deliver
        self._agent: AgentClient | None = None

    @property
    def agent(self) -> AgentClient:
        """The session's agent client (one keep-alive connection), made on first use."""
        if self._agent is None:
            self._agent = AgentClient.for_endpoint(self.link.endpoint)
        return self._agent

    def close_connections(self) -> None:
        """Let go of the kernel, the agent and the link (the session itself keeps running)."""
        if self._agent is not None:
            self._agent.close()
        self.kernel.close()
        self.link.close()

    @property
    def id(self) -> str:
        return self.record.id

    @property
    def name(self) -> str:
        return self.record.name

    def refresh(self) -> SessionRecord:
        self.record = self.manager.store.get(self.record.id)
        return self.record

    def healthy(self) -> bool:
        """Link up and remote side alive (the backend check is throttled to once in 2 s). Raises
        LinkLost when the link gave up (refused, or down past the reconnect give-up time) while
        the session still runs: a waiting cell ends with why, instead of waiting for ever."""
        if not self.link.healthy():
            alive = self.backend.is_alive(self.record)
            why = self.link.failure() if alive else None
            if why is not None:
                raise LinkLost(f"lost the connection to session {self.name}: {why}")
            return alive
        at, alive = self._alive_checked
        if time.monotonic() - at > 2.0:
            alive = self.backend.is_alive(self.record)
            self._alive_checked = (time.monotonic(), alive)
        return alive

    def _after_reconnect(self, timeout: float = 30.0) -> None:
        """After the link came back: wait until iopub delivers again (its SUB socket reconnects
        on its own, maybe after shell), so the next cell's output and its `idle` are not lost.
        The check jupyter_client's wait_for_ready makes: a kernel_info whose status shows on iopub."""
        seen = self.link.reconnects
        if seen == self._reconnects_seen:
            return
        client, deadline = self.kernel.client, time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.link.healthy():
                self.healthy()  # LinkLost when it gave up meanwhile
            msg_id = client.kernel_info()
            tick = time.monotonic() + 0.5
            while time.monotonic() < tick:
                try:
                    msg = client.get_iopub_msg(timeout=0.1)
                except queue.Empty:
                    continue
                if msg["parent_header"].get("msg_id") == msg_id:
                    self._reconnects_seen = seen
                    return

    def _still_held(self) -> None:
        """Before sending: this process let go of the session's connections (it was found
        stopped, say by a poll after the laptop woke): say how it ended, send nothing."""
        if not self.kernel.closed:
            return
        record = self.manager.refresh_state(self.id)
        if not record.state.active:
            self.record = record
            raise SessionEnded(record)
        raise LinkLost(f"not connected to session {self.name} any more; `%gpu use {self.name}`")

    def run(self, code: str, sink: OutputSink | None = None) -> dict:
        self._still_held()
        if not self.link.healthy():  # gave up already: say so now, send nothing
            try:
                self.healthy()
            except LinkLost as exc:
                raise LinkLost(f"{exc}; this cell was not sent") from None
        self._after_reconnect()
        try:
            return self.kernel.execute(code, sink=sink)
        except KernelDied:
            ended = self.manager.mark_gone(self, "kernel died while running a cell")
            if ended is not None:  # its own watchdog stopped it: say so, it is no failure
                raise SessionEnded(ended) from None
            raise

    @contextlib.contextmanager
    def _ended_during(self, what: str) -> Iterator[None]:
        """A transfer the session's end cut (a spot notice, its watchdog): SessionEnded, saying
        how it ended, with the transfer's own words on what did not land."""
        try:
            yield
        except KernelDied as exc:
            ended = self.manager.mark_gone(self, f"kernel died during {what}")
            if ended is not None:
                raise SessionEnded(ended, during=str(exc)) from None
            raise

    def push(self, namespace: dict[str, Any], progress: Progress | None = None) -> None:
        self._still_held()
        self._after_reconnect()
        with self._ended_during("a push"):
            self.kernel.push(namespace, progress)

    def pull(self, names: list[str], progress: Progress | None = None) -> dict[str, Any]:
        self._still_held()
        self._after_reconnect()
        with self._ended_during("a pull"):
            return self.kernel.pull(names, progress)

    def upload(
        self,
        paths: list[str],
        to: str = ".",
        progress: Progress | None = None,
        *,
        everything: bool = False,
    ) -> dict:
        """Local files or folders into folder `to` below the session kernel's working directory
        (a folder without .git and what its .gitignore files ignore, unless `everything`).
        Returns {"files", "bytes", "dest"}."""
        tree = files.collect(paths, everything=everything)
        self._still_held()
        self._after_reconnect()
        with self._ended_during("an upload"):
            return transfer_client.upload(self.kernel, tree.files, tree.size, to, progress)

    def download(self, paths: list[str], to: str = ".", progress: Progress | None = None) -> dict:
        """Files or folders of the session (relative to its kernel's working directory) into
        local folder `to`. Returns {"files", "bytes", "dest"}."""
        self._still_held()
        self._after_reconnect()
        with self._ended_during("a download"):
            return transfer_client.download(self.kernel, paths, to, progress)

    def stop(self) -> SessionRecord:
        return self.manager.stop(self.id)

    def kernel_state(self) -> dict:
        """The runtime's word on the session kernel, through the agent: {"generation": kernels
        started so far, "running", "ready"}. AgentUnavailable when the agent does not answer."""
        state = self.agent.health().get("kernel")
        if not state:
            raise AgentUnavailable(
                "this session's runtime cannot restart its kernel (an older image?)"
            )
        return state

    def restart_kernel(self, after: int, *, force: bool = False, timeout: float = 60.0) -> int:
        """Wait for a fresh kernel in this session, newer than generation `after`, and for it to
        answer; returns its generation. The old kernel goes by itself on a shutdown_request with
        restart=true (the runtime then starts the next); `force` ends it first when it still runs
        (POST /restart). Variables are gone; ports, key and the session stay."""
        deadline = time.monotonic() + timeout
        state = self._kernel_state_until(deadline)
        if (
            force and state["generation"] <= after and state["running"] and state["ready"]
        ):  # not the fresh one booting
            self.agent.restart_kernel()
        while not (state["generation"] > after and state["ready"]):
            if time.monotonic() > deadline:
                raise TimeoutError(f"no fresh kernel in session {self.name} within {timeout:.0f}s")
            if not self.healthy():
                raise KernelDied(
                    f"session {self.name} ended while its kernel restarted{self._why_ended()}"
                )
            time.sleep(0.1)
            state = self._kernel_state_until(deadline)
        self.kernel.wait_ready(timeout=max(1.0, deadline - time.monotonic()))
        return state["generation"]

    def _kernel_state_until(self, deadline: float) -> dict:
        """kernel_state(), asked again while the agent refuses (never delivered: right after a
        start the agent may not listen yet) until `deadline`; a session found ended says so."""
        while True:
            try:
                return self.kernel_state()
            except AgentUnavailable as exc:
                if not exc.refused or time.monotonic() > deadline:
                    raise
                if not self.healthy():
                    raise KernelDied(
                        f"session {self.name} ended while its kernel restarted{self._why_ended()}"
                    ) from exc
                time.sleep(0.2)

    def _why_ended(self) -> str:
        record = self.manager.refresh_state(self.id)
        return f" ({record.events[-1].detail})" if record.events and not record.state.active else ""

    def stats(self, since: float | None = None, limit: int | None = None) -> dict:
        """Live stats from the session's agent: samples newer than `since` (unix s), the newest
        `limit` of them, plus the idle countdown and cost (docs/gpu-agent.md)."""
        return self.manager.stats.fetch(self.id, since=since, limit=limit)

    def keepalive(self, duration: str | float = "1h") -> dict:
        """Postpone the idle stop ("1h"); capped by the agent (default 4 h). Returns what the
        agent granted."""
        return self.manager.stats.keepalive(self.id, duration)
