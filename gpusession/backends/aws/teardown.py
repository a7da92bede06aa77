"""Finding and removing a session's AWS pieces (instance, key pair, security group), and reading
why an instance ended."""

from __future__ import annotations

import time
from collections import defaultdict

from ...core.protocol import StopDetails, StopKind, StopReason
from ..base import RemoteResource, stop_details_from_log
from .launch import TAG_SESSION
from .sdk import Aws, aws_errors, error_code, explain

LIVE_STATES = ["pending", "running", "stopping", "stopped", "shutting-down"]
ENDING = ("shutting-down", "terminated")
GROUP_DELETE_WAIT_S = 120.0  # the group stays "in use" for a while after the instance is gone


class Teardown:
    def __init__(self, aws: Aws, *, poll_s: float = 5.0, terminate_wait_s: float = 600.0):
        self.aws = aws
        self.poll_s = poll_s
        self.terminate_wait_s = terminate_wait_s

    def session(self, session_id: str, *, instance_ids, key_names, group_ids) -> None:
        """Terminate the session's instances, wait until they are gone, then delete its key pair
        and security group. Saved handles and tag lookups both count; gone is fine."""
        try:
            self._terminate(
                {i for i in instance_ids if i} | set(self._tagged_instances(session_id))
            )
            for name in {k for k in key_names if k} | set(self._tagged_key_pairs(session_id)):
                self._quiet(
                    lambda: self.aws.ec2.delete_key_pair(KeyName=name), "InvalidKeyPair.NotFound"
                )
            for group in {g for g in group_ids if g} | set(self._tagged_groups(session_id)):
                self._delete_group(group)
        except aws_errors() as exc:
            raise explain(
                exc, f"removing the AWS resources of session {session_id[:8]}", self.aws.region
            ) from None

    def _terminate(self, ids: set[str]) -> None:
        live = [iid for iid, state in self._states(ids).items() if state != "terminated"]
        if not live:
            return
        try:
            self.aws.ec2.terminate_instances(InstanceIds=live)
        except aws_errors():
            # the instance may be ending on its own meanwhile (its boot script shuts it down when
            # a pull fails; a spot reclaim): EC2 can answer that terminate with an error, and the
            # key pair and group must still go. Only one that is not ending is a real failure.
            if any(s not in ENDING for s in self._states(set(live)).values()):
                raise
        self.aws.ec2.get_waiter("instance_terminated").wait(
            InstanceIds=live,
            WaiterConfig={
                "Delay": self.poll_s,
                "MaxAttempts": max(1, int(self.terminate_wait_s / self.poll_s)),
            },
        )

    def _states(self, ids: set[str]) -> dict[str, str]:
        """The state of each of `ids` that EC2 knows."""
        states = {}
        for iid in sorted(ids):
            try:
                found = self.aws.ec2.describe_instances(InstanceIds=[iid])["Reservations"]
            except aws_errors() as exc:
                if error_code(exc) == "InvalidInstanceID.NotFound":
                    continue
                raise
            if found:
                states[iid] = found[0]["Instances"][0]["State"]["Name"]
        return states

    def _delete_group(self, group: str) -> None:
        deadline = time.monotonic() + GROUP_DELETE_WAIT_S
        while True:
            try:
                self.aws.ec2.delete_security_group(GroupId=group)
                return
            except aws_errors() as exc:
                code = error_code(exc)
                if code == "InvalidGroup.NotFound":
                    return
                if code != "DependencyViolation" or time.monotonic() > deadline:
                    raise
            time.sleep(self.poll_s)

    @staticmethod
    def _quiet(call, *codes: str) -> None:
        try:
            call()
        except aws_errors() as exc:
            if error_code(exc) not in codes:
                raise

    # -- lookups by tag -------------------------------------------------------------------

    def _instances(self, filters: list[dict]) -> list[dict]:
        pages = self.aws.ec2.get_paginator("describe_instances").paginate(Filters=filters)
        return [i for page in pages for r in page["Reservations"] for i in r["Instances"]]

    def _tagged_instances(self, session_id: str) -> list[str]:
        return [
            i["InstanceId"]
            for i in self._instances(
                [
                    {"Name": f"tag:{TAG_SESSION}", "Values": [session_id]},
                    {"Name": "instance-state-name", "Values": LIVE_STATES},
                ]
            )
        ]

    def _tagged_key_pairs(self, session_id: str) -> list[str]:
        pairs = self.aws.ec2.describe_key_pairs(
            Filters=[{"Name": f"tag:{TAG_SESSION}", "Values": [session_id]}]
        )
        return [k["KeyName"] for k in pairs["KeyPairs"]]

    def _tagged_groups(self, session_id: str) -> list[str]:
        groups = self.aws.ec2.describe_security_groups(
            Filters=[{"Name": f"tag:{TAG_SESSION}", "Values": [session_id]}]
        )
        return [g["GroupId"] for g in groups["SecurityGroups"]]

    def find(self, backend: str) -> list[RemoteResource]:
        """One resource per session that has anything tagged here: its instance(s) if any are
        not terminated, else the key pair and security group it left."""
        ec2 = self.aws.ec2
        by_session: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
        tag_key = [{"Name": "tag-key", "Values": [TAG_SESSION]}]
        for inst in self._instances(
            tag_key + [{"Name": "instance-state-name", "Values": LIVE_STATES}]
        ):
            by_session[_tag(inst)]["instances"].append(inst)
        for pair in ec2.describe_key_pairs(Filters=tag_key)["KeyPairs"]:
            by_session[_tag(pair)]["key_names"].append(pair["KeyName"])
        for group in ec2.describe_security_groups(Filters=tag_key)["SecurityGroups"]:
            by_session[_tag(group)]["group_ids"].append(group["GroupId"])
        found = []
        for session_id, parts in sorted(by_session.items()):
            instances = parts["instances"]
            leftovers = [f"key pair {k}" for k in parts["key_names"]] + [
                f"security group {g}" for g in parts["group_ids"]
            ]
            if instances:
                what = ", ".join(
                    f"EC2 instance {i['InstanceId']} ({i['InstanceType']}, {i['State']['Name']})"
                    for i in instances
                )
                description = f"{what} in {self.aws.region}" + (
                    f" with its {' and '.join(leftovers)}" if leftovers else ""
                )
            else:
                description = f"{' and '.join(leftovers)} in {self.aws.region} (no instance left)"
            found.append(
                RemoteResource(
                    backend=backend,
                    session_id=session_id,
                    resource_id=instances[0]["InstanceId"]
                    if instances
                    else (parts["key_names"] or parts["group_ids"])[0],
                    description=description,
                    running=any(
                        i["State"]["Name"] in ("pending", "running", "stopping") for i in instances
                    ),
                    details={
                        "region": self.aws.region,
                        "instance_ids": [i["InstanceId"] for i in instances],
                        "key_names": list(parts["key_names"]),
                        "group_ids": list(parts["group_ids"]),
                    },
                )
            )
        return found


