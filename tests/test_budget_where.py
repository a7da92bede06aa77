"""A start refused by the monthly budget says where that budget lives and how to change it there
(issue 32 §5): the sidebar's refusal suggested `%config GpuSessionConfig.monthly_budget = 500`,
which cannot change the Jupyter server's budget. The server's budget (its environment, or its
own config), a notebook's (`%config`), the CLI's (its environment) and a policy's cap each say
their own place."""

from __future__ import annotations

import json
import time

import pytest
from IPython.core.interactiveshell import InteractiveShell
from test_spend import _session
from tornado.httpclient import HTTPClientError

from gpusession.configuration.config import EnvConfig, GpuSessionConfig
from gpusession.session.spend import budget_where
from gpusession.session.store import Store

NOT_FOR_THE_SERVER = "%config GpuSessionConfig.monthly_budget = 500"


def test_each_process_says_where_its_budget_is_set(monkeypatch):
    monkeypatch.setenv("GPUSESSION_MONTHLY_BUDGET", "5")
    shell = InteractiveShell.instance()
    try:
        notebook = GpuSessionConfig(parent=shell)
        where, change = budget_where(notebook)
        assert where == "GPUSESSION_MONTHLY_BUDGET in this kernel's environment"
        assert NOT_FOR_THE_SERVER in change
        shell.run_line_magic("config", "GpuSessionConfig.monthly_budget = 7")  # lands in .config
        notebook.update_config(shell.config)
        assert budget_where(notebook)[0] == "this notebook's GpuSessionConfig.monthly_budget"
    finally:
        InteractiveShell.clear_instance()
    where, change = budget_where(EnvConfig())
    assert (where, change) == (
        "GPUSESSION_MONTHLY_BUDGET in your environment",
        "set GPUSESSION_MONTHLY_BUDGET=500 for the CLI",
    )


@pytest.fixture
def over_budget(gs_home, monkeypatch):
    """This month's spend ($1.20) past the Jupyter server's budget ($1.00, its environment)."""
    monkeypatch.setenv("GPUSESSION_MONTHLY_BUDGET", "1")
    store = Store(gs_home / "sessions.sqlite3")
    _session(store, "spent", "t4", time.time(), price=72.0, billed=(70.0, 10.0))  # 1 min, $1.20
    return store


@pytest.mark.integration
async def test_the_sidebars_refusal_names_the_servers_budget(over_budget, jp_fetch):
    with pytest.raises(HTTPClientError) as refused:
        await jp_fetch(
            "gpusession", "api", "sessions", method="POST",
            body=json.dumps({"type": "t4", "backend": "local", "name": "over"}),
        )  # fmt: skip
    assert refused.value.code == 400
    message = json.loads(refused.value.response.body)["message"]
    assert message.startswith("this month's spend $1.20 has reached the monthly budget of $1.00 ")
    assert "set by GPUSESSION_MONTHLY_BUDGET in the Jupyter server's environment: " in message
    assert "restart JupyterLab (a notebook's %config does not change it)" in message, message
    assert NOT_FOR_THE_SERVER not in message
    assert "over" not in {r.name for r in over_budget.list()}  # nothing recorded
