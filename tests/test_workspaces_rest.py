"""Workspaces through the REST API of a real jupyter server (pytest-jupyter) on the local backend:
`GET workspaces` lists them as `gpusession workspaces` does; `DELETE workspaces/NAME` needs the
name as confirmation and refuses a workspace a session uses; an ended session's view says what its
stop saved and carries a `resume` body (the history card's Resume) beside the fresh `restart`."""

from __future__ import annotations

import asyncio
import json
import re
import time

import pytest
import tornado.httpclient


async def _call(jp_fetch, *path, method="GET", body=None, **params):
    kwargs = {"method": method, **({"body": json.dumps(body)} if body is not None else {})}
    if params:
        kwargs["params"] = params
    r = await jp_fetch("gpusession", "api", *path, **kwargs)
    return json.loads(r.body)


async def _error(jp_fetch, code, *path, **kwargs) -> str:
    with pytest.raises(tornado.httpclient.HTTPClientError) as e:
        await _call(jp_fetch, *path, **kwargs)
    assert e.value.code == code, e.value.response.body
    body = json.loads(e.value.response.body)
    assert set(body) == {"message"}, body
    return body["message"]


async def _running(jp_fetch, sid):
    deadline = time.monotonic() + 60
    while (view := await _call(jp_fetch, "sessions", sid))["state"] not in ("running", "failed"):
        assert time.monotonic() < deadline
        await asyncio.sleep(0.2)
    assert view["state"] == "running", view
    return view


def _listed(listing, name):
    return next((w for w in listing["workspaces"] if w["name"] == name), None)


@pytest.mark.integration
async def test_list_resume_and_delete_workspaces(jp_fetch, manager):
    first = await _running(
        jp_fetch,
        (
            await _call(
                jp_fetch,
                "sessions",
                method="POST",
                body={"type": "t4", "backend": "local", "idle": "off", "name": "rw1"},
            )
        )["id"],
    )
    assert first["resume"] is None and first["saved"] is None and "resume" not in first["restart"]
    assert first["restart"]["workspace"] == "rw1"
    assert manager.attach("rw1").run("v = 5")["status"] == "ok"
    assert first["workspace"] == "rw1"
    said = await _error(jp_fetch, 400, "sessions", "rw1", method="DELETE", save="yes")
    assert said == "'save' must be 1 or 0, got 'yes'"
    # the card's "Save and stop"
    stopped = await _call(jp_fetch, "sessions", "rw1", method="DELETE", save="1")
    assert stopped["state"] == "stopped", stopped

    ended = await _call(jp_fetch, "sessions", "rw1")
    assert ended["saved"].startswith("saved 1 variable, "), ended["saved"]
    assert "resume with `%gpu start --resume rw1`" in ended["saved"]
    assert ended["restart"] == {
        "type": "t4",
        "backend": "local",
        "idle": "off",
        "workspace": "rw1",
    }  # "Start again": a fresh kernel on the same workspace (its files, not its variables)
    assert ended["resume"] == {"type": "t4", "backend": "local", "idle": "off", "resume": "rw1"}
    row = _listed(await _call(jp_fetch, "workspaces"), "rw1")
    assert row["backend"] == "local" and row["where"].endswith("/workspaces/rw1"), row
    assert row["size_bytes"] > 0 and row["size"].endswith(("bytes", "kB")), row
    assert (
        row["cost_per_month"] is None and row["in_use"] is False and row["used_by"] == "none left"
    ), row

    again = await _running(
        jp_fetch,
        (await _call(jp_fetch, "sessions", method="POST", body=dict(ended["resume"], name="rw2")))[
            "id"
        ],
    )
    deadline = time.monotonic() + 10  # the restore report is kept just after the state says running
    while "restored" not in manager.get("rw2").resource and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    assert manager.get("rw2").resource["restored"]["restored"] == ["v"]
    restored = (await _call(jp_fetch, "sessions", "rw2"))["restored"]
    assert re.fullmatch(r"workspace rw1: restored 1 name\(s\) from \S+ ago: v", restored), restored
    row = _listed(await _call(jp_fetch, "workspaces"), "rw1")
    assert (
        row["in_use"] is True and row["active"] == ["rw2"] and row["used_by"] == "rw2 (active)"
    ), row
    said = await _error(jp_fetch, 409, "workspaces", "rw1", method="DELETE", confirm="rw1")
    assert said == "workspace rw1 is in use by session rw2; stop it first"

    # no deleting without the name as confirmation; bad names and parameters are 400, unknown ones 404
    said = await _error(jp_fetch, 400, "workspaces", "rw1", method="DELETE")
    assert "confirm it with 'confirm' set to the workspace's name (rw1), got none" in said
    assert "got 'yes'" in await _error(
        jp_fetch, 400, "workspaces", "rw1", method="DELETE", confirm="yes"
    )
    assert "bad workspace name '-x'" in await _error(
        jp_fetch, 400, "workspaces", "-x", method="DELETE", confirm="-x"
    )
    assert "allowed: confirm, backend" in await _error(
        jp_fetch, 400, "workspaces", "rw1", method="DELETE", force="1"
    )
    # (every built-in backend keeps workspaces now that slurm does: issue 22 section 3)
    assert "no workspace ghost" in await _error(
        jp_fetch, 404, "workspaces", "ghost", method="DELETE", confirm="ghost"
    )

    await _call(jp_fetch, "sessions", again["id"], method="DELETE")
    # with the bare timestamp JupyterLab's ServerConnection adds against caches
    gone = await _call(
        jp_fetch, "workspaces", "rw1", method="DELETE", confirm="rw1", **{"1796094695341": ""}
    )
    assert gone["deleted"] == "rw1" and gone["backend"] == "local"
    assert _listed(await _call(jp_fetch, "workspaces"), "rw1") is None


async def test_workspaces_need_a_token(jp_base_url, http_server_client):
    for path, method in (("workspaces", "GET"), ("workspaces/rw1?confirm=rw1", "DELETE")):
        r = await http_server_client.fetch(
            f"{jp_base_url}gpusession/api/{path}".replace("//", "/"),
            method=method,
            raise_error=False,
        )
        assert r.code == 403 and set(json.loads(r.body)) == {"message"}, (path, r.code, r.body)
