"""The quickstart notebook, executed headless with nbclient exactly as a user would run it."""

import re
from pathlib import Path

import pytest

from gpusession.faces.demo import execute_notebook, output_text

# integration: starts kernels, the agent or servers (tests/conftest.py: the fast tier starts none)
pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent


def test_quickstart_notebook_runs_end_to_end(nb_env, tmp_path):
    nb = execute_notebook(
        ROOT / "notebooks" / "quickstart.ipynb", env=nb_env, timeout=180, cwd=str(tmp_path)
    )
    texts = {
        c.source.splitlines()[0] if c.source else "": output_text(c)
        for c in nb.cells
        if c.cell_type == "code"
    }
    joined = "\n".join(output_text(c) for c in nb.cells if c.cell_type == "code")
    remote_pid = int(re.search(r"session kernel: pid (\d+)", joined).group(1))
    local_pid = int(re.search(r"this notebook:  pid (\d+)", joined).group(1))
    assert remote_pid != local_pid
    assert "step 0\nstep 1\nstep 2" in joined
    assert "[html] <b>rendered in the session kernel</b>" in joined
    assert "computed remotely: 385" in joined and "back here: 385" in joined
    assert f"this cell ran in the session, pid {remote_pid}" in joined
    assert "t4-1: 1 x t4 on local - running" in joined
    assert re.search(r"stopped t4-1: ran \d+s, cost \$0\.\d+", joined)
    assert "a100-80gb" in texts["%gpu types"]
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert errors == []
