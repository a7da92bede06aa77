"""`types --live`: the current spot price per zone, from a local EC2 API (moto's server, which
serves DescribeSpotPriceHistory), beside the catalog's on-demand price."""

from __future__ import annotations

import json
import os

import pytest
from test_aws_provision import NOTHING, instance_of, provision
from test_aws_provision import spec_for as aws_spec
from test_cli import cli

from gpusession.configuration.settings import ConfigError
from support.ec2 import Fault, inspector, leftovers

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


@pytest.mark.integration
def test_types_live_lists_each_zones_spot_price_cheapest_first(aws_env, look, gs_home, moto_server):
    zones = sorted(latest_prices(look, "g4dn.xlarge"))
    moto_server.set_spot_prices({z: 0.3 - 0.01 * (i % 3) for i, z in enumerate(zones)})
    expected = latest_prices(look, "g4dn.xlarge")
    assert len(set(expected.values())) == 3 and sorted(expected) != sorted(
        expected, key=expected.get
    )
    assert expected, "the local EC2 API serves a spot price history"
    r = cli(dict(os.environ), "types", "--live")
    assert r.returncode == 0, r.stderr
    t4 = [line.split() for line in r.stdout.splitlines() if line.startswith("t4 ")]
    assert [row[2] for row in t4] == sorted(expected, key=lambda z: (expected[z], z))
    for row in t4:
        assert row[1] == "g4dn.xlarge" and float(row[3]) == pytest.approx(expected[row[2]])
        assert row[4] == "0.5260" and row[5] == f"{100 * (1 - expected[row[2]] / 0.526):.0f}%"
    assert "on-demand prices from the catalog of 2025-11-01" in r.stdout
    aws_calls = [a for a, _ in aws_env.calls if a == "DescribeSpotPriceHistory"]
    assert len(aws_calls) == len({line.split()[1] for line in r.stdout.splitlines()[1:-1]})


def spec_for(manager, gpu, **options):
    """An aws spec with a machine image given: no SSM look-up (moto's is slow), none needed here"""
    return aws_spec(manager, gpu, ami="ami-0123456789abcdef0", **options)


def default_subnets(look) -> dict[str, str]:
    """zone -> its default subnet's id"""
    found = look.describe_subnets(Filters=[{"Name": "default-for-az", "Values": ["true"]}])
    return {s["AvailabilityZone"]: s["SubnetId"] for s in found["Subnets"]}


def no_capacity_in(aws_env, subnet: str) -> None:
    aws_env.faults.append(
        Fault(
            "RunInstances",
            "InsufficientInstanceCapacity",
            "We currently do not have sufficient g4dn.xlarge capacity in the zone you requested",
            when={"NetworkInterface.1.SubnetId": subnet},
        )
    )


def test_cheapest_starts_in_the_cheapest_zone_with_capacity(manager, aws_env, look, moto_server):
    subnets = default_subnets(look)
    zones = sorted(latest_prices(look, "g4dn.xlarge"))  # those of moto's us-east-1 offering it
    prices = dict(zip(zones, (0.2210, 0.1930, 0.2490, 0.1578, 0.1702)))
    moto_server.set_spot_prices(prices)
    ranked = sorted(zones, key=prices.get)
    no_capacity_in(aws_env, subnets[ranked[0]])  # the cheapest zone has none
    spec = spec_for(manager, "t4", cheapest=True)  # no --spot: --cheapest is a spot start
    record, lines = provision(manager, spec)
    assert record.spec.extra.get("spot") and record.resource["market"] == "spot"
    assert (
        record.resource["zone"]
        == ranked[1]
        == instance_of(look, record)["Placement"]["AvailabilityZone"]
    )
    assert record.price_per_hour == pytest.approx(0.1702)
    said = (
        f"{ranked[1]} at $0.1702/h, the cheapest of {len(zones)} zones in us-east-1 with "
        f"capacity ({ranked[0]}: none)"
    )
    assert any(line.endswith(f"] {said}") for line in lines) and any(
        said == e.detail for e in record.events
    ), lines
    tried = [p["NetworkInterface.1.SubnetId"] for a, p in aws_env.calls if a == "RunInstances"]
    assert tried == [subnets[ranked[0]], subnets[ranked[1]]]  # in price order, no more
    manager.backend("aws").stop(record)
    assert leftovers(look) == NOTHING


