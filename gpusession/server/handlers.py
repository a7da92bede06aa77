"""REST handlers. Every verb is `@tornado.web.authenticated`; bodies are validated (400 with a
message, never a 500 from a missing key); unknown sessions are 404. Blocking work (starting,
stopping, asking an agent) runs in a thread, never on the server's event loop.

Every error body is `{"message": ...}` (tornado's own 403/404/405 too: `write_error`), speaks of
fields as the body names them, and echoes at most a short piece of a bad value. A body is at most
`MAX_BODY` bytes, refused before it is parsed; nesting too deep and NaN/Infinity are refused."""

from __future__ import annotations

import dataclasses
import json
import math
import time
import urllib.parse

import tornado.web
from jupyter_server.utils import url_path_join

from ..configuration import options
from ..configuration.registry import backend_names, backend_places, price_lists
from ..configuration.settings import load_policy
from ..core.durations import KEEPALIVE, shown
from ..core.errors import BadInput, SessionBusy, SessionEnded, StageError
from ..provisioner import kernelspecs
from ..session import SessionManager, carry, default_backend_name
from ..session.store import owner_id
from ..words.spend import budget_line, live_spot_line, report_rest
from ..words.status import image_text, recorded_words, rest_view, with_error_texts
from ..words.stops import warning_texts
from ..words.switches import switch_line
from .api import Api
from .handler_base import BaseHandler
from .sidebar_state import MAX_HISTORY, kernel_ids_by_pid, kernel_pid, with_history
from .workspace_handlers import WorkspaceHandler, WorkspacesHandler


class SessionsHandler(BaseHandler):
    @tornado.web.authenticated
    async def get(self) -> None:
        show_all = self.get_query_argument("all", "0") in ("1", "true", "yes")
        history_text = self.get_query_argument("history", "0")  # also the N latest ended sessions
        if not history_text.isdigit() or int(history_text) > MAX_HISTORY:
            return self.fail(
                400,
                f"'history' must be a whole number from 0 to {MAX_HISTORY}, got {shown(history_text)}",
            )
        history = int(history_text)
        kernels = kernel_ids_by_pid(self.settings.get("kernel_manager"))

        def listing() -> dict:
            m = self.api.manager
            records = m.list(
                active_only=not (show_all or history), check=True
            )  # gone ones shown ended
            if history and not show_all:
                records = with_history(records, history)
            # the month's spend from the reading the cards' budget warnings use (the sidebar's
            # header shows it): one figure at one moment, to the cent (issue 32 §5)
            budget = m.spend.budget()
            return {
                "sessions": [self.api.view(r, kernels) for r in records],
                "budget": budget,
                "budget_line": budget_line(budget) if budget else None,
            }

        await self.guarded(listing)

    @tornado.web.authenticated
    async def post(self) -> None:
        body = self.body()  # the fields of GET options; an absent one takes its default
        problems = options.body_problems(body)
        if problems:
            return self.fail(400, str(options.BadOptions(problems, options.REST)))
        await self.guarded(self.api.start_in_background, body, ok=202)


class OptionsHandler(BaseHandler):
    """The start options (gpusession/configuration/options.py) with this server's defaults: what a form shows."""

    @tornado.web.authenticated
    async def get(self) -> None:
        m = self.api.manager

        def document() -> dict:  # the default backend may ask the Docker engine: not on the loop
            doc = options.options_document(
                m.config,
                catalog=m.catalog,
                backends=backend_names(),
                backend_default=default_backend_name(m.config),
            )
            return dict(doc, places=backend_places(m.config))  # pools offered for --host

        await self.guarded(document)


class OptionsCheckHandler(BaseHandler):
    """What is wrong with a start body, field by field, without starting anything: a form asks
    as the user types. Reads the body only (no backend is asked, nothing is recorded)."""

    @tornado.web.authenticated
    async def post(self) -> None:
        body = self.body()
        m = self.api.manager

        def check() -> dict:
            errors = options.check_body(body, catalog=m.catalog, backends=backend_names())
            if not errors and load_policy() is not None:  # what a policy refuses, by field too
                try:
                    m.spec_from({k: v for k, v in body.items() if k != "upload"})
                except options.BadOptions as exc:
                    errors = exc.problems
            return {"errors": errors}

        await self.guarded(check)


