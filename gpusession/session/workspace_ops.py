"""Workspaces that outlive sessions: the restore report of a resumed start, the save of
`stop --save`, and the listing `gpusession workspaces` and gc's report show.

gc never deletes a workspace: deleting one is `remove(...)`, which the faces call only when the
user confirmed. Returns data; the faces put it into words (gpusession/words/workspaces.py).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Callable

from ..configuration.registry import load_backend_class, workspace_backends
from ..core.errors import BackendUnavailable, BadInput, GpuSessionError, WorkspaceInUse
from ..core.models import State
from .agentclient import AgentClient, AgentUnavailable
from .store import Store

if TYPE_CHECKING:
    from ..backends.base import Backend, Workspace
    from ..core.models import LaunchSpec, SessionRecord
    from .handle import Session

SAVE_WAIT_EXTRA_S = 15.0  # the agent answers POST /save within the bound; the link may add to it


@dataclasses.dataclass
class WorkspaceView:
    """A workspace with the store's word on it."""

    workspace: "Workspace"
    sessions: list[str]  # names of the recorded sessions that used it, newest first
    active: list[str]  # names of those still active (running, starting, stopping)
    last_type: str | None = None  # the GPU type of the newest session that used it
    saved_at: float | None = None  # when that session last saved into it (else ended); unix time

    @property
    def orphaned(self) -> bool:
        """Every session that used it is gone (or none is known): nothing will use it by itself."""
        return not self.active and not self.workspace.in_use_by

    def to_dict(self) -> dict[str, Any]:
        return dict(
            dataclasses.asdict(self.workspace),
            sessions=self.sessions,
            active=self.active,
            orphaned=self.orphaned,
        )


__all__ = ["WorkspaceInUse"]  # (defined in errors.py: the store raises it too)


def workspace_claim(spec: "LaunchSpec", name: str) -> tuple[str, str, str] | None:
    """What a session holds while active: (backend, engine or region, workspace); None when its
    backend keeps no workspace. The store refuses a second active session on the same one."""
    if spec.backend not in workspace_backends():
        return None
    extra = spec.extra
    return (
        spec.backend,
        workspace_place(spec),
        extra.get("resume") or extra.get("workspace") or name,
    )


def workspace_place(spec: "LaunchSpec") -> str:
    """Where a session's workspace lives, as its backend's `place_option` says (an engine, a
    login node, a region; "": its place when none is given): two specs of one backend and place
    mount the same workspaces."""
    option = load_backend_class(spec.backend).place_option
    return str(spec.extra.get(option) or "") if option else ""


def fetch_restore_report(store: Store, session: "Session") -> None:
    """After a --resume start: what the kernel restored, kept in the record (`restored`)."""
    if not session.record.spec.extra.get("resume"):
        return
    try:
        report = session.agent.restored()
    except AgentUnavailable as exc:
        report = {"found": False, "error": str(exc)}
    session.record = store.update_resource(session.id, restored=report)


def save_checkpoint(store: Store, record: "SessionRecord", session: "Session | None") -> dict:
    """`stop --save`: the agent saves the kernel's namespace into the workspace (bounded by the
    session's save time bound); its result, kept in the record (`checkpoint`)."""
    if session is None:
        result = {"committed": False, "error": "not connected"}
    else:
        bound = (
            record.spec.extra.get("save_timeout") or 60.0
        )  # off: an asked save takes the default bound
        client = AgentClient.for_endpoint(session.link.endpoint, timeout=bound + SAVE_WAIT_EXTRA_S)
        try:
            result = client.save()
        except AgentUnavailable as exc:
            result = {"committed": False, "error": str(exc)}
        finally:
            client.close()
    store.update_resource(record.id, checkpoint=result)
    return result


