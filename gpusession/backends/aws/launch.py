"""Creating an instance's pieces: image, network placement, key pair, security group, and the
RunInstances attempts (spot or on-demand, one zone after another) with capacity fallback."""

from __future__ import annotations

import dataclasses
import datetime
import os
import urllib.request
from typing import Any

from ...core.errors import BadInput, GpuSessionError, StageError
from .sdk import CAPACITY_CODES, QUOTA_CODES, Aws, error_code, error_message, explain

TAG_SESSION = "gpusession:session"
TAG_OWNER = "gpusession:owner"

# GPU-ready images (NVIDIA driver, Docker, NVIDIA container toolkit), tried in order. The Deep
# Learning Base AMI is the one meant for this; the ECS GPU-optimized ones are the fallback where
# it is not published (they run an idle ECS agent besides).
AMI_PARAMETERS = (
    "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id",
    "/aws/service/ecs/optimized-ami/amazon-linux-2023/gpu/recommended/image_id",
    "/aws/service/ecs/optimized-ami/amazon-linux-2/gpu/recommended/image_id",
)
FALLBACKS = ("off", "zone", "on-demand", "any")
CHECKIP_URL = "https://checkip.amazonaws.com"


def tags(session_id: str, owner: str, name: str) -> list[dict[str, str]]:
    return [
        {"Key": TAG_SESSION, "Value": session_id},
        {"Key": TAG_OWNER, "Value": owner[:255]},
        {"Key": "Name", "Value": name[:255]},
    ]


def tag_spec(resource_type: str, tag_list: list[dict[str, str]]) -> list[dict[str, Any]]:
    return [{"ResourceType": resource_type, "Tags": tag_list}]


# -- image ---------------------------------------------------------------------------------------


def resolve_ami(aws: Aws, extra: dict) -> tuple[str, str]:
    """(image id, where it came from): --ami / GPUSESSION_AWS_AMI, else the first SSM public
    parameter that exists in the region (--ami-parameter replaces the list)."""
    explicit = extra.get("ami") or os.environ.get("GPUSESSION_AWS_AMI")
    if explicit:
        return str(explicit), "given"
    names = [extra["ami_parameter"]] if extra.get("ami_parameter") else list(AMI_PARAMETERS)
    missing = []
    for name in names:
        try:
            value = aws.ssm.get_parameter(Name=name)["Parameter"]["Value"]
        except Exception as exc:  # noqa: BLE001 - sorted below
            if error_code(exc) in ("ParameterNotFound", "ParameterVersionNotFound"):
                missing.append(name)
                continue
            raise explain(exc, f"looking up the image {name}", aws.region) from None
        return value, f"SSM {name}"
    raise StageError(
        "provision",
        f"no GPU image found in {aws.region}: none of the SSM parameters {', '.join(missing)} exists there; "
        "pass --ami ami-... (an image with the NVIDIA driver, Docker and the NVIDIA container toolkit)",
    )


# -- network ---------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Subnet:
    id: str
    zone: str
    vpc: str


def subnets(aws: Aws, extra: dict, instance_type: str) -> list[Subnet]:
    """--subnet, else the default VPC's default subnet in every zone that offers the type."""
    ec2 = aws.ec2
    if extra.get("subnet"):
        found = ec2.describe_subnets(SubnetIds=[str(extra["subnet"])])["Subnets"]
        return [Subnet(s["SubnetId"], s["AvailabilityZone"], s["VpcId"]) for s in found]
    vpcs = ec2.describe_vpcs(Filters=[{"Name": "is-default", "Values": ["true"]}])["Vpcs"]
    if not vpcs:
        raise StageError(
            "provision",
            f"{aws.region} has no default VPC: pass --subnet subnet-... (one with a route to the internet)",
        )
    found = ec2.describe_subnets(
        Filters=[
            {"Name": "vpc-id", "Values": [vpcs[0]["VpcId"]]},
            {"Name": "default-for-az", "Values": ["true"]},
        ]
    )["Subnets"]
    offered = zones_offering(aws, instance_type)
    result = [
        Subnet(s["SubnetId"], s["AvailabilityZone"], s["VpcId"])
        for s in found
        if offered is None or s["AvailabilityZone"] in offered
    ]
    if not result:
        raise StageError(
            "provision",
            f"no zone of {aws.region} offers {instance_type}: try another --region or --type",
        )
    return sorted(result, key=lambda s: s.zone)


