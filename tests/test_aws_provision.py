"""The aws backend against a local EC2 API (moto's server), through the backend's one seam
(GPUSESSION_AWS_ENDPOINT_URL). These tests need no Docker: the instances' network side is absent
(their address maps to a closed port), so they cover provisioning, faults, teardown and gc."""

from __future__ import annotations

import base64
import re
import shlex
import stat
import subprocess
import sys
import time

import pytest

from gpusession.backends.aws.instances import instance_table
from gpusession.core.errors import BackendUnavailable, BadInput, StageError, WorkspaceInUse
from gpusession.core.models import State
from gpusession.core.progress import Progress
from gpusession.core.protocol import StopKind
from support.ec2 import Fault, leftovers
from support.ec2_platform import SSH_CIDR

CIDR = SSH_CIDR
pytest_plugins = ["support.ec2_fixtures"]  # fixtures: moto_server, ec2_api, aws_env, look
NOTHING = {"instances": [], "key_pairs": [], "security_groups": []}


def spec_for(manager, gpu="t4", **options):
    options.setdefault("ssh_cidr", CIDR)
    options.setdefault("boot_timeout", 3)
    return manager.make_spec(gpu, backend="aws", idle="5s", **options)


def provision(manager, spec):
    """Record a session and run the backend's provision step (what start does before connecting)."""
    record = manager.create(spec)
    manager.store.transition(record.id, State.PROVISIONING)
    backend = manager.backend("aws")
    lines: list[str] = []
    with Progress(lines.append).stage("provision"):
        backend.provision(manager.store.get(record.id), Progress(lines.append))
    return manager.store.get(record.id), lines


def unpacked(item: dict) -> str:
    """A write_files entry's text, as cloud-init decodes it."""
    import gzip

    assert item["encoding"] == "gz+b64"
    return gzip.decompress(base64.b64decode(item["content"])).decode()


def instance_of(look, record) -> dict:
    return look.describe_instances(InstanceIds=[record.resource["instance_id"]])["Reservations"][0][
        "Instances"
    ][0]


def user_data_of(look, record) -> dict:
    raw = look.describe_instance_attribute(
        InstanceId=record.resource["instance_id"], Attribute="userData"
    )
    text = base64.b64decode(raw["UserData"]["Value"]).decode()
    assert text.startswith("#cloud-config\n")
    import yaml  # what cloud-init reads it with

    return yaml.safe_load(text)


