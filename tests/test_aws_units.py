"""Pure parts of the aws backend: the boot plan, the address map, the order of attempts."""

from __future__ import annotations

import subprocess

import pytest

from gpusession.backends.aws.cloudinit import BootPlan, authorized_key_line, boot_script, new_host_key, user_data
from gpusession.backends.aws.launch import Attempt, Subnet, attempts, fallback_mode
from gpusession.backends.aws.link import map_address
from gpusession.backends.aws.teardown import console_details, ended_reason
from gpusession.backends.base import stop_details_from_log
from gpusession.errors import BadInput
from gpusession.protocol import (
    ENV_AGENT_ARGS,
    ENV_AUTHORIZED_KEY,
    ENV_SESSION_ID,
    Marker,
    StopDetails,
    StopKind,
    StopReason,
    find_markers,
    marker_line,
)

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


def test_the_boot_script_speaks_the_protocol(tmp_path):
    """Its markers and environment names come from gpusession.protocol; a failed `docker run`
    leaves a FAILED marker whose payload parses, and the container's last markers are copied."""
    script = boot_script(plan())
    for name in (ENV_SESSION_ID, ENV_AUTHORIZED_KEY, ENV_AGENT_ARGS):
        assert f"-e {name}=" in script
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    for tool in ("docker", "poweroff", "seq"):
        (fake_bin / tool).write_text("#!/bin/sh\nexit 1\n" if tool == "docker" else "#!/bin/sh\n")
        (fake_bin / tool).chmod(0o755)
    script = script.replace("DIR=/var/lib/gpusession/", f"DIR={tmp_path}/").replace("/dev/console", f"{tmp_path}/console")
    (tmp_path / "console").touch()
    out = subprocess.run(["sh", "-c", script], env={"PATH": f"{fake_bin}:/usr/bin:/bin"}, capture_output=True,
                         text=True, timeout=30).stdout
    assert find_markers(out, Marker.BOOT) == ["starting registry.example/gpusession:1"]
    (failed,) = find_markers(out, Marker.FAILED)
    assert failed == {"stage": "container", "error": "docker run registry.example/gpusession:1 failed"}
    assert stop_details_from_log(out).reason.kind == StopKind.START_FAILED
    assert out.rstrip().endswith(Marker.POWEROFF.value)
    assert (tmp_path / "console").read_text() == out  # what EC2's console output keeps


def test_why_ec2_says_an_instance_ended():
    def inst(state, code=None, message=None):
        return {"State": {"Name": state}, **({"StateReason": {"Code": code, "Message": message}} if code else {})}

    assert ended_reason(inst("running"), interrupted=False) is None
    assert ended_reason(None, interrupted=False) == StopReason(StopKind.GONE)
    assert ended_reason(None, interrupted=True) == StopReason(StopKind.SPOT_INTERRUPTION)
    spot = ended_reason(inst("terminated", "Server.SpotInstanceTermination", "Server.SpotInstanceTermination: Spot"),
                        interrupted=False)
    assert spot.kind == StopKind.SPOT_INTERRUPTION
    ended = ended_reason(inst("terminated", "Client.InstanceInitiatedShutdown",
                              "Client.InstanceInitiatedShutdown: Instance initiated shutdown"), interrupted=False)
    assert ended == StopReason(StopKind.INSTANCE_ENDED,
                               detail="terminated: Client.InstanceInitiatedShutdown: Instance initiated shutdown")
    assert ended_reason(inst("stopped"), interrupted=False) == StopReason(StopKind.INSTANCE_ENDED, detail="stopped")


def test_the_console_keeps_the_agents_last_words():
    reason = StopReason(StopKind.IDLE, idle_for_s=300.0, idle_timeout_s=300.0)
    output = "\n".join(["[  OK  ] Started cloud-init", "GPUSESSION_BOOT container started",
                        marker_line(Marker.STOPPED, reason.to_dict()), marker_line(Marker.SUMMARY, {"cost": 0.1}),
                        Marker.POWEROFF.value])

    class Ec2:
        def get_console_output(self, InstanceId):  # noqa: N803 - boto3's name
            return {"Output": output}

    class Aws:
        ec2 = Ec2()

    assert console_details(Aws(), "i-1") == StopDetails(reason=reason, summary={"cost": 0.1})
