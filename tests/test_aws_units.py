"""Pure parts of the aws backend: the boot plan, the address map, the order of attempts."""

from __future__ import annotations

import subprocess

import pytest

from gpusession.backends.aws.cloudinit import BootPlan, authorized_key_line, boot_script, new_host_key, user_data
from gpusession.backends.aws.launch import Attempt, Subnet, attempts, fallback_mode
from gpusession.backends.aws.link import map_address
from gpusession.errors import BadInput

A, B, C = (Subnet(f"subnet-{z}", f"us-east-1{z}", "vpc-1") for z in "abc")


def plan(spot=False):
    return BootPlan("0123456789abcdef0123456789abcdef", "registry.example/gpusession:1", "ssh-ed25519 AAAAkey s",
                    new_host_key("host"), new_host_key("container"), ["--idle", "1800", "--price-per-hour", "0.5"],
                    spot=spot)


def test_user_data_fits_and_script_is_valid_shell():
    for spot in (False, True):
        text = user_data(plan(spot))
        assert text.startswith("#cloud-config\n") and len(text.encode()) < 16 * 1024
        subprocess.run(["sh", "-n"], input=boot_script(plan(spot)), text=True, check=True)
    script = boot_script(plan(True))
    assert "GPUSESSION_AGENT_ARGS='--idle 1800 --price-per-hour 0.5'" in script  # one word for docker, split by the entrypoint
    assert "watch_spot &" in script and "poweroff" in script


def test_session_key_may_only_reach_the_container_sshd():
    line = authorized_key_line(plan())
    assert line == 'restrict,port-forwarding,permitopen="127.0.0.1:2222" ssh-ed25519 AAAAkey s'


def test_address_map(monkeypatch):
    monkeypatch.delenv("GPUSESSION_AWS_ADDRESS_MAP", raising=False)
    assert map_address("54.1.2.3") == ("54.1.2.3", 22)
    monkeypatch.setenv("GPUSESSION_AWS_ADDRESS_MAP", "54.1.2.3=10.201.0.2, *=127.0.0.1:2200")
    assert map_address("54.1.2.3") == ("10.201.0.2", 22)
    assert map_address("3.3.3.3") == ("127.0.0.1", 2200)


def describe(plan_):
    return [(a.spot, a.subnet.zone[-1]) for a in plan_]


def test_attempts_follow_the_fallback_the_user_allowed():
    prices = {"us-east-1a": 0.3, "us-east-1b": 0.2, "us-east-1c": 0.25}
    zones = [A, B, C]
    assert describe(attempts(True, "off", zones, prices)) == [(True, "b")]  # cheapest zone first
    assert describe(attempts(True, "zone", zones, prices)) == [(True, "b"), (True, "c"), (True, "a")]
    assert describe(attempts(True, "on-demand", zones, prices)) == [(True, "b"), (False, "b")]
    assert describe(attempts(True, "any", zones, prices)) == [(True, "b"), (True, "c"), (True, "a"),
                                                              (False, "b"), (False, "c"), (False, "a")]
    assert describe(attempts(False, "off", zones, {})) == [(False, "a")]
    assert describe(attempts(False, "any", zones, {})) == [(False, "a"), (False, "b"), (False, "c")]
    assert Attempt(True, A).describe("g5.xlarge") == "g5.xlarge spot in us-east-1a"
    with pytest.raises(BadInput, match="use one of off, zone, on-demand, any"):
        fallback_mode({"fallback": "sometimes"})
