"""A stand-in for gpusession's REST API, to develop and demo the sidebar panel without
GPUs, Docker or the real server extension.

It serves the endpoints of ``labextension/src/types.ts`` under ``<base_url>/gpusession/api/``
from memory, with made-up but plausible GPU stats and a made-up option table (durations and
money are parsed by ``gpusession.core.durations``, as the real server does). Load it as a server extension:

    PYTHONPATH=labextension/dev jupyter lab \
        --ServerApp.jpserver_extensions=fake_api=True

Environment:
    FAKE_GPUSESSION_SESSIONS  how many sessions to start with (default 3: one running with
                              two GPUs, one running without a visible GPU, one failed);
                              a larger number gives that many running sessions.
    FAKE_GPUSESSION_EMPTY=1   start with no sessions.

POST ``sessions`` with ``type: "fail"`` makes a session that fails while provisioning.
Do not load it next to the real gpusession server extension: both claim the same URLs.
"""

from __future__ import annotations

import json
import math
import os
import time
import uuid
from dataclasses import dataclass, field

import tornado.web
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join

from gpusession.core.durations import parse_duration as _parse_duration
from gpusession.core.durations import parse_money
from gpusession.core.errors import BadInput

CATALOG = {
    "types": [
        {
            "name": "T4",
            "memory_gb": 16,
            "on_demand_per_hour": 0.526,
            "spot_per_hour": 0.158,
            "instance_types": [
                {"name": "g4dn.xlarge", "gpu_count": 1, "on_demand_per_hour": 0.526, "spot_per_hour": 0.158}
            ],
        },
        {
            "name": "A10G",
            "memory_gb": 24,
            "on_demand_per_hour": 1.006,
            "spot_per_hour": 0.302,
            "instance_types": [
                {"name": "g5.xlarge", "gpu_count": 1, "on_demand_per_hour": 1.006, "spot_per_hour": 0.302}
            ],
        },
        {
            "name": "A100",
            "memory_gb": 40,
            "on_demand_per_hour": 4.096,
            "spot_per_hour": None,
            "instance_types": [
                {"name": "p4d.24xlarge", "gpu_count": 8, "on_demand_per_hour": 32.77, "spot_per_hour": None}
            ],
        },
    ],
    "snapshot_date": "2024-06-01",
    "region": "us-east-1",
}
PRICES = {t["name"]: t for t in CATALOG["types"]}
BACKENDS = ["local", "docker", "aws"]


def _option(name, kind, label, help, default=None, backends=None, choices=None, form=True) -> dict:
    flag = "--" + name.replace("_", "-")
    return {"name": name, "flag": flag, "kind": kind, "label": label, "help": help, "default": default,
            "backends": backends, "choices": choices, "form": form}


#: The reply of GET options (made up; the real table is the server's).
OPTIONS = [
    _option("type", "gpu_type", "GPU type", "GPU type from the catalog", "T4", choices=list(PRICES)),
    _option("backend", "backend", "Backend", "where the kernel runs", "docker", choices=BACKENDS),
    _option("host", "text", "Host", "Docker host, e.g. ssh://user@host", backends=["docker"]),
    _option("spot", "bool", "Spot instance", "a cheaper instance that may be taken back", False,
            backends=["aws"]),
    _option("idle", "duration", "Idle stop", "stop after this long idle (off: never)", "30m"),
    _option("max_cost", "money", "Max cost", "stop when the session has cost this much"),
    _option("max_runtime", "duration", "Max runtime", "stop after this long in any case"),
    _option("name", "text", "Name", "a name to find the session by"),
    _option("gpu_only", "bool", "GPU-only idle", "count only GPU utilization as activity", False, form=False),
]
#: Seconds a new session spends in each state before the next.
STEP_S = 1.5
GIB = 2**30


