"""The spend report and the monthly budget (gpusession/configuration/cost.py): a real session store filled with
sessions of every state and backend, read by the report's rules, then by the faces through their
real paths (`gpusession report` and `gpusession start` as subprocesses, REST `GET report` through
a real Jupyter server)."""

from __future__ import annotations

import json
import os
import time

import pytest
import tornado.httpclient
from test_advice import replayed_usage
from test_cli import cli

from gpusession.configuration.catalog import load_catalog
from gpusession.configuration.cost import BILLED_FROM, cost_of, month_start, spend_report
from gpusession.core.models import LaunchSpec, State
from gpusession.core.protocol import StopKind, StopReason
from gpusession.session.store import Store

H, D = 3600.0, 86400.0


def _session(store, name, gpu, at, *, backend="local", price, billed, end=State.STOPPED, **kw):
    """A recorded session billed over `billed` (start, end) seconds before `at`; end=None: still
    running. kw: resource values, spot, workspace."""
    spec = LaunchSpec(
        gpu_type=gpu, backend=backend, name=name, extra={"spot": kw.pop("spot", False)}
    )
    record = store.create(spec, price_per_hour=price)
    if kw:
        store.update_resource(record.id, **kw)
    if billed is None:
        return record
    start, stop = billed
    store.transition(record.id, State.PROVISIONING, at=at - start)
    store.transition(record.id, State.RUNNING, at=at - start + 5)
    if end == State.FAILED:  # it ran, then failed (one that failed provisioning never ran: $0)
        return store.transition(record.id, State.FAILED, "failed", error="boom", at=at - stop)
    if stop is None:
        return store.get(record.id)
    store.transition(record.id, State.STOPPING, at=at - stop)
    return store.transition(record.id, State.STOPPED, "stopped", at=at - stop + 1)


def idle_a100_summary() -> dict:
    """The agent's summary of two hours on an A100, one of them idle (recorded samples)."""
    return {
        "duration_s": 2 * H,
        "mean_gpu_utilization": 2.9,
        "idle_minutes": 60.0,
        "usage": replayed_usage("usage_idle_a100.json"),
    }


SPOT_STOP = StopReason(StopKind.SPOT_INTERRUPTION).to_dict()


def fill(store: Store, at: float) -> dict:
    """Sessions of every state and backend, all within the last 30 days but one."""
    idle_a100, spot = idle_a100_summary(), SPOT_STOP
    return {
        "done": _session(store, "t4-done", "t4", at, price=0.526, billed=(5 * H, 4 * H),
                         agent_summary={"mean_gpu_utilization": 40.0, "idle_minutes": 30.0}),
        "idle": _session(store, "a100-idle", "a100", at - 2 * D, backend="docker", price=2.745,
                         billed=(2 * H, 0.0), agent_summary=idle_a100, workspace="ws1"),
        "running": _session(store, "a100-run", "a100", at, price=2.745, billed=(H / 2, None)),
        "failed": _session(store, "t4-failed", "t4", at, backend="docker", price=0.526,
                           billed=(3 * H, 3 * H - 120), end=State.FAILED, workspace="ws1"),
        "spot": _session(store, "t4-spot", "t4", at, backend="aws", price=0.1579,
                         billed=(10 * H, 9 * H), spot=True, market="spot", zone="us-east-1a",
                         stop_reason=spot),
        "never": _session(store, "never", "t4", at, price=0.526, billed=None),
        "old": _session(store, "t4-old", "t4", at - 40 * D, price=0.526, billed=(2 * H, H)),
        "straddle": _session(store, "t4-straddle", "t4", at, price=0.526,
                             billed=(31 * D, 29 * D)),
        "queued": _session(store, "slurm-queued", "t4", at, backend="slurm", price=1.0,
                           billed=(H, None), **{BILLED_FROM: None}),
        "slurm": _session(store, "slurm-ran", "t4", at, backend="slurm", price=1.0,
                          billed=(3 * H, H), **{BILLED_FROM: at - 2 * H}),
    }  # fmt: skip


