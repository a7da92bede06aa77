"""The aws backend end to end: our code against a local EC2 API (moto's server), with each
instance's network side played by tests/support/ec2_platform.py in the gpus-ec2 network
namespace (sshd + Docker, scripts/ci-ec2-host.sh). Needs root and a Docker engine with the
product image (scripts/ci-host-setup.sh); skipped otherwise."""

from __future__ import annotations

import os
import threading
import time

import pytest

from gpusession.core.errors import SessionEnded, StageError
from gpusession.core.models import State
from gpusession.core.protocol import Marker, StopKind, StopReason, find_markers
from gpusession.words.stops import ended_message
from support.ec2 import leftovers
from support.ec2_platform import SSH_CIDR
from support.hosts import product_image
from support.sinks import Collect

pytestmark = [pytest.mark.docker, pytest.mark.slow]
pytest_plugins = ["support.ec2_fixtures"]  # fixtures: moto_server, ec2_api, aws_env, look, platform
NOTHING = {"instances": [], "key_pairs": [], "security_groups": []}


def spec_for(manager, **options):
    options.setdefault("idle", "5m")
    options.setdefault("image", product_image())
    options.setdefault(
        "workspace_size", "1"
    )  # GiB: the platform backs each volume with a sparse file
    return manager.make_spec("t4", backend="aws", ssh_cidr=SSH_CIDR, boot_timeout=120, **options)


def let_go(session) -> None:
    """Close this process's connection to a session that ended remotely (the manager keeps it)."""
    session.kernel.close()
    session.link.close()


def instance_state(look, record) -> str:
    iid = record.resource["instance_id"]
    return look.describe_instances(InstanceIds=[iid])["Reservations"][0]["Instances"][0]["State"][
        "Name"
    ]


def test_start_run_idle_stop_terminates_instance_then_gc_cleans(manager, platform, look):
    lines: list[str] = []
    t0 = time.monotonic()
    session = manager.start(spec_for(manager, idle="5s"), report=lines.append)
    started_s = time.monotonic() - t0
    record = session.record
    assert record.state == State.RUNNING
    for stage in (
        "provision: image ami-",
        "provision: launching g4dn.xlarge on-demand",
        "connect: waiting for the instance's sshd",
        "connect: instance: waiting for the runtime",
        "connect: sending the runtime's code",
        "connect: opening the SSH tunnel",
        "running: session",
    ):
        assert any(stage in line for line in lines), (stage, lines)
    out = Collect()
    reply = session.run(
        "import os; print(os.environ['GPUSESSION_SESSION_ID'], os.environ.get('NVIDIA_VISIBLE_DEVICES')); 6 * 7",
        sink=out,
    )
    assert reply["status"] == "ok"
    assert (
        f"{record.id} all" in out.text and "42" in out.text
    )  # in the container, with every GPU requested
    # nothing runs now: after 5 s idle the agent stops, the boot script powers off, EC2 terminates
    platform.wait_for(lambda: instance_state(look, record) == "terminated", timeout=90)
    idle_s = time.monotonic() - t0 - started_s
    assert any("shutdown behavior terminate" in e for e in platform.events), platform.events
    console = platform.console_text(record.resource["instance_id"])
    assert [StopReason.from_dict(r).kind for r in find_markers(console, Marker.STOPPED)] == [
        StopKind.IDLE
    ], console
    assert find_markers(console, Marker.POWEROFF), console
    assert not manager.backend("aws").is_alive(manager.get(record.id))
    actions = manager.gc()
    assert any(a.verb == "record-stopped" and a.target == record.name for a in actions), actions
    assert manager.get(record.id).state == State.STOPPED
    assert leftovers(look) == NOTHING
    let_go(session)
    print(f"start {started_s:.1f}s, idle stop to terminated {idle_s:.1f}s")


