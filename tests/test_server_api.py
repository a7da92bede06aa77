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


async def test_start_list_get_stop(jp_fetch):
    code, view = await fetch_json(jp_fetch, "sessions", method="POST",
                                  body={"type": "t4", "backend": "local", "idle": "off", "name": "api1"})
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


async def test_sessions_started_elsewhere_show_up(jp_fetch, manager):
    session = manager.start(manager.make_spec("l4", backend="local", idle="off", name="from-notebook"))
    _, listing = await fetch_json(jp_fetch, "sessions")
    assert [s["name"] for s in listing["sessions"]] == ["from-notebook"]
    assert listing["sessions"][0]["state"] == "running"
    await fetch_json(jp_fetch, "sessions", session.id, method="DELETE")
    assert manager.get(session.id).state.value == "stopped"


@pytest.mark.parametrize("body, needle", [
    ({}, "missing 'type'"),
    ({"type": "t5"}, "unknown GPU type 't5'"),
    ({"type": "t4", "idle": "abc"}, "bad idle timeout"),
    ({"type": "t4", "backend": "nope"}, "unknown backend 'nope'"),
    ({"type": "t4", "spot": "yes"}, "'spot' has the wrong type"),
    ({"type": "t4", "colour": "red"}, "unknown field(s) colour"),
    ("not json", "body is not JSON"),
    ("[1, 2]", "JSON object"),
])
async def test_bad_start_bodies_are_400_with_a_message(jp_fetch, manager, body, needle):
    message = await expect_error(jp_fetch, 400, "sessions", method="POST", body=body)
    if needle in ("body is not JSON", "JSON object"):
        return  # tornado puts these in the reason line
    assert needle in message
    assert manager.list() == [], "bad input records nothing"


async def test_unknown_session_is_404(jp_fetch):
    assert "no session named 'ghost'" in await expect_error(jp_fetch, 404, "sessions", "ghost")
    await expect_error(jp_fetch, 404, "sessions", "ghost", method="DELETE")
    await expect_error(jp_fetch, 404, "sessions", "ghost", "stats")


async def test_no_token_is_403(jp_fetch, jp_base_url, http_server_client, jp_serverapp):
    url = f"{jp_base_url}gpusession/api/sessions".replace("//", "/")
    for method, body in (("GET", None), ("POST", "{}")):
        r = await http_server_client.fetch(url, method=method, body=body, raise_error=False)
        assert r.code == 403, (method, r.code)