def _tag(item: dict) -> str:
    return next((t["Value"] for t in item.get("Tags", []) if t["Key"] == TAG_SESSION), "")


def console_details(aws: Aws, instance_id: str) -> StopDetails | None:
    """The agent's last markers as the boot script copied them to the serial console (None when
    the console shows none, or cannot be read)."""
    try:  # botocore decodes the base64 itself
        text = aws.ec2.get_console_output(InstanceId=instance_id).get("Output") or ""
    except aws_errors():
        return None
    return stop_details_from_log(text)


def ended_reason(inst: dict | None, interrupted: bool) -> StopReason | None:
    """Why EC2 says the instance ended (None while it runs): a spot interruption, else its
    state and state reason as EC2 gives them."""
    if inst is None:
        return StopReason(StopKind.SPOT_INTERRUPTION if interrupted else StopKind.GONE)
    state = inst["State"]["Name"]
    if state in ("pending", "running"):
        return None
    state_reason = inst.get("StateReason") or {}
    message = state_reason.get("Message") or state_reason.get("Code")
    if interrupted or state_reason.get("Code") == "Server.SpotInstanceTermination":
        return StopReason(StopKind.SPOT_INTERRUPTION, detail=message)
    return StopReason(StopKind.INSTANCE_ENDED, detail=f"{state}: {message}" if message else state)
