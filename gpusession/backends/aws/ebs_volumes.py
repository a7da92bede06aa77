"""A session's workspace on AWS: a tagged EBS volume (gp3) that outlives its instances.

The volume is found by its tags (the store's id and the workspace's name) in the session's region,
made when new (in the zone the instance will be launched in), and attached once the instance runs.
A volume attached after launch keeps `DeleteOnTermination` false, so terminating the instance
detaches it and leaves it `available`; `verify_kept` checks it anyway. Only `remove` (the user's
`gpusession workspaces rm NAME --yes`) deletes one; gc never does.

The instance's boot script (session.sh) waits for the device, makes a filesystem only when it has
none, and gives it to the session's container at /workspace.
"""

from __future__ import annotations

import time
from typing import Any

from ...core.errors import BackendUnavailable, BadInput, GpuSessionError, StageError
from ...core.textvalues import gib_size
from ..base import Workspace
from .launch import TAG_OWNER, Subnet
from .sdk import Aws, aws_errors, error_code, explain

TAG_WORKSPACE = "gpusession:workspace"
TAG_STORE = "gpusession:store"
TAG_MOVED_FROM = "gpusession:moved-from"  # the volume a snapshot moved the workspace from
DEFAULT_SIZE_GIB = 50
DEVICE = "/dev/sdf"  # the name it is attached as (a Nitro instance shows it as an NVMe disk: by-id has its id)
# gp3 storage, us-east-1, per GiB-month (https://aws.amazon.com/ebs/pricing/, 2024); other regions
# cost up to ~30% more: the listing's figure is an estimate, like the catalog's instance prices
GP3_USD_PER_GIB_MONTH = 0.08
# A snapshot copied to another region is billed as data transferred out of the source region:
# $0.02/GB from us-east-1 and the other US and most EU regions ("Data Transfer OUT From Amazon EC2
# To Another AWS Region", https://aws.amazon.com/ec2/pricing/on-demand/#Data_Transfer, which
# https://aws.amazon.com/ebs/pricing/ names for snapshot copies; 2024); some Asia Pacific, South
# America, Middle East and Africa regions charge more: an estimate, said as one
CROSS_REGION_USD_PER_GB = 0.02
ATTACH_WAIT_S = 120.0
SNAPSHOT_WAIT_S = 3600.0  # a first snapshot of a big volume takes minutes to tens of minutes


def size_gib(extra: dict) -> int:
    """--workspace-size (whole GiB) of a new workspace's volume; DEFAULT_SIZE_GIB when not given."""
    value = extra.get("workspace_size")
    return DEFAULT_SIZE_GIB if value in (None, "") else gib_size(str(value))


def monthly_cost(size: int) -> float:
    return round(size * GP3_USD_PER_GIB_MONTH, 2)


def _filters(store_id: str, name: str | None = None) -> list[dict[str, Any]]:
    found = [{"Name": f"tag:{TAG_STORE}", "Values": [store_id]}]
    if name is not None:
        found.append({"Name": f"tag:{TAG_WORKSPACE}", "Values": [name]})
    else:
        found.append({"Name": "tag-key", "Values": [TAG_WORKSPACE]})
    return found


def find(aws: Aws, store_id: str, name: str) -> dict | None:
    found = [
        v
        for v in aws.ec2.describe_volumes(Filters=_filters(store_id, name))["Volumes"]
        if v["State"] not in ("deleting", "deleted")
    ]
    return found[0] if found else None


def listed(aws: Aws, store_id: str) -> list[dict]:
    return [
        v
        for v in aws.ec2.describe_volumes(Filters=_filters(store_id))["Volumes"]
        if v["State"] not in ("deleting", "deleted")
    ]


def tag(volume: dict, key: str) -> str:
    return next((t["Value"] for t in volume.get("Tags") or [] if t["Key"] == key), "")


