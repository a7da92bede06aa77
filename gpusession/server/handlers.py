"""REST handlers. Every verb is `@tornado.web.authenticated`; bodies are validated (400 with a
message, never a 500 from a missing key); unknown sessions are 404. Blocking work (starting,
stopping, asking an agent) runs in a thread, never on the server's event loop."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import tornado.web
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join

from .. import options
from ..backends import backend_names
from ..errors import BadInput, BackendUnavailable, GpuSessionError, NoSession, UnknownSession
from ..session import SessionManager, default_backend_name
from ..words import error_text, rest_view, warning_texts


class Api:
    """What the handlers share: one SessionManager for the server process, and the threads
    that start sessions in the background."""

    def __init__(self, manager: SessionManager | None = None):
        self.manager = manager or SessionManager()
        self.starting: dict[str, threading.Thread] = {}

    def start_in_background(self, body: dict[str, Any]) -> dict:
        """Record the session from a POST body (`options.body_problems` passed), start it in a thread."""
        m = self.manager
        given = dict(body)
        spec = m.make_spec(given.pop("type", None), backend=given.pop("backend", None),
                           idle=given.pop("idle", "default"), face=options.REST, **given)
        record = m.create(spec)

        def run() -> None:
            try:
                m.launch(record, report=lambda line: None)
            except BaseException:  # noqa: BLE001 - launch recorded the failure and cleaned up
                pass
            finally:
                self.starting.pop(record.id, None)

        thread = threading.Thread(target=run, name=f"gpusession-start-{record.name}", daemon=True)
        self.starting[record.id] = thread
        thread.start()
        return rest_view(m.view(record))


class BaseHandler(APIHandler):
    @property
    def api(self) -> Api:
        return self.settings["gpusession_api"]

    async def blocking(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(None, fn, *args)

    def body(self) -> dict[str, Any]:
        try:
            data = json.loads(self.request.body or b"{}", parse_constant=_no_constants)
        except ValueError:
            raise tornado.web.HTTPError(400, reason="body is not JSON (NaN and Infinity are not JSON either)")
        if not isinstance(data, dict):
            raise tornado.web.HTTPError(400, reason="body must be a JSON object")
        return data

    def fail(self, status: int, message: str) -> None:
        self.set_status(status)
        self.finish(json.dumps({"message": message}))

    async def guarded(self, fn, *args, ok: int = 200) -> None:
        """Run a blocking call and map our errors: BadInput 400, unknown 404, else 409/503."""
        try:
            result = await self.blocking(fn, *args)
        except UnknownSession as exc:
            return self.fail(404, str(exc))
        except BadInput as exc:
            return self.fail(400, str(exc))
        except NoSession as exc:
            return self.fail(409, error_text(exc))
        except BackendUnavailable as exc:
            return self.fail(503, str(exc))
        except GpuSessionError as exc:
            return self.fail(500, f"{type(exc).__name__}: {exc}")
        self.set_status(ok)
        self.finish(json.dumps(result))


class SessionsHandler(BaseHandler):
    @tornado.web.authenticated
    async def get(self) -> None:
        show_all = self.get_query_argument("all", "0") in ("1", "true", "yes")

        def listing() -> dict:
            m = self.api.manager
            return {"sessions": [rest_view(m.view(r)) for r in m.list(active_only=not show_all)]}

        await self.guarded(listing)

    @tornado.web.authenticated
    async def post(self) -> None:
        body = self.body()  # the fields of GET options; an absent one takes its default
        problems = options.body_problems(body)
        if problems:
            return self.fail(400, str(options.BadOptions(problems, options.REST)))
        await self.guarded(self.api.start_in_background, body, ok=202)


class OptionsHandler(BaseHandler):
    """The start options (gpusession/options.py) with this server's defaults: what a form shows."""

    @tornado.web.authenticated
    async def get(self) -> None:
        m = self.api.manager

        def document() -> dict:  # the default backend may ask the Docker engine: not on the loop
            return options.options_document(m.config, catalog=m.catalog, backends=backend_names(),
                                            backend_default=default_backend_name(m.config))

        await self.guarded(document)


class OptionsCheckHandler(BaseHandler):
    """What is wrong with a start body, field by field, without starting anything: a form asks
    as the user types. Reads the body only (no backend is asked, nothing is recorded)."""

    @tornado.web.authenticated
    async def post(self) -> None:
        body = self.body()
        m = self.api.manager
        await self.guarded(lambda: {"errors": options.check_body(body, catalog=m.catalog, backends=backend_names())})


class SessionHandler(BaseHandler):
    @tornado.web.authenticated
    async def get(self, key: str) -> None:
        m = self.api.manager
        await self.guarded(lambda: rest_view(m.view(m.get(key))))

    @tornado.web.authenticated
    async def delete(self, key: str) -> None:
        m = self.api.manager
        await self.guarded(lambda: rest_view(m.view(m.stop(m.get(key).id, by="the JupyterLab sidebar"))))


class StatsHandler(BaseHandler):
    @tornado.web.authenticated
    async def get(self, key: str) -> None:
        since_text = self.get_query_argument("since", None)
        try:
            since = float(since_text) if since_text is not None else None
        except ValueError:
            return self.fail(400, f"'since' must be unix seconds, got {since_text!r}")
        m = self.api.manager
        def stats() -> dict:
            doc = m.stats(m.get(key).id, since=since)
            warnings = [w for w in doc.get("warnings") or [] if warning_texts([w])]
            return dict(doc, warnings=[dict(w, text=warning_texts([w], hint=False)[0]) for w in warnings])

        await self.guarded(stats)


class KeepaliveHandler(BaseHandler):
    @tornado.web.authenticated
    async def post(self, key: str) -> None:
        body = self.body()
        duration = body.get("duration", "1h")
        if not isinstance(duration, (str, int, float)):
            return self.fail(400, "'duration' must be a string like \"1h\"")
        m = self.api.manager
        def keepalive() -> dict:
            sid = m.get(key).id
            m.keepalive(sid, str(duration))
            return rest_view(m.view(m.get(sid)))

        await self.guarded(keepalive)


class CatalogHandler(BaseHandler):
    @tornado.web.authenticated
    async def get(self) -> None:
        self.finish(json.dumps(self.api.manager.catalog.to_dict()))


def _no_constants(name: str) -> None:
    raise ValueError(f"{name} is not a number")


def setup_handlers(server_app, manager: SessionManager | None = None) -> None:
    web_app = server_app.web_app
    web_app.settings["gpusession_api"] = Api(manager)
    base = url_path_join(web_app.settings["base_url"], "gpusession", "api")
    sid = r"(?P<key>[A-Za-z0-9._-]+)"
    web_app.add_handlers(
        ".*$",
        [
            (url_path_join(base, "sessions"), SessionsHandler),
            (url_path_join(base, "sessions", sid), SessionHandler),
            (url_path_join(base, "sessions", sid, "stats"), StatsHandler),
            (url_path_join(base, "sessions", sid, "keepalive"), KeepaliveHandler),
            (url_path_join(base, "catalog"), CatalogHandler),
            (url_path_join(base, "options"), OptionsHandler),
            (url_path_join(base, "options", "check"), OptionsCheckHandler),
        ],
    )
