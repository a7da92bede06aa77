"""The REST API through a real jupyter server (pytest-jupyter's jp_fetch)."""

import asyncio
import json
import time

import pytest
import tornado.httpclient


async def fetch_json(jp_fetch, *path, method="GET", body=None, **params):
    kwargs = {"method": method}
    if body is not None:
        kwargs["body"] = json.dumps(body) if not isinstance(body, (str, bytes)) else body
    if params:
        kwargs["params"] = params
    r = await jp_fetch("gpusession", "api", *path, **kwargs)
    return r.code, json.loads(r.body)


async def expect_error(jp_fetch, code, *path, **kwargs):
    with pytest.raises(tornado.httpclient.HTTPClientError) as e:
        await fetch_json(jp_fetch, *path, **kwargs)
    assert e.value.code == code, e.value.response.body
    return json.loads(e.value.response.body or b"{}").get("message", "")


async def wait_state(jp_fetch, sid, states, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _, view = await fetch_json(jp_fetch, "sessions", sid)
        if view["state"] in states:
            return view
        await asyncio.sleep(0.2)
    raise AssertionError(f"session {sid} never reached {states}: {view}")


async def test_catalog(jp_fetch):
    code, cat = await fetch_json(jp_fetch, "catalog")
    assert code == 200
    names = [t["name"] for t in cat["types"]]
    assert "t4" in names and "h200" in names
    t4 = cat["types"][names.index("t4")]
    assert t4["on_demand_per_hour"] > 0 and t4["instance_types"][0]["name"] == "g4dn.xlarge"


@pytest.mark.integration
async def test_start_list_get_stop(jp_fetch):
    code, view = await fetch_json(
        jp_fetch,
        "sessions",
        method="POST",
        body={"type": "t4", "backend": "local", "idle": "off", "name": "api1"},
    )
    assert code == 202 and view["name"] == "api1" and view["state"] == "requested"
    view = await wait_state(jp_fetch, view["id"], {"running", "failed"})
    assert view["state"] == "running", view
    assert view["price_per_hour"] == pytest.approx(0.526) and view["gpu_type"] == "t4"
    _, listing = await fetch_json(jp_fetch, "sessions")
    assert [s["name"] for s in listing["sessions"]] == ["api1"]
    _, by_name = await fetch_json(jp_fetch, "sessions", "api1")
    assert by_name["id"] == view["id"]
    code, stopped = await fetch_json(jp_fetch, "sessions", view["id"], method="DELETE")
    assert code == 200 and stopped["state"] == "stopped" and stopped["cost_so_far"] > 0
    _, listing = await fetch_json(jp_fetch, "sessions")
    assert listing["sessions"] == []
    _, everything = await fetch_json(jp_fetch, "sessions", all="1")
    assert [s["state"] for s in everything["sessions"]] == ["stopped"]


@pytest.mark.integration
async def test_sessions_started_elsewhere_show_up(jp_fetch, manager):
    session = manager.start(
        manager.make_spec("l4", backend="local", idle="off", name="from-notebook")
    )
    _, listing = await fetch_json(jp_fetch, "sessions")
    assert [s["name"] for s in listing["sessions"]] == ["from-notebook"]
    assert listing["sessions"][0]["state"] == "running"
    await fetch_json(jp_fetch, "sessions", session.id, method="DELETE")
    assert manager.get(session.id).state.value == "stopped"


@pytest.mark.parametrize(
    "body, needle",
    [
        ({"type": 4}, "'type': wrong type (number): expected a string"),
        ({"type": "t5"}, "'type': unknown GPU type 't5'"),
        ({"type": "t4", "idle": "abc"}, "'idle': bad idle timeout 'abc'"),
        ({"type": "t4", "idle": "8d"}, "'idle': idle timeout must be at most 7d"),
        (
            {"type": "t4", "max_runtime": "1e999"},
            "'max_runtime': max runtime must be a finite number",
        ),
        ('{"type": "t4", "max_cost": 1e999}', "'max_cost': max cost must be a finite number"),
        ({"type": "t4", "backend": "nope"}, "'backend': unknown backend 'nope'"),
        ({"type": "t4", "spot": "yes"}, "'spot': wrong type (string): expected true or false"),
        ({"type": "t4", "gpu_only": 1}, "'gpu_only': wrong type (number)"),
        ({"type": "t4", "colour": "red"}, "unknown field(s) colour; allowed: type, backend, name,"),
        ("not json", "body is not JSON"),
        ('{"type": "t4", "max_cost": NaN}', "body is not JSON"),
        ('{"type": "t4", "idle": Infinity}', "body is not JSON"),
        ("[1, 2]", "JSON object"),
    ],
)
async def test_bad_start_bodies_are_400_with_a_message(jp_fetch, manager, body, needle):
    message = await expect_error(jp_fetch, 400, "sessions", method="POST", body=body)
    if needle in ("body is not JSON", "JSON object"):
        return  # tornado puts these in the reason line
    assert needle in message
    assert manager.list() == [], "bad input records nothing"


CONFIGURED = {
    "ServerApp": {"jpserver_extensions": {"gpusession": True}},
    "GpuSessionConfig": {"default_type": "l4", "default_idle": "12m", "default_backend": "local"},
}


@pytest.mark.parametrize("jp_server_config", [CONFIGURED])
async def test_options_are_the_table_with_the_server_config_applied(gs_home, jp_fetch):
    from gpusession.configuration.options import table

    NAMES = table().names

    code, doc = await fetch_json(jp_fetch, "options")
    assert code == 200 and set(doc) == {"options", "metrics", "places"}
    assert [o["name"] for o in doc["options"]] == list(NAMES)
    by_name = {o["name"]: o for o in doc["options"]}
    assert by_name["idle"] == {
        "name": "idle",
        "flag": "--idle",
        "kind": "duration",
        "label": "Idle stop",
        "help": by_name["idle"]["help"],
        "default": "12m",
        "backends": None,
        "choices": None,
        "form": True,
        # what the empty field shows in both forms: its default, short enough for the sidebar
        "placeholder": "default 12m",
        "form_help": by_name["idle"]["form_help"],
        "first": False,
    }
    assert "90s, 15m, 1h30m" in by_name["idle"]["form_help"]  # the shape: under the field
    assert by_name["host"]["placeholder"] == "default this machine"
    assert by_name["max_cost"]["placeholder"] == "default off"
    assert by_name["image"]["form"] and by_name["image"]["placeholder"].startswith("default ")
    assert by_name["type"]["default"] == "l4" and "t4" in by_name["type"]["choices"]
    assert by_name["backend"]["default"] == "local" and {"local", "docker", "aws"} <= set(
        by_name["backend"]["choices"]
    )
    assert by_name["spot"]["default"] is False and by_name["host"]["backends"] == [
        "docker",
        "slurm",
    ]
    # and a start without those fields takes them
    code, view = await fetch_json(jp_fetch, "sessions", method="POST", body={"name": "dflt"})
    assert code == 202 and (view["gpu_type"], view["backend"]) == ("l4", "local")
    view = await wait_state(jp_fetch, view["id"], {"running", "failed"})
    assert view["idle"]["timeout_s"] == 720.0
    await fetch_json(jp_fetch, "sessions", view["id"], method="DELETE")


async def test_options_check_says_what_is_wrong_field_by_field(jp_fetch, manager):
    code, doc = await fetch_json(
        jp_fetch,
        "options",
        "check",
        method="POST",
        body={"type": "a100:8", "backend": "local", "idle": "1h30m", "max_cost": 5},
    )
    assert code == 200 and doc == {"errors": {}}
    code, doc = await fetch_json(jp_fetch, "options", "check", method="POST", body={})
    assert code == 200 and doc == {"errors": {}}
    code, doc = await fetch_json(
        jp_fetch,
        "options",
        "check",
        method="POST",
        body={"type": "t5", "idle": "abc", "spot": "yes", "max_cost": -1, "colour": "red"},
    )
    errors = doc["errors"]
    assert code == 200 and set(errors) == {"type", "idle", "spot", "max_cost", "colour"}
    assert (
        errors["idle"]
        == "bad idle timeout 'abc': write e.g. 90s, 15m, 1h30m (a bare number means minutes) or 'off'"
    )
    assert errors["type"].startswith("unknown GPU type 't5'; valid types: t4,")
    assert errors["spot"] == "wrong type (string): expected true or false"
    assert errors["max_cost"] == "max cost must be positive, got -1"
    assert errors["colour"].startswith("unknown field; allowed: type, backend,")
    await expect_error(jp_fetch, 400, "options", "check", method="POST", body='{"idle": NaN}')
    await expect_error(jp_fetch, 400, "options", "check", method="POST", body="[1]")
    assert manager.list() == [], "a check records nothing"


async def test_unknown_session_is_404(jp_fetch):
    assert "no session named 'ghost'" in await expect_error(jp_fetch, 404, "sessions", "ghost")
    await expect_error(jp_fetch, 404, "sessions", "ghost", method="DELETE")
    await expect_error(jp_fetch, 404, "sessions", "ghost", "stats")


async def test_no_token_is_403(jp_fetch, jp_base_url, http_server_client, jp_serverapp):
    url = f"{jp_base_url}gpusession/api/sessions".replace("//", "/")
    for method, body in (("GET", None), ("POST", "{}")):
        r = await http_server_client.fetch(url, method=method, body=body, raise_error=False)
        assert r.code == 403, (method, r.code)
    for path, method, body in (("options", "GET", None), ("options/check", "POST", "{}")):
        r = await http_server_client.fetch(
            f"{jp_base_url}gpusession/api/{path}".replace("//", "/"),
            method=method,
            body=body,
            raise_error=False,
        )
        assert r.code == 403, (path, r.code)


@pytest.mark.docker
async def test_images_lists_what_the_engine_has_with_size_and_runtime(jp_fetch):
    """The start forms' image field offers what the chosen backend's engine has; a bad host is
    a 400 naming the field, a backend without images lists none."""
    from support.hosts import docker_available, product_image

    if not docker_available():
        pytest.skip("no Docker engine")
    code, reply = await fetch_json(jp_fetch, "images", backend="docker")
    assert code == 200 and reply["backend"] == "docker" and reply["default"]
    (ours,) = [i for i in reply["images"] if i["reference"] == product_image()]
    assert ours["size_bytes"] > 0 and isinstance(ours["runtime_cached"], bool)
    assert ours["text"].startswith(f"{product_image()} · ") and " MB" in ours["text"] + " GB"
    message = await expect_error(jp_fetch, 400, "images", backend="docker", host="nope")
    assert "host" in message
    code, reply = await fetch_json(jp_fetch, "images", backend="local")
    assert code == 200 and reply["images"] == [] and reply["default"] is None


async def test_slow_calls_in_progress_do_not_hold_up_the_list(
    jp_base_url, http_server_client, jp_serverapp, monkeypatch
):
    """Forty slow calls at once (live prices from a slow cloud API here; stops that save,
    switches) do not queue the sidebar's list behind them: the default thread pool (six threads
    on a two-core machine, twenty on this one) would."""
    import threading

    from gpusession.session.spend import Spend

    release = threading.Event()

    def slow_prices(self, *args, **kwargs):
        release.wait(60)
        return []

    monkeypatch.setattr(Spend, "live_prices", slow_prices)
    client = tornado.httpclient.AsyncHTTPClient(force_instance=True, max_clients=100)
    base = http_server_client.get_url(f"{jp_base_url}gpusession/api/".replace("//", "/"))
    headers = {"Authorization": f"token {jp_serverapp.identity_provider.token}"}

    def get(path: str):
        return client.fetch(base + path, headers=headers, request_timeout=90)

    slow = [asyncio.ensure_future(get("prices?type=t4")) for _ in range(40)]
    try:
        await asyncio.sleep(1.0)
        assert not any(call.done() for call in slow)
        started = time.monotonic()
        listing = await asyncio.wait_for(get("sessions"), timeout=15)
        assert listing.code == 200 and time.monotonic() - started < 5
    finally:
        release.set()
        replies = await asyncio.gather(*slow)
        client.close()
    assert {r.code for r in replies} == {200}


async def test_a_slow_answer_is_said_in_the_server_log_without_its_query(
    jp_fetch, monkeypatch, caplog
):
    """Jupyter logs only failed requests; one of ours slower than SLOW_S is said at INFO, by
    its path (a query may carry a name typed as confirmation), status and time."""
    from gpusession.server import handler_base

    monkeypatch.setattr(handler_base, "SLOW_S", -1.0)  # every answer counts as slow here
    caplog.set_level("INFO")
    await fetch_json(jp_fetch, "catalog", probe="x1")
    said = [r.getMessage() for r in caplog.records if "answered" in r.getMessage()]
    assert said and said[-1].startswith("gpusession: GET /"), said
    assert "/gpusession/api/catalog answered 200 after " in said[-1] and "x1" not in said[-1]
    monkeypatch.setattr(handler_base, "SLOW_S", 60.0)
    caplog.clear()
    await fetch_json(jp_fetch, "catalog")
    assert not [r for r in caplog.records if "answered" in r.getMessage()]
