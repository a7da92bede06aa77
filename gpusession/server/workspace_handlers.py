"""REST for the workspaces that outlive sessions (docs/workspaces.md): `GET workspaces` lists
them as `gpusession workspaces` does; `DELETE workspaces/NAME?confirm=NAME` deletes one, only
with that confirmation (the name typed again), and never one a session uses (409)."""

from __future__ import annotations

import tornado.web

from ..configuration.registry import workspace_backends
from ..core.durations import shown
from ..core.errors import BadInput
from ..core.textvalues import workspace_name
from ..session.workspace_ops import NoWorkspace, WorkspaceInUse, list_all, remove
from ..words.workspaces import host_failed_line, workspace_rest_view
from .handler_base import BaseHandler


class WorkspacesHandler(BaseHandler):
    @tornado.web.authenticated
    async def get(self) -> None:
        m = self.api.manager

        def listing() -> dict:
            skipped: list[str] = []
            failed: list[dict] = []  # said once, in `skipped`, then remembered
            retry = self.get_query_argument("retry_hosts", "0") in ("1", "true", "yes")
            views = [
                workspace_rest_view(v)
                for v in list_all(m.store, m.backend, skipped, failed=failed, retry_hosts=retry)
            ]
            skipped += [host_failed_line(item) for item in failed]
            return {"workspaces": views, "skipped": skipped}

        await self.guarded(listing)


class WorkspaceHandler(BaseHandler):
    @tornado.web.authenticated
    async def delete(self, key: str) -> None:
        # JupyterLab's ServerConnection adds a bare timestamp (`?1796094695341`) against caches
        unknown = [
            k for k in self.request.arguments if k not in ("confirm", "backend") and not k.isdigit()
        ]
        if unknown:
            return self.fail(
                400,
                f"unknown parameter(s) {', '.join(shown(k, 40) for k in unknown[:5])}; "
                "allowed: confirm, backend",
            )
        try:
            name = workspace_name(key)
        except BadInput as exc:
            return self.fail(400, str(exc))
        confirm = self.get_query_argument("confirm", None)
        if confirm != name:
            got = "none" if confirm is None else shown(confirm, 40)
            return self.fail(
                400,
                f"deleting workspace {name} deletes its files and saved variables; confirm it with "
                f"'confirm' set to the workspace's name ({name}), got {got}",
            )
        backend = self.get_query_argument("backend", None)
        kept_by = workspace_backends()
        if backend is not None and backend not in kept_by:
            return self.fail(
                400, f"'backend' {shown(backend, 40)}: workspaces are kept by {', '.join(kept_by)}"
            )
        m = self.api.manager

        def deleting() -> dict:
            ws = remove(m.store, m.backend, name, backend)
            return {"deleted": ws.name, "backend": ws.backend, "where": ws.where}

        await self.guarded(deleting, statuses={NoWorkspace: 404, WorkspaceInUse: 409})