class WorkspaceVolume:
    """The session's workspace volume while it starts. A kept volume decides the zone: the
    instance goes there (an EBS volume attaches only in its own zone). A new one is made, per
    launch attempt, in that attempt's zone; when an attempt fails for capacity and the next one
    is in another zone, the fresh (never attached, empty) volume moves with it."""

    def __init__(
        self,
        aws: Aws,
        *,
        store_id: str,
        owner: str,
        name: str,
        extra: dict,
        say,
        release=None,
        look_in=(),
        may_move=False,
    ):
        self.aws, self.store_id, self.owner, self.name, self.extra, self.say = (
            aws,
            store_id,
            owner,
            name,
            extra,
            say,
        )
        self.volume = find(aws, store_id, name)
        self.home = aws  # the region the volume is in
        self.fresh = False  # made by this start
        if self.volume is None and extra.get("resume"):
            self._look_elsewhere(look_in, may_move)
        if self.volume is None and extra.get("resume"):
            raise StageError(
                "provision",
                f"no workspace {name} in {aws.region} to resume "
                "(`gpusession workspaces` lists them)",
            )
        self.release = release  # a switch's: frees the volume (the old session saves and stops)
        self.moved_from = ""  # the zone a snapshot moved the volume from
        self.moved_bytes = 0  # the size of the volume it moved (a snapshot copies what is used)
        if self.volume is not None:
            v = self.volume
            if v["State"] != "available" and release is None:
                users = ", ".join(a.get("InstanceId", "?") for a in v.get("Attachments") or [])
                raise StageError(
                    "provision",
                    f"workspace {name}'s volume {v['VolumeId']} is {v['State']}"
                    f"{' (attached to ' + users + ')' if users else ''}: "
                    "stop the session that uses it first",
                )
            say(
                f"workspace {name}: volume {v['VolumeId']} ({v['Size']} GiB) in {v['AvailabilityZone']}, "
                "kept from an earlier session"
                + (f"; it moves to {aws.region}" if self.home is not aws else "")
            )

    def _look_elsewhere(self, look_in, may_move: bool) -> None:
        """A resumed workspace that is not in this start's region: found in another region the
        store's sessions used, it moves here when the start named this region (`may_move`: a
        switch's or resume's --region); otherwise the start stops and says where it is."""
        for other in look_in:
            found = find(other, self.store_id, self.name)
            if found is None:
                continue
            if not may_move:
                raise BadInput(
                    f"workspace {self.name} is in {other.region}, not {self.aws.region}: add "
                    f"--region {other.region} to resume it there, or --region {self.aws.region} "
                    f"to move it here (a snapshot copied across regions, "
                    f"${CROSS_REGION_USD_PER_GB:.2f}/GB)"
                )
            self.volume, self.home = found, other
            return

    def _tags(self) -> list[dict[str, str]]:
        """The tags of the workspace's volume (the snapshot that moves it: all but the first)."""
        return [
            {"Key": TAG_WORKSPACE, "Value": self.name},
            {"Key": TAG_STORE, "Value": self.store_id},
            {"Key": TAG_OWNER, "Value": self.owner[:255]},
            {"Key": "Name", "Value": f"gpusession-ws-{self.name}"},
        ]

    @property
    def volume_id(self) -> str:
        return self.volume["VolumeId"] if self.volume else ""

    def places(self, places: list[Subnet], *, zones_allowed: bool) -> list[Subnet]:
        """The subnets an instance may use. A kept volume's zone comes first (the volume attaches
        there as it is); the other zones follow when the start allows them (`zones_allowed`:
        --fallback zone/any, a recovery) or when its zone cannot have the instance at all: an
        instance there gets the volume moved by snapshot (`in_zone`)."""
        if self.volume is None:
            return places
        if self.home is not self.aws:
            return places  # it moves to the region by snapshot copy: any zone there
        zone = self.volume["AvailabilityZone"]
        here = [s for s in places if s.zone == zone]
        if here and not zones_allowed:
            return here
        if not here:
            offered = ", ".join(sorted({s.zone for s in places})) or "none"
            self.say(
                f"workspace {self.name}: its volume {self.volume_id} is in {zone}, where the "
                f"instance cannot be launched (the zones allowed: {offered}); it moves by snapshot"
            )
        return here + [s for s in places if s.zone != zone]

    def in_zone(self, zone: str) -> str:
        """The volume id for an instance launched in `zone` (made there when new)."""
        if self.volume is not None and self.home is not self.aws:
            return self._move_region(zone)
        if self.volume is not None and self.volume["AvailabilityZone"] == zone:
            return self.volume_id
        if self.volume is not None and not self.fresh:  # kept: its files move by snapshot
            return self._move(zone)
        if self.volume is not None:  # fresh, never attached: it moves to the next attempt's zone
            remove(self.aws, self.volume_id)
        size = size_gib(self.extra)
        self.say(
            f"workspace {self.name}: new {size} GiB gp3 volume in {zone} "
            f"(${monthly_cost(size):.2f}/month while kept)"
        )
        tag_list = self._tags()
        self.volume = self.aws.ec2.create_volume(
            AvailabilityZone=zone,
            Size=size,
            VolumeType="gp3",
            TagSpecifications=[{"ResourceType": "volume", "Tags": tag_list}],
        )
        self.fresh = True
        _wait(self.aws, self.volume_id, "available")
        return self.volume_id

    def released(self) -> None:
        """The volume free to attach: a switch's old session saved and stopped first (once)."""
        release, self.release = self.release, None
        if release is None:
            return
        release()
        _wait(self.home, self.volume_id, "available")
        self.volume = self.home.ec2.describe_volumes(VolumeIds=[self.volume_id])["Volumes"][0]

    def _freed(self) -> tuple[dict, str, int, str]:
        """The kept volume once free to move (a switch's old session stopped): it, its id, size
        (GiB) and zone."""
        self.released()
        old = self.volume
        assert old is not None
        return old, old["VolumeId"], old["Size"], old["AvailabilityZone"]

    def _from_snapshot(self, aws: Aws, zone: str, snapshot: str) -> dict:
        """A volume like the workspace's, in `zone`, from its snapshot (tagged with the old id)."""
        old = self.volume or {}
        return aws.ec2.create_volume(
            AvailabilityZone=zone,
            SnapshotId=snapshot,
            VolumeType=old.get("VolumeType") or "gp3",
            TagSpecifications=[
                {
                    "ResourceType": "volume",
                    "Tags": [
                        *self._tags(),
                        {"Key": TAG_MOVED_FROM, "Value": old.get("VolumeId", "")},
                    ],
                }
            ],
        )

    def _move(self, zone: str) -> str:
        """The kept volume's files into a new volume in `zone`: a snapshot of it, a volume from
        the snapshot, then the old volume and the snapshot deleted (the new one is the workspace)."""
        old, old_id, size, source = self._freed()
        self.say(
            f"workspace {self.name}: moving volume {old_id} ({size} GiB, "
            f"${monthly_cost(size):.2f}/month) from {source} to {zone} by snapshot "
            f"(up to {size} GiB to copy; the snapshot is billed while it exists, minutes)"
        )
        tag_list = self._tags()
        snap = self.aws.ec2.create_snapshot(
            VolumeId=old_id,
            Description=f"gpusession: workspace {self.name} moving to {zone}",
            TagSpecifications=[{"ResourceType": "snapshot", "Tags": tag_list[1:]}],
        )["SnapshotId"]
        try:
            _wait_snapshot(self.aws, snap, self.say)
            self.volume = self._from_snapshot(self.aws, zone, snap)
            _wait(self.aws, self.volume_id, "available")
        finally:
            self.aws.ec2.delete_snapshot(SnapshotId=snap)
        remove(self.aws, old_id)
        self.moved_from, self.moved_bytes = source, size * 2**30
        self.say(f"workspace {self.name}: now volume {self.volume_id} in {zone}")
        return self.volume_id

    def _move_region(self, zone: str) -> str:
        """The kept volume, in another region, into a new volume in `zone` of this start's
        region: a snapshot there, copied here (CopySnapshot), a volume from the copy; then both
        snapshots and the old volume deleted. A failure on the way deletes what the move made
        and leaves the old volume as it was (the workspace stays there, and says so)."""
        old, old_id, size, source = self._freed()
        src, dst = self.home, self.aws
        self.say(
            f"workspace {self.name}: moving volume {old_id} ({size} GiB) from {source} to {zone} "
            f"({src.region} -> {dst.region}): a snapshot, copied across regions, then a volume "
            f"from the copy; up to {size} GiB to copy (the blocks its files use), billed as "
            f"inter-region data transfer at about ${CROSS_REGION_USD_PER_GB:.2f}/GB: up to "
            f"${size * CROSS_REGION_USD_PER_GB:.2f}, plus the snapshots while they exist (minutes)"
        )
        tag_list = self._tags()
        made: list[tuple[Aws, str]] = []  # (region, snapshot or volume id) to delete after
        try:
            snap = src.ec2.create_snapshot(
                VolumeId=old_id,
                Description=f"gpusession: workspace {self.name} moving to {dst.region}",
                TagSpecifications=[{"ResourceType": "snapshot", "Tags": tag_list[1:]}],
            )["SnapshotId"]
            made.append((src, snap))
            _wait_snapshot(src, snap, self.say)
            self.say(f"snapshot {snap}: copying to {dst.region}")
            copy = dst.ec2.copy_snapshot(
                SourceRegion=src.region,
                SourceSnapshotId=snap,
                Description=f"gpusession: workspace {self.name} from {src.region}",
                TagSpecifications=[{"ResourceType": "snapshot", "Tags": tag_list[1:]}],
            )["SnapshotId"]
            made.append((dst, copy))
            _wait_snapshot(dst, copy, self.say)
            volume = self._from_snapshot(dst, zone, copy)
            made.append((dst, volume["VolumeId"]))
            _wait(dst, volume["VolumeId"], "available")
        except BaseException as exc:
            left = _delete(made)
            why = _why(exc, dst.region)
            raise StageError(
                "provision",
                f"workspace {self.name} could not move to {dst.region} ({why}); its volume "
                f"{old_id} in {source} is untouched (`--region {src.region} --resume {self.name}` "
                f"uses it there); {'left behind: ' + ', '.join(left) if left else 'nothing else is left'}",
            ) from None
        left = _delete(made[:2])
        try:
            remove(src, old_id)
        except Exception as exc:  # noqa: BLE001 - said: the move itself landed
            left.append(f"volume {old_id} in {src.region} ({exc})")
        if left:
            self.say(
                f"workspace {self.name}: moved, but could not delete {', '.join(left)}: "
                "delete it in the EC2 console (it is billed while it exists)"
            )
        self.volume, self.home = volume, dst
        self.moved_from, self.moved_bytes = source, size * 2**30
        self.say(f"workspace {self.name}: now volume {self.volume_id} in {zone}")
        return self.volume_id


