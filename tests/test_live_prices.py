"""`types --live`: the current spot price per zone, from a local EC2 API (moto's server, which
serves DescribeSpotPriceHistory), beside the catalog's on-demand price."""

from __future__ import annotations

import os

import pytest

from test_cli import cli

pytest_plugins = ["support.ec2_fixtures"]  # fixtures: moto_server, ec2_api, aws_env, look


def latest_prices(look, instance_type: str) -> dict[str, float]:
    history = look.describe_spot_price_history(
        InstanceTypes=[instance_type], ProductDescriptions=["Linux/UNIX"]
    )["SpotPriceHistory"]
    latest: dict[str, tuple] = {}
    for item in history:
        zone = item["AvailabilityZone"]
        if zone not in latest or item["Timestamp"] > latest[zone][0]:
            latest[zone] = (item["Timestamp"], float(item["SpotPrice"]))
    return {zone: price for zone, (_, price) in latest.items()}


def test_types_live_lists_each_zones_spot_price_cheapest_first(aws_env, look, gs_home):
    expected = latest_prices(look, "g4dn.xlarge")
    assert expected, "the local EC2 API serves a spot price history"
    r = cli(dict(os.environ), "types", "--live")
    assert r.returncode == 0, r.stderr
    t4 = [line.split() for line in r.stdout.splitlines() if line.startswith("t4 ")]
    assert [row[2] for row in t4] == sorted(expected, key=lambda z: (expected[z], z))
    for row in t4:
        assert row[1] == "g4dn.xlarge" and float(row[3]) == pytest.approx(expected[row[2]])
        assert row[4] == "0.5260" and row[5] == f"{100 * (1 - expected[row[2]] / 0.526):.0f}%"
    assert "on-demand: the catalog, snapshot 2025-11-01" in r.stdout
    aws_calls = [a for a, _ in aws_env.calls if a == "DescribeSpotPriceHistory"]
    assert len(aws_calls) == len({line.split()[1] for line in r.stdout.splitlines()[1:-1]})