def list_all(
    store: Store,
    backend_of: Callable[[str], "Backend"],
    skipped: list[str] | None = None,
    *,
    failed: list[dict] | None = None,
    retry_hosts: bool = False,
    only: str | None = None,
) -> list[WorkspaceView]:
    """Every workspace the workspace backends keep (`only`: that backend's), with the sessions
    that used each (`store`: the records; `backend_of`: a backend by name, e.g.
    SessionManager.backend). `failed` gets the hosts that did not answer this time ({backend,
    host, error}): remembered, they are not asked again until `retry_hosts` forgets them all
    first."""
    if retry_hosts:
        store.forget_hosts()
    before = store.failed_hosts()
    records = store.list()
    views = []
    for name in workspace_backends():
        if only not in (None, name):
            continue
        try:
            found = backend_of(name).list_workspaces()
        except (BackendUnavailable, GpuSessionError) as exc:
            if skipped is not None:
                skipped.append(f"{name}: {exc}")
            continue
        for ws in found:
            users = [
                r for r in records if r.backend == name and r.resource.get("workspace") == ws.name
            ]
            newest = users[0] if users else None
            views.append(
                WorkspaceView(
                    ws,
                    [r.name for r in users],
                    [r.name for r in users if r.state.active],
                    last_type=newest.spec.gpu_type if newest else None,
                    saved_at=_saved_at(newest),
                )
            )
    if failed is not None:
        failed.extend(
            {"backend": backend, "host": host, "error": error}
            for (backend, host), (_, error) in sorted(store.failed_hosts().items())
            if (backend, host) not in before
        )
    return views


def _saved_at(record: "SessionRecord | None") -> float | None:
    """When `record` last saved into its workspace: its checkpoint's time, else its end."""
    if record is None:
        return None
    saved = record.resource.get("checkpoint") or (record.resource.get("agent_summary") or {}).get(
        "checkpoint"
    )
    if isinstance(saved, dict) and saved.get("at"):
        return float(saved["at"])
    return None if record.state.active else record.updated_at


class NoWorkspace(BadInput):
    """No workspace by that name (REST: 404)."""


def remove(
    store: Store, backend_of: Callable[[str], "Backend"], name: str, backend: str | None = None
) -> "Workspace":
    """Delete the workspace `name` (of `backend`, when several backends have one of that name)."""
    matches = [  # the sidebar names the backend: the others are not asked
        v for v in list_all(store, backend_of, only=backend) if v.workspace.name == name
    ]
    if not matches:
        raise NoWorkspace(f"no workspace {name} (`gpusession workspaces` lists them)")
    if len(matches) > 1:
        where = ", ".join(v.workspace.backend for v in matches)
        raise BadInput(
            f"workspace {name} is on several backends ({where}); name one with --backend"
        )
    view = matches[0]
    if not view.orphaned:
        raise WorkspaceInUse(
            f"workspace {name} is in use by session {', '.join(view.active or view.workspace.in_use_by)}; "
            "stop it first"
        )
    backend_of(view.workspace.backend).remove_workspace(view.workspace)
    return view.workspace


#: spec.extra: where a --resume was sent because its workspace lives there ({"session",
#: "backend", "place", "image"}: the options taken from that session's record)
RESUMED_WHERE = "resumed_where"


def resume_values(store: Store, values: dict[str, Any]) -> dict[str, Any]:
    """Start options with a `resume` (as a face gave them) sent where the workspace lives: the
    backend, place (its `place_option`: an engine, a region) and image of the newest session
    that ran on it, each where the user gave none (a different backend takes none of them).
    Unchanged without a resume, or when no session of this store ran on that workspace."""
    name = values.get("resume")
    if not isinstance(name, str) or not name.strip():
        return values
    record = _last_ran_on(store, name.strip())
    if record is None:
        return values
    given_backend = values.get("backend")
    if isinstance(given_backend, str) and given_backend.strip() not in ("", record.backend):
        return values  # the user said otherwise
    out, taken = dict(values), {"session": record.name, "backend": record.backend}
    out["backend"] = record.backend
    backend_class = load_backend_class(record.backend)
    place = backend_class.place_option
    if place and not values.get(place) and record.spec.extra.get(place):
        out[place] = taken["place"] = record.spec.extra[place]
    image = record.resource.get("image") or record.spec.extra.get("image")
    if backend_class.takes_image and not values.get("image") and image:
        out["image"] = taken["image"] = image
    out[RESUMED_WHERE] = taken
    return out


def _last_ran_on(store: Store, workspace: str) -> "SessionRecord | None":
    """The newest session that reached running on the workspace `workspace` (a start that
    failed, on another backend say, is not where the workspace lives)."""
    for record in store.list():  # newest first
        used = (
            record.resource.get("workspace")
            or (workspace_claim(record.spec, record.name) or ("",))[-1]
        )
        if used == workspace and any(e.state == State.RUNNING for e in record.events):
            return record
    return None
