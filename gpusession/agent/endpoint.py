"""The agent's HTTP endpoint: loopback only, reached through the session's SSH tunnel.

    GET  /health                       {"ok": true, "session_id", "stopping", "cpu_s", "kernel"}
                                       (kernel: {"generation", "running", "ready"})
    GET  /stats?since=UNIX&limit=N     samples newer than `since`, the newest N; limits, cost
    GET  /summary                      duration, GPU-hours, cost, mean GPU utilization, idle minutes
    POST /keepalive {"seconds": N}     postpone the idle stop (capped by --keepalive-limit)
    POST /restart                      a fresh kernel in this session (same ports and key): the
                                       running one is ended, the runtime starts the next
    POST /save                         the kernel's namespace into the workspace (waits, at most
                                       the save time bound): {"committed", "saved", "bytes", ...}
    GET  /restored                     what the first kernel restored from the workspace, or
                                       {"asked": false}

Every route, /health too, needs `Authorization: Bearer <token>`, where the token is derived from
the kernel's connection key (`agent_token`): whoever may run code in the kernel may read its
stats, and nobody else on a shared machine can keep its GPU billing or learn which session runs
there (until the kernel's connection file exists, every route answers 503). Nothing is logged per
request, so neither the token nor a query string ends up in a log.
"""

from __future__ import annotations

import hmac
import json
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

from ..core.protocol import agent_token as agent_token

MAX_BODY = 4096


class _HttpError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def _number(value: Any, what: str, *, minimum: float = 0.0) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise _HttpError(400, f"{what} must be a number, got {value!r}") from None
    if number != number or number < minimum:  # NaN or too small
        raise _HttpError(400, f"{what} must be >= {minimum:g}, got {value!r}")
    return number