def zones_offering(aws: Aws, instance_type: str) -> set[str] | None:
    """Zones that offer the type; None when the API cannot say (then every zone is tried)."""
    try:
        pages = aws.ec2.get_paginator("describe_instance_type_offerings").paginate(
            LocationType="availability-zone",
            Filters=[{"Name": "instance-type", "Values": [instance_type]}],
        )
        zones = {o["Location"] for page in pages for o in page["InstanceTypeOfferings"]}
    except Exception:  # noqa: BLE001 - an optional refinement
        return None
    return zones or None


def caller_cidr(extra: dict) -> str:
    """Who may reach the instance's sshd: --ssh-cidr, else this machine's public IPv4 /32."""
    given = extra.get("ssh_cidr") or os.environ.get("GPUSESSION_AWS_SSH_CIDR")
    if given:
        import ipaddress

        try:
            return str(ipaddress.ip_network(str(given), strict=False))
        except ValueError:
            raise BadInput(
                f"--ssh-cidr {given!r} is not an address range such as 203.0.113.7/32"
            ) from None
    try:
        with urllib.request.urlopen(CHECKIP_URL, timeout=10) as reply:
            address = reply.read().decode().strip()
    except OSError as exc:
        raise StageError(
            "provision",
            f"cannot learn this machine's public address from {CHECKIP_URL} ({exc}); "
            "pass --ssh-cidr 203.0.113.7/32 (the address your SSH comes from)",
        ) from None
    return f"{address}/32"


def create_security_group(aws: Aws, name: str, vpc: str, cidr: str, tag_list: list[dict]) -> str:
    ec2 = aws.ec2
    group = ec2.create_security_group(
        GroupName=name,
        VpcId=vpc,
        Description=f"gpusession: ssh from {cidr} only",
        TagSpecifications=tag_spec("security-group", tag_list),
    )["GroupId"]
    ranges = (
        {"Ipv6Ranges": [{"CidrIpv6": cidr, "Description": "gpusession ssh"}]}
        if ":" in cidr
        else {"IpRanges": [{"CidrIp": cidr, "Description": "gpusession ssh"}]}
    )
    ec2.authorize_security_group_ingress(
        GroupId=group, IpPermissions=[{"IpProtocol": "tcp", "FromPort": 22, "ToPort": 22, **ranges}]
    )
    return group


def import_key_pair(aws: Aws, name: str, public_line: str, tag_list: list[dict]) -> str:
    aws.ec2.import_key_pair(
        KeyName=name,
        PublicKeyMaterial=public_line.encode(),
        TagSpecifications=tag_spec("key-pair", tag_list),
    )
    return name


def instance_params(
    *,
    ami: str,
    instance_type: str,
    key_name: str,
    group: str,
    public_ip: bool,
    tag_list: list[dict],
) -> dict[str, Any]:
    """RunInstances parameters every attempt shares (the attempt adds subnet, market, user data)."""
    return {
        "ImageId": ami,
        "InstanceType": instance_type,
        "MinCount": 1,
        "MaxCount": 1,
        "KeyName": key_name,
        # the idle watchdog powers the machine off; EC2 then terminates it, so nothing bills on
        "InstanceInitiatedShutdownBehavior": "terminate",
        "NetworkInterfaces": [
            {
                "DeviceIndex": 0,
                "Groups": [group],
                "AssociatePublicIpAddress": public_ip,
                "DeleteOnTermination": True,
            }
        ],
        # IMDSv2 only, one hop: containers cannot read the user data (it holds the host keys)
        "MetadataOptions": {
            "HttpTokens": "required",
            "HttpPutResponseHopLimit": 1,
            "HttpEndpoint": "enabled",
        },
        "TagSpecifications": tag_spec("instance", tag_list) + tag_spec("volume", tag_list),
    }


# -- prices and attempts ---------------------------------------------------------------------------


