"""An administrator's policy file (gpusession/configuration/settings.py `load_policy`) against a user's config,
through the real faces: the Python face (make_spec), `gpusession start` as a subprocess, and REST
(`POST sessions`, the form's `POST options/check`) through a real Jupyter server."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
import tornado.httpclient
from test_cli import cli
from test_spend import fill, report

from gpusession.configuration.config import ConfigError, GpuSessionConfig
from gpusession.configuration.cost import month_start
from gpusession.core.errors import BadInput
from gpusession.core.models import State
from gpusession.session import SessionManager
from gpusession.session.store import Store

POLICY = {
    "max_idle": "15m",
    "max_runtime": "2h",
    "max_cost": 5,
    "allowed_types": ["t4", "l4"],
    "allowed_backends": ["local", "docker"],
    "allowed_regions": ["us-east-1"],
}


@pytest.fixture
def policy(tmp_path, monkeypatch):
    path = tmp_path / "etc" / "gpusession_policy.json"
    path.parent.mkdir()

    def write(**changes):
        path.write_text(json.dumps(dict(POLICY, **changes)))
        return str(path)

    write()
    monkeypatch.setenv("GPUSESSION_POLICY", str(path))
    return write


def test_policy_bounds_what_the_config_leaves_open_and_refuses_the_rest(policy, gs_home):
    m = SessionManager(GpuSessionConfig(default_idle="1h"))  # the user's config: looser
    spec = m.make_spec("t4", backend="local")
    assert (spec.idle, spec.max_runtime, spec.max_cost) == (900.0, 7200.0, 5.0)
    path = policy()
    assert [b["field"] for b in spec.extra["policy_bounds"]] == ["idle", "max_runtime", "max_cost"]
    assert m.make_spec("t4", backend="local", idle="10m").idle == 600.0  # within: kept
    refusals = {
        "idle": ({"idle": "2h"}, f"'idle': your policy ({path}) allows at most 15m"),
        "off": ({"idle": "off"}, f"'idle': your policy ({path}) allows at most 15m (off is not"),
        "cost": ({"max_cost": "$50"}, f"'max_cost': your policy ({path}) allows at most $5.00"),
        "type": ({"type": "a100"}, f"'type': your policy ({path}) allows only t4, l4, not 'a100'"),
        "backend": ({"backend": "slurm"}, "'backend': your policy"),
        "region": ({"region": "eu-west-1"}, "allows only us-east-1, not 'eu-west-1'"),
    }
    for values, message in refusals.values():
        with pytest.raises(BadInput) as e:
            m.spec_from(dict({"type": "t4", "backend": "local"}, **values))
        assert message in str(e.value) and "\n" not in str(e.value)
    policy(max_idle="soon")
    with pytest.raises(
        ConfigError, match=r"the gpusession policy .* cannot be used \(max_idle: bad idle"
    ):
        m.make_spec("t4", backend="local")


@pytest.mark.integration
def test_cli_start_says_each_bound_and_refuses_beyond_them(policy, nb_env, gs_home):
    store, at = Store(gs_home / "sessions.sqlite3"), time.time()
    fill(store, at)  # this month's spend, 85% of the user's budget: the start warns too
    spent = report(store, at, since=at - month_start(at))["total"]["cost"]
    path = policy()
    env = dict(
        nb_env,
        GPUSESSION_POLICY=path,
        GPUSESSION_IDLE="2h",
        GPUSESSION_MONTHLY_BUDGET=f"{spent / 0.85:.2f}",
    )
    refused = cli(env, "start", "--backend", "local", "--idle", "2h", "--name", "p0")
    assert refused.returncode == 1 and refused.stderr.count("\n") == 1, refused.stderr
    assert f"--idle: your policy ({path}) allows at most 15m" in refused.stderr
    started = cli(env, "start", "--backend", "local", "--name", "p1")
    try:
        assert started.returncode == 0, started.stderr
        assert f"idle stop 15m: the most your policy allows ({path})" in started.stdout
        assert f"max cost $5.00: the most your policy allows ({path})" in started.stdout
        assert "p1 is running (idle stop after 15m00s" in started.stdout
        assert "WARNING: this month: $" in started.stdout and "monthly budget (8" in started.stdout
        assert Store(gs_home / "sessions.sqlite3").get("p1").spec.idle == 900.0
    finally:
        cli(env, "stop", "p1")
    # the policy's monthly cap binds though the user's own budget is larger
    path = policy(monthly_cap=1)
    capped = dict(env, GPUSESSION_POLICY=path, GPUSESSION_MONTHLY_BUDGET="100000")
    over = cli(capped, "start", "--backend", "local", "--name", "p2")
    assert over.returncode == 1 and over.stderr.count("\n") == 1, over.stderr
    assert f"has reached the monthly cap of $1.00 set by your policy ({path})" in over.stderr
    assert "of the $1.00 monthly budget" in cli(capped, "report").stdout


async def post(jp_fetch, path, body):
    r = await jp_fetch("gpusession", "api", *path, method="POST", body=json.dumps(body))
    return r.code, json.loads(r.body)


async def test_rest_and_form_meet_the_same_policy(policy, jp_fetch, gs_home):
    path = policy()
    code, check = await post(jp_fetch, ["options", "check"], {"type": "a100", "idle": "2h"})
    assert code == 200
    assert check["errors"] == {
        "idle": f"your policy ({path}) allows at most 15m",
        "type": f"your policy ({path}) allows only t4, l4, not 'a100'",
    }
    with pytest.raises(tornado.httpclient.HTTPClientError) as e:
        await post(jp_fetch, ["sessions"], {"type": "t4", "backend": "local", "idle": "2h"})
    assert e.value.code == 400
    assert json.loads(e.value.response.body)["message"] == (
        f"'idle': your policy ({path}) allows at most 15m"
    )
    code, view = await post(jp_fetch, ["sessions"], {"type": "t4", "backend": "local"})
    assert code == 202
    assert view["policy"][0] == f"idle stop 15m: the most your policy allows ({path})"
    store = Store(gs_home / "sessions.sqlite3")
    for _ in range(300):  # let its start finish, then stop it
        if store.get(view["id"]).state in (State.RUNNING, State.FAILED):
            break
        await asyncio.sleep(0.1)
    r = await jp_fetch("gpusession", "api", "sessions", view["id"], method="DELETE")
    assert r.code == 200
