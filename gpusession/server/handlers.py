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

from ..errors import BadInput, BackendUnavailable, GpuSessionError, NoSession, UnknownSession
from ..session import SessionManager

_START_FIELDS = {
    "type": str, "backend": str, "host": str, "spot": bool, "idle": str, "max_cost": (int, float, str),
    "name": str, "image": str, "region": str, "gpu_only": bool, "max_runtime": str,
}


class Api:
    """What the handlers share: one SessionManager for the server process, and the threads
    that start sessions in the background."""

    def __init__(self, manager: SessionManager | None = None):
        self.manager = manager or SessionManager()
        self.starting: dict[str, threading.Thread] = {}

    def start_in_background(self, body: dict[str, Any]) -> dict:
        m = self.manager
        spec = m.make_spec(
            body.get("type"),
            backend=body.get("backend"),
            idle=body.get("idle", "default"),
            name=body.get("name"),
            host=body.get("host") or None,
            image=body.get("image") or None,
            spot=body.get("spot") or None,
            region=body.get("region") or None,
            gpu_only_idle=body.get("gpu_only") or None,
            max_cost=body.get("max_cost"),
            max_runtime=body.get("max_runtime"),
        )
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
        return m.view(record)


class BaseHandler(APIHandler):
    @property
    def api(self) -> Api:
        return self.settings["gpusession_api"]

    async def blocking(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(None, fn, *args)

    def body(self) -> dict[str, Any]:
        try:
            data = json.loads(self.request.body or b"{}")
        except ValueError:
            raise tornado.web.HTTPError(400, reason="body is not JSON")
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
            return self.fail(409, str(exc))
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
            return {"sessions": [m.view(r) for r in m.list(active_only=not show_all)]}

        await self.guarded(listing)

    @tornado.web.authenticated
    async def post(self) -> None:
        body = self.body()
        if not body.get("type"):
            return self.fail(400, "missing 'type': a GPU type from GET /gpusession/api/catalog, e.g. \"t4\"")
        unknown = sorted(set(body) - set(_START_FIELDS))
        if unknown:
            return self.fail(400, f"unknown field(s) {', '.join(unknown)}; allowed: {', '.join(sorted(_START_FIELDS))}")
        for key, kind in _START_FIELDS.items():
            if key in body and body[key] is not None and not isinstance(body[key], kind):
                return self.fail(400, f"'{key}' has the wrong type ({type(body[key]).__name__})")
        await self.guarded(self.api.start_in_background, body, ok=202)


class SessionHandler(BaseHandler):
    @tornado.web.authenticated
    async def get(self, key: str) -> None:
        m = self.api.manager
        await self.guarded(lambda: m.view(m.get(key)))

    @tornado.web.authenticated
    async def delete(self, key: str) -> None:
        m = self.api.manager
        await self.guarded(lambda: m.view(m.stop(m.get(key).id)))


class StatsHandler(BaseHandler):
    @tornado.web.authenticated
    async def get(self, key: str) -> None:
        since_text = self.get_query_argument("since", None)
        try:
            since = float(since_text) if since_text is not None else None
        except ValueError:
            return self.fail(400, f"'since' must be unix seconds, got {since_text!r}")
        m = self.api.manager
        await self.guarded(lambda: m.stats(m.get(key).id, since=since))


class KeepaliveHandler(BaseHandler):
    @tornado.web.authenticated
    async def post(self, key: str) -> None:
        body = self.body()
        duration = body.get("duration", "1h")
        if not isinstance(duration, (str, int, float)):
            return self.fail(400, "'duration' must be a string like \"1h\"")
        m = self.api.manager
        await self.guarded(lambda: m.view(m.keepalive(m.get(key).id, str(duration))))


class CatalogHandler(BaseHandler):
    @tornado.web.authenticated
    async def get(self) -> None:
        self.finish(json.dumps(self.api.manager.catalog.to_dict()))


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
        ],
    )