class ImagesHandler(BaseHandler):
    """The images a backend's machine already has (`?backend=docker&host=ssh://...`): what the
    start forms offer for 'image', with their size and whether the runtime is cached for them.
    A reference not listed is pulled at start."""

    @tornado.web.authenticated
    async def get(self) -> None:
        m = self.api.manager
        name = self.get_query_argument("backend", "") or None
        host = self.get_query_argument("host", "") or None

        def listing() -> dict:
            backend = m.backend(
                options.parse_values(
                    {"backend": name or default_backend_name(m.config)},
                    catalog=m.catalog,
                    backends=backend_names(),
                )["backend"]
            )
            if host is not None:
                options.parse_values({"host": host}, catalog=m.catalog)  # BadOptions: 400
            images = backend.local_images(host)
            return {
                "backend": backend.name,
                "default": backend.default_image(),
                "images": [dict(dataclasses.asdict(i), text=image_text(i)) for i in images],
            }

        await self.guarded(listing)


class SessionHandler(BaseHandler):
    @tornado.web.authenticated
    async def get(self, key: str) -> None:
        m = self.api.manager
        await self.guarded(
            lambda: self.api.view(
                m.liveness.check([m.get(key)])[0],
                kernel_ids_by_pid(self.settings.get("kernel_manager")),
            )
        )

    @tornado.web.authenticated
    async def delete(self, key: str) -> None:
        """`?save=1`: first save the kernel's variables into the session's workspace (its card's
        and the palette's "Save and stop")."""
        m = self.api.manager
        save = self.get_query_argument("save", "")
        if save not in ("", "0", "1"):
            return self.fail(400, f"'save' must be 1 or 0, got {shown(save)}")
        await self.guarded(
            lambda: rest_view(
                m.view(m.stop(m.get(key).id, by="the JupyterLab sidebar", save=save == "1"))
            )
        )


class SwitchHandler(BaseHandler):
    """POST sessions/NAME/switch: move the running session to other capacity (the body: start
    options that change, as POST sessions takes them, and `on_demand`), keeping its variables
    and files. Answers when the new session runs and the old one stopped: the new session's
    view, the switch's report (data) and its line; 409 while a cell runs, 502 when the new
    session cannot start (the old one keeps running)."""

    @tornado.web.authenticated
    async def post(self, key: str) -> None:
        body = self.body()
        on_demand = body.pop("on_demand", False)
        if not isinstance(on_demand, bool):
            return self.fail(400, "'on_demand': wrong type: expected true or false")
        refused = [name for name in options.SWITCH_SKIP if name in body]
        if refused:
            return self.fail(
                400,
                f"{', '.join(repr(n) for n in refused)}: a switch keeps the session's workspace",
            )
        problems = options.body_problems(body)
        if problems:
            return self.fail(400, str(options.BadOptions(problems, options.REST)))
        m = self.api.manager

        def switch() -> dict:
            sid = m.get(key).id
            spec = m.switch_spec(sid, dict(body, on_demand=on_demand))
            stages = self.api.progress.reporter(sid)  # its card shows the stages while it runs
            session, report = m.switch(sid, spec, stages, by="the JupyterLab sidebar's switch")
            session.close_connections()
            return {
                "session": self.api.view(m.get(session.id)),
                "report": report.to_dict(),
                "line": switch_line(report.to_dict()),
            }

        await self.guarded(switch, statuses={SessionBusy: 409, StageError: 502})


class KernelSessionHandler(BaseHandler):
    """PUT kernels/KERNEL_ID/session `{"session": NAME}`: connect a notebook (its kernel, one of
    this server's) to a session: recorded in the store as a use of the session by the kernel's
    process (`resource["users"]`, as `%gpu use` records one), so the notebook's next `%%gpu`
    cell runs there (the magic follows it), and its toolbar, the status bar and the session's
    card say so. Answers the session's view; 404 for a kernel this server does not run or an
    unknown session, 400 for an ended one."""

    @tornado.web.authenticated
    async def put(self, key: str) -> None:
        kernel_id = key
        body = self.body()
        unknown = [options.field_shown(k) for k in body if k != "session"]
        if unknown:
            return self.fail(400, f"unknown field(s) {', '.join(unknown[:5])}; allowed: session")
        name = body.get("session")
        if not isinstance(name, str) or not name.strip():
            return self.fail(400, "'session': the name of the session to connect, as text")
        kernel_manager = self.settings.get("kernel_manager")
        pid = kernel_pid(kernel_manager, kernel_id)
        if pid is None:
            return self.fail(
                404, f"no kernel {shown(kernel_id, 40)} runs on this server (was it shut down?)"
            )
        m = self.api.manager

        def connect() -> dict:
            record = m.get(name.strip())
            if not record.state.active:
                raise BadInput(
                    f"session {record.name} is {record.state.value}: connect a running one, "
                    "or start or resume one first"
                )
            m.store.note_user(record.id, owner_id(pid), time.time())
            return self.api.view(m.get(record.id), kernel_ids_by_pid(kernel_manager))

        await self.guarded(connect)


