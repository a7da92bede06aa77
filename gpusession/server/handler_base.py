"""What every REST handler shares: the login check's error shape, bodies read with limits, and
our errors mapped to HTTP statuses (see handlers.py and workspace_handlers.py)."""

from __future__ import annotations

import asyncio
import json
from http.client import responses
from typing import TYPE_CHECKING, Any

import tornado.web
from jupyter_server.base.handlers import APIHandler

from ..core.durations import shown
from ..core.errors import BackendUnavailable, BadInput, GpuSessionError, NoSession, UnknownSession
from ..words.stops import error_text

if TYPE_CHECKING:
    from .api import Api

MAX_BODY = 64 * 1024  # bytes of a request body; a start body is well under 1 KiB
SLOW_S = 2.0  # a request that took longer is said in the server's log (Jupyter logs only failures)


class BaseHandler(APIHandler):
    @property
    def api(self) -> "Api":
        return self.settings["gpusession_api"]

    async def prepare(self) -> None:
        await super().prepare()
        if self.api.unavailable and self.current_user:  # logged in: say why nothing works (503)
            self.fail(503, self.api.unavailable)

    def on_finish(self) -> None:
        """A slow answer said at INFO: "why is the sidebar slow" has an answer in the log."""
        super().on_finish()
        took = self.request.request_time()
        if took > SLOW_S:
            self.log.info(
                "gpusession: %s %s answered %d after %.1f s",
                self.request.method,
                self.request.path,
                self.get_status(),
                took,
            )

    async def blocking(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self.api.threads, fn, *args)

    def body(self) -> dict[str, Any]:
        raw = self.request.body or b"{}"
        if len(raw) > MAX_BODY:
            raise tornado.web.HTTPError(
                413, f"the body is {len(raw):,} bytes; at most {MAX_BODY:,} bytes"
            )
        try:
            data = json.loads(raw, parse_constant=_no_constants)
        except RecursionError:
            raise tornado.web.HTTPError(400, "the body is nested too deeply") from None
        except ValueError as exc:  # UnicodeDecodeError and the digit limit of ints too
            raise tornado.web.HTTPError(
                400,
                f"the body is not JSON ({shown(str(exc), 80)[1:-1]}); "
                "NaN and Infinity are not JSON either",
            ) from None
        if not isinstance(data, dict):
            raise tornado.web.HTTPError(400, "the body must be a JSON object")
        return data

    def fail(self, status: int, message: str) -> None:
        self.set_status(status)
        self.finish(json.dumps({"message": message}))

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        """Tornado's errors (an HTTPError raised here, 403 from the login check, 405) in our one
        shape, `{"message": ...}`; anything unexpected says only that it was."""
        message = responses.get(status_code, "error")
        exc = (kwargs.get("exc_info") or (None, None, None))[1]
        if isinstance(exc, tornado.web.HTTPError):  # tornado >= 6.5 doubles each % of log_message
            message = (
                getattr(exc, "get_message", lambda: exc.log_message)() or exc.reason or message
            )
        elif exc is not None:
            message = f"internal error ({type(exc).__name__}); the server log has the details"
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"message": message}))

    async def guarded(self, fn, *args, ok: int = 200, statuses: dict | None = None) -> None:
        """Run a blocking call and map our errors: BadInput 400, unknown 404, else 409/503;
        `statuses` ({error class: status}) comes first, for a handler's own errors."""
        try:
            result = await self.blocking(fn, *args)
        except tuple(statuses or ()) as exc:
            status = next(code for cls, code in statuses.items() if isinstance(exc, cls))
            return self.fail(status, str(exc))
        except UnknownSession as exc:  # names the sessions that exist
            return self.fail(404, error_text(exc))
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


def _no_constants(name: str) -> None:
    raise ValueError(f"{name} is not a number")