class AgentServer:
    """Serves one Watchdog. `token` is a callable so it can be read once the kernel's
    connection file exists (the server starts first). `kernel`: the runtime, for the kernel's
    state and restarts (`kernel_state()`, `request_restart()`); None serves neither."""

    def __init__(
        self,
        watchdog,
        token: Callable[[], str | None],
        host: str = "127.0.0.1",
        port: int = 0,
        kernel=None,
        save: Callable[[], dict] | None = None,
        restored: Callable[[], dict | None] | None = None,
        sock=None,
    ):
        """`sock`: a socket bound and listening already (the runtime's first step bound the
        port the KERNEL and READY lines name), served instead of binding `host`:`port`."""
        self.watchdog = watchdog
        self.kernel = kernel
        self._save = save
        self._restored = restored
        self._token = token
        if sock is None:
            self.httpd = ThreadingHTTPServer((host, port), self._handler_class())
        else:
            self.httpd = ThreadingHTTPServer(
                (host, port), self._handler_class(), bind_and_activate=False
            )
            self.httpd.socket.close()
            self.httpd.socket = sock
            self.httpd.server_address = sock.getsockname()
            self.httpd.server_name, self.httpd.server_port = self.httpd.server_address[:2]
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self._thread: threading.Thread | None = None

    def start(self) -> "AgentServer":
        self._thread = threading.Thread(
            target=self.httpd.serve_forever, name="gpusession-agent-http", daemon=True
        )
        self._thread.start()
        return self

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    # -- routes ---------------------------------------------------------------------------

    def route(
        self, method: str, path: str, query: dict[str, list[str]], body: bytes, auth: str | None
    ) -> tuple[int, dict]:
        self._check_token(auth)
        if method == "GET" and path == "/health":
            return 200, {
                "ok": True,
                "session_id": self.watchdog.session_id,
                "stopping": self.watchdog.stop_reason.to_dict()
                if self.watchdog.stop_reason
                else None,
                "cpu_s": round(
                    time.process_time(), 6
                ),  # this process's CPU time (ns clock): its own cost
                "kernel": self.kernel.kernel_state() if self.kernel is not None else None,
            }
        if method == "GET" and path == "/stats":
            since = query.get("since", [None])[0]
            limit = query.get("limit", [None])[0]
            return 200, self.watchdog.stats(
                since=None if since in (None, "") else _number(since, "since"),
                limit=None if limit in (None, "") else int(_number(limit, "limit")),
            )
        if method == "GET" and path == "/summary":
            return 200, self.watchdog.summary()
        if method == "POST" and path == "/keepalive":
            try:
                data = json.loads(body or b"{}")
            except ValueError:
                raise _HttpError(400, 'body must be JSON like {"seconds": 3600}') from None
            if not isinstance(data, dict) or "seconds" not in data:
                raise _HttpError(400, 'body must be JSON like {"seconds": 3600}')
            return 200, self.watchdog.keepalive(_number(data["seconds"], "seconds"))
        if method == "POST" and path == "/restart":
            if self.kernel is None:
                raise _HttpError(404, "this runtime cannot restart its kernel")
            try:
                return 200, self.kernel.request_restart()
            except RuntimeError as exc:  # the session is stopping
                raise _HttpError(409, str(exc)) from None
        if method == "POST" and path == "/save":
            if self._save is None:
                raise _HttpError(404, "this runtime has no workspace to save into")
            return 200, self._save()
        if method == "GET" and path == "/restored":
            report = self._restored() if self._restored is not None else None
            return 200, report if report is not None else {"asked": False}
        if path in (
            "/health",
            "/stats",
            "/summary",
            "/keepalive",
            "/restart",
            "/save",
            "/restored",
        ):
            raise _HttpError(405, f"{method} is not allowed on {path}")
        raise _HttpError(404, f"no route {path}")

    def _check_token(self, auth: str | None) -> None:
        expected = self._token()
        if expected is None:
            raise _HttpError(503, "the session is starting; try again in a moment")
        given = (auth or "").removeprefix("Bearer ").strip()
        if not hmac.compare_digest(given.encode(), expected.encode()):
            raise _HttpError(401, "missing or wrong agent token")

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            server_version = "gpusession-agent"
            protocol_version = "HTTP/1.1"  # keep-alive: the panel and `%gpu watch` poll
            timeout = 120  # an idle keep-alive connection is closed after this (its thread ends)
            # One write per response (buffered, flushed after each request): sshd does not set
            # TCP_NODELAY on forwarded channels, and headers and body in two writes cost a 40 ms
            # Nagle/delayed-ACK stall per request through the tunnel.
            wbufsize = 256 * 1024
            disable_nagle_algorithm = True

            def _serve(self, method: str) -> None:
                url = urllib.parse.urlsplit(self.path)
                try:
                    length = int(self.headers.get("Content-Length") or 0)
                    if length > MAX_BODY:
                        raise _HttpError(413, f"body over {MAX_BODY} bytes")
                    body = self.rfile.read(length) if length else b""
                    status, doc = server.route(
                        method,
                        url.path,
                        urllib.parse.parse_qs(url.query),
                        body,
                        self.headers.get("Authorization"),
                    )
                except _HttpError as exc:
                    status, doc = exc.status, {"error": str(exc)}
                except Exception as exc:  # noqa: BLE001 - a bug of ours: say so, keep serving
                    status, doc = 500, {"error": f"{type(exc).__name__}: {exc}"}
                payload = json.dumps(doc).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.send_header("Cache-Control", "no-store")
                self.end_headers()
                self.wfile.write(payload)

            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                self._serve("GET")

            def do_POST(self) -> None:  # noqa: N802
                self._serve("POST")

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass  # no request log: nothing secret can leak into one

        return Handler


def token_from_connection_file(path: str) -> Callable[[], str | None]:
    """A token getter that reads the kernel's connection file once it exists."""
    cache: dict[str, str] = {}

    def get() -> str | None:
        if "token" not in cache:
            try:
                with open(path) as f:
                    cache["token"] = agent_token(json.load(f)["key"])
            except (OSError, ValueError, KeyError):
                return None
        return cache["token"]

    return get