def report(store, at, by="type", since=30 * D, split=None):
    catalog = load_catalog()
    from gpusession.configuration.advice import could_save

    return spend_report(
        store.list(),
        since=at - since,
        by=by,
        at=at,
        split=split,
        catalog_prices=lambda r: (catalog.price_per_hour(catalog.get(r.spec.gpu_type), 1),),
        could_save=lambda r: could_save(
            r.resource.get("agent_summary"), gpu_type=r.spec.gpu_type, gpu_count=1,
            catalog=catalog, spot=r.spec.extra.get("spot"),
        ),
    )  # fmt: skip


def test_report_agrees_with_the_store_for_every_state(tmp_path):
    store, at = Store(tmp_path / "s.sqlite3"), time.time()
    s = {k: store.get(r.id) for k, r in fill(store, at).items()}
    doc = report(store, at)
    rows = {r["key"]: r for r in doc["rows"]}
    inside = ("done", "idle", "running", "failed", "spot", "slurm")
    # the straddling session: only its day inside the period, at its price
    straddle = 0.526 * 24
    assert doc["total"]["cost"] == pytest.approx(
        sum(cost_of(s[k], at) for k in inside) + straddle, abs=0.005
    )
    assert doc["total"]["sessions"] == len(inside) + 1  # never billed, queued and old: left out
    assert rows["a100"]["cost"] == pytest.approx(
        cost_of(s["idle"], at) + cost_of(s["running"], at), abs=0.005
    )
    assert cost_of(s["running"], at) == pytest.approx(2.745 * (H / 2) / H, abs=0.005)  # to now
    assert cost_of(s["failed"], at) == pytest.approx(0.526 * 120 / H, abs=0.005)  # to failure
    assert cost_of(s["slurm"], at) == pytest.approx(1.0, abs=0.005)  # from the job's start
    assert doc["total"]["running"] == 1 and doc["total"]["failed"] == 1
    assert doc["prices"] == {"catalog": 5, "paid": 1, "configured": 1}
    # idle money: what the agent counted idle, at the session's price
    assert doc["total"]["idle_cost"] == pytest.approx(0.526 * 0.5 + 2.745 * 1.0, abs=0.005)
    # could have saved: the idle A100's advice (a T4) over its two hours
    assert rows["a100"]["could_save"] == pytest.approx((2.745 - 0.526) * 2, abs=0.005)
    assert rows["a100"]["mean_utilization"] == 2.9  # the running one has no summary yet
    by_backend = {r["key"]: r["cost"] for r in report(store, at, "backend")["rows"]}
    assert set(by_backend) == {"local", "docker", "aws", "slurm"}
    # rows and total are each rounded to the micro-dollar
    assert sum(by_backend.values()) == pytest.approx(doc["total"]["cost"], abs=1e-5)
    by_ws = {r["key"]: r["sessions"] for r in report(store, at, "workspace")["rows"]}
    assert by_ws == {"ws1": 2, "-": 5}
    days = [r["key"] for r in report(store, at, "day")["rows"]]
    assert days == sorted(days) and len(days) >= 2
    # the Spend view's bars: each day's parts by type add up to the day, and to each type's row
    split = report(store, at, "day", split="type")
    per_type: dict[str, float] = {}
    for day in split["rows"]:
        assert sum(p["cost"] for p in day["split"]) == pytest.approx(day["cost"], abs=1e-5)
        for part in day["split"]:
            per_type[part["key"]] = per_type.get(part["key"], 0.0) + part["cost"]
    assert per_type == pytest.approx({k: r["cost"] for k, r in rows.items()}, abs=1e-5)
    # each row counts its own price sources; together they are the report's
    assert rows["t4"]["prices"] == {"catalog": 3, "paid": 1, "configured": 1}
    assert rows["a100"]["prices"] == {"catalog": 2}
    assert report(store, at, since=60 * D)["total"]["sessions"] == len(inside) + 2  # old too


