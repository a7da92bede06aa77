"""`gpusession catalog refresh`: on-demand prices from the AWS Price List API (played by the
test's EC2 proxy, behind the aws backend's one endpoint seam: moto has no Price List API),
written as the user's dated snapshot; and every face saying the catalog's date."""

from __future__ import annotations

import datetime
import json
import os

import pytest
from test_cli import cli

from gpusession.backends.aws.instances import instance_table, packaged_table
from gpusession.configuration.catalog import packaged_catalog
from gpusession.faces.magics import GpuMagics
from gpusession.session import SessionManager
from gpusession.widgets.panel import StartForm

pytest_plugins = ["support.ec2_fixtures"]  # fixtures: moto_server, ec2_api, aws_env, look
# integration: starts kernels, the agent or servers (tests/conftest.py: the fast tier starts none)
pytestmark = pytest.mark.integration

PACKAGED = "2025-11-01"


def test_refresh_without_credentials_says_so_in_one_line_and_writes_nothing(aws_env, gs_home):
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_ACCESS_KEY")}
    env = {k: v for k, v in env.items() if not k.startswith("AWS_SECRET")}
    aws_env.price_list = {"g4dn.xlarge": 0.5}
    r = cli(env, "catalog", "refresh")
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith(
        f"gpusession catalog: the catalog was not refreshed (its prices stay those of {PACKAGED})"
        ": no AWS credentials found: run `aws configure`"
    ), r.stderr
    assert not (gs_home / "catalog.json").exists() and "GetProducts" not in aws_env.actions()


async def test_refresh_writes_the_users_dated_snapshot_that_every_face_dates(
    aws_env, gs_home, jp_fetch, capsys
):
    base = packaged_table()  # the aws backend's own table: its instance types and prices
    wanted = base.names()
    prices = {name: round(base_price * 0.9, 4) for name, base_price in _on_demand(base).items()}
    prices["g4dn.xlarge"] = 0.5  # t4's one-GPU instance
    del prices[wanted[-1]]  # one the price list does not know: it keeps the package's price
    aws_env.price_list = prices
    r = cli(dict(os.environ), "catalog", "refresh")
    today = datetime.datetime.now(datetime.timezone.utc).date().isoformat()
    assert r.returncode == 0, r.stderr
    path = gs_home / "catalog.json"
    assert r.stdout == (
        f"catalog refreshed: on-demand prices of {len(wanted) - 1} of {len(wanted)} instance "
        f"types ({len(wanted) - 1} changed), dated {today} (was {PACKAGED}), in {path}; 1 "
        f"unpriced kept the package's price ({wanted[-1]})\n"
    )
    asked = [p for a, p in aws_env.calls if a == "GetProducts"]
    assert [p["instanceType"] for p in asked] == wanted
    assert {(p["regionCode"], p["operatingSystem"], p["tenancy"]) for p in asked} == {
        ("us-east-1", "Linux", "Shared")
    }
    snapshot = json.loads(path.read_text())
    # the aws backend's prices under its name, the catalog's reference rates they give
    assert snapshot["snapshot_date"] == today and snapshot["backends"]["aws"]["on_demand"] == dict(
        sorted(prices.items())
    )
    assert snapshot["rates"]["t4"] == 0.5 and snapshot["rates"]["a100"] == round(
        prices["p4d.24xlarge"] / 8, 6
    )
    assert packaged_catalog().snapshot_date == PACKAGED  # the package's files are untouched
    assert packaged_table().instances(packaged_catalog().get("t4"))[0].on_demand == 0.526
    assert instance_table().price(packaged_catalog().get("t4"), 1) == 0.5  # aws's table reads it

    dated = f"on-demand prices from the catalog of {today}"
    # the CLI's table, with the new price
    types = cli(dict(os.environ), "types").stdout
    assert dated in types
    assert [line.split()[5] for line in types.splitlines() if line.startswith("t4 ")] == ["0.500"]
    # `types --live`, beside the spot prices
    live = cli(dict(os.environ), "types", "--live").stdout
    assert dated in live
    t4_rows = [line.split() for line in live.splitlines() if line.startswith("t4 ")]
    assert t4_rows and {row[4] for row in t4_rows} == {"0.5000"}
    # %gpu types
    manager = SessionManager()
    GpuMagics(None, manager=manager).gpu("types")
    assert dated in capsys.readouterr().out
    # the %gpu panel's start form
    assert dated in StartForm(manager, lambda values: None).prices_note.value
    # REST GET catalog (the JupyterLab form shows its prices_line)
    reply = json.loads((await jp_fetch("gpusession", "api", "catalog")).body)
    assert reply["snapshot_date"] == today and reply["prices_line"] == dated
    t4 = next(t for t in reply["types"] if t["name"] == "t4")
    assert t4["on_demand_per_hour"] == 0.5
    manager.close()


def _on_demand(table) -> dict[str, float]:
    return {i.name: i.on_demand for rows in table.by_type.values() for i in rows}
