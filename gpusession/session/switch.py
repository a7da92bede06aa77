"""Moving a running session to other capacity (`%gpu switch`): save its namespace into its
workspace, start the next session on that workspace (moved first when the next one cannot mount
it) and restore it there, then stop the old one, only once the new one answered.

When anything before that last step fails, the old session keeps running untouched and the new
record is recorded as failed with why. Returns data (`SwitchReport`); the faces put it into words
(`gpusession.words.switches.switch_line`). Recovery after a spot notice or a Slurm time limit reuses
`switch_session` with a spec of its own choosing.
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Mapping, Protocol

from ..backends.base import Backend
from ..configuration import options
from ..configuration.agentargs import workspace_name
from ..configuration.registry import load_backend_class, loaded_classes
from ..core.errors import BadInput, GpuSessionError, SessionBusy, SessionEnded, StageError
from ..core.models import LaunchSpec, SessionRecord, State
from ..core.progress import Progress, Reporter
from ..core.protocol import StopKind
from ..transport.pulls import format_bytes
from .agentclient import AgentUnavailable
from .orphans import SwitchStep, forget_cut
from .views import restart_body
from .workspace_ops import save_checkpoint, workspace_claim, workspace_place

if TYPE_CHECKING:
    from ..configuration.catalog import Catalog
    from .handle import AgentAsker, Session
    from .store import Store


class Owner(Protocol):
    """What a switch asks of the SessionManager that runs it (and nothing more)."""

    store: "Store"
    config: Any
    catalog: "Catalog"

    def backend(self, name: str) -> Backend: ...

    @property
    def stats(self) -> "AgentAsker": ...  # the agent's stats documents (session/stats.py)

    def refresh_state(self, key: str) -> SessionRecord: ...

    def connected(self, key: str | None = None) -> "Session | None": ...

    def attach(self, key: str, report: Reporter | None = None) -> "Session": ...

    def launch(
        self,
        record: SessionRecord,
        report: Reporter | None = None,
        *,
        within: Progress | None = None,
    ) -> "Session": ...

    def stop(self, key: str, by: str = "user", kind: StopKind = StopKind.USER) -> SessionRecord: ...


MOVE_REPORT_EVERY_S = 2.0  # a progress line while a workspace moves, at most this often

#: start options a switch does not carry over from the old session (it names its own)
NOT_CARRIED = ("name", "upload", "upload_max", *options.SWITCH_SKIP)  # its files are there


@dataclasses.dataclass
class SwitchReport:
    """What a switch did, as data (REST: `to_dict()`)."""

    old: str  # the session's name before the switch
    new: str  # its name after it: the same (the successor takes it over, `Store.hand_name_over`)
    workspace: str  # the workspace that carried the state
    saved: dict  # the old session's save (the agent's checkpoint result)
    restored: dict | None  # the new session's restore report (`GET /restored` of its agent)
    moved_bytes: (
        int | None
    )  # bytes of workspace that moved; None: the new session mounts it where it was
    moved_from: str  # where the workspace was ("the local engine", "ssh://...", a folder)
    moved_to: str  # where it is now
    old_price_per_hour: float
    price_per_hour: float  # the new session's rate
    seconds: float  # from the switch's start to the old session's stop
    old_stopped: bool  # False: the stop of the old session failed (`stop_error` says why)
    stop_error: str | None = None
    former: str = ""  # the record of the former capacity, under its retired name (`t4-3~1`)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _place_options() -> set[str]:
    """Where a backend runs (a Slurm login node, a Docker engine's host, an AWS region: each
    class's `place_option`): another backend's place is another machine, so these are not
    carried across backends unless given."""
    return {c.place_option for c in loaded_classes().values() if c.place_option}


def switch_values(old: SessionRecord, given: Mapping[str, Any]) -> dict[str, Any]:
    """The start options of the next session: the old session's (as `restart_body` writes them)
    with the given ones over them. Options of the old backend that the new one does not take,
    and the old place (--host, --region) on another backend, are dropped; `on_demand` (given true) turns spot off."""
    given = dict(given)
    values = {k: v for k, v in restart_body(old.spec).items() if k not in NOT_CARRIED}
    backend = given.get("backend") or old.spec.backend
    if backend != old.spec.backend:
        by_name, places = options.table().by_name, _place_options()
        values = {
            k: v
            for k, v in values.items()
            if k in given
            or (k not in places and (by_name[k].backends is None or backend in by_name[k].backends))
        }
    if given.pop("on_demand", False):
        values.pop("spot", None)
        given.pop("spot", None)
    values.update(given)
    return values


def _where(spec: LaunchSpec) -> str:
    """Where a workspace of this spec lives, in words for the progress lines (its backend's)."""
    return load_backend_class(spec.backend).workspace_where(workspace_place(spec))


def _kernel_busy(manager: "Owner", session_id: str) -> bool:
    """The session's agent says its kernel runs a cell: its latest sample says busy, and so does
    one taken after this question (the latest may predate the end of a cell that just finished,
    the usual case of a switch typed right after a cell). An agent that does not answer, or
    samples nothing, counts as idle: the save then says what it could do."""
    try:
        doc = manager.stats.fetch(session_id, limit=1)
        samples = doc.get("samples") or []
        if not (samples and samples[-1].get("kernel_busy")):
            return False
        asked_at, interval = doc.get("t") or 0.0, doc.get("interval_s") or 0.0
        deadline = time.monotonic() + 3 * interval + 1.0
        while time.monotonic() < deadline:
            samples = manager.stats.fetch(session_id, since=asked_at, limit=1).get("samples") or []
            if samples:
                return bool(samples[-1].get("kernel_busy"))
            time.sleep(min(interval / 4, 0.25))
    except (AgentUnavailable, GpuSessionError):
        return False
    return True


def _counted(
    chunks: Iterable[bytes], total: int | None, progress: Progress, moved: list[int]
) -> Iterator[bytes]:
    """The chunks, passed on, with a line every few seconds of how much moved."""
    started = last = time.monotonic()
    for chunk in chunks:
        moved[0] += len(chunk)
        yield chunk
        now = time.monotonic()
        if now - last >= MOVE_REPORT_EVERY_S:
            last = now
            rate = format_bytes(moved[0] / max(now - started, 1e-6))
            of = f" of {format_bytes(total)}" if total else ""
            progress.step(f"{format_bytes(moved[0])}{of} moved ({rate}/s)")


def switch_session(
    manager: "Owner",
    key: str,
    spec: LaunchSpec,
    report: Reporter | None = None,
    *,
    by: str = "a switch",
) -> tuple["Session", SwitchReport]:
    """Move running session `key` to a session started from `spec` (whose `name`, `workspace`
    and `resume` are set here). Raises SessionBusy while it runs a cell, BadInput for a backend
    without workspaces, and any start failure with the old session still running."""
    progress = Progress(report)
    old = manager.refresh_state(key)
    if old.state != State.RUNNING:
        raise SessionEnded(old)
    move = _plan(manager, old, spec)
    if _kernel_busy(manager, old.id):
        raise SessionBusy(
            f"session {old.name} is running a cell; switch once it has finished, or interrupt "
            "it first: nothing was changed"
        )
    spec.extra.pop("workspace", None)
    spec.extra["resume"] = move.workspace
    keeps_name = not spec.name  # no name given: the session keeps its own (`_keep_name`)
    first = SwitchStep.START if move.handover else SwitchStep.SAVE
    record = _create(manager, move.new_backend, spec, old, first)
    forget_cut(manager.store, old.id)  # an earlier cut of this session is moot now
    progress.say(f"switch {old.name} to {spec.gpu_count} x {spec.gpu_type} on {spec.backend}")
    if move.handover:
        return _hand_over(
            manager, old, record, move.new_backend, move.workspace, progress, by, keeps_name
        )
    moved = [0]
    saved = _save_and_move(manager, old, record, move, progress, moved)
    session = _start_new(manager, old, record, move, progress)
    stop_error = _stop_old(manager, old, record, session, progress, by)
    session.record = _keep_name(manager, old, record, keeps_name)
    return session, SwitchReport(
        old=old.name,
        new=session.name,
        former=manager.store.get(old.id).name,
        workspace=move.workspace,
        saved=saved,
        restored=session.record.resource.get("restored"),
        moved_bytes=None if move.same_place else moved[0],
        moved_from=_where(old.spec),
        moved_to=_where(spec),
        old_price_per_hour=old.price_per_hour,
        price_per_hour=session.record.price_per_hour,
        seconds=round(progress.elapsed(), 1),
        old_stopped=stop_error is None,
        stop_error=stop_error,
    )


@dataclasses.dataclass
class _Move:
    """How a switch moves the workspace: `same_place` (nothing to copy), `handover` (the new
    session takes the workspace over: one machine at a time, an EBS volume), `at_boot` (the files
    go into the new machine while it starts: into aws from another backend)."""

    old_backend: Backend
    new_backend: Backend
    workspace: str
    same_place: bool
    handover: bool
    at_boot: bool


def _plan(manager: "Owner", old: SessionRecord, spec: LaunchSpec) -> _Move:
    """How the workspace will move; BadInput, before anything is made, when it cannot."""
    old_backend = manager.backend(old.backend)
    new_backend = manager.backend(spec.backend)
    for backend in (old_backend, new_backend):
        if not backend.keeps_workspaces:
            raise BadInput(
                f"the {backend.name} backend keeps no workspace, so the variables cannot move "
                f"there or from there; `%gpu stop` and `%gpu start --backend {spec.backend}` instead"
            )
    workspace = old.resource.get("workspace") or workspace_name(old)
    same_place = (old.spec.backend, workspace_place(old.spec)) == (
        spec.backend,
        workspace_place(spec),
    )
    moves_itself = old.spec.backend == spec.backend and getattr(
        new_backend, "moves_workspaces_across_places", False
    )  # aws: another region's volume by snapshot copy
    handover = (same_place or moves_itself) and not new_backend.shares_workspaces
    if handover and not hasattr(new_backend, "take_workspace_over"):
        raise BadInput(
            f"the {new_backend.name} backend's workspace attaches to one session at a time and "
            f"cannot be copied yet, so session {old.name} cannot switch while it runs; "
            f"`%gpu stop --save`, then `%gpu start --resume {workspace}` "
            "with the new options"
        )
    # into aws from another backend: the files go into the new instance's volume while it
    # starts, before its kernel restores (`import_while_starting`); elsewhere into the workspace
    # before the start (aws <-> aws moves its volume itself: `take_workspace_over`)
    at_boot = (
        not same_place
        and old_backend is not new_backend
        and hasattr(new_backend, "import_while_starting")
    )
    if not same_place and not handover:
        for backend, can in ((old_backend, "export_workspace"), (new_backend, "import_workspace")):
            if getattr(type(backend), can) is getattr(Backend, can) and not (
                at_boot and backend is new_backend
            ):
                raise BadInput(
                    f"the {backend.name} backend cannot move its workspaces yet, so session "
                    f"{old.name} cannot switch from {_where(old.spec)} to {_where(spec)}; "
                    "a switch that keeps the place (another type, image, spot) works"
                )
    return _Move(old_backend, new_backend, workspace, same_place, handover, at_boot)


def _stop_old(
    manager: "Owner",
    old: SessionRecord,
    record: SessionRecord,
    session: "Session",
    progress: Progress,
    by: str,
) -> str | None:
    """Stop the old session once its successor answers; why it could not, or None."""
    _step(manager, record, SwitchStep.STOP_OLD)
    # whoever used the old session (a notebook, a watcher) follows it to its successor
    manager.store.update_resource(old.id, switched_to=session.id, switched_by=by)
    with progress.stage("stop", f"stopping {old.name}'s former capacity (the new one answered)"):
        try:
            manager.stop(old.id, by=f"{by} to {_capacity(record.spec)}", kind=StopKind.USER)
        except GpuSessionError as exc:
            return str(exc)
    return None


def _save_and_move(
    manager: "Owner",
    old: SessionRecord,
    record: SessionRecord,
    move: _Move,
    progress: Progress,
    moved: list[int],
) -> dict[str, Any]:
    """Save the old session's variables into its workspace and move the workspace where the new
    session will run (or arrange that it goes in while the new one boots): the save's result. A
    failure ends the new record as failed and leaves the old session running."""
    old_backend, new_backend = move.old_backend, move.new_backend
    try:
        old_session = manager.connected(old.id) or manager.attach(old.id)
        with progress.stage(
            "save", f"saving the variables of {old.name} into workspace {move.workspace}"
        ):
            saved = save_checkpoint(manager.store, old, old_session)
            if not saved.get("committed"):
                raise StageError("save", f"variables not saved ({saved.get('error') or 'unknown'})")
            progress.step(
                f"saved {saved.get('saved', 0)} variable(s), {format_bytes(saved.get('bytes') or 0)}"
            )
        if move.at_boot:
            new_backend.import_while_starting(  # type: ignore[attr-defined]
                record.id,
                lambda into: _move(old_backend, new_backend, old, record, progress, moved, into),
            )
        elif not move.same_place:
            _step(manager, record, SwitchStep.MOVE)
            _move(old_backend, new_backend, old, record, progress, moved)
    except BaseException as exc:
        why = (
            f"switch stopped at {exc}" if isinstance(exc, StageError) else f"switch stopped: {exc}"
        )
        _step(manager, record, SwitchStep.FAILED)
        manager.store.transition(record.id, State.FAILED, why, error=why)
        raise _kept_running(exc, old.name) from None
    return saved


def _start_new(
    manager: "Owner", old: SessionRecord, record: SessionRecord, move: _Move, progress: Progress
) -> "Session":
    """Start the new session on the workspace (its kernel restores the variables); a failure
    leaves the old session running."""
    _step(manager, record, SwitchStep.START)
    try:
        return manager.launch(manager.store.get(record.id), within=progress)
    except BaseException as exc:
        _step(manager, record, SwitchStep.FAILED)
        raise _kept_running(exc, old.name) from None
    finally:
        if move.at_boot:
            move.new_backend.import_while_starting(record.id, None)  # type: ignore[attr-defined]


def _hand_over(
    manager: "Owner",
    old: SessionRecord,
    record: SessionRecord,
    backend: Backend,
    workspace: str,
    progress: Progress,
    by: str,
    keeps_name: bool,
) -> tuple["Session", SwitchReport]:
    """A switch where the workspace attaches to one machine at a time (an EBS volume): the new
    session starts, and once its machine is there (the capacity found) the old session saves and
    stops and its workspace moves over (attached, or by snapshot to another zone), then the new
    one restores. A failure before that hand-over leaves the old session running untouched; one
    after it leaves the variables saved in the workspace, for `--resume`."""
    old_session = manager.connected(old.id) or manager.attach(old.id)
    done: dict[str, Any] = {}

    def release() -> None:
        _step(manager, record, SwitchStep.SAVE)
        progress.step(f"saving the variables of {old.name} into workspace {workspace}")
        saved = save_checkpoint(manager.store, old, old_session)
        if not saved.get("committed"):
            raise StageError("save", f"variables not saved ({saved.get('error') or 'unknown'})")
        done["saved"] = saved
        progress.step(
            f"saved {saved.get('saved', 0)} variable(s), {format_bytes(saved.get('bytes') or 0)}; "
            f"stopping {old.name} so that its workspace can move to {_capacity(record.spec)}"
        )
        _step(manager, record, SwitchStep.STOP_OLD)
        manager.stop(old.id, by=f"{by} to {_capacity(record.spec)}", kind=StopKind.USER)
        done["stopped"] = True
        _step(manager, record, SwitchStep.START)  # the volume moves over, the kernel restores

    backend.take_workspace_over(record.id, release)  # type: ignore[attr-defined]
    try:
        session = manager.launch(manager.store.get(record.id), within=progress)
    except BaseException as exc:
        _step(manager, record, SwitchStep.FAILED)
        backend.take_workspace_over(record.id, None)  # type: ignore[attr-defined]
        raise _handover_failed(exc, old, workspace, stopped=bool(done.get("stopped"))) from None
    if not done.get("stopped"):  # the backend never needed the volume free (it cannot happen
        manager.stop(old.id, by=f"{by} to {_capacity(record.spec)}", kind=StopKind.USER)  # on aws)
    session.record = _keep_name(manager, old, record, keeps_name)
    return session, _handover_report(manager, old, record, session, workspace, done, progress)


def _handover_failed(
    exc: BaseException, old: SessionRecord, workspace: str, *, stopped: bool
) -> BaseException:
    """What a failed hand-over raises: the old session still runs (before it was stopped), or
    where its saved variables are (after)."""
    if not stopped:
        return _kept_running(exc, old.name)
    tail = (
        f"; session {old.name} was stopped after saving its variables into workspace "
        f"{workspace}: `%gpu start --resume {workspace}` brings them back"
    )
    if isinstance(exc, StageError):
        return StageError(exc.stage, exc.message + tail)
    return StageError("switch", f"{exc}{tail}")


def _handover_report(
    manager: "Owner",
    old: SessionRecord,
    record: SessionRecord,
    session: "Session",
    workspace: str,
    done: dict[str, Any],
    progress: Progress,
) -> SwitchReport:
    moved_from = session.record.resource.get("moved_from") or ""
    zone = session.record.resource.get("zone") or ""
    return SwitchReport(
        old=old.name,
        new=session.name,
        former=manager.store.get(old.id).name,
        workspace=workspace,
        saved=done.get("saved") or {},
        restored=session.record.resource.get("restored"),
        moved_bytes=session.record.resource.get("moved_bytes") if moved_from else None,
        moved_from=f"{old.backend} {moved_from or old.resource.get('zone') or ''}".strip(),
        moved_to=f"{record.backend} {zone}".strip(),  # zones: the backend's place is its region
        old_price_per_hour=old.price_per_hour,
        price_per_hour=session.record.price_per_hour,
        seconds=round(progress.elapsed(), 1),
        old_stopped=True,
    )


def _create(
    manager: "Owner", backend: "Backend", spec: LaunchSpec, old: SessionRecord, step: SwitchStep
) -> SessionRecord:
    """The new record, as `SessionManager.create` makes it, but the old session's hold on the
    workspace does not count: the two share it until the old one stops. It carries the switch's
    intent from its first moment (session/orphans.py settles a switch whose driver died)."""

    def claim(s: LaunchSpec, name: str):
        return None if name == old.name else workspace_claim(s, name)

    manager.config.check()
    backend.check(spec)
    return manager.store.create(
        spec,
        price_per_hour=backend.price_per_hour(spec, manager.catalog),
        claim=claim,
        resource={"switch": {"old": old.id, "old_name": old.name, "step": step.value}},
    )


def _keep_name(
    manager: "Owner", old: SessionRecord, record: SessionRecord, keeps_name: bool
) -> SessionRecord:
    """The switch is done: the new record takes the session's name (it is the user's session,
    now on other capacity) unless the switch named it; the old one keeps a retired name."""
    done = _step(manager, record, SwitchStep.DONE)
    return manager.store.hand_name_over(old.id, record.id) if keeps_name else done


def _capacity(spec: LaunchSpec) -> str:
    return f"{spec.gpu_count} x {spec.gpu_type} on {spec.backend}"


def _step(manager: "Owner", record: SessionRecord, step: SwitchStep) -> SessionRecord:
    """The switch reached `step` (kept on the new record, for whoever finds it cut)."""
    switch = dict(manager.store.get(record.id).resource.get("switch") or {}, step=step.value)
    return manager.store.update_resource(record.id, switch=switch)


def _move(
    source: "Backend",
    dest: "Backend",
    old: SessionRecord,
    record: SessionRecord,
    progress: Progress,
    moved: list[int],
    into=None,
) -> None:
    """The workspace from where `old` mounts it to where `record` will, through this machine
    (`into`: how the new backend takes it in, when not `dest.import_workspace`)."""
    with progress.stage("move", f"workspace from {_where(old.spec)} to {_where(record.spec)}"):
        export = source.export_workspace(old, progress)
        try:
            size = (
                format_bytes(export.size_bytes)
                if export.size_bytes is not None
                else "an unknown size"
            )
            progress.step(f"{size} to move, through this machine")
            (into or dest.import_workspace)(
                record, _counted(export.chunks, export.size_bytes, progress, moved), progress
            )
        finally:
            export.close()
        progress.step(f"moved {format_bytes(moved[0])}")


def _kept_running(exc: BaseException, old_name: str) -> BaseException:
    """The failure, saying that the old session still runs."""
    tail = f"; session {old_name} keeps running untouched"
    if isinstance(exc, KeyboardInterrupt):
        return StageError("switch", "interrupted" + tail)
    if isinstance(exc, StageError):
        return StageError(exc.stage, exc.message + tail)
    if isinstance(exc, GpuSessionError):
        return StageError("switch", f"{exc}{tail}")
    return StageError("switch", f"{type(exc).__name__}: {exc}{tail}")


__all__ = ["SwitchReport", "switch_session", "switch_values", "NOT_CARRIED"]
