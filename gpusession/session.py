"""Orchestration: start -> provision -> connect -> (cells) -> stop, with every transition recorded.

The faces (magics, CLI, server, widgets) talk to `SessionManager` only; they never import a
concrete backend.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from typing import Any, Callable

from .backends import Backend, Link, load_backend_class
from .catalog import load_catalog
from .config import GpuSessionConfig
from .cost import cost_of, uptime_seconds
from .errors import BadInput, GpuSessionError, KernelDied, NoSession, StageError
from .kernel import KernelClient, OutputSink
from .models import LaunchSpec, SessionRecord, State
from .progress import Progress, Reporter
from .stats import AgentOps, is_watchdog_stop
from .statsview import describe_stop
from .store import Store


def default_backend_name(config: GpuSessionConfig) -> str:
    """The configured default, else docker when an engine answers, else local."""
    if config.default_backend:
        return config.default_backend
    try:
        cls = load_backend_class("docker")
        if getattr(cls, "engine_available", lambda: False)():
            return "docker"
    except GpuSessionError:
        pass
    return "local"


class Session:
    """A session this process is connected to: run cells, move variables, stop."""

    def __init__(self, manager: "SessionManager", record: SessionRecord, backend: Backend, link: Link, kernel: KernelClient):
        self.manager = manager
        self.record = record
        self.backend = backend
        self.link = link
        self.kernel = kernel
        self._alive_checked = (0.0, True)
        self._reconnects_seen = 0  # link.reconnects when iopub was last known to deliver
        self.agent_client = None  # gpusession.stats.AgentClient, made on first use

    def close_connections(self) -> None:
        """Let go of the kernel, the agent and the link (the session itself keeps running)."""
        if self.agent_client is not None:
            self.agent_client.close()
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
        """Link up and remote side alive (the backend check is throttled to once in 2 s)."""
        if not self.link.healthy():
            return self.backend.is_alive(self.record)
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

    def run(self, code: str, sink: OutputSink | None = None) -> dict:
        self._after_reconnect()
        try:
            return self.kernel.execute(code, sink=sink)
        except KernelDied:
            ended = self.manager._mark_gone(self, "kernel died while running a cell")
            if ended:  # its own watchdog stopped it: say so, it is no failure
                raise NoSession(ended) from None
            raise

    def push(self, namespace: dict[str, Any]) -> None:
        self._after_reconnect()
        self.kernel.push(namespace)

    def pull(self, names: list[str]) -> dict[str, Any]:
        self._after_reconnect()
        return self.kernel.pull(names)

    def stop(self) -> SessionRecord:
        return self.manager.stop(self.id)

    @property
    def agent_url(self) -> str | None:
        return self.link.endpoint.agent_url

    def stats(self, since: float | None = None, limit: int | None = None) -> dict:
        """Live stats from the session's agent: samples newer than `since` (unix s), the newest
        `limit` of them, plus the idle countdown and cost (docs/gpu-agent.md)."""
        return self.manager.stats(self.id, since=since, limit=limit)

    def history(self, since: float | None = None) -> list[dict]:
        """The samples the agent keeps (the last hour), oldest first."""
        return self.stats(since=since)["samples"]

    def keepalive(self, duration: str | float = "1h") -> SessionRecord:
        """Postpone the idle stop ("1h", or seconds); capped by the agent (default 4 h)."""
        return self.manager.keepalive(self.id, duration)


class SessionManager(AgentOps):
    """The one entry point of the faces. Cheap; one per process is typical but not required.
    Stats, keepalive and stop summaries come from `AgentOps` (gpusession/stats.py)."""

    def __init__(self, config: GpuSessionConfig | None = None, store: Store | None = None):
        self.config = config or GpuSessionConfig()
        self.store = store or Store(self.config.data_path / "sessions.sqlite3")
        self.catalog = load_catalog()
        self._backends: dict[str, Backend] = {}
        self._connected: dict[str, Session] = {}
        self._lock = threading.RLock()
        self._stats_cache: dict[str, tuple[float, dict]] = {}  # id -> (fetched at, stats)

    # -- building blocks -----------------------------------------------------------------

    def backend(self, name: str) -> Backend:
        with self._lock:
            if name not in self._backends:
                self._backends[name] = load_backend_class(name)(self.config, self.store)
            return self._backends[name]

    def make_spec(
        self,
        gpu_type: str | None = None,
        *,
        backend: str | None = None,
        idle: str | float | None = "default",
        **options: Any,
    ) -> LaunchSpec:
        """Validate user input into a LaunchSpec (BadInput says what was wrong)."""
        from .durations import parse_duration, parse_money

        gpu, count = self.catalog.parse(gpu_type or self.config.default_type)
        name = (backend or default_backend_name(self.config)).strip().lower()
        load_backend_class(name)  # validates the name
        idle_s = parse_duration(self.config.default_idle if idle == "default" else idle, what="idle timeout")
        spec = LaunchSpec(gpu_type=gpu.name, gpu_count=count, backend=name, idle_timeout_s=idle_s)
        spec.max_cost = parse_money(options.pop("max_cost", None), what="--max-cost")
        max_runtime = options.pop("max_runtime", None)
        spec.max_runtime_s = parse_duration(max_runtime, what="--max-runtime") if max_runtime else None
        for key in ("name", "image", "host", "spot", "region", "gpu_only_idle"):
            if options.get(key) is not None:
                setattr(spec, key, options.pop(key))
        spec.extra.update({k: v for k, v in options.items() if v is not None})
        return spec

    # -- start ---------------------------------------------------------------------------

    def create(self, spec: LaunchSpec) -> SessionRecord:
        """Check the backend and record the session (state requested). Fast; raises on bad input."""
        backend = self.backend(spec.backend)
        backend.check(spec)
        return self.store.create(spec, price_per_hour=backend.price_per_hour(spec, self.catalog))

    def start(self, spec: LaunchSpec, report: Reporter | None = None) -> Session:
        """Provision, connect and wait for the kernel. On any failure (Ctrl-C included) the
        half-started session is stopped and recorded as failed, naming the stage."""
        record = self.create(spec)
        return self.launch(record, report)

    def launch(self, record: SessionRecord, report: Reporter | None = None) -> Session:
        progress = Progress(report)
        backend = self.backend(record.backend)
        spec = record.spec
        progress.say(f"session {record.name}: {spec.gpu_count} x {spec.gpu_type} on {record.backend}")
        link: Link | None = None
        try:
            self.store.transition(record.id, State.PROVISIONING)
            with progress.stage("provision"):
                backend.provision(self.store.get(record.id), progress)
            record = self.store.transition(record.id, State.STARTING)
            with progress.stage("connect"):
                link = backend.connect(record, progress)
            with progress.stage("kernel", "waiting for the kernel to answer"):
                session = Session(self, record, backend, link, None)  # type: ignore[arg-type]
                kernel = KernelClient(link.endpoint.connection_info, healthy=session.healthy, reconnects=lambda: link.reconnects)
                session.kernel = kernel
                try:
                    kernel.wait_ready(timeout=120)
                except BaseException:
                    kernel.close()
                    raise
        except BaseException as exc:
            stage = exc.stage if isinstance(exc, StageError) else (progress.current or "start")
            message = str(exc) if isinstance(exc, StageError) else f"{stage}: {type(exc).__name__}: {exc}"
            if isinstance(exc, KeyboardInterrupt):
                message = f"{stage}: interrupted"
            self._abort(record, link, backend, message)
            raise
        session.record = self.store.transition(record.id, State.RUNNING, f"ready in {progress.elapsed():.1f}s")
        progress.say(f"running: session {record.name} is ready")
        with self._lock:
            self._connected[record.id] = session
        return session

    def _abort(self, record: SessionRecord, link: Link | None, backend: Backend, message: str) -> None:
        try:
            if link is not None:
                link.close()
            backend.stop(self.store.get(record.id))
            self.store.transition(record.id, State.FAILED, f"start failed; cleaned up ({message})", error=message)
        except Exception as cleanup_exc:  # noqa: BLE001 - keep the first error; record the second
            self.store.transition(
                record.id,
                State.FAILED,
                f"start failed and cleanup failed: {cleanup_exc}; run `gpusession gc`",
                error=message,
            )

    # -- attach / look up ----------------------------------------------------------------

    def get(self, key: str) -> SessionRecord:
        return self.store.get(key)

    def list(self, *, active_only: bool = False) -> list[SessionRecord]:
        return self.store.list(active_only=active_only)

    def connected(self, key: str | None = None) -> Session | None:
        with self._lock:
            if key is None:
                return None
            rec = self.store.get(key)
            return self._connected.get(rec.id)

    def attach(self, key: str, report: Reporter | None = None) -> Session:
        """Connect this process to a running session (started here or anywhere else)."""
        record = self.store.get(key)
        with self._lock:
            if record.id in self._connected:
                return self._connected[record.id]
        if record.state != State.RUNNING:
            raise NoSession(f"session {record.name} is {record.state.value}, not running")
        backend = self.backend(record.backend)
        progress = Progress(report)
        with progress.stage("connect", f"attaching to {record.name}"):
            if not backend.is_alive(record):
                self._reconcile(record, backend)
                raise NoSession(f"session {record.name} is gone ({backend.stop_reason(record) or 'remote side ended'})")
            link = backend.connect(record, progress)
            session = Session(self, record, backend, link, None)  # type: ignore[arg-type]
            session.kernel = KernelClient(link.endpoint.connection_info, healthy=session.healthy, reconnects=lambda: link.reconnects)
            session.kernel.wait_ready(timeout=30)
        with self._lock:
            self._connected[record.id] = session
        return session

    def close(self) -> None:
        """Let go of every session this process is connected to; the sessions keep running."""
        with self._lock:
            sessions = list(self._connected.values())
            self._connected.clear()
        for session in sessions:
            session.close_connections()

    # -- stop ----------------------------------------------------------------------------

    def stop(self, key: str, reason: str = "stopped by user") -> SessionRecord:
        record = self.store.get(key)
        backend = self.backend(record.backend)
        with self._lock:
            session = self._connected.pop(record.id, None)
        if not record.state.active:
            if session:  # stopped elsewhere (the sidebar, its watchdog): let go of the kernel's sockets too
                session.close_connections()
            return record
        self.store.transition(record.id, State.STOPPING, reason)
        if session is not None:
            self._save_summary(record, session=session)
            try:
                session.kernel.shutdown(timeout=3)
            except Exception:  # noqa: BLE001 - the kernel may be gone already; teardown follows
                pass
            session.close_connections()
        try:
            backend.stop(record)
        except Exception as exc:
            self.store.note(record.id, f"stop failed: {exc}")
            raise StageError("stop", f"{exc}; the session stays recorded as stopping, run `gpusession gc` to retry") from exc
        record = self.store.get(record.id)
        if "agent_summary" not in record.resource:
            self._save_summary(record, backend=backend)
            record = self.store.get(record.id)
        return self.store.transition(record.id, State.STOPPED, self.summary_line(record))

    def stop_all(self) -> list[SessionRecord]:
        return [self.stop(r.id) for r in self.store.list(active_only=True)]

    def _mark_gone(self, session: Session, why: str) -> str | None:
        """The kernel stopped answering. Returns what to tell the user when the session's own
        watchdog stopped it (recorded as stopped); else records it as failed, returns None."""
        with self._lock:
            self._connected.pop(session.id, None)
        session.close_connections()
        reason = session.backend.stop_reason(session.record)
        if is_watchdog_stop(reason):
            session.record = self._reconcile(session.record, session.backend)
            return describe_stop(session.name, reason)
        try:
            session.backend.stop(session.record)
        finally:
            session.record = self.store.transition(session.id, State.FAILED, why, error=why)
        return None

    def _reconcile(self, record: SessionRecord, backend: Backend) -> SessionRecord:
        """The remote side is gone: record it as stopped, with the reason it left."""
        with self._lock:  # found by gc while this process held it: let go (the tunnel retries forever)
            connected = self._connected.pop(record.id, None)
        if connected is not None:
            connected.close_connections()
        reason = backend.stop_reason(record) or "remote side ended"
        # when it really stopped (the laptop may have slept for hours since): billing ended then
        details = getattr(backend, "stop_details", lambda r: None)(record) or {}
        at = details.get("at")
        self._save_summary(record, backend=backend)
        backend.stop(record)
        last = max((e.at for e in record.events), default=record.created_at)
        at = at if isinstance(at, (int, float)) and last <= at <= time.time() else None
        return self.store.transition(record.id, State.STOPPED, f"found stopped: {reason}", at=at)

    # -- reporting -----------------------------------------------------------------------

    def view(self, record: SessionRecord) -> dict[str, Any]:
        """The JSON shape every face shows (REST SessionView)."""
        started = next((e.at for e in record.events if e.state == State.RUNNING), None)
        stopped = next((e.at for e in reversed(record.events) if not e.state.active), None)
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
            "idle": self.live_idle(record)
            or {"timeout_s": record.spec.idle_timeout_s, "remaining_s": None, "warning": None},
            "max_cost": record.spec.max_cost,
            "owner": record.owner,
        }

    # -- gc ------------------------------------------------------------------------------

    def gc(self, *, dry_run: bool = False, backends: list[str] | None = None, orphans: bool = False,
           skipped: list[str] | None = None) -> list[str]:
        """Find and stop what crashed processes left behind. Returns one line per action;
        backends that could not be asked (no engine, no credentials) go to `skipped`.

        - a labelled resource whose session is stopped, failed or unknown to the store: removed
        - an active record whose remote side is gone: recorded as stopped
        - a record stuck starting (requested/provisioning/starting) whose owner process is dead:
          stopped and recorded as failed
        - with orphans=True, also running sessions whose owner process is dead
        """
        from .backends import backend_names

        actions: list[str] = []
        names = backends or backend_names()
        records = {r.id: r for r in self.store.list()}
        for name in names:
            try:
                backend = self.backend(name)
                resources = backend.list_resources()
            except GpuSessionError as exc:
                if skipped is not None:
                    skipped.append(f"{name}: not checked ({exc})")
                continue
            for res in resources:
                rec = records.get(res.session_id)
                if rec is not None and rec.state.active:
                    continue
                why = "unknown to the store" if rec is None else f"session {rec.name} is {rec.state.value}"
                actions.append(f"{'would remove' if dry_run else 'removed'} {res.description} ({why})")
                if not dry_run:
                    backend.remove_resource(res)
        for rec in self.store.list(active_only=True):
            try:
                backend = self.backend(rec.backend)
            except GpuSessionError:
                continue
            stuck = rec.state in (State.REQUESTED, State.PROVISIONING, State.STARTING, State.STOPPING)
            owner_dead = _owner_dead(rec.owner)
            if stuck and owner_dead:
                actions.append(f"{'would stop' if dry_run else 'stopped'} {rec.name} (left {rec.state.value} by a dead process)")
                if not dry_run:
                    backend.stop(rec)
                    self.store.transition(rec.id, State.FAILED, "cleaned up by gc: its starter died", error="starter process died")
            elif rec.state == State.RUNNING and not backend.is_alive(rec):
                actions.append(f"{'would record' if dry_run else 'recorded'} {rec.name} as stopped (remote side gone)")
                if not dry_run:
                    self._reconcile(rec, backend)
            elif rec.state == State.RUNNING and orphans and owner_dead:
                actions.append(f"{'would stop' if dry_run else 'stopped'} {rec.name} (its notebook process is gone)")
                if not dry_run:
                    self.stop(rec.id, reason="stopped by gc: owner process gone")
        return actions


def _owner_dead(owner: str) -> bool:
    """True when the owner ran on this host and its pid no longer exists."""
    import socket

    try:
        who, pid_text = owner.rsplit(":", 1)
        host = who.split("@", 1)[1]
        pid = int(pid_text)
    except (ValueError, IndexError):
        return False
    if host != socket.gethostname():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False