@dataclass
class FakeSession:
    id: str
    name: str
    gpu_type: str
    gpu_count: int
    backend: str = "docker"
    spot: bool = False
    host: str | None = None
    created_at: float = field(default_factory=time.time)
    stopped_at: float | None = None
    fail: bool = False
    gpus_visible: bool = True
    idle_timeout_s: float | None = 1800.0
    keepalive_until: float = 0.0
    max_cost: float | None = None

    def state(self, now: float) -> str:
        if self.stopped_at is not None:
            return "stopped"
        steps = ("requested", "provisioning", "starting")
        age = now - self.created_at
        if age < STEP_S * len(steps):
            return steps[int(age // STEP_S)]
        return "failed" if self.fail else "running"

    def started_at(self) -> float:
        return self.created_at + STEP_S * 3

    def price(self) -> float:
        entry = PRICES.get(self.gpu_type)
        if not entry:
            return 0.0
        rate = entry["spot_per_hour"] if self.spot and entry["spot_per_hour"] else entry["on_demand_per_hour"]
        return rate * self.gpu_count

    def view(self) -> dict:
        now = time.time()
        state = self.state(now)
        started = self.started_at() if state in ("running", "stopped") and not self.fail else None
        end = self.stopped_at or now
        uptime = max(0.0, end - started) if started else 0.0
        remaining = None
        warning = None
        if self.idle_timeout_s is not None and state == "running" and started:
            remaining = max(0.0, self.idle_timeout_s - (now - started), self.keepalive_until - now)
            if remaining < 300:
                warning = f"Idle: stopping in {math.ceil(remaining / 60)} min unless a cell runs"
        return {
            "id": self.id,
            "name": self.name,
            "backend": self.backend,
            "gpu_type": self.gpu_type,
            "gpu_count": self.gpu_count,
            "state": state,
            "created_at": self.created_at,
            "started_at": started,
            "stopped_at": self.stopped_at,
            "uptime_s": uptime,
            "price_per_hour": self.price(),
            "cost_so_far": self.price() * uptime / 3600,
            "spot": self.spot,
            "host": self.host,
            "error": "provisioning failed: no capacity for this GPU type (fake)" if state == "failed" else None,
            "idle": {"timeout_s": self.idle_timeout_s, "remaining_s": remaining, "warning": warning},
            "max_cost": self.max_cost,
            "stop_reason": ({"kind": "user", "by": "the JupyterLab sidebar", "text": "stopped by the JupyterLab sidebar"}
                            if state == "stopped" else None),
            "ended": {"stopped": "stopped by the JupyterLab sidebar",
                      "failed": "failed: provisioning failed: no capacity for this GPU type (fake)"}.get(state),
            "restart": {"type": self.gpu_type, "backend": self.backend,
                        "idle": f"{self.idle_timeout_s:g}s" if self.idle_timeout_s else "off"},
            "progress": [f"[{min(now - self.created_at, 9.9):6.1f}s] {state} (fake)"]
            if state in ("requested", "provisioning", "starting") else None,
            "kernel_id": None,
        }

    def samples(self, since: float) -> list[dict]:
        now = time.time()
        start = max(since, self.started_at(), now - 300)
        first = math.floor(start) + 1
        return [self._sample(float(t)) for t in range(int(first), int(now) + 1)]

    def _sample(self, t: float) -> dict:
        seed = int(self.id[:6], 16) % 97
        gpus = []
        for i in range(self.gpu_count):
            phase = t / 15 + seed + i
            util = 55 + 40 * math.sin(phase)
            gpus.append(
                {
                    "index": i,
                    "name": f"NVIDIA {self.gpu_type} (fake)",
                    "uuid": f"GPU-{self.id}-{i}",
                    "utilization": round(util, 1),
                    "memory_used": int((4 + 3 * math.sin(phase / 3)) * GIB),
                    "memory_total": int(PRICES.get(self.gpu_type, {"memory_gb": 16})["memory_gb"] * GIB),
                    "temperature": round(45 + util / 4, 1),
                    "power_draw": round(20 + util * 0.5, 1),
                    "power_limit": 70.0,
                    "sm_clock": 1590,
                    "processes": [{"pid": 4242, "name": "python", "memory_used": 3 * GIB}],
                }
            )
        return {
            "t": t,
            "gpus": gpus,
            "cpu_percent": 12.5,
            "memory_used": 6 * GIB,
            "memory_total": 32 * GIB,
            "kernel_busy": math.sin(t / 15 + seed) > 0,
        }


class FakeStore:
    def __init__(self) -> None:
        self.sessions: dict[str, FakeSession] = {}
        if os.environ.get("FAKE_GPUSESSION_EMPTY") == "1":
            return
        count = int(os.environ.get("FAKE_GPUSESSION_SESSIONS", "3"))
        started = time.time() - 600
        if count == 3:
            self.add(FakeSession(new_id(), "training", "T4", 2, created_at=started, idle_timeout_s=840.0))
            self.add(FakeSession(new_id(), "no-gpu-here", "T4", 1, created_at=started, gpus_visible=False))
            self.add(FakeSession(new_id(), "unlucky", "A100", 1, backend="aws", created_at=started, fail=True))
        else:
            for n in range(count):
                self.add(FakeSession(new_id(), f"s{n:02d}", "A10G", 1 + n % 2, created_at=started - n * 60))

    def add(self, session: FakeSession) -> FakeSession:
        self.sessions[session.id] = session
        return session


def new_id() -> str:
    return uuid.uuid4().hex[:12]


def parse_duration(text: str) -> float | None:
    try:
        return _parse_duration(text)
    except BadInput as error:
        raise tornado.web.HTTPError(400, reason=str(error)) from error


def check_options(body: dict) -> dict[str, str]:
    """What POST options/check answers: option name -> what is wrong."""
    errors: dict[str, str] = {}
    known = {option["name"]: option for option in OPTIONS}
    for name, value in body.items():
        option = known.get(name)
        if option is None:
            errors[name] = f"unknown option {name!r}"
            continue
        try:
            if option["kind"] == "duration":
                _parse_duration(value, what=option["label"].lower())
            elif option["kind"] == "money":
                parse_money(value, what=option["label"].lower())
            elif option["choices"] is not None and value not in option["choices"]:
                errors[name] = f"{value!r} is not one of {', '.join(option['choices'])}"
        except BadInput as error:
            errors[name] = str(error)
    if not body.get("type"):
        errors["type"] = "choose a GPU type"
    return errors


class FakeHandler(APIHandler):
    store: FakeStore

    def initialize(self, store: FakeStore) -> None:
        self.store = store

    def session(self, session_id: str) -> FakeSession:
        session = self.store.sessions.get(session_id)
        if session is None:
            raise tornado.web.HTTPError(404, reason=f"no session {session_id!r}")
        return session

    def body(self) -> dict:
        try:
            body = json.loads(self.request.body or b"{}")
        except ValueError as error:
            raise tornado.web.HTTPError(400, reason=f"body is not JSON: {error}") from error
        if not isinstance(body, dict):
            raise tornado.web.HTTPError(400, reason="body must be a JSON object")
        return body


class SessionsHandler(FakeHandler):
    @tornado.web.authenticated
    def get(self) -> None:
        self.finish({"sessions": [s.view() for s in self.store.sessions.values()]})

    @tornado.web.authenticated
    def post(self) -> None:
        body = self.body()
        gpu_type = body.get("type")
        errors = check_options(body) if gpu_type != "fail" else {}
        if errors:
            self.set_status(400)
            self.finish({"message": "; ".join(f"{name}: {text}" for name, text in errors.items())})
            return
        idle = body.get("idle")
        session = FakeSession(
            new_id(),
            body.get("name") or f"{gpu_type.lower()}-{len(self.store.sessions) + 1}",
            gpu_type,
            1,
            backend=body.get("backend") or "docker",
            spot=bool(body.get("spot")),
            host=body.get("host"),
            fail=gpu_type == "fail",
            idle_timeout_s=parse_duration(idle) if isinstance(idle, str) else 1800.0,
            max_cost=parse_money(body.get("max_cost")),
        )
        self.store.add(session)
        self.set_status(202)
        self.finish(session.view())


class SessionHandler(FakeHandler):
    @tornado.web.authenticated
    def get(self, session_id: str) -> None:
        self.finish(self.session(session_id).view())

    @tornado.web.authenticated
    def delete(self, session_id: str) -> None:
        session = self.session(session_id)
        if session.stopped_at is None:
            session.stopped_at = time.time()
        self.finish(session.view())


class StatsHandler(FakeHandler):
    @tornado.web.authenticated
    def get(self, session_id: str) -> None:
        session = self.session(session_id)
        try:
            since = float(self.get_argument("since", "0"))
        except ValueError as error:
            raise tornado.web.HTTPError(400, reason="'since' must be unix seconds") from error
        visible = session.gpus_visible and session.state(time.time()) == "running"
        self.finish(
            {
                "session_id": session.id,
                "gpus_visible": visible,
                "message": None if visible else "no NVIDIA GPU visible (fake)",
                "samples": session.samples(since) if visible else [],
            }
        )


class KeepAliveHandler(FakeHandler):
    @tornado.web.authenticated
    def post(self, session_id: str) -> None:
        session = self.session(session_id)
        duration = self.body().get("duration")
        if not isinstance(duration, str):
            raise tornado.web.HTTPError(400, reason="'duration' is required, e.g. \"1h\"")
        session.keepalive_until = time.time() + (parse_duration(duration) or 0)
        self.finish(session.view())


class CatalogHandler(FakeHandler):
    @tornado.web.authenticated
    def get(self) -> None:
        self.finish(CATALOG)


class OptionsHandler(FakeHandler):
    @tornado.web.authenticated
    def get(self) -> None:
        self.finish({"options": OPTIONS})


class OptionsCheckHandler(FakeHandler):
    @tornado.web.authenticated
    def post(self) -> None:
        self.finish({"errors": check_options(self.body())})


def _jupyter_server_extension_points() -> list[dict]:
    return [{"module": "fake_api"}]


def _load_jupyter_server_extension(serverapp) -> None:
    store = FakeStore()
    base = url_path_join(serverapp.web_app.settings["base_url"], "gpusession", "api")
    ident = r"(?P<session_id>[^/]+)"
    kwargs = {"store": store}
    serverapp.web_app.add_handlers(
        ".*$",
        [
            (url_path_join(base, "sessions"), SessionsHandler, kwargs),
            (url_path_join(base, "sessions", ident), SessionHandler, kwargs),
            (url_path_join(base, "sessions", ident, "stats"), StatsHandler, kwargs),
            (url_path_join(base, "sessions", ident, "keepalive"), KeepAliveHandler, kwargs),
            (url_path_join(base, "catalog"), CatalogHandler, kwargs),
            (url_path_join(base, "options"), OptionsHandler, kwargs),
            (url_path_join(base, "options", "check"), OptionsCheckHandler, kwargs),
        ],
    )
    serverapp.log.info("fake gpusession API at %s with %d sessions", base, len(store.sessions))
