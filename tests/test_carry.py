"""Variables moved from a notebook's own kernel into the GPU session its kernel becomes ("Run
this notebook on a GPU…", issue 32 §1): the notebook's kernel saves them with the code POST carry
answers, POST sessions/NAME/carry restores them in the session's kernel. The browser's whole
path: tests/test_browser_notebook.py."""

from __future__ import annotations

import json
import stat

import numpy as np
import pytest
from IPython.core.interactiveshell import InteractiveShell

from gpusession.session.carry import CARRY_MARK, carry_into, marked, stage, staged_folder


async def test_staging_over_rest_is_private_and_refuses_what_is_not_ours(gs_home, jp_fetch):
    r = await jp_fetch("gpusession", "api", "carry", method="POST", body="{}")
    doc = json.loads(r.body)
    folder = gs_home / "carry" / doc["folder"].rsplit("/", 1)[-1]
    assert doc["folder"] == str(folder) and folder.is_dir()
    assert stat.S_IMODE((gs_home / "carry").stat().st_mode) == 0o700  # the owner's alone
    assert f"_gpusession_carry({str(folder)!r})" in doc["code"]

    async def refused(path: tuple[str, ...], body: dict, status: int) -> str:
        r = await jp_fetch(
            "gpusession", "api", *path, method="POST", body=json.dumps(body), raise_error=False
        )
        message = json.loads(r.body)["message"]
        assert r.code == status and "\n" not in message, (r.code, message)
        return message

    assert "takes no fields" in await refused(("carry",), {"x": 1}, 400)
    said = await refused(("sessions", "nope", "carry"), {"folder": "/etc"}, 400)
    assert said == "'/etc' is not a staging folder of this server (POST carry makes one)"
    assert "allowed: folder" in await refused(("sessions", "nope", "carry"), {"path": "x"}, 400)
    assert "nope" in await refused(("sessions", "nope", "carry"), {"folder": str(folder)}, 404)


@pytest.mark.integration
def test_a_kernels_variables_move_into_a_session(gs_home, manager):
    """The save code run by a real IPython (as the notebook's kernel runs it), then restored in a
    real local session: values, arrays and imports come back; what cannot move is named."""
    staged = stage(manager.config.data_path)
    shell = InteractiveShell.instance()
    try:
        shell.run_cell(
            "import numpy as np\nanswer = 42\ntable = np.arange(12.0).reshape(3, 4)\n"
            "gen = (i for i in range(3))"
        )
        printed = shell.run_cell(staged["code"])
        assert printed.success
        assert "_gpusession_carry" not in shell.user_ns  # nothing of ours left in it
    finally:
        InteractiveShell.clear_instance()
    folder = staged_folder(manager.config.data_path, staged["folder"])
    session = manager.start(manager.make_spec("t4", backend="local", idle="off", name="carried"))
    moved = carry_into(session, folder)
    assert moved["restored"] == ["answer", "table"] and moved["imports"] == ["np"], moved
    assert [(s["name"], s["why"]) for s in moved["skipped"]] == [("gen", "generator")]
    assert not folder.exists()  # the staging folder is gone once moved
    out = session.run("print(answer, table.sum(), np.__name__)")
    assert out["status"] == "ok"
    answer = session.pull(["answer", "table"])
    assert answer["answer"] == 42 and np.array_equal(answer["table"], np.arange(12.0).reshape(3, 4))
    assert session.run("import os; assert not os.path.exists('.gpusession-carry/' + "
                       f"{folder.name!r})")["status"] == "ok"  # fmt: skip


def test_the_marked_line_is_the_answer():
    assert marked(f"noise\n{CARRY_MARK} " + '{"saved": 1}\n') == {"saved": 1}
    assert marked("nothing marked") is None
