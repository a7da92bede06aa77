"""Orchestration: start -> provision -> connect -> (cells) -> stop, with every transition recorded.

The faces (magics, CLI, server, widgets) talk to `SessionManager` only; they never import a
concrete backend. It holds the sessions' lifecycle (create, launch/start, attach, switch,
recover, stop, reconcile, settle, list, view, gc) and composes the other jobs, each in a module
of its own that takes the narrow things it uses, never the manager:

- `manager.spend` (session/spend.py `Spend`): budget, spend report, advice, live prices, the
  catalog's refresh;
- `manager.stats` (session/stats.py `Stats`): the agent's stats documents with the notices
  added to them (spot interruption, budget, the policy's stop at its monthly cap), keepalive,
  the latest document for views;
- `manager.liveness` (session/liveness.py `Liveness`): which running sessions are still alive.

It returns data (records, views, stats documents); the faces put them into words with
`gpusession.words`.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any, Mapping

from ..backends import Backend, Link
from ..configuration import options
from ..configuration.catalog import load_catalog
from ..configuration.cost import PRICE_BASIS
from ..configuration.registry import (
    backend_names,
    default_order,
    load_backend_class,
    loaded_classes,
)
from ..configuration.settings import load_policy
from ..core.errors import (
    BadInput,
    GpuSessionError,
    KernelDied,
    OverBudget,
    SessionEnded,
    StageError,
    WorkspaceInUse,
)
from ..core.models import LaunchSpec, SessionRecord, State
from ..core.progress import Progress, Reporter
from ..core.protocol import StopKind, StopReason
from ..transport.kernel import files
from .fallback import PASSED_OVER, provision_placed, taken_line
from .gc import collect
from .liveness import Liveness, ended_state
from .orphans import cut_switch
from .orphans import settle as settle_orphaned
from .recorder import StoreRecorder
from .recovery import avoid_zone, replacement_values
from .spend import Spend
from .stats import Stats, save_summary
from .store import Store
from .views import session_view
from .workspace_ops import fetch_restore_report, resume_values, save_checkpoint, workspace_claim

if TYPE_CHECKING:
    from ..configuration.config import GpuSessionConfig
    from .handle import Session

log = logging.getLogger(__name__)

POLICY_BOUNDS = (
    "policy_bounds"  # spec.extra: the bounds a policy put in ({"field", "limit", "policy"})
)
ORPHAN_READY_S = 20.0  # how long a record left starting by a dead process may take to answer


def default_backend_name(config: GpuSessionConfig) -> str:
    """The configured default, else the first backend whose `available()` answers yes in the
    backends' `default_rank` order (docker when an engine answers, else local); the last ranked
    one when none answers."""
    if config.default_backend:
        return config.default_backend
    ranked = default_order(loaded_classes())
    for name in ranked[:-1]:
        try:
            if load_backend_class(name).available():
                return name
        except GpuSessionError:
            pass
    return ranked[-1] if ranked else "local"


class SessionManager:
    """The one entry point of the faces: the sessions' lifecycle here, what they cost in
    `.spend`, what their agents say in `.stats`. Cheap; one per process is typical but not
    required."""

    def __init__(self, config: GpuSessionConfig | None = None, store: Store | None = None):
        if config is None:  # the CLI gives an EnvConfig (settings.py): no traitlets.config
            # lazy: docs/architecture.md#imports-kept-inside-functions
            from ..configuration.config import GpuSessionConfig

            config = GpuSessionConfig()
        self.config = config
        self.store = store or Store(self.config.data_path / "sessions.sqlite3")
        self._backends: dict[str, Backend] = {}
        self._connected: dict[str, Session] = {}
        self._lock = threading.RLock()
        # which running sessions are still alive, asked cheaply; those a dead process left
        # starting or stopping settled (orphans.py)
        self.liveness = Liveness(self.store, self.backend, self.reconcile, self.settle)
        # what sessions cost: budget, spend report, advice, live prices, catalog refresh
        self.spend = Spend(
            self.store,
            self.config,
            catalog=lambda: self.catalog,
            backend=self.backend,
            checked=lambda: self.list(check=True),
            summary=lambda key: self._running_session(key).agent.summary(),
        )
        # what a running session's agent says: stats with their notices, keepalive, for views
        self.stats = Stats(
            self.store,
            running=self._running_session,
            connected=self.connected,
            refresh_state=self.refresh_state,
            budget=self.spend.budget,
            stop=self.stop,
            saw=self.liveness.saw,
        )

    # -- building blocks -----------------------------------------------------------------

    @property
    def catalog(self):
        """The GPU catalog, with the user's refreshed prices as soon as they are written."""
        return load_catalog()

    def backend(self, name: str) -> Backend:
        with self._lock:
            if name not in self._backends:
                self._backends[name] = load_backend_class(name)(
                    self.config, StoreRecorder(self.store)
                )
            return self._backends[name]

    def make_spec(
        self, gpu_type: str | None = None, /, *, face: str = options.REST, **values: Any
    ) -> LaunchSpec:
        """The Python face: `make_spec("a100:8", backend="docker", idle="15m")`; keywords as
        `spec_from` takes them (a keyword left out takes its default; idle=None: no idle stop)."""
        if gpu_type is not None:
            values["type"] = gpu_type
        return self.spec_from(values, face)

    def spec_from(self, values: Mapping[str, Any], face: str = options.REST) -> LaunchSpec:
        """Validate start options as a face was given them (BadInput says what was wrong, naming
        each field in the words of `face`: options.REST, FLAGS or FORM): the option table's rules
        (gpusession/configuration/options.py), with this manager's config for defaults. An option left out
        takes its default; a `resume` without a backend goes where its workspace lives
        (session/workspace_ops.py `resume_values`)."""
        values = resume_values(self.store, dict(values))  # --resume: where its workspace lives
        picked: list[str] = []  # the backend nobody named, picked by `default_rank`

        def backend_default() -> str:
            name = default_backend_name(self.config)
            if not self.config.default_backend:
                picked.append(name)
            return name

        spec = options.build_spec(
            values,
            config=self.config,
            catalog=self.catalog,
            backends=backend_names(),
            backend_default=backend_default,
            face=face,
        )
        files.check_start_tree(
            spec.extra, face
        )  # --upload: a tree over its cap is refused before anything starts
        policy = load_policy()
        if policy is not None:  # an administrator's bounds: refused beyond, put in where unset
            problems, bounds = policy.bound(spec, options.given_names(values))
            if problems:
                raise options.BadOptions(problems, face)
            if bounds:
                spec.extra[POLICY_BOUNDS] = bounds
        replay = getattr(self.config, "nvml_replay", "")  # GPUSESSION_NVML_REPLAY: charts, no GPU
        if (
            replay
            and "nvml_replay" not in spec.extra
            and load_backend_class(spec.backend).agent_beside_us
        ):
            spec.extra["nvml_replay"] = replay
        if picked:
            self._check_picked(spec)
        return spec

    def _check_picked(self, spec: LaunchSpec) -> None:
        """A backend nobody chose must be able to give the type asked, said before anything is
        pulled (a first run on a machine with a Docker engine and no GPU)."""
        why = self.backend(spec.backend).cannot_give(spec)
        if why:
            raise BadInput(
                f"no backend was named, and the default ({spec.backend}) cannot give "
                f"{spec.gpu_count} x {spec.gpu_type.upper()}: {why}; nothing was pulled or "
                "started. Run `gpusession "
                "setup` to find where your GPUs are and make that the default, or name one with "
                "--backend (--backend local runs on this machine without a GPU)"
            )

    # -- start ---------------------------------------------------------------------------

    def create(self, spec: LaunchSpec) -> SessionRecord:
        """Check the settings and the backend, then record the session (state requested). Fast;
        raises on bad input or a bad setting (an env var the start reads), before anything starts."""
        self.config.check()
        backend = self.backend(spec.backend)
        backend.check(spec)
        budget = self.spend.budget(fresh=True)  # money at the gate: the store as it is now
        if budget is not None and budget["state"] == "over" and budget.get("policy"):
            raise OverBudget(
                f"this month's spend ${budget['spent']:,.2f} has reached the monthly cap of "
                f"${budget['budget']:,.2f} set by your policy ({budget['policy']}); only its "
                "administrator can raise it; `gpusession report` shows the spend"
            )
        if budget is not None and budget["state"] == "over":
            raise OverBudget(  # says where the budget that refused lives, and how to raise it
                f"this month's spend ${budget['spent']:,.2f} has reached the monthly budget of "
                f"${budget['budget']:,.2f} set by {budget['source']}: {budget['change']}, or "
                "wait for the next month; `gpusession report` shows the spend"
            )
        price = backend.price_per_hour(spec, self.catalog)
        held: dict = {}  # in the record from its first write (one write, not three)
        basis = backend.price_basis(spec)  # the faces say "cloud rate, own hardware" from it
        if basis:
            held[PRICE_BASIS] = basis
        if budget is not None and budget["state"] == "warn":  # the faces say it at the start
            held["budget"] = budget
        try:
            return self.store.create(
                spec, price_per_hour=price, claim=workspace_claim, resource=held
            )
        except WorkspaceInUse:  # its holder may have ended unseen (a spot notice, no watcher)
            if not self._found_ended(workspace_claim(spec, spec.name or "")):
                raise
            return self.store.create(
                spec, price_per_hour=price, claim=workspace_claim, resource=held
            )

    def start(self, spec: LaunchSpec, report: Reporter | None = None) -> Session:
        """Provision, connect and wait for the kernel. On any failure (Ctrl-C included) the
        half-started session is stopped and recorded as failed, naming the stage."""
        with self.store.held():  # its 12-15 uses of the store: none checkpoints the WAL
            return self.launch(self.create(spec), report)

    def launch(
        self,
        record: SessionRecord,
        report: Reporter | None = None,
        *,
        within: Progress | None = None,
    ) -> Session:
        """`within`: the progress of a longer operation this start is part of (a switch): its
        lines then count from that operation's start."""
        progress, started = within or Progress(report), time.monotonic()
        link: Link | None = None
        backend: Backend | None = None
        try:  # from the first instruction: a Ctrl-C anywhere must not strand the record or its name
            backend = self.backend(record.backend)
            spec = record.spec
            if within is None:  # a switch has said what it starts (and its new record's name
                # is a temporary one until the hand-over)
                progress.say(
                    f"session {record.name}: {spec.gpu_count} x {spec.gpu_type} on {record.backend}"
                )
            self.store.transition(record.id, State.PROVISIONING)
            with progress.stage("provision"):
                record = provision_placed(
                    self.store,
                    backend,
                    record,
                    progress,
                    lambda s: backend.price_per_hour(s, self.catalog),
                )
                if record.spec.extra.get(PASSED_OVER):
                    progress.step(taken_line(record.spec))
            record = self.store.transition(record.id, State.STARTING)
            with progress.stage("connect"):
                link = backend.connect(record, progress)
            session = self._kernel_answers(record, backend, link, progress)
        except BaseException as exc:
            self._abort(record, link, backend, _failure_message(exc, progress))
            raise
        session.record = self.store.transition(
            record.id, State.RUNNING, f"ready in {time.monotonic() - started:.1f}s"
        )
        fetch_restore_report(self.store, session)  # --resume: what came back, for the faces to say
        if spec.extra.get("host"):  # it answers again: workspace listings ask it again too
            self.store.forget_hosts(record.backend, str(spec.extra["host"]))
        progress.say(
            "running: the new capacity is ready"
            if within
            else f"running: session {record.name} is ready"
        )
        with self._lock:
            self._connected[record.id] = session
        return session

    def _kernel_answers(
        self, record: SessionRecord, backend: Backend, link: Link, progress: Progress
    ) -> Session:
        """The connected session once its kernel answers (and --upload's files are there)."""
        # lazy: docs/architecture.md#imports-kept-inside-functions (jupyter_client, zmq)
        from .handle import Session

        session = Session(self, record, backend, link)
        try:
            with progress.stage("kernel", "waiting for the kernel to answer"):
                session.kernel.wait_ready(
                    timeout=600 if record.spec.extra.get("resume") else 120
                )  # a restore loads first
            files.upload_start_tree(
                session.kernel, record.spec.extra, progress
            )  # --upload: a stage of its own
        except BaseException:
            session.kernel.close()
            raise
        return session

    def _found_ended(self, claim: Any) -> bool:
        """Ask the backend of each running session holding `claim` (a workspace) whether it is
        still alive; record those gone as ended (reconcile). True when one was."""
        found = False
        for held in self.store.list(active_only=True):
            if held.state != State.RUNNING or workspace_claim(held.spec, held.name) != claim:
                continue
            backend = self.backend(held.backend)
            if not backend.is_alive(held):
                self.reconcile(held, backend)
                found = True
        return found

    def _abort(
        self, record: SessionRecord, link: Link | None, backend: Backend | None, message: str
    ) -> None:
        try:
            if link is not None:
                link.close()
            if backend is not None:
                backend.stop(self.store.get(record.id))
            self.store.transition(
                record.id, State.FAILED, f"start failed; cleaned up ({message})", error=message
            )
        except Exception as cleanup_exc:  # noqa: BLE001 - keep the first error; record the second
            self.store.transition(
                record.id,
                State.FAILED,
                f"start failed and cleanup failed: {cleanup_exc}; run `gpusession gc`",
                error=message,
            )

    # -- switch --------------------------------------------------------------------------

    def switch_spec(
        self, key: str, given: Mapping[str, Any], face: str = options.REST
    ) -> LaunchSpec:
        """The spec of the session that replaces running session `key`: its start options with
        the `given` ones over them (`on_demand`: true turns spot off); BadInput as `spec_from`."""
        # lazy: docs/architecture.md#imports-kept-inside-functions
        from .switch import switch_values

        return self.spec_from(switch_values(self.store.get(key), given), face)

    def switch(
        self,
        old: str | Session,
        spec: LaunchSpec,
        report: Reporter | None = None,
        *,
        by: str = "a switch",
    ) -> tuple[Session, Any]:
        """Move running session `old` (a key or its handle) to a new session started from `spec`,
        keeping its variables and files through its workspace (session/switch.py). Returns the
        new session and a `SwitchReport`; on any failure the old session keeps running."""
        # lazy: docs/architecture.md#imports-kept-inside-functions
        from .switch import switch_session

        return switch_session(self, old if isinstance(old, str) else old.id, spec, report, by=by)

    def recover(self, key: str, report: Reporter | None = None) -> Session | None:
        """A replacement for a session whose capacity was taken back after its state was saved,
        when it asks for one (`--recover`; session/recovery.py): started like the first, on the
        same workspace, restoring it. None when no recovery is wanted; raises as `start` does."""
        record = self.store.get(key)
        if record.state == State.RUNNING:  # ended unseen (no watcher alive): asked now
            backend = self.backend(record.backend)
            if not backend.is_alive(record):
                record = self.reconcile(record, backend)
        values = replacement_values(record)
        if values is None:
            return None
        spec = self.spec_from(values)
        if avoid_zone(record):
            spec.extra["avoid_zone"] = avoid_zone(record)
        session = self.start(spec, report)
        # the user's session, back on new capacity: it keeps its name (the ended record retired)
        session.record = self.store.hand_name_over(record.id, session.id)
        return session

    # -- attach / look up ----------------------------------------------------------------

    def get(self, key: str) -> SessionRecord:
        return self.store.get(key)

    def list(self, *, active_only: bool = False, check: bool = False) -> list[SessionRecord]:
        records = self.store.list(
            active_only=active_only
        )  # check: its running ones checked (liveness.py)
        return self.liveness.check(records) if check else records

    def connected(self, key: str | None = None) -> Session | None:
        with self._lock:
            return None if key is None else self._connected.get(self.store.get(key).id)

    def attach(self, key: str, report: Reporter | None = None) -> Session:
        """Connect this process to a running session (started here or anywhere else)."""
        record = self.store.get(key)
        with self._lock:
            if record.id in self._connected:
                return self._connected[record.id]
        if record.state != State.RUNNING:
            raise SessionEnded(record)
        backend = self.backend(record.backend)
        progress = Progress(report)
        with progress.stage("connect", f"attaching to {record.name}"):
            if not backend.is_alive(record):
                raise SessionEnded(self.reconcile(record, backend))
            # lazy: docs/architecture.md#imports-kept-inside-functions
            from .handle import Session

            session = Session(self, record, backend, backend.connect(record, progress))
            session.kernel.wait_ready(timeout=30)
        with self._lock:
            self._connected[record.id] = session
        return session

    def _release(self, session_id: str) -> None:
        """Let go of this process's connections to a session (it may keep running elsewhere)."""
        with self._lock:
            session = self._connected.pop(session_id, None)
        if session is not None:
            session.close_connections()

    def close(self) -> None:
        """Let go of every session this process is connected to; the sessions keep running."""
        with self._lock:
            ids = list(self._connected)
        for sid in ids:
            self._release(sid)

    # -- stop ----------------------------------------------------------------------------

    def stop(
        self,
        key: str,
        by: str = "user",
        kind: StopKind = StopKind.USER,
        *,
        kernel_told: bool = False,
        save: bool = False,
    ) -> SessionRecord:
        """Stop a session and record why (`by`: "user", "the sidebar"...; kernel_told: it was sent a
        shutdown_request; save: `stop --save`, its variables go into its workspace first)."""
        record = self.store.get(key)
        backend = self.backend(record.backend)
        with self._lock:
            session = self._connected.pop(record.id, None)
        if not record.state.active:
            if (
                session
            ):  # stopped elsewhere (the sidebar, its watchdog): let go of the kernel's sockets too
                session.close_connections()
            return record
        reason = StopReason(kind, by=by)
        if session is None and record.state == State.RUNNING:
            session = self._attach_for_summary(record)
            record = self.store.get(record.id)
            if not record.state.active:  # it had ended already: attaching found out and recorded it
                return record
        self.store.transition(record.id, State.STOPPING, f"stop requested by {by}")
        self.store.update_resource(record.id, stop_reason=reason.to_dict())
        if save:
            save_checkpoint(self.store, record, session)
        if session is not None:
            save_summary(self.store, record, session=session)
            try:  # a kernel told already (by JupyterLab) is going: no waiting for its second reply
                session.kernel.shutdown(timeout=0 if kernel_told else 3)
            except Exception:  # noqa: BLE001 - the kernel may be gone already; teardown follows
                pass
            session.close_connections()
        try:
            backend.stop(record)
        except Exception as exc:
            self.store.note(record.id, f"stop failed: {exc}")
            raise StageError(
                "stop",
                f"{exc}; the session stays recorded as stopping, run `gpusession gc` to retry",
            ) from exc
        record = self.store.get(record.id)
        if "agent_summary" not in record.resource:
            save_summary(self.store, record, backend=backend)
        return self.store.transition(record.id, State.STOPPED, f"stopped: {kind.value}")

    def _attach_for_summary(self, record: SessionRecord) -> Session | None:
        """A process that is not connected (the CLI, the server) stops a running session: connect
        first, so the agent's summary is kept as when the notebook stops it. None when that fails."""
        try:
            session = self.attach(record.id)
        except (GpuSessionError, OSError):
            return None
        with self._lock:
            self._connected.pop(record.id, None)
        return session

    def stop_all(self, by: str = "user") -> list[SessionRecord]:
        return [self.stop(r.id, by=by) for r in self.store.list(active_only=True)]

    def mark_gone(self, session: Session, why: str) -> SessionRecord | None:
        """The kernel stopped answering while a cell ran: recorded by the same rule as a session
        found ended later (`ended_state`). Returns the record when the session ended without a
        failure (its watchdog, a stop elsewhere), else None (recorded as failed, `error` = why)."""
        self._release(session.id)  # stopped elsewhere (the sidebar, the CLI): that is what happened
        session.record = self._stopped_elsewhere(session.id) or self.reconcile(
            session.record, session.backend, died_while=why
        )
        return None if session.record.state == State.FAILED else session.record

    def _stopped_elsewhere(self, session_id: str, wait_s: float = 15.0) -> SessionRecord | None:
        """The record when another process stopped the session (recorded, or under way: waited for)."""
        deadline, record = time.monotonic() + wait_s, self.store.get(session_id)
        while record.state == State.STOPPING and time.monotonic() < deadline:
            time.sleep(0.2)
            record = self.store.get(session_id)
        return None if record.state.active and record.state != State.STOPPING else record

    def reconcile(
        self, record: SessionRecord, backend: Backend, died_while: str | None = None
    ) -> SessionRecord:
        """The remote side ended: remove what is left of it and record how it ended, with the
        reason it left (typed, in `resource["stop_reason"]`) and when (billing ended then).
        `died_while`: what this process saw (a kernel that died mid-cell), for the error."""
        self._release(
            record.id
        )  # found by gc while this process held it (the tunnel retries forever)
        seen = record.state
        details = backend.stop_details(record)
        fresh = self.store.get(record.id)
        if fresh.state != seen:  # another process stops it (its teardown is what was found):
            return fresh  # its stop records how it ended, not a gone remote side
        reason = details.reason if details and details.reason else StopReason(StopKind.GONE)
        if details is not None and details.summary:
            self.store.update_resource(record.id, agent_summary=details.summary)
        self.store.update_resource(record.id, stop_reason=reason.to_dict())
        backend.stop(record)
        last = max((e.at for e in record.events), default=record.created_at)
        at = details.at if details is not None else None
        at = at if at is not None and last <= at <= time.time() else None
        state = ended_state(reason)
        error = (
            (died_while or f"the session ended by itself ({reason.kind.value})")
            if state == State.FAILED
            else None
        )
        return self.store.transition(
            record.id,
            state,
            f"found {state.value}: {reason.kind.value}",
            at=at,
            error=error,
            expect=seen,
        )

    def settle(self, record: SessionRecord) -> SessionRecord | None:
        """A record its dead driver left in a driven state (session/orphans.py): settled with its
        backend, once. Returns it as now stored; None when another process settles it."""
        done = settle_orphaned(
            self.store,
            self.backend,
            record,
            answers=self._answers,
            stop=self.stop,
            choice=getattr(self.config, "cut_switch", "ask") or "ask",
        )
        return None if done is None else done.record

    def _answers(self, record: SessionRecord) -> bool:
        """Does a started session's kernel answer (a record left starting, found by `settle`)?
        Asked by connecting as any process attaching would, within ORPHAN_READY_S: a connect
        still waiting then (a machine still booting) counts as no, and the caller's teardown
        ends it."""
        backend = self.backend(record.backend)
        answered: list[bool] = []

        def ask() -> None:
            try:
                if not backend.is_alive(record):
                    return
                # lazy: docs/architecture.md#imports-kept-inside-functions
                from .handle import Session

                link = backend.connect(record, Progress(None))
                session = Session(self, record, backend, link)
                try:
                    session.kernel.wait_ready(timeout=ORPHAN_READY_S)
                    answered.append(True)
                finally:
                    session.close_connections()
            except (GpuSessionError, OSError, TimeoutError, RuntimeError) as exc:
                log.debug("%s left starting does not answer: %s", record.name, exc)

        asking = threading.Thread(target=ask, name=f"gpusession-answers-{record.name}", daemon=True)
        asking.start()
        asking.join(ORPHAN_READY_S + 10.0)
        return bool(answered)

    def refresh_state(self, key: str) -> SessionRecord:
        """The record, after checking that a running session's remote side still exists; when
        it is gone (its watchdog stopped it, say) the store records why."""
        record = self.store.get(key)
        backend = self.backend(record.backend) if record.state == State.RUNNING else None
        if backend is None or backend.is_alive(record):
            return record
        return self.reconcile(record, backend)

    # -- a running session's handle (for `stats` and `spend`) -----------------------------

    def _running_session(self, key: str) -> Session:
        """A running session's handle, attaching when this process is not connected: the server
        and other processes ask about sessions they did not start."""
        record = self.refresh_state(key)
        if record.state != State.RUNNING:
            raise SessionEnded(record)
        return self.connected(record.id) or self.attach(record.id)

    # -- reporting -----------------------------------------------------------------------

    def view(self, record: SessionRecord) -> dict[str, Any]:
        """The JSON shape every face shows (REST SessionView): data, no words."""
        return session_view(
            record,
            self.stats.fresh(record),
            cut_switch=cut_switch(self.store, record),
            **self.liveness.seen(record),
        )

    def gc(
        self,
        *,
        dry_run: bool = False,
        backends: list[str] | None = None,
        orphans: bool = False,
        skipped: list[str] | None = None,
        volumes: bool = False,
    ) -> list[dict]:
        """Find and stop what crashed processes left behind (gpusession/session/gc.py)."""
        return collect(
            self.store,
            self.backend,
            reconcile=self.reconcile,
            settle=self.settle,
            stop=self.stop,
            dry_run=dry_run,
            backends=backends,
            orphans=orphans,
            skipped=skipped,
            volumes=volumes,
        )


def _failure_message(exc: BaseException, progress: Progress) -> str:
    """What a failed start's record says: the stage it failed in, and why."""
    stage = exc.stage if isinstance(exc, StageError) else (progress.current or "start")
    if isinstance(exc, KeyboardInterrupt):
        return f"{stage}: interrupted"
    return str(exc) if isinstance(exc, StageError) else f"{stage}: {type(exc).__name__}: {exc}"


__all__ = ["SessionManager", "Session", "default_backend_name", "KernelDied"]