class KernelspecsHandler(BaseHandler):
    """POST kernelspecs: install (or replace) the GPU kernelspec of a start body (the fields of
    POST sessions, no `name`: each of its kernels is a new session) for this server's user,
    as `gpusession kernelspec install` does; answers `{"name", "display_name"}`, the kernel a
    notebook then changes to ("Run this notebook on a GPU…")."""

    @tornado.web.authenticated
    async def post(self) -> None:
        body = self.body()
        problems = options.body_problems(body)
        if problems:
            return self.fail(400, str(options.BadOptions(problems, options.REST)))
        if "type" not in body:
            body = dict(body, type=self.api.manager.config.default_type)

        def install() -> dict:
            values = {k: v for k, v in body.items() if v not in (None, "")}
            installed = kernelspecs.install(values, name=None, user=True)
            return {"name": installed.name, "display_name": installed.display_name}

        await self.guarded(install)


class CarryHandler(BaseHandler):
    """POST carry: a private staging folder for a notebook's variables and the code its current
    kernel runs to save them there (session/carry.py), before "Run this notebook on a GPU…"
    changes its kernel. Answers `{"folder", "code"}`."""

    @tornado.web.authenticated
    async def post(self) -> None:
        body = self.body()
        if body:
            unknown = ", ".join(options.field_shown(k) for k in list(body)[:5])
            return self.fail(400, f"unknown field(s) {unknown}; POST carry takes no fields")
        await self.guarded(lambda: carry.stage(self.api.manager.config.data_path))


class SessionCarryHandler(BaseHandler):
    """POST sessions/NAME/carry `{"folder"}`: move the variables saved into that staging folder
    (POST carry) into the running session's kernel, restored as a --resume restores them; the
    folder is removed. Answers `{"restored", "imports", "failed", "skipped"}`; 400 for a folder
    that is not one of ours, 404 for an unknown session, 409 for one that does not run."""

    @tornado.web.authenticated
    async def post(self, key: str) -> None:
        body = self.body()
        unknown = [options.field_shown(k) for k in body if k != "folder"]
        if unknown:
            return self.fail(400, f"unknown field(s) {', '.join(unknown[:5])}; allowed: folder")
        m = self.api.manager

        def move() -> dict:
            folder = carry.staged_folder(m.config.data_path, body.get("folder"))
            return carry.carry_into(m.attach(m.get(key).id), folder)

        await self.guarded(move, statuses={SessionEnded: 409})


class StatsHandler(BaseHandler):
    @tornado.web.authenticated
    async def get(self, key: str) -> None:
        since_text = self.get_query_argument("since", None)
        try:
            since = float(since_text) if since_text is not None and len(since_text) <= 40 else None
        except ValueError:
            since = None
        if since_text is not None and since is None:
            return self.fail(400, f"'since' must be unix seconds, got {shown(since_text)}")
        if since is not None and not (math.isfinite(since) and since >= 0):
            return self.fail(
                400,
                f"'since' must be unix seconds, a finite number from 0, got {shown(since_text)}",
            )
        m = self.api.manager

        def stats() -> dict:
            doc = m.stats.fetch(m.get(key).id, since=since)
            warnings = [w for w in doc.get("warnings") or [] if warning_texts([w])]
            return dict(
                doc,
                warnings=[dict(w, text=warning_texts([w], hint=False)[0]) for w in warnings],
                samples=[with_error_texts(s) for s in doc.get("samples") or []],
                source_text=recorded_words(doc),  # a recording of another machine says so
            )

        await self.guarded(stats)


class KeepaliveHandler(BaseHandler):
    @tornado.web.authenticated
    async def post(self, key: str) -> None:
        body = self.body()  # {"duration": "1h"}; checked before the session is looked up
        unknown = [options.field_shown(k) for k in body if k != "duration"]
        if unknown:
            return self.fail(400, f"unknown field(s) {', '.join(unknown[:5])}; allowed: duration")
        duration = body.get("duration")
        duration = "1h" if duration is None else duration
        if isinstance(duration, bool) or not isinstance(duration, (str, int, float)):
            got = {bool: "boolean", list: "array", dict: "object"}.get(
                type(duration), type(duration).__name__
            )
            return self.fail(
                400,
                f"'duration': wrong type ({got}): expected a string like \"1h\" or a number of minutes",
            )
        if isinstance(duration, str) and len(duration) > 40:
            return self.fail(
                400,
                f"'duration': {KEEPALIVE.what} is {len(duration):,} characters long; at most 40",
            )
        try:
            KEEPALIVE.parse(duration)
        except BadInput as exc:
            return self.fail(400, f"'duration': {exc}")
        m = self.api.manager

        def keepalive() -> dict:
            sid = m.get(key).id
            m.stats.keepalive(sid, duration)
            return rest_view(m.view(m.get(sid)))

        await self.guarded(keepalive)


