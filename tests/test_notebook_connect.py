"""A session belongs to a notebook (issue 32 §1): the sidebar connects the open notebook to a
session with `PUT kernels/KERNEL_ID/session`, recorded as a use of the session by the kernel's
process; the notebook's next `%%gpu` cell runs there with no magic typed, and the session's view
lists the kernel (its card, the notebook's toolbar and the status bar read that). A real Jupyter
server (jp_fetch) with a real kernel it started, real local sessions, a real notebook kernel."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
import tornado.httpclient

from gpusession.session.store import owner_id


async def _put(jp_fetch, kernel_id: str, body) -> tuple[int, dict]:
    try:
        r = await jp_fetch(
            "gpusession",
            "api",
            "kernels",
            kernel_id,
            "session",
            method="PUT",
            body=json.dumps(body) if not isinstance(body, str) else body,
        )
    except tornado.httpclient.HTTPClientError as exc:
        return exc.code, json.loads(exc.response.body)
    return r.code, json.loads(r.body)


@pytest.mark.integration
async def test_the_sidebar_connects_a_notebooks_kernel_to_a_session(jp_fetch, manager):
    session = manager.start(manager.make_spec("t4", backend="local", idle="off", name="linked"))
    r = await jp_fetch("api", "kernels", method="POST", body=json.dumps({"name": "python3"}))
    kernel_id = json.loads(r.body)["id"]
    try:
        before = time.time()
        code, view = await _put(jp_fetch, kernel_id, {"session": "linked"})
        assert code == 200 and view["name"] == "linked", view
        assert view["kernels"][kernel_id] >= before, view["kernels"]
        # what the kernel's own process finds in the store: this session, taken just now
        (owner,) = [o for o in manager.get(session.id).resource["users"]]
        taken = manager.store.taken_by(owner)
        assert taken is not None and taken[0].name == "linked"

        code, body = await _put(jp_fetch, "no-such-kernel", {"session": "linked"})
        assert code == 404 and "no kernel 'no-such-kernel' runs on this server" in body["message"]
        code, body = await _put(jp_fetch, kernel_id, {"session": "ghost"})
        assert code == 404 and "active now: linked (running)" in body["message"], body
        code, body = await _put(jp_fetch, kernel_id, {"name": "linked"})
        assert code == 400 and "allowed: session" in body["message"]
        manager.stop(session.id)
        code, body = await _put(jp_fetch, kernel_id, {"session": "linked"})
        assert code == 400 and "session linked is stopped" in body["message"], body
    finally:
        await jp_fetch("api", "kernels", kernel_id, method="DELETE")
        await asyncio.sleep(0)


@pytest.mark.integration
def test_a_notebook_connected_elsewhere_runs_its_next_cell_there(notebook, manager):
    """The kernel follows the newest connection: the next %%gpu runs in the connected session,
    with one line, though the notebook had started another; a session still starting is
    waited for."""
    assert notebook.run("%gpu start --idle off --name its-own").status == "ok"
    linked = manager.start(manager.make_spec("t4", backend="local", idle="off", name="linked2"))
    assert linked.run("where = 'linked2'")["status"] == "ok"
    pid = int(notebook.run("import os; print(os.getpid())").text.split()[-1])
    manager.store.note_user(linked.id, owner_id(pid), time.time())  # what the PUT records
    r = notebook.run("%%gpu\nprint('ran in', where)")
    assert r.status == "ok", r.text
    lines = r.text.strip().splitlines()
    assert lines[-1] == "ran in linked2", lines
    assert "this notebook now uses linked2 (1 x t4 on local): connected from the sidebar" in r.text
    again = notebook.run("%%gpu\nprint(where)")
    assert again.text.strip() == "linked2", "one line, once"
    assert "linked2" in notebook.run("%gpu status").text
    manager.stop(linked.id)
    notebook.run("%gpu stop its-own")


async def test_a_start_body_installs_the_gpu_kernelspec_a_notebook_changes_to(
    jp_fetch, manager, tmp_path, monkeypatch
):
    """POST kernelspecs ("Run this notebook on a GPU…"): the start form's body becomes a GPU
    kernelspec for this server's user (here a data folder of the test's own)."""
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path))
    body = {"type": "t4", "backend": "local", "idle": "off"}
    r = await jp_fetch("gpusession", "api", "kernelspecs", method="POST", body=json.dumps(body))
    reply = json.loads(r.body)
    assert r.code == 200 and reply["name"] == "gpusession-t4-local", reply
    assert reply["display_name"].startswith("Python 3 (GPU · T4"), reply
    spec = json.loads((tmp_path / "kernels" / reply["name"] / "kernel.json").read_text())
    assert spec["metadata"]["kernel_provisioner"]["config"] == body
    for bad, needle in (
        ({"type": "t4", "name": "x"}, "a kernelspec cannot set name"),
        ({"type": "t5"}, "unknown GPU type 't5'"),
        ({"colour": "red"}, "unknown field(s) colour"),
    ):
        try:
            await jp_fetch("gpusession", "api", "kernelspecs", method="POST", body=json.dumps(bad))
        except tornado.httpclient.HTTPClientError as exc:
            assert exc.code == 400 and needle in json.loads(exc.response.body)["message"]
        else:
            raise AssertionError(f"{bad} was accepted")
    assert manager.list() == [], "nothing started"