def _why(exc: BaseException, region: str) -> str:
    if isinstance(exc, StageError):
        return exc.message
    if isinstance(exc, GpuSessionError):
        return str(exc)
    if isinstance(exc, Exception):
        return str(explain(exc, "copying the snapshot", region))
    return "interrupted"


def _delete(made: list[tuple[Aws, str]]) -> list[str]:
    """Delete these snapshots and volumes (newest first); what could not be deleted, in words."""
    left = []
    for aws, item in reversed(made):
        try:
            if item.startswith("snap-"):
                aws.ec2.delete_snapshot(SnapshotId=item)
            else:
                remove(aws, item)
        except Exception as exc:  # noqa: BLE001 - said by the caller
            left.append(f"{item} in {aws.region} ({error_code(exc) or exc})")
    return left


def attach(aws: Aws, volume_id: str, instance_id: str) -> None:
    aws.ec2.attach_volume(VolumeId=volume_id, InstanceId=instance_id, Device=DEVICE)
    _wait(aws, volume_id, "in-use")
    verify_kept(aws, volume_id, instance_id)


def verify_kept(aws: Aws, volume_id: str, instance_id: str) -> None:
    """The attachment must not delete the volume with the instance (set it false if it would)."""
    found = aws.ec2.describe_instances(InstanceIds=[instance_id])["Reservations"][0]["Instances"][0]
    for mapping in found.get("BlockDeviceMappings") or []:
        ebs = mapping.get("Ebs") or {}
        if ebs.get("VolumeId") == volume_id and ebs.get("DeleteOnTermination"):
            aws.ec2.modify_instance_attribute(
                InstanceId=instance_id,
                BlockDeviceMappings=[
                    {
                        "DeviceName": mapping["DeviceName"],
                        "Ebs": {"VolumeId": volume_id, "DeleteOnTermination": False},
                    }
                ],
            )