def _cli(*args: str):
    import subprocess
    import sys

    return subprocess.run(
        [sys.executable, "-m", "gpusession", *args],
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_workspace_volume_outlives_the_instance_and_resumes(manager, platform, look, tmp_path):
    """The workspace is a tagged gp3 volume made in the instance's zone, attached after launch with
    DeleteOnTermination false, formatted once and mounted at /workspace; stop --save keeps a file
    and a variable there; the volume stays available after the instance terminated; --resume on a
    new instance brings both back; listed with size and cost; gc reports it and keeps it; rm
    --yes deletes it. Files move over the instance's tunnel: an uploaded module imports, a file
    written before the stop downloads after the resume."""
    lines: list[str] = []
    session = manager.start(spec_for(manager, name="ew1", workspace="ews"), report=lines.append)
    record = session.record
    vid = record.resource["volume_id"]
    assert any(
        f"workspace ews: new 1 GiB gp3 volume in {record.resource['zone']}" in line
        for line in lines
    ), lines
    inst = look.describe_instances(InstanceIds=[record.resource["instance_id"]])["Reservations"][0][
        "Instances"
    ][0]
    (mapping,) = [m for m in inst["BlockDeviceMappings"] if m["Ebs"]["VolumeId"] == vid]
    assert mapping["Ebs"]["DeleteOnTermination"] is False and mapping["DeviceName"] == "/dev/sdf"
    (tmp_path / "utils.py").write_text("def answer():\n    return 'from utils'\n")
    sent = session.upload([str(tmp_path / "utils.py")])
    assert sent["files"] == 1, sent
    out = Collect()
    assert session.run("import utils; print(utils.answer())", sink=out)["status"] == "ok", out.text
    assert "from utils" in out.text, out.text
    out = Collect()
    code = "import os\nopen('notes.txt', 'w').write('kept')\nx = {'a': 41}\nprint(os.getcwd(), os.path.ismount('/workspace'))"
    assert session.run(code, sink=out)["status"] == "ok", out.text
    assert "/workspace True" in out.text, out.text
    stopped = manager.stop(session.id, save=True)
    assert stopped.resource["checkpoint"]["saved"] == 1, stopped.resource["checkpoint"]
    assert instance_state(look, record) == "terminated"
    (volume,) = look.describe_volumes(VolumeIds=[vid])["Volumes"]
    tags = {t["Key"]: t["Value"] for t in volume["Tags"]}
    assert volume["State"] == "available" and volume["VolumeType"] == "gp3" and volume["Size"] == 1
    assert volume["AvailabilityZone"] == inst["Placement"]["AvailabilityZone"]
    assert (
        tags["gpusession:workspace"] == "ews" and tags["gpusession:store"] == manager.store.store_id
    )
    let_go(session)
    platform.wait_for(lambda: not platform.machines, timeout=30)

    listed = _cli("workspaces")
    (row,) = [line for line in listed.stdout.splitlines() if line.startswith("ews ")]
    assert "aws" in row and "1.1 GB" in row and "$0.0800" in row and f"EBS volume {vid}" in row, (
        listed.stdout
    )
    gc = _cli("gc")
    assert f"kept workspace ews (EBS volume {vid}" in gc.stdout, gc.stdout + gc.stderr
    assert look.describe_volumes(VolumeIds=[vid])["Volumes"][0]["State"] == "available"

    again = manager.start(spec_for(manager, name="ew2", resume="ews"), report=lines.append)
    assert again.record.resource["volume_id"] == vid
    assert again.record.resource["restored"]["restored"] == ["x"], again.record.resource["restored"]
    out = Collect()
    assert again.run("print(x['a'] + 1, open('notes.txt').read())", sink=out)["status"] == "ok", (
        out.text
    )
    assert "42 kept" in out.text, out.text
    got = again.download(["notes.txt"], to=str(tmp_path / "back"))
    assert got["files"] == 1 and (tmp_path / "back" / "notes.txt").read_text() == "kept", got
    busy = _cli("workspaces", "rm", "ews", "--yes")
    assert busy.returncode == 1 and "in use by session ew2" in busy.stderr, busy.stderr
    manager.stop(again.id)
    let_go(again)
    assert _cli("workspaces", "rm", "ews").returncode == 1  # without --yes nothing is deleted
    assert look.describe_volumes(VolumeIds=[vid])["Volumes"]
    removed = _cli("workspaces", "rm", "ews", "--yes")
    assert removed.returncode == 0 and "deleted workspace ews" in removed.stdout, removed.stderr
    assert not look.describe_volumes(Filters=[{"Name": "volume-id", "Values": [vid]}])["Volumes"]
    assert leftovers(look) == NOTHING


def test_stop_terminates_and_removes_key_pair_and_group(manager, platform, look):
    session = manager.start(spec_for(manager))
    assert session.run("1 + 1", sink=Collect())["status"] == "ok"
    record = manager.stop(session.id)
    assert record.state == State.STOPPED
    assert instance_state(look, record) == "terminated"
    assert leftovers(look) == NOTHING
    platform.wait_for(lambda: not platform.machines, timeout=30)


def test_a_spot_notice_saves_ends_the_session_and_resume_picks_it_up(manager, platform, look):
    """The boot script polls instance metadata (the platform's IMDS stand-in) and writes what it
    says into the agent's notice folder: a rebalance recommendation saves the namespace and the
    session goes on; the interruption notice, during a running cell, saves it again, ends the
    session (the instance powers off and terminates) and the cell is said to be cut; `list` says
    "interrupted, state saved", the stop line says how to resume."""
    session = manager.start(spec_for(manager, name="sp1", spot=True))
    record = session.record
    assert record.resource["market"] == "spot"
    assert session.run("kept = {'k': 41}", sink=Collect())["status"] == "ok"

    platform.recommend_rebalance()
    # the agent's save, seen from a cell: the workspace's manifest says what it was for
    wait_saved = (
        "import json, os, time\n"
        "path = '/workspace/.gpusession/checkpoint.json'\n"
        "for _ in range(150):\n"
        "    if os.path.exists(path) and 'for' in json.load(open(path)): break\n"
        "    time.sleep(0.2)\n"
        "print(json.load(open(path)).get('for') if os.path.exists(path) else 'no checkpoint')"
    )
    out = Collect()
    reply = session.run(wait_saved, sink=out)
    assert reply["status"] == "ok" and out.text.strip() == "rebalance", out.text

    cut: list = []

    def long_cell():
        try:
            session.run("open('ran.txt', 'a').write('x')\nfor i in range(1200): time.sleep(0.1)")
        except Exception as exc:  # noqa: BLE001 - what the notebook would be told
            cut.append(exc)

    cell = threading.Thread(target=long_cell)
    cell.start()
    time.sleep(1)
    t0 = time.monotonic()
    notice = platform.interrupt()
    cell.join(90)
    assert not cell.is_alive(), "the running cell went on after the notice"
    downtime = time.monotonic() - t0
    (ended,) = cut
    assert isinstance(ended, SessionEnded), repr(ended)
    said = ended_message(ended.record)
    assert "session sp1 ended: AWS took the spot instance back" in said, said
    assert "resume with `%gpu start --resume sp1`" in said, said
    platform.wait_for(lambda: instance_state(look, record) == "terminated", timeout=60)
    console = platform.console_text(record.resource["instance_id"])
    marks = find_markers(console, Marker.CHECKPOINT)
    assert [(m["for"], m["committed"]) for m in marks] == [
        ("rebalance", True),
        ("spot-interruption", True),
    ], console
    assert marks[1]["notice"] == notice
    record = manager.get(record.id)
    assert record.state == State.STOPPED
    assert record.stop_reason.kind == StopKind.SPOT_INTERRUPTION
    assert record.resource["agent_summary"]["checkpoint"]["for"] == "spot-interruption"
    listed = _cli("list", "--all")
    (row,) = [line for line in listed.stdout.splitlines() if line.split()[:1] == ["sp1"]]
    assert "interrupted, state saved" in row, listed.stdout
    let_go(session)
    platform.wait_for(lambda: not platform.machines, timeout=30)

    assert leftovers(look) == NOTHING
    # `--resume sp1` on a new instance restores from the volume as any resume does
    # (test_a_workspace_volume_outlives_the_instance_and_resumes); the cut cell is never re-run
    # (tests/test_interruptions.py): a second instance here would double this test's time
    print(f"notice to the session ended: {downtime:.1f}s")


def test_wrong_host_key_is_refused_and_everything_removed(manager, platform, look):
    platform.tamper_host_key = True
    with pytest.raises(StageError) as err:
        manager.start(spec_for(manager))
    assert err.value.stage == "connect"
    assert "host key" in str(err.value) and "refusing" in str(err.value)
    assert leftovers(look) == NOTHING


# Each foreign image costs an instance boot on the namespace host (~25 s on 2 cores): CI runs a
# slice (the non-root USER, whose folders on the instance differ; the local and ssh:// engines run
# the Debian 13 and conda-layout images); the whole matrix runs with GPUSESSION_FOREIGN_MATRIX=full
# (scripts/foreign-matrix.sh).
EC2_SLICE = ("gpusession-ci/py-nonroot",)


def _foreign_params():
    from support.images import foreign_params

    return foreign_params(EC2_SLICE)


@pytest.mark.parametrize("foreign", _foreign_params())
def test_a_foreign_image_gets_the_runtime_and_runs_with_its_own_python(
    foreign, manager, platform, look
):
    """An image with python3 only (Debian 12 or 13, Python under /opt/conda/bin, a non-root USER,
    the default image's shape): the instance probes it, the client sends ipykernel and pip for
    its Python and the agent, the kernel runs with the image's Python; the idle stop ends the
    instance and gc leaves nothing."""
    lines: list[str] = []
    session = manager.start(spec_for(manager, idle="5s", image=foreign.image), report=lines.append)
    for said in (
        f"the image's Python {foreign.version.rstrip('.')}",
        "no ipykernel: the runtime brings it",
        "sending the runtime's site",
        "sending the runtime's code",
    ):
        assert any(said in line for line in lines), (said, lines)
    out = Collect()
    assert (
        session.run(
            "import os, sys\nprint(sys.version)\nprint(sys.executable, os.getuid())", sink=out
        )["status"]
        == "ok"
    )
    version, where = out.text.strip().splitlines()[:2]
    assert version.startswith(foreign.version) and where.split() == [
        foreign.executable,
        str(foreign.uid),
    ]
    record = session.record
    platform.wait_for(lambda: instance_state(look, record) == "terminated", timeout=90)
    console = platform.console_text(record.resource["instance_id"])
    assert [StopReason.from_dict(r).kind for r in find_markers(console, Marker.STOPPED)] == [
        StopKind.IDLE
    ], console
    manager.gc()
    assert manager.get(record.id).state == State.STOPPED
    assert leftovers(look) == NOTHING
    let_go(session)


def test_an_image_without_python_fails_in_one_line_and_leaves_nothing(manager, platform, look):
    from support.images import NO_PYTHON

    with pytest.raises(StageError) as err:
        manager.start(spec_for(manager, image=NO_PYTHON))
    assert f"image {NO_PYTHON} has no Python to run the session kernel in" in str(err.value)
    assert "use an image with python3 3.9 or newer" in str(err.value)
    assert leftovers(look) == NOTHING


def _volumes(look, workspace: str) -> list[dict]:
    return look.describe_volumes(
        Filters=[{"Name": "tag:gpusession:workspace", "Values": [workspace]}]
    )["Volumes"]


def _started_with_work(manager, **options):
    """A session with a variable (kept) and a file (notes.txt) to move: (it, zone, volume id)."""
    start = manager.start(spec_for(manager, **options))
    code = "kept = {'k': 41}\nopen('notes.txt', 'w').write('moved')"
    assert start.run(code, sink=Collect())["status"] == "ok"
    return start, start.record.resource["zone"], start.record.resource["volume_id"]


def test_a_switch_moves_the_workspace_to_another_zone_and_a_spot_recovery_prefers_another_zone(
    manager, platform, look, aws_env
):
    """One session, four instances. `%gpu switch --spot`: in its zone, the new instance runs
    first, then the old session saves and stops and the same volume is attached to the new one.
    `%gpu switch --type a10g` where its zone has no capacity: the new instance runs in another zone, the old session saves and stops, its
    workspace volume moves there by snapshot (said before it does), the variables and files
    come back. Then a spot notice ends the new one with no watcher alive: its agent saves, AWS
    takes the instance back, `gpusession list` (reading the instance's console as EC2 keeps
    it) says "interrupted, state saved"; its replacement (the same start as `--resume`, as a
    watcher or the sidebar's Resume asks it) tries another zone than the interrupted one first
    (said on its start line), the volume moves back by snapshot, the variables come back."""
    from gpusession.words.switches import switch_line
    from support.ec2 import Fault

    start, zone_a, vol_a = _started_with_work(manager, name="mv0", workspace="mv", fallback="zone")
    # to spot in its zone: the new instance runs first, then the old session saves and stops
    # and the same volume is attached to it (no snapshot)
    lines: list[str] = []
    first, report = manager.switch(
        start, manager.switch_spec(start.id, {"spot": True, "name": "mv"}), lines.append
    )
    said = "\n".join(lines)
    assert said.index("runs at") < said.index("saving the variables of mv0"), said
    assert "the old session hands over" in said and "by snapshot" not in said, said
    assert first.record.resource["volume_id"] == vol_a and first.record.resource["market"] == "spot"
    assert report.moved_bytes is None and report.restored["restored"] == ["kept"], report
    assert manager.get(start.id).state == State.STOPPED
    let_go(start)
    (subnet_a,) = look.describe_subnets(
        Filters=[
            {"Name": "default-for-az", "Values": ["true"]},
            {"Name": "availability-zone", "Values": [zone_a]},
        ]
    )["Subnets"]
    aws_env.faults.append(
        Fault(
            "RunInstances",
            "InsufficientInstanceCapacity",
            "no capacity in this zone",
            when={"NetworkInterface.1.SubnetId": subnet_a["SubnetId"]},
        )
    )
    lines.clear()
    second, report = manager.switch(
        first, manager.switch_spec(first.id, {"type": "a10g"}), lines.append
    )
    aws_env.faults.clear()
    zone_b = second.record.resource["zone"]
    assert zone_b != zone_a and second.record.resource["instance_type"] == "g5.xlarge"
    said = "\n".join(lines)
    assert (
        f"moving volume {vol_a} (1 GiB" in said and f"from {zone_a} to {zone_b} by snapshot" in said
    ), said
    assert said.index("saving the variables of mv") < said.index("moving volume"), said
    line = switch_line(report.to_dict())
    assert second.name == "mv" and line.startswith("switched mv in "), line
    assert "moved 1 name(s) (kept)" in line and f"from aws {zone_a} to aws {zone_b})" in line, line
    old = manager.get(first.id)
    assert old.state == State.STOPPED and "switch to 1 x a10g on aws" in str(old.events), old.events
    (vol_b,) = _volumes(look, "mv")
    assert vol_b["AvailabilityZone"] == zone_b and vol_b["VolumeId"] != vol_a
    ours = [{"Name": "tag:gpusession:store", "Values": [manager.store.store_id]}]
    assert not look.describe_snapshots(Filters=ours)[
        "Snapshots"
    ]  # deleted once the volume was made
    out = Collect()
    reply = second.run("print(kept['k'] + 1, open('notes.txt').read())", sink=out)
    assert reply["status"] == "ok" and "42 moved" in out.text, out.text
    let_go(first)

    # no watcher alive (a laptop asleep): nothing of this process looks at the session
    let_go(second)
    manager._release(second.id)
    iid = second.record.resource["instance_id"]
    platform.interrupt()
    platform.wait_for(lambda: "GPUSESSION_SUMMARY" in platform.console_text(iid), timeout=60)
    platform.take_back(iid)  # AWS, at the notice's time
    platform.wait_for(lambda: not platform.machines, timeout=60)
    platform.calm()
    lines.clear()
    # asked later (`gpusession watch`, the sidebar's Resume): the record still says running;
    # EC2 says terminated, its console the agent's last markers: recorded, then replaced
    third = manager.recover(second.id, lines.append)
    listed = _cli("list", "--all")
    assert third.name == second.name, "the recovered session keeps its name"
    rows = [line for line in listed.stdout.splitlines() if line.split()[:1] == [second.name]]
    retired = [  # the switched-from record (mv~1) and the interrupted one (mv~2)
        ln for ln in listed.stdout.splitlines() if ln.split()[:1] == [f"{second.name}~2"]
    ]
    assert len(rows) == 1 and len(retired) == 1, listed.stdout
    assert "interrupted, state saved" in retired[0], listed.stdout
    ended = manager.get(second.id)
    assert ended.stop_reason.kind == StopKind.SPOT_INTERRUPTION, ended.stop_reason
    assert ended.resource["agent_summary"]["checkpoint"]["for"] == "spot-interruption"
    said = "\n".join(lines)
    assert third is not None and third.record.resource["zone"] != zone_b, said
    assert (
        f"spot in {third.record.resource['zone']} (another zone than {zone_b}, where the spot "
        "instance was interrupted)" in said
    ), said
    assert f"from {zone_b} to {third.record.resource['zone']} by snapshot" in said, said
    assert third.record.resource["restored"]["restored"] == ["kept"], third.record.resource
    out = Collect()
    assert third.run("print(kept['k'] + 1)", sink=out)["status"] == "ok" and "42" in out.text
    manager.stop(third.id)
    let_go(third)
    platform.wait_for(lambda: not platform.machines, timeout=30)
    assert leftovers(look) == NOTHING
    assert [v["AvailabilityZone"] for v in _volumes(look, "mv")] == [third.record.resource["zone"]]


def test_a_switch_from_aws_to_docker_and_back_streams_the_workspace_over_the_instances_logins(
    manager, platform, look, engine
):
    """`%gpu switch --backend docker` from an aws session: its variables are saved into its EBS
    workspace, whose files are read on the instance (the boot script reads the running
    container's /workspace, the session login passes it on) and stream over the session's own
    SSH login through this machine into a fresh volume on this engine, the size said first; the
    docker session restores the variable and finds the file; the aws instance is terminated."""
    from gpusession.transport.pulls import format_bytes
    from gpusession.words.switches import switch_line

    start = manager.start(spec_for(manager, name="ad0", workspace="adw"))
    code = "kept = {'k': 41}\nopen('notes.txt', 'w').write('from aws')"
    assert start.run(code, sink=Collect())["status"] == "ok"
    lines: list[str] = []
    try:
        there, report = manager.switch(
            start, manager.switch_spec(start.id, {"backend": "docker", "idle": "off"}), lines.append
        )
        said = "\n".join(lines)
        assert "move: workspace from aws" in said and "to docker (this machine's engine)" in said
        assert f"reading workspace adw on {start.record.resource['instance_id']}" in said, said
        assert " to move, through this machine" in said and "move: moved " in said, said
        assert said.index("to move, through this machine") < said.index("move: moved "), said
        assert report.moved_bytes and report.moved_bytes > 4096, report  # the file, the save
        # the size said before it moved is what moved (the stream's bytes, counted there first)
        assert f"move: {format_bytes(report.moved_bytes)} to move" in said, said
        assert report.restored["restored"] == ["kept"], report.restored
        line = switch_line(report.to_dict())
        assert "moved 1 name(s) (kept)" in line and "to docker (this machine's engine)" in line
        out = Collect()
        reply = there.run("print(kept['k'] + 1, open('notes.txt').read())", sink=out)
        assert reply["status"] == "ok" and "42 from aws" in out.text, out.text
        assert there.record.spec.backend == "docker"
        platform.wait_for(lambda: instance_state(look, start.record) == "terminated", timeout=60)
        assert manager.get(start.id).state == State.STOPPED

        # and back to aws: the new instance's volume (the workspace's, kept in the region) takes
        # the files over its login while it boots, before its kernel restores, replacing them
        code = "kept['k'] = 1\nopen('notes.txt', 'w').write('from docker')"
        assert there.run(code, sink=Collect())["status"] == "ok"
        lines.clear()
        back, report = manager.switch(
            there,
            manager.switch_spec(there.id, {"backend": "aws", "ssh_cidr": SSH_CIDR}),
            lines.append,
        )
        said = "\n".join(lines)
        assert "move: workspace from docker (this machine's engine) to aws" in said, said
        assert said.index("instance: waiting for the workspace's files") < said.index(
            " to move, through this machine"
        ), said
        assert "workspace adw's files are in place on the new instance" in said, said
        assert said.index("move: moved ") < said.index("waiting for the kernel"), said
        assert report.restored["restored"] == ["kept"] and report.moved_bytes, report
        out = Collect()
        reply = back.run("print(kept['k'] + 1, open('notes.txt').read())", sink=out)
        assert reply["status"] == "ok" and "2 from docker" in out.text, out.text
        assert back.record.resource["volume_id"] == start.record.resource["volume_id"]
        assert manager.get(there.id).state == State.STOPPED
        manager.stop(back.id)
        let_go(back)

        # a stream cut halfway (its source fails) into a new instance lands nowhere: the start
        # fails with the source's error, the boot drops what came, the volume keeps what it held
        record = manager.create(spec_for(manager, name="ad4", resume="adw"))
        manager.backend("aws").import_while_starting(record.id, _cut_move(record))
        with pytest.raises(StageError, match="the source broke off"):
            manager.launch(record)
        iid = manager.get(record.id).resource["instance_id"]
        assert "the client stopped sending the workspace's files; nothing of them was kept" in (
            platform.console_text(iid)
        )
        again = manager.start(spec_for(manager, name="ad5", resume="adw"))
        out = Collect()
        code = "import os; print(kept['k'] + 1, open('notes.txt').read(), sorted(os.listdir()))"
        assert again.run(code, sink=out)["status"] == "ok", out.text
        assert "2 from docker" in out.text and "half" not in out.text, out.text
        assert ".gpusession-import" not in out.text, out.text
        manager.stop(again.id)
        let_go(again)
    finally:
        manager.stop_all()
        let_go(start)
        for volume in engine.volumes.list(filters={"label": "gpusession.workspace=adw"}):
            volume.remove(force=True)


def _cut_move(record):
    """A switch's move whose source breaks off halfway through a real tar stream."""
    import io
    import tarfile

    from gpusession.core.progress import Progress

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in (("workspace/half.bin", os.urandom(64 << 10)), ("workspace/b", b"x")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    whole = buffer.getvalue()

    def chunks():
        yield whole[: len(whole) // 2]
        raise StageError("move", "the source broke off")

    return lambda into: into(record, chunks(), Progress(None))


def test_a_switch_to_another_region_moves_the_workspace_by_snapshot_copy(
    manager, platform, look, aws_env, moto_server
):
    """`%gpu switch --region us-west-2`: the old session saves and stops, its volume moves by a
    snapshot copied across regions (how much and at what rate said before; the snapshot and
    the copy's progress shown), the variables and files come back there, and nothing is left
    in the old region. Then a `--resume` without --region goes where the workspace lives and
    says so (nothing moves); one with --region of the old region copies the volume there, and a
    copy that fails leaves it untouched and says so."""
    from gpusession.core.errors import GpuSessionError
    from gpusession.words.switches import switch_line
    from gpusession.words.workspaces import resumed_where_line
    from support.ec2 import Fault, inspector

    west = "us-west-2"
    platform.play_region(west)  # one machine at a time, whichever region
    look_west = inspector(moto_server.url, west)
    start, zone_a, vol_a = _started_with_work(manager, name="rg0", workspace="rg")
    lines: list[str] = []
    moved, report = manager.switch(
        start, manager.switch_spec(start.id, {"region": west, "name": "rg"}), lines.append
    )
    said = "\n".join(lines)
    zone_b = moved.record.resource["zone"]
    assert zone_b.startswith(west) and moved.record.resource["region"] == west, said
    assert (
        f"moving volume {vol_a} (1 GiB) from {zone_a} to {zone_b} (us-east-1 -> {west})" in said
    ), said
    assert "up to 1 GiB to copy" in said and "$0.02/GB: up to $0.02" in said, said
    assert said.index("saving the variables of rg0") < said.index("moving volume"), said
    assert f"copying to {west}" in said and said.count(": completed") == 2, said
    line = switch_line(report.to_dict())
    assert "moved 1 name(s) (kept)" in line and f"from aws {zone_a} to aws {zone_b})" in line, line
    assert manager.get(start.id).state == State.STOPPED
    assert _volumes(look, "rg") == []
    (vol_b,) = _volumes(look_west, "rg")
    assert vol_b["AvailabilityZone"] == zone_b
    ours = [{"Name": "tag:gpusession:store", "Values": [manager.store.store_id]}]
    for ec2 in (look, look_west):
        assert not ec2.describe_snapshots(Filters=ours)["Snapshots"]
    out = Collect()
    reply = moved.run("print(kept['k'] + 1, open('notes.txt').read())", sink=out)
    assert reply["status"] == "ok" and "42 moved" in out.text, out.text
    manager.stop(moved.id, save=True)
    let_go(start)
    let_go(moved)
    platform.wait_for(lambda: not platform.machines, timeout=30)

    # --resume without --region goes where the workspace lives (issue 32 §1), said at the start:
    # the volume is used where it is (nothing moves) and the variables come back there
    lines.clear()
    back = manager.start(spec_for(manager, name="rg2", resume="rg"), report=lines.append)
    note = resumed_where_line(back.record) or ""
    assert note.startswith(f"resuming workspace rg where it lives: aws on {west}"), note
    assert "(as session rg ran" in note, note
    assert back.record.resource["region"] == west, back.record.resource
    assert "moving volume" not in "\n".join(lines), lines
    (same,) = _volumes(look_west, "rg")
    assert same["VolumeId"] == vol_b["VolumeId"] and _volumes(look, "rg") == []
    out = Collect()
    reply = back.run("print(kept['k'] + 2)", sink=out)
    assert reply["status"] == "ok" and "43" in out.text, out.text
    manager.stop(back.id, save=True)
    let_go(back)
    platform.wait_for(lambda: not platform.machines, timeout=30)
    # --region us-east-1 --resume: the copy fails; the volume stays as it was, nothing is left
    aws_env.faults.append(Fault("CopySnapshot", "InternalError", "copy broke"))
    with pytest.raises(GpuSessionError) as failed:
        manager.start(spec_for(manager, name="rg3", resume="rg", region="us-east-1"))
    aws_env.faults.clear()
    text = str(failed.value)
    assert "workspace rg could not move to us-east-1" in text and "copy broke" in text, text
    assert f"its volume {vol_b['VolumeId']} in {zone_b} is untouched" in text, text
    assert "nothing else is left" in text, text
    (kept,) = _volumes(look_west, "rg")
    assert kept["VolumeId"] == vol_b["VolumeId"] and kept["State"] == "available"
    assert _volumes(look, "rg") == []
    for ec2 in (look, look_west):
        assert not ec2.describe_snapshots(Filters=ours)["Snapshots"]
        assert leftovers(ec2) == NOTHING


def test_a_switch_cut_at_every_step_on_aws_leaves_one_truth(manager, platform, aws_env, engine):
    """Issue 30 on aws (moto, the namespace host playing the instances): a switch in the region
    hands the workspace volume over (the new instance launches first, then the old session saves
    and stops); its driver is killed before the save, while the new instance launches, during
    the save, during a move to docker, and before the old session stops. The next `gpusession
    list` settles what it left: nothing stuck, nothing billing without a word (instances
    included), no variable lost - in a running session or saved in the workspace, said so."""
    from support.switchcut import assert_figures, cut_every_step

    same = ["--type", "a10g"]
    cases = cut_every_step(
        manager,
        lambda: manager.start(spec_for(manager, name="cuta", workspace="cuta")),
        same,
        None,
        "aws",
        plan=[
            ("before-save", same),
            ("launch", same),
            ("save", same),
            ("move", ["--backend", "docker", "--image", product_image()]),
            ("stop-old", same),
        ],
    )
    assert_figures(cases)