@pytest.mark.integration
def test_report_and_budget_on_the_cli(nb_env, gs_home):
    store, at = Store(gs_home / "sessions.sqlite3"), time.time()
    fill(store, at)
    r = cli(nb_env, "report", "--by", "backend")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("spend ") and lines[0].endswith("UTC, by backend")
    assert lines[1].split() == [
        "BACKEND", "SESSIONS", "GPU-HOURS", "COST", "MEAN", "UTIL", "IDLE", "COST", "COULD", "SAVE"
    ]  # fmt: skip
    assert any(line.split()[0] == "aws" for line in lines[2:])
    assert "prices: 5 at the catalog's rate (snapshot 2025-11-01)" in r.stdout
    assert "1 at the price paid (learnt at launch: the zone's spot price)" in r.stdout
    assert "1 configured" not in r.stdout and "1 at the configured price" in r.stdout
    # the "running" local session has no process: the report's check found it ended and the
    # store recorded it failed, billed until then (a running one is counted up to now: above)
    assert "0 still running (counted up to now), 2 failed (billed until they failed)" in r.stdout
    assert store.get("a100-run").state == State.FAILED
    bad = cli(nb_env, "report", "--since", "soon")
    assert bad.returncode == 1 and bad.stderr.count("\n") == 1 and "report period" in bad.stderr
    assert "or month: this calendar month" in bad.stderr
    # --since month: the calendar month so far, the budget's period (the Spend view opens on it)
    month = cli(nb_env, "report", "--since", "month")
    assert month.returncode == 0, month.stderr
    first = time.strftime("%Y-%m-%d 00:00", time.gmtime(month_start(time.time())))
    assert month.stdout.startswith(f"spend {first} .. "), month.stdout

    # the month's spend against a budget (a start's warning at 80%: tests/test_policy.py);
    # at 100% a start is refused, with the figure and how to raise it
    spent = report(store, at, since=at - month_start(at))["total"]["cost"]
    warn = dict(nb_env, GPUSESSION_MONTHLY_BUDGET=f"{spent / 0.85:.2f}")
    assert "monthly budget (8" in cli(warn, "report").stdout
    over = dict(nb_env, GPUSESSION_MONTHLY_BUDGET=f"{spent / 1.5:.2f}")
    refused = cli(over, "start", "--backend", "local", "--idle", "off", "--name", "b2")
    assert refused.returncode == 1 and refused.stderr.count("\n") == 1, refused.stderr
    assert f"has reached the monthly budget of ${spent / 1.5:,.2f}" in refused.stderr
    assert "GPUSESSION_MONTHLY_BUDGET=500" in refused.stderr
    assert "b2" not in {r.name for r in store.list()}  # nothing recorded, nothing started


async def fetch_json(jp_fetch, *path, **params):
    r = await jp_fetch("gpusession", "api", *path, params=params)
    return r.code, json.loads(r.body)


@pytest.mark.integration
async def test_rest_report_agrees_with_the_cli_to_the_cent(jp_fetch, gs_home):
    store, at = Store(gs_home / "sessions.sqlite3"), time.time()
    fill(store, at)
    for key in ("a100-run", "slurm-queued"):  # ended, so the figures stand still between faces
        store.transition(store.get(key).id, State.STOPPED, "stopped", at=at)
    code, doc = await fetch_json(jp_fetch, "report", since="30d", by="type")
    assert code == 200 and doc["by"] == "type"
    env = dict(os.environ, GPUSESSION_HOME=str(gs_home), GPUSESSION_BACKEND="local")
    printed = cli(env, "report").stdout
    total = next(line for line in printed.splitlines() if line.split()[:1] == ["total"])
    assert total.split()[3] == f"${doc['total']['cost']:,.2f}"
    rest_total = next(line for line in doc["lines"] if line.split()[:1] == ["total"])
    assert rest_total == total  # the same words, from the same formatter
    with pytest.raises(tornado.httpclient.HTTPClientError) as e:
        await fetch_json(jp_fetch, "report", by="colour")
    assert e.value.code == 400
    assert "cannot break a report down by 'colour'" in json.loads(e.value.response.body)["message"]