class CatalogHandler(BaseHandler):
    @tornado.web.authenticated
    async def get(self) -> None:
        # the catalog, and the backends that price GPUs themselves (the forms show theirs)
        self.finish(
            json.dumps(dict(self.api.manager.catalog.to_dict(), backend_prices=price_lists()))
        )


class PricesHandler(BaseHandler):
    """GET prices?type=t4: the current spot prices of the type's instance per zone of the allowed
    regions (what `%gpu types --live` shows), and the forms' line for it (`line`); `rows` is
    empty where no cloud backend answers (own hardware)."""

    @tornado.web.authenticated
    async def get(self) -> None:
        gpu_type = self.get_query_argument("type", "").strip().lower()
        m = self.api.manager

        def prices() -> dict:
            if gpu_type not in {t.name for t in m.catalog.types}:
                raise BadInput(
                    f"unknown GPU type {gpu_type!r}: pass type= one of the catalog's "
                    "(GET catalog lists them)"
                )
            rows = m.spend.live_prices([gpu_type])
            return {
                "type": gpu_type,
                "rows": rows,
                "line": live_spot_line(rows, gpu_type),
                "prices_line": m.catalog.prices_line,
            }

        await self.guarded(prices)


class ReportHandler(BaseHandler):
    """GET report?since=30d&by=type[&split=type]: the spend report (gpusession/configuration/cost.py)
    with its words (`lines`, what `gpusession report` prints), from the store; `split`: each
    row's parts by a second key."""

    @tornado.web.authenticated
    async def get(self) -> None:
        since = self.get_query_argument("since", "30d")
        by = self.get_query_argument("by", "type")
        split = self.get_query_argument("split", None)  # the Spend view's bars: day, then type
        m = self.api.manager

        def report() -> dict:
            return report_rest(m.spend.report(since, by, split=split))

        await self.guarded(report)


class NotFoundHandler(BaseHandler):
    """Any other path under the API: a 404 in the API's shape, not the server's HTML page."""

    def prepare(self):  # before the login check and any verb: every method gets this answer
        path = urllib.parse.unquote(
            self.request.path
        )  # as the client wrote it: 50%off, not 50%25off
        raise tornado.web.HTTPError(404, f"no such endpoint: {shown(path, 80)}")


def setup_handlers(
    server_app, manager: SessionManager | None = None, unavailable: str | None = None
) -> None:
    web_app = server_app.web_app
    web_app.settings["gpusession_api"] = Api(manager, unavailable)
    base = url_path_join(web_app.settings["base_url"], "gpusession", "api")
    sid = r"(?P<key>[A-Za-z0-9._-]+)"
    web_app.add_handlers(
        ".*$",
        [
            (url_path_join(base, "sessions"), SessionsHandler),
            (url_path_join(base, "sessions", sid), SessionHandler),
            (url_path_join(base, "sessions", sid, "stats"), StatsHandler),
            (url_path_join(base, "sessions", sid, "keepalive"), KeepaliveHandler),
            (url_path_join(base, "sessions", sid, "switch"), SwitchHandler),
            (url_path_join(base, "sessions", sid, "carry"), SessionCarryHandler),
            (url_path_join(base, "carry"), CarryHandler),
            (url_path_join(base, "kernels", sid, "session"), KernelSessionHandler),
            (url_path_join(base, "kernelspecs"), KernelspecsHandler),
            (url_path_join(base, "catalog"), CatalogHandler),
            (url_path_join(base, "prices"), PricesHandler),
            (url_path_join(base, "report"), ReportHandler),
            (url_path_join(base, "options"), OptionsHandler),
            (url_path_join(base, "options", "check"), OptionsCheckHandler),
            (url_path_join(base, "images"), ImagesHandler),
            (url_path_join(base, "workspaces"), WorkspacesHandler),
            (url_path_join(base, "workspaces", sid), WorkspaceHandler),
            (url_path_join(base, r"(?P<rest>.*)"), NotFoundHandler),  # last: add endpoints above it
        ],
    )