def test_cheapest_moves_to_the_next_region_and_leaves_nothing_behind(
    manager, aws_env, look, moto_server, tmp_path, monkeypatch
):
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps({"allowed_regions": ["us-east-1", "us-west-2"]}))
    monkeypatch.setenv("GPUSESSION_POLICY", str(policy))
    west = inspector(moto_server.url, "us-west-2")
    west_zones = sorted(latest_prices(west, "g4dn.xlarge"))
    east_zones = sorted(latest_prices(look, "g4dn.xlarge"))
    prices = {z: 0.12 + 0.001 * i for i, z in enumerate(west_zones)}
    prices.update({z: 0.30 + 0.01 * i for i, z in enumerate(east_zones)})
    moto_server.set_spot_prices(prices)
    for subnet in default_subnets(west).values():  # the cheaper region has no capacity at all
        no_capacity_in(aws_env, subnet)
    zones = len(west_zones) + len(east_zones)
    assert manager.backend("aws").price_per_hour(
        spec_for(manager, "t4", cheapest=True), manager.catalog
    ) == pytest.approx(0.12)  # the estimate: the cheapest of both regions
    record, lines = provision(manager, spec_for(manager, "t4", cheapest=True))
    first_east = east_zones[0]
    assert (record.resource["region"], record.resource["zone"]) == ("us-east-1", first_east)
    assert any(line.endswith("] no capacity in us-west-2: trying us-east-1 next") for line in lines)
    assert any(
        line.split("] ", 1)[-1].startswith(
            f"{first_east} at $0.3000/h, the cheapest of {zones} zones in "
            "us-east-1, us-west-2 with capacity ("
        )
        for line in lines
    ), lines
    assert leftovers(west) == NOTHING  # its key pair and security group went with the move
    assert not west.describe_volumes()["Volumes"]  # and the empty workspace volume made there
    manager.backend("aws").stop(record)
    assert leftovers(look) == NOTHING

    # the user's regions are narrowed by the policy; none of them allowed: one line
    manager.backend("aws").settings_section().regions = "eu-west-1"
    with pytest.raises(ConfigError) as e:
        manager.create(spec_for(manager, "t4", cheapest=True))
    assert "holds none of the regions your policy" in str(e.value) and "\n" not in str(e.value)


async def test_the_forms_spot_line_comes_from_rest(aws_env, look, moto_server, jp_fetch):
    """GET prices?type=t4: the rows of `types --live` for that type and the start forms' line
    (the cheapest zone's current spot price beside the on-demand one); a type not in the
    catalog is a 400 that says where the types are."""
    import tornado.httpclient

    zones = sorted(latest_prices(look, "g4dn.xlarge"))
    prices = dict(zip(zones, (0.2210, 0.1930, 0.2490, 0.1578, 0.1702)))
    moto_server.set_spot_prices(prices)
    r = await jp_fetch("gpusession", "api", "prices", params={"type": "T4"})
    doc = json.loads(r.body)
    cheapest = min(prices, key=prices.get)
    assert [row["zone"] for row in doc["rows"]] == sorted(prices, key=prices.get), doc
    assert doc["line"] == (
        f"spot now $0.1578/h for g4dn.xlarge in {cheapest}, the cheapest of {len(prices)} zones "
        "(on demand $0.5260/h)"
    ), doc
    assert "on-demand prices from the catalog of" in doc["prices_line"]
    asked = [p.get("InstanceType.1") for a, p in aws_env.calls if a == "DescribeSpotPriceHistory"]
    assert asked == ["g4dn.xlarge"], asked  # the type asked for, not the whole catalog's
    with pytest.raises(tornado.httpclient.HTTPClientError) as e:
        await jp_fetch("gpusession", "api", "prices", params={"type": "t5000"})
    assert e.value.code == 400
    assert "unknown GPU type 't5000'" in json.loads(e.value.response.body)["message"]


def test_the_panel_forms_spot_line_shows_for_a_spot_start_on_aws(
    manager, aws_env, look, moto_server
):
    """`%gpu panel`'s start form: with aws and spot ticked, the type's current spot price in the
    cheapest zone shows under the type, in the same words as the sidebar's form; none for
    on-demand."""
    from gpusession.widgets.panel import StartForm
    from support.waits import wait_until

    zones = sorted(latest_prices(look, "g4dn.xlarge"))
    prices = dict(zip(zones, (0.2210, 0.1930, 0.2490, 0.1578, 0.1702)))
    moto_server.set_spot_prices(prices)
    form = StartForm(manager, lambda values: None)
    form.backend_select.value = "aws"
    form.type_select.value = "t4"
    assert form.spot_note.value == ""  # on demand: the type's catalog price says it
    form.fields["spot"].value = True
    shown = wait_until(lambda: form.spot_note.value, 20, "the spot line", 0.1)
    assert f"spot now $0.1578/h for g4dn.xlarge in {min(prices, key=prices.get)}" in shown, shown
    form.fields["spot"].value = False
    assert form.spot_note.value == ""