@pytest.mark.integration
def test_import_needs_no_boto3():
    code = (
        "import sys; sys.modules['boto3'] = None; sys.modules['botocore'] = None\n"
        "import gpusession, gpusession.session\n"
        "from gpusession.configuration.registry import load_backend_class\n"
        "from gpusession.configuration.config import GpuSessionConfig\n"
        "from gpusession.session.recorder import StoreRecorder\n"
        "from gpusession.session.store import Store\n"
        "import tempfile, pathlib\n"
        "cls = load_backend_class('aws')\n"
        "d = pathlib.Path(tempfile.mkdtemp())\n"
        "b = cls(GpuSessionConfig(data_dir=str(d)), StoreRecorder(Store(d / 's.sqlite3')))\n"
        "from gpusession.core.models import LaunchSpec\n"
        "try:\n"
        "    b.check(LaunchSpec('t4', backend='aws'))\n"
        "except Exception as e:\n"
        "    print(type(e).__name__, e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "BackendUnavailable" in out.stdout and "pip install 'gpusession[aws]'" in out.stdout


def test_provision_on_demand_makes_tagged_locked_down_instance(manager, aws_env, look):
    record, lines = provision(manager, spec_for(manager, "t4"))
    res = record.resource
    inst = instance_of(look, record)
    assert inst["InstanceType"] == "g4dn.xlarge" and inst["State"]["Name"] == "running"
    assert inst.get("InstanceLifecycle") != "spot"
    tags = {t["Key"]: t["Value"] for t in inst["Tags"]}
    assert tags["gpusession:session"] == record.id
    assert tags["gpusession:owner"] == record.owner
    assert tags["Name"] == f"gpusession-{record.name}"
    behavior = look.describe_instance_attribute(
        InstanceId=inst["InstanceId"], Attribute="instanceInitiatedShutdownBehavior"
    )
    assert behavior["InstanceInitiatedShutdownBehavior"]["Value"] == "terminate"
    assert (
        inst["MetadataOptions"]["HttpTokens"] == "required"
        and inst["MetadataOptions"]["HttpPutResponseHopLimit"] == 1
    )
    assert inst["KeyName"] == res["key_name"] == f"gpusession-{record.id}"
    # the image came from an SSM public parameter (moto has the ECS GPU one, not the DLAMI one)
    assert any("image ami-" in line and "SSM /aws/service/" in line for line in lines), lines
    assert inst["ImageId"] == res["ami"]
    # security group: ssh from the given range only
    group = look.describe_security_groups(GroupIds=[res["security_group"]])["SecurityGroups"][0]
    assert [
        (p["IpProtocol"], p["FromPort"], p["ToPort"], [r["CidrIp"] for r in p["IpRanges"]])
        for p in group["IpPermissions"]
    ] == [("tcp", 22, 22, [CIDR])]
    assert {t["Key"]: t["Value"] for t in group["Tags"]}["gpusession:session"] == record.id
    # key pair: our own key, imported
    pair = look.describe_key_pairs(KeyNames=[res["key_name"]])["KeyPairs"][0]
    assert pair["KeyType"] == "ed25519"
    # user data: host keys we made, the restricted login, the container command
    cfg = user_data_of(look, record)
    assert cfg["ssh_keys"]["ed25519_public"] == res["instance_host_key"]
    user = cfg["users"][1]
    folder = f"/var/lib/gpusession/{record.id}"
    assert user["name"] == "gpusession"
    login = user["ssh_authorized_keys"][0]
    assert login.startswith(f'restrict,port-forwarding,permitopen="[{folder}/kernel/k-1]:*",')
    assert f'permitopen="[{folder}/kernel/k-r]:*",' in login  # a download's raw stream
    assert res["sockets"] == f"{folder}/kernel"  # where the link finds the kernel
    assert f',command="sh {folder}/access.sh" ssh-ed25519 ' in login
    files = {f["path"]: f for f in cfg["write_files"]}
    assert files[f"{folder}/boot.sh"]["content"].startswith(
        "#!/bin/sh"
    )  # the bundle's, for the probe
    assert files[f"{folder}/access.sh"]["permissions"] == "0755"
    assert files[f"{folder}/session.sh"]["encoding"] == "gz+b64"
    script = unpacked(files[f"{folder}/session.sh"])
    for part in (
        "--gpus all",
        "--network host",
        "--idle 5",
        "--price-per-hour 0.526",
        "poweroff",
        f"SESSION_ID={record.id}",
        "GPUSESSION_KERNEL_KEY=",
    ):
        assert part in script, part
    key_file = manager.config.data_path / "keys" / f"{record.id}.kernel"
    assert f"GPUSESSION_KERNEL_KEY={key_file.read_text().strip()}\n" in script
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert "\nSPOT=0\n" in script  # on-demand: no interruption watch
    subprocess.run(["sh", "-n"], input=script, text=True, check=True)  # valid shell
    assert record.price_per_hour == 0.526  # the catalog's on-demand price of the whole instance

    manager.backend("aws").stop(record)
    assert leftovers(look) == NOTHING
    assert (
        look.describe_instances(InstanceIds=[inst["InstanceId"]])["Reservations"][0]["Instances"][
            0
        ]["State"]["Name"]
        == "terminated"
    )
    assert not (manager.config.data_path / "keys" / record.id).exists() and not key_file.exists()


def test_spot_price_is_the_current_spot_price(manager, aws_env, look):
    history = look.describe_spot_price_history(
        InstanceTypes=["g5.xlarge"], ProductDescriptions=["Linux/UNIX"]
    )
    cheapest = min(float(h["SpotPrice"]) for h in history["SpotPriceHistory"])
    record, _ = provision(manager, spec_for(manager, "a10g", spot=True))
    assert record.price_per_hour == pytest.approx(cheapest)
    assert (
        record.price_per_hour != instance_table().instance_for(manager.catalog.get("a10g"), 1).spot
    )  # not the aws table's guess
    inst = instance_of(look, record)
    assert inst["InstanceLifecycle"] == "spot"
    assert record.resource["market"] == "spot" and record.resource[
        "price_per_hour"
    ] == pytest.approx(cheapest)
    run = [p for a, p in aws_env.calls if a == "RunInstances"][-1]
    assert run["InstanceMarketOptions.MarketType"] == "spot"
    assert float(run["InstanceMarketOptions.SpotOptions.MaxPrice"]) == pytest.approx(
        1.006
    )  # on-demand cap
    cfg = user_data_of(look, record)
    script = unpacked(
        {f["path"]: f for f in cfg["write_files"]}[f"/var/lib/gpusession/{record.id}/session.sh"]
    )
    agent_args = shlex.split(re.search(r"\nset -- (.*)\n", script).group(1))
    assert (
        "\nSPOT=1\n" in script
        and float(agent_args[agent_args.index("--price-per-hour") + 1]) == cheapest
    )
    assert manager.view(record)["spot"] is True and manager.view(record)[
        "price_per_hour"
    ] == pytest.approx(cheapest)
    manager.backend("aws").stop(record)
    assert leftovers(look) == NOTHING


def test_spot_price_falls_back_to_catalog_when_aws_has_none(manager, aws_env, look):
    aws_env.faults.append(Fault("DescribeSpotPriceHistory", "UnauthorizedOperation", "not allowed"))
    spec = spec_for(manager, "a10g", spot=True)
    assert manager.backend("aws").price_per_hour(spec, manager.catalog) == 0.44


def test_spot_capacity_falls_back_to_on_demand_when_allowed(manager, aws_env, look):
    aws_env.faults.append(
        Fault(
            "RunInstances",
            "InsufficientInstanceCapacity",
            "We currently do not have sufficient g4dn.xlarge capacity",
            when={"InstanceMarketOptions.MarketType": "spot"},
        )
    )
    record, lines = provision(manager, spec_for(manager, "t4", spot=True, fallback="on-demand"))
    inst = instance_of(look, record)
    assert inst.get("InstanceLifecycle") != "spot"
    assert record.resource["market"] == "on-demand" and record.resource["price_per_hour"] == 0.526
    assert any("fell back to g4dn.xlarge on-demand" in line for line in lines), lines
    assert any(
        "capacity fallback" in e.detail and "InsufficientInstanceCapacity" in e.detail
        for e in record.events
    )
    manager.backend("aws").stop(record)


def test_capacity_falls_back_to_another_zone_when_allowed(manager, aws_env, look):
    subnets = look.describe_subnets(Filters=[{"Name": "default-for-az", "Values": ["true"]}])[
        "Subnets"
    ]
    first = min(subnets, key=lambda s: s["AvailabilityZone"])
    aws_env.faults.append(
        Fault(
            "RunInstances",
            "InsufficientInstanceCapacity",
            "no capacity in this zone",
            when={"NetworkInterface.1.SubnetId": first["SubnetId"]},
        )
    )
    record, _ = provision(manager, spec_for(manager, "t4", fallback="zone"))
    assert record.resource["zone"] != first["AvailabilityZone"]
    assert instance_of(look, record)["Placement"]["AvailabilityZone"] == record.resource["zone"]
    # the new workspace's volume moved with the attempt: one volume, in the instance's zone
    (volume,) = look.describe_volumes(
        Filters=[{"Name": "tag:gpusession:workspace", "Values": [record.name]}]
    )["Volumes"]
    assert (
        volume["VolumeId"] == record.resource["volume_id"]
        and volume["AvailabilityZone"] == record.resource["zone"]
    )
    manager.backend("aws").stop(record)


def test_capacity_error_without_fallback_fails_clearly_and_leaves_nothing(manager, aws_env, look):
    aws_env.faults.append(
        Fault(
            "RunInstances",
            "InsufficientInstanceCapacity",
            "We currently do not have sufficient g4dn.xlarge capacity in the AZ you requested",
        )
    )
    with pytest.raises(StageError) as err:
        manager.start(spec_for(manager, "t4", spot=True))
    assert err.value.stage == "provision"
    assert "no g4dn.xlarge could be launched in us-east-1" in str(err.value)
    assert "InsufficientInstanceCapacity" in str(err.value) and "fallback=any" in str(err.value)
    record = manager.list()[0]
    assert record.state == State.FAILED and "provision" in record.error
    assert leftovers(look) == NOTHING
    # the workspace's volume, made before the launch, is the user's: kept, and said
    (volume,) = look.describe_volumes(
        Filters=[{"Name": "tag:gpusession:workspace", "Values": [record.name]}]
    )["Volumes"]
    assert volume["State"] == "available" and volume["Size"] == 50 and volume["VolumeType"] == "gp3"
    assert any(
        f"workspace {record.name} (EBS volume {volume['VolumeId']}) is kept" in e.detail
        for e in record.events
    )


def test_the_instance_goes_to_its_workspace_volumes_zone(manager, aws_env, look):
    subnets = sorted(
        look.describe_subnets(Filters=[{"Name": "default-for-az", "Values": ["true"]}])["Subnets"],
        key=lambda s: s["AvailabilityZone"],
    )
    last = subnets[-1]["AvailabilityZone"]
    tags = [
        {"Key": "gpusession:workspace", "Value": "wz"},
        {"Key": "gpusession:store", "Value": manager.store.store_id},
    ]
    vid = look.create_volume(
        AvailabilityZone=last,
        Size=8,
        VolumeType="gp3",  # an earlier session's workspace
        TagSpecifications=[{"ResourceType": "volume", "Tags": tags}],
    )["VolumeId"]
    record, lines = provision(manager, spec_for(manager, "t4", resume="wz"))
    assert record.resource["volume_id"] == vid and record.resource["zone"] == last
    assert instance_of(look, record)["Placement"]["AvailabilityZone"] == last
    assert any(
        f"volume {vid} (8 GiB) in {last}, kept from an earlier session" in line for line in lines
    ), lines
    assert (
        look.describe_volumes(VolumeIds=[vid])["Volumes"][0]["Attachments"][0]["InstanceId"]
        == record.resource["instance_id"]
    )
    manager.backend("aws").stop(record)
    manager.store.transition(
        record.id, State.STOPPED
    )  # the session ended: its workspace is free again
    assert look.describe_volumes(VolumeIds=[vid])["Volumes"][0]["State"] == "available"
    # asked into another zone: the volume moves there by snapshot, said before it does
    first = subnets[0]["AvailabilityZone"]
    elsewhere = spec_for(manager, "t4", resume="wz", subnet=subnets[0]["SubnetId"])
    moved, lines = provision(manager, elsewhere)
    said = "\n".join(lines)
    assert f"its volume {vid} is in {last}, where the instance cannot be launched" in said, said
    assert f"moving volume {vid} (8 GiB, $0.64/month) from {last} to {first} by snapshot" in said
    assert moved.resource["zone"] == first and moved.resource["moved_from"] == last
    (volume,) = look.describe_volumes(
        Filters=[{"Name": "tag:gpusession:workspace", "Values": ["wz"]}]
    )["Volumes"]
    assert volume["AvailabilityZone"] == first and volume["VolumeId"] == moved.resource["volume_id"]
    assert {"Key": "gpusession:moved-from", "Value": vid} in volume["Tags"]
    assert volume["Size"] == 8 and volume["SnapshotId"]
    ours = [{"Name": "tag:gpusession:store", "Values": [manager.store.store_id]}]
    assert not look.describe_snapshots(Filters=ours)["Snapshots"]
    manager.backend("aws").stop(moved)
    manager.store.transition(moved.id, State.STOPPED)
    with pytest.raises(StageError, match="no workspace nope in us-east-1 to resume"):
        manager.start(spec_for(manager, "t4", resume="nope"))
    assert leftovers(look) == NOTHING


def test_quota_error_names_the_quota_and_leaves_nothing(manager, aws_env, look):
    aws_env.faults.append(
        Fault(
            "RunInstances",
            "VcpuLimitExceeded",
            "You have requested more vCPU capacity than your current vCPU limit of 0 allows",
        )
    )
    with pytest.raises(StageError) as err:
        manager.start(spec_for(manager, "t4"))
    assert err.value.stage == "provision"
    assert "quota is too low" in str(err.value) and "L-DB2E81BA" in str(err.value)
    assert leftovers(look) == NOTHING


def test_unreachable_instance_times_out_naming_the_stage_and_leaves_nothing(manager, aws_env, look):
    t0 = time.monotonic()
    with pytest.raises(StageError) as err:
        manager.start(spec_for(manager, "t4", boot_timeout=2))
    assert err.value.stage == "connect"
    assert "timed out" in str(err.value) and "instance's sshd" in str(err.value)
    assert time.monotonic() - t0 < 60
    record = manager.list()[0]
    assert record.state == State.FAILED and record.error.startswith("connect:")
    assert leftovers(look) == NOTHING


def test_unknown_region_is_refused_before_anything_is_asked(manager, aws_env):
    with pytest.raises(BadInput) as err:
        manager.start(spec_for(manager, "t4", region="mars-east-1"))
    assert "region 'mars-east-1' is no AWS region name" in str(err.value) and "us-east-1" in str(
        err.value
    )
    assert aws_env.calls == [] and manager.list() == []


@pytest.mark.integration
def test_bad_credentials_are_refused_before_anything_is_recorded(
    manager, aws_env, look, monkeypatch
):
    from support.ec2 import MotoServer

    strict = MotoServer(env={"INITIAL_NO_AUTH_ACTION_COUNT": "0"})  # moto checks keys like IAM does
    try:
        monkeypatch.setenv("GPUSESSION_AWS_ENDPOINT_URL", strict.url)
        with pytest.raises(BackendUnavailable) as err:
            manager.start(spec_for(manager, "t4"))
    finally:
        strict.close()
    assert "AWS refused the credentials" in str(err.value) and "AuthFailure" in str(err.value)
    assert manager.list() == []


def test_credentials_rejected_midway_clean_up_what_was_made(manager, aws_env, look):
    aws_env.faults.append(
        Fault(
            "CreateSecurityGroup",
            "UnauthorizedOperation",
            "You are not authorized to perform this operation.",
        )
    )
    with pytest.raises(StageError) as err:
        manager.start(spec_for(manager, "t4"))
    assert err.value.stage == "provision" and "AWS refused the credentials" in str(err.value)
    assert "ImportKeyPair" in aws_env.actions() and "DeleteKeyPair" in aws_env.actions()
    assert leftovers(look) == NOTHING


def test_a_stop_racing_the_instances_own_shutdown_still_removes_everything(manager, aws_env, look):
    """The instance ends on its own (its boot script shuts it down after a failed pull) while the
    stop terminates it, and EC2 answers that terminate with an error (moto answers the loser of
    two terminates so): the stop goes on, and the key pair and group go too."""
    record, _ = provision(manager, spec_for(manager, "t4"))
    iid = record.resource["instance_id"]

    def ended_first(params):
        look.terminate_instances(InstanceIds=[iid])  # the instance's own shutdown, just before
        return None  # then the fault below answers

    aws_env.answers["TerminateInstances"] = ended_first
    aws_env.faults.append(
        Fault(
            "TerminateInstances",
            "InvalidNetworkInterfaceID.NotFound",
            "The networkInterface ID 'eni-9b0d83ff16c1fa7f3' does not exist",
            times=1,
        )
    )
    manager.backend("aws").stop(manager.store.get(record.id))
    assert leftovers(look) == NOTHING

    # one still running after a refused terminate: the stop says so (nothing is hidden)
    record, _ = provision(manager, spec_for(manager, "t4"))
    aws_env.answers.clear()
    aws_env.faults.append(
        Fault("TerminateInstances", "UnauthorizedOperation", "You are not authorized.", times=1)
    )
    with pytest.raises(Exception, match="UnauthorizedOperation|not authorized|credentials"):
        manager.backend("aws").stop(manager.store.get(record.id))
    assert leftovers(look)["instances"]
    manager.backend("aws").stop(manager.store.get(record.id))
    assert leftovers(look) == NOTHING


def test_no_credentials_at_all(manager, aws_env, monkeypatch):
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    with pytest.raises(BackendUnavailable) as err:
        manager.start(spec_for(manager, "t4"))
    assert "no AWS credentials found" in str(err.value) and "aws sso login" in str(err.value)


def test_gc_removes_what_a_dead_process_left(manager, aws_env, look):
    spec = spec_for(manager, "t4")
    backend = manager.backend("aws")
    record = manager.store.create(
        spec,
        price_per_hour=0.526,
        owner="someone@" + __import__("socket").gethostname() + ":999999999",
    )
    manager.store.transition(record.id, State.PROVISIONING)
    manager.store.update_resource(record.id, driver=record.owner)  # the dead one drove it
    backend.provision(manager.store.get(record.id), Progress())
    assert leftovers(look)["instances"]
    resources = backend.list_resources()
    assert [r.session_id for r in resources] == [record.id]
    assert (
        resources[0].running
        and "key pair" in resources[0].description
        and "security group" in resources[0].description
    )
    actions = manager.gc()
    assert any(
        a.verb == "stop" and a.why == "left provisioning by a dead process" for a in actions
    ), actions
    assert leftovers(look) == NOTHING
    assert manager.get(record.id).state == State.FAILED


def test_gc_removes_resources_of_a_stopped_session(manager, aws_env, look):
    record, _ = provision(manager, spec_for(manager, "t4"))
    manager.store.transition(record.id, State.STOPPED, "recorded stopped, but the instance stayed")
    actions = manager.gc(dry_run=True)
    assert any(
        a.verb == "remove" and not a.done and a.target.startswith("EC2 instance") for a in actions
    ), actions
    assert leftovers(look)["instances"]
    actions = manager.gc()
    assert any(
        a.verb == "remove"
        and a.done
        and a.target.startswith("EC2 instance")
        and a.why.endswith("is stopped")
        for a in actions
    ), actions
    assert leftovers(look) == NOTHING


def test_gc_asks_aws_nothing_without_aws_sessions(manager, aws_env):
    assert manager.backend("aws").list_resources() == []
    assert aws_env.calls == []


def test_a_resume_finds_the_session_holding_its_workspace_ended_unseen(manager, aws_env, look):
    """No watcher was alive when AWS took the instance back: the record still says running and
    holds the workspace. `--resume` asks EC2 about the holder (instead of refusing the workspace
    as in use), records it ended and goes on; a holder that still runs keeps it."""
    record, _ = provision(manager, spec_for(manager, "t4", name="held", spot=True))
    for state in (State.STARTING, State.RUNNING):
        manager.store.transition(record.id, state)
    with pytest.raises(WorkspaceInUse, match="workspace held is in use by session held"):
        manager.create(spec_for(manager, "t4", resume="held"))  # it runs: refused
    look.terminate_instances(InstanceIds=[record.resource["instance_id"]])
    again = manager.create(spec_for(manager, "t4", resume="held"))
    ended = manager.get(record.id)
    assert ended.state == State.STOPPED and ended.stop_reason.kind == StopKind.INSTANCE_ENDED
    assert again.spec.extra["resume"] == "held"
    manager.store.transition(again.id, State.FAILED, "not started by this test")
    assert leftovers(look) == NOTHING


def test_a_fallback_list_launches_the_next_type_when_the_first_has_no_capacity(
    manager, aws_env, look
):
    """--type l4,a10g (issue 34 §3): EC2 has no g6.xlarge (l4) anywhere, so the same session
    moves on to a10g; what the l4 attempt made is gone, the record says which type was taken
    and why l4 was passed over, and its price is a10g's."""
    from gpusession.session.fallback import provision_placed
    from gpusession.words.status import placement_line

    aws_env.faults.append(
        Fault(
            "RunInstances",
            "InsufficientInstanceCapacity",
            "We currently do not have sufficient g6.xlarge capacity",
            when={"InstanceType": "g6.xlarge"},
        )
    )
    spec = spec_for(manager, "l4,a10g,t4")
    assert spec.gpu_type == "l4" and spec.extra["types"] == ["l4:1", "a10g:1", "t4:1"]
    record = manager.create(spec)
    manager.store.transition(record.id, State.PROVISIONING)
    backend = manager.backend("aws")
    lines: list[str] = []
    record = provision_placed(
        manager.store,
        backend,
        record,
        Progress(lines.append),
        lambda s: backend.price_per_hour(s, manager.catalog),
    )
    try:
        assert record.spec.gpu_type == "a10g"
        assert instance_of(look, record)["InstanceType"] == "g5.xlarge"
        (passed,) = record.spec.extra["passed_over"]
        assert passed["type"] == "l4:1" and "InsufficientInstanceCapacity" in passed["why"]
        assert any(
            "no capacity for l4:1 (" in line and "trying a10g:1 next" in line for line in lines
        )
        assert any(
            "fallback: l4:1 passed over (no capacity); trying a10g:1" in e.detail
            for e in record.events
        )
        assert record.price_per_hour == backend.price_per_hour(record.spec, manager.catalog)
        line = placement_line(manager.view(record))
        assert line.startswith("took a10g:1 of l4:1, a10g:1, t4:1 (passed over l4:1: no g6.xlarge")
        # the l4 attempt's key pair and security group went with it: one of each, the a10g's
        left = leftovers(look)
        assert len(left["instances"]) == 1 and len(left["key_pairs"]) == 1
        assert len(left["security_groups"]) == 1
    finally:
        backend.stop(manager.store.get(record.id))
    assert leftovers(look) == NOTHING