def workspaces(backend, regions: list[str]) -> list:
    """`gpusession workspaces` on aws: one Workspace per volume of this store in these regions."""
    found = []
    for region in regions:
        try:
            kept = listed(backend.aws(region), backend.recorder.store_id)
        except aws_errors() as exc:
            raise BackendUnavailable(
                str(explain(exc, "listing workspace volumes", region))
            ) from None
        for v in kept:
            found.append(
                Workspace(
                    backend.name,
                    tag(v, TAG_WORKSPACE),
                    f"EBS volume {v['VolumeId']} ({v.get('VolumeType', 'gp3')}, "
                    f"{v['State']}) in {v['AvailabilityZone']}",
                    v["Size"] * 2**30,
                    monthly_cost=monthly_cost(v["Size"]),
                    in_use_by=[
                        a["InstanceId"] for a in v.get("Attachments") or [] if a.get("InstanceId")
                    ],
                    details={"region": region, "volume_id": v["VolumeId"]},
                )
            )
    return found


def remove(aws: Aws, volume_id: str) -> None:
    try:
        aws.ec2.delete_volume(VolumeId=volume_id)
    except Exception as exc:  # noqa: BLE001 - sorted below
        code = error_code(exc)
        if code == "InvalidVolume.NotFound":
            return
        if code == "VolumeInUse":
            raise BadInput(
                f"volume {volume_id} is attached to an instance; stop its session first"
            ) from None
        raise explain(exc, f"deleting volume {volume_id}", aws.region) from None