def spot_prices(aws: Aws, instance_type: str) -> dict[str, float]:
    """Zone -> the latest Linux spot price of the type ({} when AWS does not say)."""
    reply = aws.ec2.describe_spot_price_history(
        InstanceTypes=[instance_type],
        ProductDescriptions=["Linux/UNIX"],
        StartTime=datetime.datetime.now(datetime.timezone.utc),
        MaxResults=100,
    )
    latest: dict[str, tuple[Any, float]] = {}
    for item in reply.get("SpotPriceHistory", []):
        zone, at, price = item["AvailabilityZone"], item["Timestamp"], float(item["SpotPrice"])
        if zone not in latest or at > latest[zone][0]:
            latest[zone] = (at, price)
    return {zone: price for zone, (at, price) in latest.items()}


@dataclasses.dataclass(frozen=True)
class Attempt:
    spot: bool
    subnet: Subnet

    def describe(self, instance_type: str) -> str:
        return f"{instance_type} {'spot' if self.spot else 'on-demand'} in {self.subnet.zone}"


def fallback_mode(extra: dict) -> str:
    mode = str(extra.get("fallback") or "off").strip().lower()
    if mode not in FALLBACKS:
        raise BadInput(f"--fallback {mode!r}: use one of {', '.join(FALLBACKS)}")
    return mode


def attempts(
    spot: bool, mode: str, places: list[Subnet], prices: dict[str, float]
) -> list[Attempt]:
    """The order to try: the cheapest zone first; other zones ('zone'), on-demand ('on-demand'),
    or both ('any') only when the user allowed it."""
    if spot:
        places = sorted(places, key=lambda s: (prices.get(s.zone, float("inf")), s.zone))
    first = [Attempt(spot, places[0])]
    zones = [Attempt(spot, s) for s in places] if mode in ("zone", "any") else first
    if not spot or mode in ("off", "zone"):
        return zones
    on_demand = [Attempt(False, s) for s in (places if mode == "any" else places[:1])]
    return zones + on_demand


def ordered(plan: list[Attempt], *, first: str = "", last: str = "") -> list[Attempt]:
    """The plan with spot before on-demand as it was, and within each market the zone `first`
    (a kept workspace volume's: no move) first and the zone `last` (a recovery's interrupted
    zone) last; otherwise in the plan's order (cheapest first)."""
    return sorted(
        plan,
        key=lambda a: (
            not a.spot,
            a.subnet.zone == last,
            a.subnet.zone != first if first else False,
        ),
    )


class NoCapacity(GpuSessionError):
    """Every allowed attempt failed for lack of capacity (or of spot quota)."""

    def __init__(self, failures: list[str], quota: bool):
        self.failures = failures
        self.quota = quota  # a quota error was among them
        super().__init__("; ".join(failures))


def run_first_that_fits(
    aws: Aws,
    base: dict,
    plan: list[Attempt],
    *,
    instance_type: str,
    client_token: str,
    max_price: float | None,
    on_attempt,
) -> tuple[dict, Attempt, list[str]]:
    """RunInstances for each attempt until one is accepted; returns (instance, attempt, failures).
    Capacity errors go on to the next attempt; a spot quota error skips to on-demand."""
    failures: list[str] = []
    quota = False
    for number, attempt in enumerate(plan):
        if attempt.spot and quota:
            continue
        params = dict(
            base, ClientToken=f"{client_token}-{number}"
        )  # a retried call never makes two
        params.update(on_attempt(attempt) or {})  # per attempt: the user data (the agent's price)
        params["NetworkInterfaces"] = [
            dict(base["NetworkInterfaces"][0], SubnetId=attempt.subnet.id)
        ]
        if attempt.spot:
            options: dict[str, Any] = {
                "SpotInstanceType": "one-time",
                "InstanceInterruptionBehavior": "terminate",
            }
            if max_price:
                options["MaxPrice"] = f"{max_price:.4f}"
            params["InstanceMarketOptions"] = {"MarketType": "spot", "SpotOptions": options}
        try:
            return aws.ec2.run_instances(**params)["Instances"][0], attempt, failures
        except Exception as exc:  # noqa: BLE001 - sorted below
            code = error_code(exc)
            if code in CAPACITY_CODES or (attempt.spot and code in QUOTA_CODES):
                failures.append(f"{attempt.describe(instance_type)}: {code}: {error_message(exc)}")
                quota = quota or code in QUOTA_CODES
                continue
            raise explain(exc, f"launching {attempt.describe(instance_type)}", aws.region) from None
    raise NoCapacity(failures, quota)
