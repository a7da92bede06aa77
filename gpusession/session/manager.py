"""Orchestration: start -> provision -> connect -> (cells) -> stop, with every transition recorded.

The faces (magics, CLI, server, widgets) talk to `SessionManager` only; they never import a
concrete backend. It returns data (records, views, stats documents); the faces put them into
words with `gpusession.words`.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any, Mapping

from ..backends import Backend, Link, default_order, load_backend_class, loaded_classes
from ..configuration import options
from ..configuration.advice import advice_document, could_save
from ..configuration.catalog import load_catalog
from ..configuration.cost import PRICE_BASIS, budget_status, month_start, spend_report
from ..configuration.settings import load_policy, price_regions
from ..core.durations import KEEPALIVE, REPORT_SINCE
from ..core.errors import (
    GpuSessionError,
    KernelDied,
    OverBudget,
    SessionEnded,
    StageError,
    WorkspaceInUse,
)
from ..core.models import LaunchSpec, SessionRecord, State
from ..core.progress import Progress, Reporter
from ..core.protocol import StopKind, StopReason, Warning, WarningKind
from ..transport.kernel import files
from .agentclient import AgentUnavailable
from .liveness import Liveness, ended_state
from .recorder import StoreRecorder
from .store import Store
from .views import session_view
from .workspaces import fetch_restore_report, save_checkpoint, workspace_claim

if TYPE_CHECKING:
    from ..configuration.config import GpuSessionConfig
    from .handle import Session

log = logging.getLogger(__name__)

POLICY_BOUNDS = (
    "policy_bounds"  # spec.extra: the bounds a policy put in ({"field", "limit", "policy"})
)
FRESH_S = 15.0  # how long a fetched stats document may fill in a view's idle countdown
BUDGET_CHECK_S = 10.0  # how old the month's spend may be when a stats poll warns of the budget
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
    """The one entry point of the faces. Cheap; one per process is typical but not required."""

    def __init__(self, config: GpuSessionConfig | None = None, store: Store | None = None):
        if config is None:  # the CLI gives an EnvConfig (settings.py): no traitlets.config
            from ..configuration.config import GpuSessionConfig

            config = GpuSessionConfig()
        self.config = config
        self.store = store or Store(self.config.data_path / "sessions.sqlite3")
        self._backends: dict[str, Backend] = {}
        self._connected: dict[str, Session] = {}
        self._lock = threading.RLock()
        self._stats_cache: dict[str, tuple[float, dict]] = {}  # id -> (fetched at, stats)
        self._budget_seen: tuple[float, dict | None] = (0.0, None)  # (when, budget()) for polls
        # which running sessions are still alive, asked cheaply; those a dead process left
        # starting or stopping settled (orphans.py)
        self.liveness = Liveness(self.store, self.backend, self.reconcile, self.settle)

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
        takes its default."""
        from ..backends import backend_names

        spec = options.build_spec(
            values,
            config=self.config,
            catalog=self.catalog,
            backends=backend_names(),
            backend_default=lambda: default_backend_name(self.config),
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
        return spec

    # -- start ---------------------------------------------------------------------------

    def create(self, spec: LaunchSpec) -> SessionRecord:
        """Check the settings and the backend, then record the session (state requested). Fast;
        raises on bad input or a bad setting (an env var the start reads), before anything starts."""
        self.config.check()
        backend = self.backend(spec.backend)
        backend.check(spec)
        budget = self.budget()
        if budget is not None and budget["state"] == "over" and budget.get("policy"):
            raise OverBudget(
                f"this month's spend ${budget['spent']:,.2f} has reached the monthly cap of "
                f"${budget['budget']:,.2f} set by your policy ({budget['policy']}); only its "
                "administrator can raise it; `gpusession report` shows the spend"
            )
        if budget is not None and budget["state"] == "over":
            raise OverBudget(
                f"this month's spend ${budget['spent']:,.2f} has reached the monthly budget of "
                f"${budget['budget']:,.2f} ({budget['source']}); raise it (e.g. "
                "`%config GpuSessionConfig.monthly_budget = 500`, or GPUSESSION_MONTHLY_BUDGET=500 "
                "for the CLI), or wait for the next month; `gpusession report` shows the spend"
            )
        price = backend.price_per_hour(spec, self.catalog)
        try:
            record = self.store.create(spec, price_per_hour=price, claim=workspace_claim)
        except WorkspaceInUse:  # its holder may have ended unseen (a spot notice, no watcher)
            if not self._found_ended(workspace_claim(spec, spec.name or "")):
                raise
            record = self.store.create(spec, price_per_hour=price, claim=workspace_claim)
        basis = backend.price_basis(spec)  # the faces say "cloud rate, own hardware" from it
        if basis:
            record = self.store.update_resource(record.id, **{PRICE_BASIS: basis})
        if budget is not None and budget["state"] == "warn":  # the faces say it at the start
            record = self.store.update_resource(record.id, budget=budget)
        return record

    def budget(self, at: float | None = None) -> dict | None:
        """This calendar month's spend (UTC, as the report counts it) against the monthly budget
        (gpusession/configuration/cost.py budget_status); None when no budget is set."""
        budget = float(self.config.monthly_budget or 0.0)
        policy = load_policy()
        cap = policy.monthly_cap if policy is not None else None
        capped = cap is not None and (budget <= 0 or cap <= budget)  # the policy's cap binds
        budget = cap if capped else budget
        if not budget or budget <= 0:
            return None
        at = time.time() if at is None else at
        since = month_start(at)
        spent = spend_report(self.store.list(), since=since, by="type", at=at)["total"]["cost"]
        status = budget_status(
            spent,
            budget,
            month=since,
            source=f"the monthly cap of your policy {policy.path}"  # type: ignore[union-attr]
            if capped
            else "GpuSessionConfig.monthly_budget / GPUSESSION_MONTHLY_BUDGET",
        )
        if status is not None and capped:
            status["policy"] = policy.path  # type: ignore[union-attr]
        return status

    def start(self, spec: LaunchSpec, report: Reporter | None = None) -> Session:
        """Provision, connect and wait for the kernel. On any failure (Ctrl-C included) the
        half-started session is stopped and recorded as failed, naming the stage."""
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
            progress.say(
                f"session {record.name}: {spec.gpu_count} x {spec.gpu_type} on {record.backend}"
            )
            self.store.transition(record.id, State.PROVISIONING)
            with progress.stage("provision"):
                backend.provision(self.store.get(record.id), progress)
            record = self.store.transition(record.id, State.STARTING)
            with progress.stage("connect"):
                link = backend.connect(record, progress)
            from .handle import Session  # the kernel client (jupyter_client, zmq): not for `list`

            session = Session(self, record, backend, link)
            try:
                with progress.stage("kernel", "waiting for the kernel to answer"):
                    session.kernel.wait_ready(
                        timeout=600 if spec.extra.get("resume") else 120
                    )  # a restore loads first
                files.upload_start_tree(
                    session.kernel, spec.extra, progress
                )  # --upload: a stage of its own
            except BaseException:
                session.kernel.close()
                raise
        except BaseException as exc:
            stage = exc.stage if isinstance(exc, StageError) else (progress.current or "start")
            message = (
                str(exc) if isinstance(exc, StageError) else f"{stage}: {type(exc).__name__}: {exc}"
            )
            if isinstance(exc, KeyboardInterrupt):
                message = f"{stage}: interrupted"
            self._abort(record, link, backend, message)
            raise
        session.record = self.store.transition(
            record.id, State.RUNNING, f"ready in {time.monotonic() - started:.1f}s"
        )
        fetch_restore_report(self.store, session)  # --resume: what came back, for the faces to say
        progress.say(f"running: session {record.name} is ready")
        with self._lock:
            self._connected[record.id] = session
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
        from .switch import switch_session

        return switch_session(self, old if isinstance(old, str) else old.id, spec, report, by=by)

    def recover(self, key: str, report: Reporter | None = None) -> Session | None:
        """A replacement for a session whose capacity was taken back after its state was saved,
        when it asks for one (`--recover`; session/recovery.py): started like the first, on the
        same workspace, restoring it. None when no recovery is wanted; raises as `start` does."""
        from .recovery import avoid_zone, replacement_values

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
        return self.start(spec, report)

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
            self._save_summary(record, session=session)
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
            self._save_summary(record, backend=backend)
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
        details = backend.stop_details(record)
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
            record.id, state, f"found {state.value}: {reason.kind.value}", at=at, error=error
        )

    def settle(self, record: SessionRecord) -> SessionRecord | None:
        """A record its dead driver left in a driven state (session/orphans.py): settled with its
        backend, once. Returns it as now stored; None when another process settles it."""
        from .orphans import settle

        done = settle(
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

    # -- the agent: stats, keepalive, summaries --------------------------------------------

    def _running_session(self, key: str) -> Session:
        """A running session's handle, attaching when this process is not connected: the server
        and other processes ask about sessions they did not start."""
        record = self.refresh_state(key)
        if record.state != State.RUNNING:
            raise SessionEnded(record)
        return self.connected(record.id) or self.attach(record.id)

    def stats(
        self,
        key: str,
        since: float | None = None,
        limit: int | None = None,
        *,
        check_alive: bool = True,
    ) -> dict:
        """The agent's stats document for a running session (docs/gpu-agent.md). Raises
        SessionEnded when the session turns out to have stopped. check_alive=False only asks the
        agent of a session this process is connected to, and never tears down connections (for a
        background poll while a cell runs)."""
        if not check_alive:
            session = self.connected(key)
            if session is None:
                raise AgentUnavailable("not connected to this session")
            return self._with_notices(session.id, session.agent.stats(since, limit))
        session = self._running_session(key)
        try:
            doc = session.agent.stats(since, limit)
        except AgentUnavailable:
            record = self.refresh_state(session.id)
            if record.state != State.RUNNING:
                raise SessionEnded(record) from None
            raise
        doc = self._with_notices(session.id, doc)
        if any(
            w.get("kind") == WarningKind.BUDGET.value and w.get("action") == "stop"
            for w in doc.get("warnings") or [] if isinstance(w, dict)
        ):  # fmt: skip
            self._stop_at_cap(session.id)
        with self._lock:
            self._stats_cache[session.id] = (time.time(), doc)
        self.liveness.saw(session.id)
        return doc

    def _with_notices(self, session_id: str, doc: dict) -> dict:
        """Add what the agent cannot know to the warnings the notebook and the panels show: a
        spot interruption notice (seen by the link and recorded in the store), and the month's
        spend past 80% of the monthly budget while the session runs (docs/cost.md)."""
        warnings = list(doc.get("warnings") or [])
        interrupted = self.store.get(session_id).resource.get("interrupted")
        if interrupted:
            notice = interrupted.get("notice") or {}
            warnings.append(
                Warning(
                    WarningKind.SPOT_INTERRUPTION,
                    action=notice.get("action"),
                    time=notice.get("time"),
                ).to_dict()
            )
        budget = self._recent_budget()
        if budget is not None and budget["state"] != "ok":
            stop = budget["state"] == "over" and self._stops_at_cap(budget)
            warnings.append(
                Warning(
                    WarningKind.BUDGET,
                    spent=budget["spent"],
                    budget=budget["budget"],
                    source=budget["source"],
                    action="stop" if stop else None,
                ).to_dict()
            )
        return dict(doc, warnings=warnings) if warnings else doc

    def _recent_budget(self) -> dict | None:
        """`budget()` at most BUDGET_CHECK_S old: every stats poll of every session asks, and
        summing the month's spend reads the whole store."""
        with self._lock:
            at, status = self._budget_seen
        if time.time() - at > BUDGET_CHECK_S:
            status = self.budget()
            with self._lock:
                self._budget_seen = (time.time(), status)
        return status

    def _stop_at_cap(self, session_id: str) -> None:
        """The policy's monthly cap is spent and it says stop (`stop_at_monthly_cap`): stop the
        session, its variables saved into its workspace first when it has one; SessionEnded
        tells the caller (the notebook's poll says so in one line)."""
        record = self.store.get(session_id)
        by = f"your policy's monthly cap ({load_policy().path})"  # type: ignore[union-attr]
        record = self.stop(session_id, by=by, save=bool(record.resource.get("workspace")))
        raise SessionEnded(record)

    @staticmethod
    def _stops_at_cap(budget: dict) -> bool:
        """Whether an administrator's policy stops running sessions once its monthly cap is
        spent (`stop_at_monthly_cap`; else a running session is only warned)."""
        policy = load_policy() if budget.get("policy") else None
        return bool(policy is not None and policy.stop_at_monthly_cap)

    def keepalive(self, key: str, duration: str | float) -> dict:
        """Postpone the session's idle stop by `duration` (the duration grammar); the agent caps
        it (default 4 h ahead). Returns what the agent granted, plus `asked_s` and `name`."""
        seconds = KEEPALIVE.parse(duration)
        session = self._running_session(key)
        granted = session.agent.keepalive(seconds)
        self.store.note(session.id, f"keepalive {granted['granted_s']:.0f}s")
        return dict(granted, asked_s=seconds, name=session.name)

    def _save_summary(
        self, record: SessionRecord, session: Session | None = None, backend: Backend | None = None
    ) -> None:
        """Keep the agent's summary in the record: asked of the agent while it still runs, or
        what it left behind (the backend's `stop_details`)."""
        summary = None
        if session is not None:
            try:
                summary = session.agent.summary()
            except AgentUnavailable:
                summary = None
        if summary is None and backend is not None:
            details = backend.stop_details(record)
            summary = details.summary if details is not None else None
        if summary:
            self.store.update_resource(record.id, agent_summary=summary)

    def advice(self, key: str, *, live: bool = True) -> dict:
        """Right-sizing advice (gpusession/configuration/advice.py) as data, from the agent's summary: asked of
        the agent while the session runs (`live`), else the one kept when it stopped. Adds
        `name` and `state`."""
        record = self.store.get(key)
        summary = None
        if live and record.state == State.RUNNING:
            try:
                summary = self._running_session(record.id).agent.summary()
            except GpuSessionError:  # ended meanwhile, or the agent does not answer
                record = self.store.get(record.id)
        summary = summary or record.resource.get("agent_summary")
        doc = advice_document(
            summary,
            gpu_type=record.spec.gpu_type,
            gpu_count=record.spec.gpu_count,
            spot=record.spec.spot,
            catalog=self.catalog,
        )
        return dict(doc, name=record.name, state=record.state.value)

    def report(
        self, since: str | float | None = "30d", by: str = "type", split: str | None = None
    ) -> dict:
        """The spend report as data (gpusession/configuration/cost.py `spend_report`): the sessions billed in
        the last `since` (the duration grammar), a row per `by`, running sessions counted up to
        now (checked first, so one that ended is counted until it ended)."""
        seconds = REPORT_SINCE.parse("30d" if since is None else since)
        at = time.time()
        doc = spend_report(
            self.list(check=True),
            since=at - float(seconds or 0.0),
            by=by,
            at=at,
            split=split,
            catalog_prices=self._catalog_prices,
            could_save=lambda r: could_save(
                r.resource.get("agent_summary"),
                gpu_type=r.spec.gpu_type,
                gpu_count=r.spec.gpu_count,
                catalog=self.catalog,
                spot=r.spec.spot,
            ),
        )
        return dict(doc, catalog_date=self.catalog.snapshot_date, budget=self.budget(at))

    def _catalog_prices(self, record: SessionRecord) -> tuple[float, ...]:
        """The catalog's rates for a session's GPUs: per GPU x count, and the whole instance."""
        try:
            gpu = self.catalog.get(record.spec.gpu_type)
            return tuple(
                self.catalog.price_per_hour(
                    gpu, record.spec.gpu_count, spot=record.spec.spot, whole_instance=whole
                )
                for whole in (False, True)
            )
        except GpuSessionError:  # a type the catalog no longer has
            return ()

    def live_prices(self, types: list[str] | None = None) -> list[dict[str, Any]]:
        """The clouds' current prices (`Backend.live_prices`) for the configured regions a
        policy allows (settings.py `price_regions`), of `types` only when given, each row with
        its `backend`."""
        from ..backends import backend_names

        regions = price_regions(getattr(self.config, "regions", "") or "")
        rows: list[dict[str, Any]] = []
        for name in backend_names():
            if load_backend_class(name).live_prices is Backend.live_prices:
                continue  # own hardware: no live prices to ask for
            rows += [
                dict(r, backend=name)
                for r in self.backend(name).live_prices(self.catalog, regions, types)
            ]
        return rows

    def refresh_catalog(self) -> dict[str, Any]:
        """`gpusession catalog refresh`: the clouds' on-demand list prices (`Backend.list_prices`)
        of the catalog's instance types, written as the user's dated snapshot (catalog.py) that
        every face then uses. Data {"path", "date", "priced", "of", "changed", "missing", "was"}.
        A failure (no credentials) writes nothing and says the date the prices stay at."""
        import datetime

        from ..backends import backend_names
        from ..configuration.catalog import packaged_catalog, write_user_snapshot

        was, base = self.catalog.snapshot_date, packaged_catalog()
        wanted = base.instance_types()
        prices: dict[str, float] = {}
        sources = []
        for name in backend_names():
            if load_backend_class(name).list_prices is Backend.list_prices:
                continue  # own hardware: no price list
            try:
                found = self.backend(name).list_prices(wanted, base.region)
            except GpuSessionError as exc:
                raise type(exc)(
                    f"the catalog was not refreshed (its prices stay those of {was}): {exc}"
                ) from None
            prices.update(found or {})
            sources.append(name)
        if not prices:
            raise GpuSessionError(
                f"no price list priced any of the catalog's {len(wanted)} instance types: the "
                f"catalog was not refreshed (its prices stay those of {was})"
            )
        date = datetime.datetime.now(datetime.timezone.utc).date().isoformat()
        path = write_user_snapshot(
            prices,
            date=date,
            source=f"on-demand list prices of the {', '.join(sources)} price list ({base.region}) "
            f"on {date}; spot and the rest from the package's catalog of {base.snapshot_date}",
        )
        old = {i.name: i.on_demand for t in base.types for i in t.instances}
        return {
            "path": str(path),
            "date": date,
            "was": was,
            "priced": len(prices),
            "of": len(wanted),
            "changed": sorted(k for k, v in prices.items() if abs(v - old.get(k, v)) > 1e-9),
            "missing": [k for k in wanted if k not in prices],
        }

    def live_stats(self, record: SessionRecord) -> dict | None:
        """Recently fetched stats of a running session (for views), with the idle countdown
        moved on to now; None when there are none fresh enough."""
        with self._lock:
            at, doc = self._stats_cache.get(record.id, (0.0, None))
        if doc is None or time.time() - at > FRESH_S or record.state != State.RUNNING:
            return None
        idle = dict(doc.get("idle") or {})
        if idle.get("remaining_s") is not None:  # it has been counting down since
            idle["remaining_s"] = round(max(0.0, idle["remaining_s"] - (time.time() - at)), 1)
        return dict(doc, idle=idle)

    # -- reporting -----------------------------------------------------------------------

    def view(self, record: SessionRecord) -> dict[str, Any]:
        """The JSON shape every face shows (REST SessionView): data, no words."""
        from .orphans import cut_switch

        return session_view(
            record,
            self.live_stats(record),
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
        from .gc import collect

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


__all__ = ["SessionManager", "Session", "default_backend_name", "KernelDied"]