def _wait_snapshot(aws: Aws, snapshot_id: str, say) -> None:
    """Until the snapshot is completed, saying its progress every few seconds."""
    deadline = time.monotonic() + SNAPSHOT_WAIT_S
    last = ""
    while True:
        found = aws.ec2.describe_snapshots(SnapshotIds=[snapshot_id])["Snapshots"][0]
        if found["State"] == "completed":
            say(f"snapshot {snapshot_id}: completed")
            return
        if found["State"] == "error":
            raise StageError(
                "provision",
                f"snapshot {snapshot_id} failed: {found.get('StateMessage', 'no reason given')}",
            )
        progress = found.get("Progress") or "0%"
        if progress != last:
            say(f"snapshot {snapshot_id}: {progress}")
            last = progress
        if time.monotonic() > deadline:
            raise StageError(
                "provision",
                f"snapshot {snapshot_id} is {found['State']} ({progress}) after {SNAPSHOT_WAIT_S:.0f}s",
            )
        time.sleep(2)


def _wait(aws: Aws, volume_id: str, state: str) -> None:
    deadline = time.monotonic() + ATTACH_WAIT_S
    while True:
        found = aws.ec2.describe_volumes(VolumeIds=[volume_id])["Volumes"][0]
        if found["State"] == state:
            return
        if time.monotonic() > deadline:
            raise StageError(
                "provision",
                f"volume {volume_id} is {found['State']}, not {state}, after {ATTACH_WAIT_S:.0f}s",
            )
        time.sleep(1)
