"""Every REST error is one JSON body, `{"message": ...}`, that speaks of fields and never echoes a
huge value (issue 10 item 7): tornado's own errors (404, 405, 403) included, bodies capped in size
before they are parsed, nesting and non-numbers refused."""

from __future__ import annotations

import json

import pytest

MAX_MESSAGE = 400


async def error(jp_fetch, *path, method="GET", body=None, params=None):
    """(status, message) of a request that must fail, checking the body's shape."""
    kwargs = {"method": method, "raise_error": False}
    if body is not None:
        kwargs["body"] = body if isinstance(body, (str, bytes)) else json.dumps(body)
    if params:
        kwargs["params"] = params
    r = await jp_fetch("gpusession", "api", *path, **kwargs)
    assert r.code >= 400, (r.code, r.body[:200])
    assert r.headers["Content-Type"].startswith("application/json"), r.headers["Content-Type"]
    doc = json.loads(r.body)
    assert set(doc) == {"message"} and isinstance(doc["message"], str), doc
    assert 0 < len(doc["message"]) <= MAX_MESSAGE, doc["message"][:500]
    assert "--" not in doc["message"], (
        f"a REST message speaks of fields, not flags: {doc['message']}"
    )
    return r.code, doc["message"]


@pytest.mark.parametrize("path", [("sessions",), ("options", "check")])
async def test_bodies_are_capped_and_parsed_safely(jp_fetch, manager, path):
    code, message = await error(
        jp_fetch, *path, method="POST", body='{"a": ' + "[" * 20_000 + "]" * 20_000 + "}"
    )
    assert code == 400 and "nested too deeply" in message
    code, message = await error(
        jp_fetch, *path, method="POST", body=json.dumps({"host": "ssh://" + "a" * 1_000_000})
    )
    assert code == 413 and "at most 65,536 bytes" in message
    code, message = await error(jp_fetch, *path, method="POST", body='{"max_cost": NaN}')
    assert code == 400 and "NaN" in message
    code, message = await error(jp_fetch, *path, method="POST", body=b'{"idle": "\xff"}')
    assert code == 400 and "not JSON" in message
    code, message = await error(jp_fetch, *path, method="POST", body="[1]")
    assert code == 400 and "JSON object" in message
    assert manager.list() == []


async def test_long_values_are_named_not_echoed(jp_fetch, manager):
    for field in ("host", "image", "idle", "region", "name", "type", "ssh_cidr"):
        code, message = await error(
            jp_fetch, "sessions", method="POST", body={"backend": "local", field: "z" * 60_000}
        )
        assert (
            code == 400
            and message.startswith(f"'{field}': ")
            and "zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz" not in message
        )
    code, message = await error(jp_fetch, "sessions", method="POST", body={"q" * 60_000: 1})
    assert code == 400 and message.startswith("unknown field(s) qqq") and len(message) < MAX_MESSAGE
    assert manager.list() == []


async def test_tornados_own_errors_have_the_same_shape(jp_fetch):
    code, message = await error(jp_fetch, "nope")
    assert code == 404 and "gpusession/api" in message
    code, message = await error(jp_fetch, "sessions", method="PUT", body="{}")
    assert code == 405
    code, message = await error(jp_fetch, "sessions", "ghost")
    assert code == 404 and "no session named 'ghost'" in message


async def test_no_token_is_403_in_the_same_shape(jp_base_url, http_server_client):
    r = await http_server_client.fetch(
        f"{jp_base_url}gpusession/api/sessions".replace("//", "/"), raise_error=False
    )
    assert r.code == 403 and set(json.loads(r.body)) == {"message"}


@pytest.mark.parametrize(
    "since, needle",
    [
        ("nan", "finite"),
        ("inf", "finite"),
        ("-1", "finite"),
        ("abc", "unix seconds"),
        ("9" * 5000, "unix seconds"),
    ],
)
async def test_stats_since_must_be_finite_unix_seconds(jp_fetch, since, needle):
    code, message = await error(jp_fetch, "sessions", "ghost", "stats", params={"since": since})
    assert code == 400 and message.startswith("'since'") and needle in message


@pytest.mark.parametrize(
    "body, needle",
    [
        ('{"duration": Infinity}', "NaN and Infinity"),
        ({"duration": "1e999"}, "'duration': keepalive duration must be a finite number"),
        ({"duration": 1e300}, "'duration': keepalive duration must be at most"),
        ({"duration": "nan"}, "'duration': keepalive duration must be a finite number"),
        ({"duration": True}, "'duration': wrong type (boolean)"),
        ({"duration": {"a": 1}}, "'duration': wrong type (object)"),
        ({"duration": "1h", "until": 5}, "unknown field(s) until; allowed: duration"),
        ({"duration": "z" * 60_000}, "'duration': keepalive duration is 60,000 characters long"),
    ],
)
async def test_keepalive_bodies_are_checked_before_the_session_is_looked_up(jp_fetch, body, needle):
    code, message = await error(
        jp_fetch, "sessions", "ghost", "keepalive", method="POST", body=body
    )
    assert code == 400 and needle in message, message


async def test_a_good_keepalive_body_for_an_unknown_session_is_404(jp_fetch):
    for body in ({}, {"duration": None}, {"duration": 30}, {"duration": "2h"}):
        code, _ = await error(jp_fetch, "sessions", "ghost", "keepalive", method="POST", body=body)
        assert code == 404
