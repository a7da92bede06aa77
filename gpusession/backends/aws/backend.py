"""`aws`: the session runs on its own EC2 GPU instance (on-demand or spot), made for it and
terminated with it.

    check       region known, credentials found and accepted, options valid
    provision   image (SSM public parameter), key pair, security group (ssh from the caller only),
                RunInstances with the boot plan as user data (capacity fallback when allowed),
                waiter until running
    connect     instance sshd (pinned host key): follow the boot, send the runtime bundle the
                image needs, forward the kernel's unix sockets and the agent's loopback port
    stop        terminate, wait until terminated, delete key pair and security group

Every piece carries the tags gpusession:session, gpusession:owner and Name, so `gpusession gc`
finds what a crashed process left, in the regions the store's sessions used.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from typing import Any

from ...configuration.agentargs import WORKSPACE_MOUNT, AgentArgs, workspace_name
from ...configuration.catalog import Catalog, CatalogColumn, GpuType, load_catalog
from ...configuration.cost import BILLED_FROM, CLOUD
from ...configuration.options import StartOption
from ...configuration.registry import load_backend_class
from ...configuration.settings import Setting, setting_value
from ...core import textvalues
from ...core.errors import BackendUnavailable, BadInput, GpuSessionError, NoCapacity, StageError
from ...core.models import LaunchSpec, SessionRecord
from ...core.progress import Progress
from ...core.protocol import StopDetails
from ...transport.pulls import PullLogin
from ..base import Backend, Link, ListedPrices, Place, RemoteResource, stop_details_from_log
from . import ebs_volumes, launch, pricing, pull_logins, workspace_stream
from .cheapest import Cheapest
from .instances import InstanceTable, instance_table, packaged_table
from .regions import price_regions, regions_setting
from .sdk import QUOTA_HINT, Aws, aws_errors, boto3_module, endpoint_url, error_code, explain
from .teardown import Teardown, console_details, ended_reason

SPOT_PRICE_TTL_S = 300.0  # spot prices move hourly at most: asked again after five minutes

#: where `live_prices` takes its spot prices from, in the words of `%gpu types --live`
LIVE_SOURCE = "AWS (DescribeSpotPriceHistory, asked at most every 5 minutes)"
log = logging.getLogger(__name__)

DEFAULT_BOOT_TIMEOUT_S = 900.0  # boot + image pull + container start
RUNNING_STATES = ("pending", "running")


class AwsBackend(Backend):
    name = "aws"
    keeps_workspaces = True  # an EBS volume per workspace
    shares_workspaces = False  # it attaches to one instance at a time
    settings = (
        Setting(
            "regions",
            "GPUSESSION_REGIONS",
            "",
            "AWS regions whose spot prices `--cheapest` and `%gpu types --live` compare, "
            "comma-separated (us-east-1,us-west-2); an administrator's policy narrows them to its "
            "allowed_regions. Empty means the policy's allowed regions, else the AWS default region.",
            parse=regions_setting,
            legacy="GpuSessionConfig.regions",
        ),
        Setting(
            "image",
            "GPUSESSION_AWS_IMAGE",
            "",
            "Image an aws session runs on its instance's Docker when --image names none. Empty "
            "means the docker backend's (c.DockerBackend.image).",
        ),
    )
    # its own words for how its capacity ends (words/stops.py takes them over its own)
    stop_words = {
        "spot-interruption": "AWS took the spot instance back",
        "instance-ended": "its instance ended: {detail}",
        "warning:spot-interruption": "spot interruption notice: AWS will {action} this instance at {time}",
    }
    place_option = "region"  # a volume in a region, never on this machine
    place_here = "the default region"
    takes_image = True
    image_help = "run on the instance's Docker; the docker backend's by default"
    order = 30
    price_source = "the instance's spot price when AWS tells it (--spot), else its table's spot or on-demand price (backends/aws/instances.json)"
    start_options = (  # (docs/aws.md)
        StartOption(
            "workspace_size",
            ("--workspace-size",),
            "text",
            "Workspace size (GiB)",
            "aws: a new workspace's gp3 volume in GiB (default 50)",
            "workspace size",
            reader=textvalues.gib_size,
        ),
        StartOption(
            "spot",
            ("--spot",),
            "bool",
            "Spot instance",
            "aws: use spot capacity",
            "spot",
            default=False,
            form=True,
        ),
        StartOption(
            "cheapest",
            ("--cheapest",),
            "bool",
            "Cheapest zone",
            "aws: spot, in the zone with the lowest current spot price of the allowed regions "
            "(--region, else AwsBackend.regions, your policy's, the AWS default); the next "
            "cheapest when one has no capacity",
            "cheapest",
            default=False,
            form=True,
        ),
        StartOption(
            "region",
            ("--region",),
            "text",
            "Region",
            "aws: region, e.g. us-east-1",
            "region",
            reader=textvalues.aws_region,
        ),
        StartOption(
            "ssh_cidr",
            ("--ssh-cidr",),
            "text",
            "SSH from",
            "aws: addresses allowed to SSH in, e.g. 203.0.113.7/32 (default: your address /32)",
            "SSH address range",
            max_len=64,
            reader=textvalues.address_range,
        ),
        StartOption(
            "fallback",
            ("--fallback",),
            "choice",
            "Capacity fallback",
            "aws: on a capacity error try another zone, on-demand, or both (default off)",
            "fallback",
            default="off",
            choices=("off", "zone", "on-demand", "any"),
        ),
        StartOption(
            "max_price",
            ("--max-price",),
            "money",
            "Max spot price ($/h)",
            "aws spot: highest $/hour to pay (default: the on-demand price)",
            "max price",
        ),
        StartOption(
            "ami",
            ("--ami",),
            "text",
            "Machine image",
            "aws: machine image id (default: a GPU image from SSM public parameters)",
            "machine image",
            reader=textvalues.machine_image,
        ),
    )

    def default_image(self) -> str | None:
        own = self.setting("image")
        if own:
            return own
        docker = load_backend_class("docker")  # the image a docker session runs, as it always was
        return setting_value(docker.__name__, docker.settings, "image", self.config)

    @classmethod
    def discover(cls, timeout: float = 4.0) -> list[Place]:
        """AWS credentials as boto3's chain finds them (env, profile, SSO, instance role): read,
        never used here (no call to AWS)."""
        try:
            session = boto3_module().Session()
            creds = session.get_credentials()
        except Exception:  # noqa: BLE001 - no SDK, a broken profile: no credentials, to setup
            return []
        if creds is None:
            return []
        region = session.region_name or "us-east-1"
        how = getattr(creds, "method", "") or "found"
        where = f"{region} ({endpoint_url()})" if endpoint_url() else region
        return [Place("aws", where, "on demand", cls.name, True, f"credentials: {how}")]

    def __init__(self, config, recorder):
        super().__init__(config, recorder)
        self._aws: dict[str, Aws] = {}
        # (region, instance type) -> (when asked, zone -> latest spot price)
        self._spot: dict[tuple[str, str], tuple[float, dict[str, float]]] = {}
        self._state_cache: dict[str, tuple[float, dict | None]] = {}
        self._last_words: dict[str, StopDetails] = {}  # id -> how it ended, read after a notice
        # id -> the login its instance pulls the image with (pull_logins.py): memory only
        self._pull_logins: dict[str, PullLogin | None] = {}
        self._handover: dict[str, Any] = {}  # new session id -> frees its workspace (a switch)
        self._imports: dict[str, Any] = {}  # new session id -> moves its workspace in (a switch)

    # a switch to another region moves the workspace volume itself (a snapshot copied across
    # regions, ebs_volumes.py), handed over as within a region: not a tar stream through this machine
    moves_workspaces_across_places = True

    def take_workspace_over(self, session_id: str, release) -> None:
        """`%gpu switch` from a running aws session (its workspace volume attached there): the
        next start of `session_id` calls `release()` (the old session saves and stops, so the
        volume is free) as late as it can: once its instance runs (same zone), or just before
        launching where the volume must first move by snapshot (another zone)."""
        if release is None:
            self._handover.pop(session_id, None)
        else:
            self._handover[session_id] = release

    def import_while_starting(self, session_id: str, move) -> None:
        """`%gpu switch` to aws from where its volume cannot be (docker, local, slurm): the next
        start of `session_id` boots with a fresh workspace volume and waits, before its kernel
        restores, for the files that `move(into)` sends (`into(record, chunks, progress)`: over
        the new instance's SSH login, backends/aws/workspace_stream.py). None forgets it."""
        if move is None:
            self._imports.pop(session_id, None)
        else:
            self._imports[session_id] = move

    def aws(self, region: str | None) -> Aws:
        key = region or ""
        if key not in self._aws:
            self._aws[key] = Aws(region)
        return self._aws[key]

    # -- before anything is recorded ------------------------------------------------------

    def check(self, spec: LaunchSpec) -> None:
        boto3_module()
        instance_table().instance_for(load_catalog().get(spec.gpu_type), spec.gpu_count)
        launch.fallback_mode(spec.extra)
        ebs_volumes.size_gib(spec.extra)
        if (
            spec.extra.get("max_price") is not None
            and _float(spec.extra["max_price"], "--max-price") <= 0
        ):
            raise BadInput("--max-price must be more than 0 dollars per hour")
        _float(spec.extra.get("boot_timeout", 1), "boot_timeout")
        if spec.extra.get("ssh_cidr"):
            launch.caller_cidr(spec.extra)  # validates the range
        if spec.extra.get("cheapest"):
            spec.extra["spot"] = True  # --cheapest compares spot prices: it is a spot start
            self.cheapest_regions(spec)  # a configuration the policy excludes: said now
        aws = self.aws(spec.extra.get("region"))
        aws.check_region()
        aws.check_credentials()
        try:  # credentials accepted, region enabled: before the session is recorded
            aws.ec2.describe_availability_zones(
                Filters=[{"Name": "state", "Values": ["available"]}]
            )
        except aws_errors() as exc:
            raise _unavailable(explain(exc, "checking access to EC2", aws.region)) from None

    def price_per_hour(self, spec: LaunchSpec, catalog: Catalog) -> float:
        """The whole instance: the current spot price (the cheapest zone, which is tried first)
        when AWS tells it, else its table's spot or on-demand price (instances.py)."""
        gpu, table = catalog.get(spec.gpu_type), instance_table()
        if spec.extra.get("spot") or spec.extra.get("cheapest"):
            instance_type = table.instance_for(gpu, spec.gpu_count).name
            regions = (
                self.cheapest_regions(spec)
                if spec.extra.get("cheapest")
                else [spec.extra.get("region")]
            )
            prices = [
                p for r in regions for p in self.spot_prices(self.aws(r), instance_type).values()
            ]
            if prices:
                return min(prices)
        return table.price(gpu, spec.gpu_count, spot=bool(spec.extra.get("spot")))

    @classmethod
    def gpu_rate(
        cls, catalog: Catalog, gpu: GpuType, count: int, *, spot: bool = False
    ) -> float | None:
        """Per GPU of its smallest instance (spot: typical), times `count`; None when no
        instance carries them (a MIG slice, more than the biggest carries)."""
        table = instance_table()
        try:
            table.instance_for(gpu, count)
        except BadInput:
            return None
        per_gpu = (spot and table.per_gpu(gpu, spot=True)) or table.per_gpu(gpu)
        return None if per_gpu is None else round(per_gpu * count, 6)

    @classmethod
    def catalog_prices(
        cls, catalog: Catalog, gpu: GpuType, count: int, *, spot: bool = False
    ) -> tuple[float, ...]:
        """Its table's price of the whole instance, and its per-GPU rate times `count`."""
        table = instance_table()
        try:
            whole = table.price(gpu, count, spot=spot)
        except BadInput:
            return ()
        rate = cls.gpu_rate(catalog, gpu, count, spot=spot)
        return (whole,) if rate is None else (rate, whole)

    @classmethod
    def catalog_columns(cls, catalog: Catalog) -> list[CatalogColumn]:
        return instance_table().columns(list(catalog.types))

    def cheapest_regions(self, spec: LaunchSpec) -> list[str | None]:
        """Where `--cheapest` looks: --region, else the configured regions the policy allows."""
        if spec.extra.get("region"):
            return [spec.extra.get("region")]
        return price_regions(self.setting("regions"))

    def price_basis(self, spec: LaunchSpec) -> str | None:
        return CLOUD

    def spot_prices(self, aws: Aws, instance_type: str) -> dict[str, float]:
        """Zone -> the current spot price, asked of AWS at most every SPOT_PRICE_TTL_S."""
        key = (aws.region, instance_type)
        at, prices = self._spot.get(key, (0.0, {}))
        if time.monotonic() - at > SPOT_PRICE_TTL_S or key not in self._spot:
            try:
                prices = launch.spot_prices(aws, instance_type)
            except aws_errors() as exc:
                log.info("no spot price history for %s in %s: %s", instance_type, aws.region, exc)
                return {}
            self._spot[key] = (time.monotonic(), prices)
        return prices

    def live_prices(self, catalog: Catalog, types: list[str] | None = None) -> list[dict[str, Any]]:
        """Called by `%gpu types --live`: per GPU type (its one-GPU, else smallest, instance)
        and zone of each region it compares (its `regions` setting the policy allows), the
        current spot price beside the catalog's on-demand one. Rows {"type", "instance",
        "region", "zone", "spot", "on_demand"}, cheapest first per type; a type AWS says nothing
        about has a row with zone and spot None."""
        rows: list[dict[str, Any]] = []
        table = instance_table()
        for region in price_regions(self.setting("regions")):
            aws = self.aws(region)
            for gpu in catalog.whole_types():
                if (types is not None and gpu.name not in types) or not table.instances(gpu):
                    continue
                inst = table.instances(gpu)[0]
                prices = self.spot_prices(aws, inst.name)
                base = {"type": gpu.name, "instance": inst.name, "region": aws.region}
                base["source"] = LIVE_SOURCE
                base["on_demand"] = inst.on_demand
                if not prices:
                    rows.append(dict(base, zone=None, spot=None))
                for zone, price in sorted(prices.items(), key=lambda zp: (zp[1], zp[0])):
                    rows.append(dict(base, zone=zone, spot=price))
        return rows

    def list_prices(self, catalog: Catalog) -> ListedPrices:
        """The on-demand prices of its table's instance types from the AWS Price List API
        (backends/aws/pricing.py), kept in the user's snapshot for its table; the catalog's
        rate of a type is one GPU's share of its smallest instance."""
        base = packaged_table()
        asked = base.names()
        aws = self.aws(pricing.PRICING_REGION)
        aws.check_credentials()
        try:
            found = pricing.on_demand_prices(aws, asked, base.region)
        except aws_errors() as exc:
            raise _unavailable(
                explain(exc, "asking the AWS Price List API", pricing.PRICING_REGION)
            ) from None
        old = {i.name: i.on_demand for rows in base.by_type.values() for i in rows}
        rates = {}
        for gpu in catalog.whole_types():
            rows = base.instances(gpu)
            if rows and rows[0].name in found:
                rates[gpu.name] = round(found[rows[0].name] / rows[0].gpu_count, 6)
        return ListedPrices(
            rates=rates,
            kept={"on_demand": dict(sorted(found.items()))},
            asked=asked,
            priced=[n for n in asked if n in found],
            changed=sorted(k for k, v in found.items() if abs(v - old.get(k, v)) > 1e-9),
            rows="instance types",
            region=base.region,
        )

    # -- start ------------------------------------------------------------------------------

    def provision(self, record: SessionRecord, progress: Progress) -> None:
        if record.spec.extra.get("cheapest"):
            return self._provision_cheapest(record, progress)
        aws = self.aws(record.spec.extra.get("region"))
        try:
            self._provision(aws, record, progress)
        except aws_errors() as exc:  # any call not explained closer to where it was made
            raise explain(exc, "provisioning", aws.region) from None

    def _provision_cheapest(self, record: SessionRecord, progress: Progress) -> None:
        """--cheapest (backends/aws/cheapest.py): the allowed regions in the order of their
        cheapest zone, each region's zones cheapest first, until one has capacity."""
        spec = record.spec
        gpu = load_catalog().get(spec.gpu_type)
        instance_type = instance_table().instance_for(gpu, spec.gpu_count).name
        regions = [self.aws(r) for r in self.cheapest_regions(spec)]
        choice = Cheapest({aws.region: self.spot_prices(aws, instance_type) for aws in regions})
        workspace = workspace_name(record)
        for aws in regions:  # a kept workspace's volume decides the region (and the zone)
            try:
                kept = ebs_volumes.find(aws, self.recorder.store_id, workspace)
            except aws_errors() as exc:
                raise explain(exc, f"looking for workspace {workspace}", aws.region) from None
            if kept is not None:
                choice.pinned = workspace
                order = [aws.region]
                break
        else:
            order = choice.regions()
        progress.step(
            f"--cheapest: {choice.zones} zone(s) with a current spot price for {instance_type} "
            f"in {', '.join(sorted(choice.prices))}"
        )
        for number, region in enumerate(order):
            aws = self.aws(region)
            last = number == len(order) - 1
            try:
                self._provision(aws, record, progress, cheapest=choice, last_region=last)
                return
            except _RegionFull as full:
                progress.step(f"no capacity in {region}: trying {order[number + 1]} next")
                self._leave_region(aws, record, full.fresh_volume)
            except aws_errors() as exc:
                raise explain(exc, "provisioning", aws.region) from None

    def _leave_region(self, aws: Aws, record: SessionRecord, fresh_volume: str) -> None:
        """What a --cheapest start made in a region without capacity (its key pair, security
        group and new empty workspace volume), removed before it tries the next region."""
        # found by the session's tag: the next region's handles replace the saved ones
        Teardown(aws).session(record.id, instance_ids=[], key_names=[], group_ids=[])
        if fresh_volume:
            ebs_volumes.remove(aws, fresh_volume)

    def _provision(
        self,
        aws: Aws,
        record: SessionRecord,
        progress: Progress,
        *,
        cheapest: Cheapest | None = None,
        last_region: bool = True,
    ) -> None:
        spec, extra = record.spec, record.spec.extra
        catalog = load_catalog()
        gpu = catalog.get(spec.gpu_type)
        instance_type = instance_table().instance_for(gpu, spec.gpu_count).name
        # every handle is saved as soon as it exists: a crash leaves it findable
        self.recorder.save(record.id, region=aws.region, instance_type=instance_type)
        public_key, kernel_key = self._session_keys(record)
        tag_list = launch.tags(record.id, record.owner, f"gpusession-{record.name}")
        name = f"gpusession-{record.id}"
        self._pull_login(record, progress)  # before anything bills: ECR may refuse the identity
        ami, places, group = self._prepare_instance(
            aws, record, progress, instance_type, name, public_key, tag_list
        )
        prices = self.spot_prices(aws, instance_type) if spec.extra.get("spot") else {}
        ws = self._workspace_volume(aws, record, progress)
        self.recorder.save(record.id, workspace=ws.name)
        try:
            start = _Start(
                gpu=gpu,
                instance_type=instance_type,
                ami=ami,
                group=group,
                places=ws.places(places, zones_allowed=_zones_allowed(extra)),
                prices=prices,
                ws=ws,
                public_key=public_key,
                kernel_key=kernel_key,
                name=name,
                tag_list=tag_list,
            )
            self._launch(aws, record, progress, start, cheapest=cheapest, last_region=last_region)
        except _RegionFull as full:  # --cheapest goes on to the next region
            full.fresh_volume = ws.volume_id if ws.fresh else ""
            raise
        except BaseException:  # the volume is the user's workspace: kept, and said
            if ws.volume_id:
                kept = f"workspace {ws.name} (EBS volume {ws.volume_id}) is kept; `gpusession workspaces` lists it"
                progress.step(f"start failed: {kept}")
                self.recorder.note(record.id, kept)
            raise

    def _session_keys(self, record: SessionRecord) -> tuple[str, str]:
        """The session's SSH key (its public half) and the kernel's connection key, both kept in
        files of the data folder's keys/ and recorded: (public key, kernel key)."""
        import secrets

        # lazy: docs/architecture.md#imports-kept-inside-functions
        from ...transport.sshlogin import make_session_key

        key_path, public_key = make_session_key(self.config.data_path / "keys", record.id)
        # the client cannot read the kernel's connection file: it makes the key
        kernel_key = secrets.token_hex(32)
        kernel_key_path = key_path.with_name(f"{record.id}.kernel")
        fd = os.open(kernel_key_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(kernel_key + "\n")
        self.recorder.save(record.id, key_path=str(key_path), kernel_key_path=str(kernel_key_path))
        return public_key, kernel_key

    def _prepare_instance(
        self,
        aws: Aws,
        record: SessionRecord,
        progress: Progress,
        instance_type: str,
        name: str,
        public_key: str,
        tag_list,
    ) -> tuple[str, list, str]:
        """The machine image, the subnets the instance type may launch in, the key pair and the
        security group (ssh from the caller only): (ami, places, security group id)."""
        extra = record.spec.extra
        try:
            progress.step("looking up the GPU image")
            ami, source = launch.resolve_ami(aws, extra)
            progress.step(f"image {ami} ({source})")
            places = launch.subnets(aws, extra, instance_type)
            cidr = launch.caller_cidr(extra)
            progress.step(f"key pair {name}, security group allowing ssh from {cidr} only")
            key_name = launch.import_key_pair(aws, name, public_key, tag_list)
            self.recorder.save(record.id, key_name=key_name)
            group = launch.create_security_group(aws, name, places[0].vpc, cidr, tag_list)
            self.recorder.save(record.id, security_group=group)
        except aws_errors() as exc:
            raise explain(exc, "preparing the instance", aws.region) from None
        return ami, places, group

    def _workspace_volume(
        self, aws: Aws, record: SessionRecord, progress: Progress
    ) -> ebs_volumes.WorkspaceVolume:
        """The session's workspace volume as the start finds it (kept, or to make per attempt)."""
        spec, extra = record.spec, record.spec.extra
        workspace = workspace_name(record)
        try:
            return ebs_volumes.WorkspaceVolume(
                aws,
                store_id=self.recorder.store_id,
                owner=record.owner,
                name=workspace,
                extra=extra,
                say=progress.step,
                release=self._handover.pop(record.id, None),
                # a resume finds its volume in another region the store used; it moves here
                # (by snapshot copy) when the start named this region (a switch's --region)
                look_in=[self.aws(r) for r in self._regions() if r != aws.region]
                if extra.get("resume")
                else (),
                may_move=bool(spec.extra.get("region")),
            )
        except aws_errors() as exc:
            raise explain(exc, f"looking for workspace {workspace}", aws.region) from None

    def _pull_login(self, record: SessionRecord, progress: Progress | None = None):
        """The login the instance pulls the image with: obtained once per session in this
        process (at start; again by a later process that connects while the boot waits)."""
        if record.id not in self._pull_logins:
            image = record.spec.extra.get("image") or self.default_image() or ""
            login = pull_logins.pull_login(image, self.aws)
            self._pull_logins[record.id] = login
            if login is not None and progress is not None:
                how = (
                    "a token from ECR"
                    if login.source == "ECR"
                    else f"your docker login as {login.username}"
                )
                progress.step(
                    f"registry login for {login.registry}: {how}, sent to the instance over SSH"
                )
        return self._pull_logins[record.id]

    def _launch(
        self,
        aws: Aws,
        record: SessionRecord,
        progress: Progress,
        start: _Start,
        *,
        cheapest: Cheapest | None,
        last_region: bool,
    ) -> None:
        # lazy: docs/architecture.md#imports-kept-inside-functions
        from ..cloudvm.cloudinit import new_host_key

        spec, extra = record.spec, record.spec.extra
        table = instance_table()
        avoid = extra.get("avoid_zone") or ""  # a recovery: the zone AWS took the spot one back in
        plan = _attempt_plan(record, start, cheapest, last_region, avoid)
        tried: list[launch.Attempt] = []
        host_key = new_host_key(start.name)
        image = spec.extra.get("image") or self.default_image()
        self.recorder.save(record.id, instance_host_key=host_key.public, image=image, ami=start.ami)

        def price_of(attempt: launch.Attempt) -> float:
            if attempt.spot and attempt.subnet.zone in start.prices:
                return start.prices[attempt.subnet.zone]
            return table.price(start.gpu, spec.gpu_count, spot=attempt.spot)

        def prepare(attempt: launch.Attempt) -> dict[str, Any]:
            tried.append(attempt)
            progress.step(
                f"launching {attempt.describe(start.instance_type)}{_why(attempt, avoid)}"
            )
            priced = dataclasses.replace(
                record, price_per_hour=price_of(attempt)
            )  # the agent's cost meter
            volume_id = start.ws.in_zone(attempt.subnet.zone)
            self.recorder.save(record.id, volume_id=volume_id)
            return {"UserData": self._user_data(priced, start, attempt, volume_id, image, host_key)}

        instance, attempt, failures = self._run_instance(
            aws,
            record,
            start,
            table,
            plan,
            prepare,
            tried,
            cheapest=cheapest,
            last_region=last_region,
        )
        price = price_of(attempt)
        self._record_placement(
            record, progress, start, instance, attempt, failures, price, cheapest, tried
        )
        self._attach_when_running(aws, record, progress, start.ws, instance)

    def _user_data(
        self,
        priced: SessionRecord,
        start: _Start,
        attempt: launch.Attempt,
        volume_id: str,
        image: str | None,
        host_key,
    ) -> str:
        """The instance's boot plan for one launch attempt, as cloud-init user data: the agent's
        options (with this attempt's price), the keys, the image, the workspace volume."""
        # lazy: docs/architecture.md#imports-kept-inside-functions
        from ...transport.tunnel import CONTAINER_AGENT_PORT
        from ..cloudvm.cloudinit import (
            CONTAINER_NOTICES,
            CONTAINER_STATE_DIR,
            BootPlan,
            instance_sockets,
            user_data,
        )

        agent_args = AgentArgs.for_record(
            priced,
            session_id=priced.id,
            state_dir=CONTAINER_STATE_DIR,
            kernel_ip=f"{instance_sockets(priced.id)}/k",
            agent_port=CONTAINER_AGENT_PORT,
            workspace=WORKSPACE_MOUNT,
            cwd=WORKSPACE_MOUNT,
            notice_dir=CONTAINER_NOTICES,
        ).argv()
        boot = BootPlan(
            priced.id,
            image,
            start.public_key,
            host_key,
            start.kernel_key,
            agent_args,
            spot=attempt.spot,
            volume_id=volume_id,
            pull_login=self._pull_logins.get(priced.id) is not None,
            import_files=priced.id in self._imports,
        )
        self.recorder.save(
            priced.id, sockets=boot.sockets
        )  # where the kernel listens (link.kernel_info)
        return user_data(boot)

    def _run_instance(
        self,
        aws: Aws,
        record: SessionRecord,
        start: _Start,
        table: InstanceTable,
        plan: list[launch.Attempt],
        prepare,
        tried: list[launch.Attempt],
        *,
        cheapest: Cheapest | None,
        last_region: bool,
    ) -> tuple[dict, launch.Attempt, list[str]]:
        """RunInstances for the plan's attempts in turn until one has capacity: (the instance,
        the attempt that launched it, why the ones before it did not)."""
        spec, extra = record.spec, record.spec.extra
        base = launch.instance_params(
            ami=start.ami,
            instance_type=start.instance_type,
            key_name=start.name,
            group=start.group,
            public_ip=not extra.get("private_ip"),
            tag_list=start.tag_list,
        )
        max_price = (
            _float(extra["max_price"], "--max-price")
            if extra.get("max_price")
            else table.price(start.gpu, spec.gpu_count)
        )
        try:
            return launch.run_first_that_fits(
                aws,
                base,
                plan,
                instance_type=start.instance_type,
                client_token=record.id[:24],
                max_price=max_price,
                on_attempt=prepare,
            )
        except launch.NoCapacity as exc:
            if cheapest is not None:
                cheapest.full += [a.subnet.zone for a in tried if a.spot]
                if not last_region:
                    raise _RegionFull() from None
            raise NoCapacity(
                _no_capacity_message(exc, start.instance_type, aws.region, spec), where=aws.region
            ) from None

    def _record_placement(
        self,
        record: SessionRecord,
        progress: Progress,
        start: _Start,
        instance: dict,
        attempt: launch.Attempt,
        failures: list[str],
        price: float,
        cheapest: Cheapest | None,
        tried: list[launch.Attempt],
    ) -> None:
        """Where the instance launched, on what market and at what price: recorded, and said
        (with the capacity fallback that led there)."""
        self.recorder.save(
            record.id,
            instance_id=instance["InstanceId"],
            zone=attempt.subnet.zone,
            market="spot" if attempt.spot else "on-demand",
            price_per_hour=price,
        )
        if failures:
            self.recorder.note(record.id, "capacity fallback: " + "; ".join(failures))
        if cheapest is not None:  # where and why, in one line (the fallback is part of it)
            cheapest.full += [a.subnet.zone for a in tried[:-1] if a.spot]
            where = cheapest.line(attempt.subnet.zone, price, attempt.spot)
            progress.step(where)
            self.recorder.note(record.id, where)
        elif failures:
            progress.step(
                f"fell back to {attempt.describe(start.instance_type)} after: {'; '.join(failures)}"
            )
        if abs(price - record.price_per_hour) > 1e-9:
            self.recorder.set_price(
                record.id,
                price,
                f"price ${price:.4f}/h ({attempt.describe(start.instance_type)}); "
                f"estimated ${record.price_per_hour:.4f}/h at start",
            )

    def _attach_when_running(
        self,
        aws: Aws,
        record: SessionRecord,
        progress: Progress,
        ws: ebs_volumes.WorkspaceVolume,
        instance: dict,
    ) -> None:
        """Wait until the instance runs (billed from then), hand a switch's volume over, and
        attach the workspace volume."""
        instance_id = instance["InstanceId"]
        progress.step(
            f"instance {instance_id} is {instance['State']['Name']}; waiting until it runs"
        )
        address = self._wait_running(
            aws, instance_id, private=bool(record.spec.extra.get("private_ip"))
        )
        # EC2 bills a running instance
        self.recorder.save(record.id, address=address, **{BILLED_FROM: time.time()})
        if ws.moved_from:  # what the switch's line says moved
            self.recorder.save(record.id, moved_from=ws.moved_from, moved_bytes=ws.moved_bytes)
        if ws.release is not None:
            progress.step(f"instance {instance_id} runs at {address}; the old session hands over")
            ws.released()
        progress.step(
            f"instance {instance_id} runs at {address}; attaching workspace volume {ws.volume_id}"
        )
        ebs_volumes.attach(aws, ws.volume_id, instance_id)

    def _wait_running(self, aws: Aws, instance_id: str, *, private: bool) -> str:
        import botocore.exceptions

        try:
            aws.ec2.get_waiter("instance_running").wait(
                InstanceIds=[instance_id], WaiterConfig={"Delay": 3, "MaxAttempts": 100}
            )
        except botocore.exceptions.WaiterError:
            inst = self._describe(aws, instance_id) or {}
            state = (inst.get("State") or {}).get("Name", "gone")
            why = (inst.get("StateReason") or {}).get("Message", "no reason given")
            raise StageError(
                "provision", f"instance {instance_id} did not start: it is {state} ({why})"
            ) from None
        except aws_errors() as exc:
            raise explain(exc, f"waiting for {instance_id}", aws.region) from None
        inst = self._describe(aws, instance_id) or {}
        address = (
            inst.get("PrivateIpAddress")
            if private
            else inst.get("PublicIpAddress") or inst.get("PrivateIpAddress")
        )
        if not address:
            raise StageError(
                "provision",
                f"instance {instance_id} has no address (a subnet without public IPs? "
                "use private_ip=True from inside the VPC)",
            )
        return address

    def connect(self, record: SessionRecord, progress: Progress) -> Link:
        # lazy: docs/architecture.md#imports-kept-inside-functions
        from ..cloudvm.link import open_link

        res = record.resource
        for needed in ("address", "key_path", "instance_host_key", "kernel_key_path"):
            if not res.get(needed):
                raise StageError(
                    "connect",
                    f"session {record.name} has no saved {needed}: it was never fully started",
                )
        timeout = _float(
            record.spec.extra.get("boot_timeout")
            or os.environ.get("GPUSESSION_AWS_BOOT_TIMEOUT")
            or DEFAULT_BOOT_TIMEOUT_S,
            "boot_timeout",
        )
        spot = res.get("market") == "spot"
        on_notice = (lambda notice: self._on_notice(record.id, notice)) if spot else None
        return open_link(
            res,
            deadline=time.monotonic() + timeout,
            forget_hint=f"stop this session (`gpusession stop {record.name}`) and start a new one",
            say=progress.step,
            gone=lambda: self._gone(record),
            on_event=lambda text: self._note(record.id, text),
            on_notice=on_notice,
            on_ended=lambda text: self._on_ended(record.id, text),
            pull_login=lambda: _header(self._pull_login(record)),
            workspace_in=self._import_over(record, progress),
        )

    def _import_over(self, record: SessionRecord, progress: Progress):
        """The switch's move into this start's instance, over its login (None: nothing moves)."""
        move = self._imports.pop(record.id, None)
        if move is None:
            return None
        return lambda transport: move(
            lambda rec, chunks, prog: workspace_stream.import_over(transport, rec, chunks, prog)
        )

    def _on_notice(self, session_id: str, notice: dict) -> None:
        text = (
            f"spot interruption notice: AWS will {notice.get('action', 'stop')} this instance at "
            f"{notice.get('time', 'any moment')} (about 2 minutes after the notice); save your work"
        )
        noticed_at = time.time()
        self._note(session_id, text)
        log.warning("gpusession: %s", text)
        # last: whoever sees the session marked interrupted finds the note and the log line too
        self.recorder.save(session_id, interrupted={"notice": notice, "noticed_at": noticed_at})

    def _on_ended(self, session_id: str, text: str) -> None:
        """The session's container ended after a notice (the link read its last markers): the
        session is over while its instance still runs, and this is how it ended."""
        details = stop_details_from_log(text)
        if details is not None:
            self._last_words[session_id] = details

    # -- life -------------------------------------------------------------------------------

    def _describe(self, aws: Aws, instance_id: str) -> dict | None:
        try:
            found = aws.ec2.describe_instances(InstanceIds=[instance_id])["Reservations"]
        except aws_errors() as exc:
            if error_code(exc) == "InvalidInstanceID.NotFound":
                return None
            raise
        return found[0]["Instances"][0] if found and found[0]["Instances"] else None

    def _instance(self, record: SessionRecord, max_age: float = 0.0) -> dict | None:
        at, inst = self._state_cache.get(record.id, (0.0, None))
        if max_age and time.monotonic() - at < max_age:
            return inst
        iid = record.resource.get("instance_id")
        inst = self._describe(self.aws(record.resource.get("region")), iid) if iid else None
        self._state_cache[record.id] = (time.monotonic(), inst)
        return inst

    def _gone(self, record: SessionRecord) -> str | None:
        """Why the instance will not come up any more (None while it may)."""
        try:
            inst = self._instance(record, max_age=5.0)
        except aws_errors():
            return None
        if inst is None:
            return "it no longer exists"
        state = inst["State"]["Name"]
        if state in RUNNING_STATES:
            return None
        return f"{state}: {(inst.get('StateReason') or {}).get('Message', 'no reason given')}"

    def is_alive(self, record: SessionRecord) -> bool:
        if record.spec.backend != self.name or not record.resource.get("instance_id"):
            return False
        if record.id in self._last_words:  # its container ended (a spot notice's stop)
            return False
        try:
            inst = self._instance(record)
        except (*aws_errors(), GpuSessionError):
            return True  # AWS cannot be asked now: unknown is not gone; never tear down blind
        return inst is not None and inst["State"]["Name"] in RUNNING_STATES

    def stop_details(self, record: SessionRecord) -> StopDetails | None:
        """What the instance said before it ended (its console output keeps the agent's last
        markers), else why EC2 says it ended."""
        iid = record.resource.get("instance_id")
        if not iid:
            return None
        try:
            aws = self.aws(record.resource.get("region"))
            logged = console_details(aws, iid) or StopDetails()
            inst = self._instance(record)
        except (*aws_errors(), GpuSessionError):
            return None
        # after a spot notice the link read the end from the instance itself (the console
        # output shows it only minutes later)
        logged = self._last_words.get(record.id) or logged
        reason = logged.reason or ended_reason(inst, bool(record.resource.get("interrupted")))
        details = StopDetails(reason=reason, summary=logged.summary)
        return None if details == StopDetails() else details

    def stop(self, record: SessionRecord) -> None:
        self._pull_logins.pop(record.id, None)
        res = record.resource
        if record.spec.backend != self.name:
            return
        if res.get("region"):
            Teardown(self.aws(res["region"])).session(
                record.id,
                instance_ids=[res.get("instance_id")],
                key_names=[res.get("key_name")],
                group_ids=[res.get("security_group")],
            )
        _forget_keys(self.config.data_path / "keys", record.id)

    # -- workspaces ---------------------------------------------------------------------------

    def list_workspaces(self) -> list:
        """This store's workspace volumes in the regions its sessions used, with their monthly cost."""
        return ebs_volumes.workspaces(self, self._regions())

    def remove_workspace(self, workspace) -> None:
        ebs_volumes.remove(self.aws(workspace.details["region"]), workspace.details["volume_id"])

    def export_workspace(self, record: SessionRecord, progress: Progress):
        """Read over the running instance's SSH login (backends/aws/workspace_stream.py)."""
        return workspace_stream.export_workspace(record, progress)

    # -- gc -----------------------------------------------------------------------------------

    def _regions(self) -> list[str]:
        """The regions the store's aws sessions used (gc never asks AWS when there were none)."""
        return sorted(
            {
                r.resource.get("region") or r.spec.extra.get("region") or self.aws(None).region
                for r in self.recorder.sessions(self.name)
            }
        )

    def list_resources(self) -> list[RemoteResource]:
        regions = self._regions()
        if regions:
            boto3_module()
        found: list[RemoteResource] = []
        for region in regions:
            aws = self.aws(region)
            try:
                found += Teardown(aws).find(self.name)
            except aws_errors() as exc:
                raise _unavailable(explain(exc, "listing gpusession instances", region)) from None
        return found

    def remove_resource(self, resource: RemoteResource) -> None:
        d = resource.details
        Teardown(self.aws(d["region"])).session(
            resource.session_id,
            instance_ids=d.get("instance_ids", []),
            key_names=d.get("key_names", []),
            group_ids=d.get("group_ids", []),
        )
        _forget_keys(self.config.data_path / "keys", resource.session_id)


def _header(login: PullLogin | None) -> str | None:
    return login.header() if login is not None else None


@dataclasses.dataclass
class _Start:
    """What `_provision` prepared in a region for `_launch`."""

    gpu: Any  # the catalog's GPU type
    instance_type: str
    ami: str
    group: str  # the security group's id
    places: list  # the subnets to try, in order (launch.Subnet)
    prices: dict[str, float]  # spot prices by zone (spot starts)
    ws: ebs_volumes.WorkspaceVolume
    public_key: str  # the session's SSH key
    kernel_key: str  # the kernel's connection key
    name: str  # of the key pair and the security group
    tag_list: list


def _attempt_plan(
    record: SessionRecord,
    start: _Start,
    cheapest: Cheapest | None,
    last_region: bool,
    avoid: str,
) -> list[launch.Attempt]:
    """The launch attempts in order (zone, market), as --fallback (and --cheapest's region, a
    recovery's zone to avoid, a kept workspace volume's zone) allow."""
    spec, extra = record.spec, record.spec.extra
    mode = launch.fallback_mode(extra)
    if cheapest is not None:
        mode = cheapest.fallback(mode, last_region)
    if avoid:  # other zones first, that one last; on-demand only as --fallback allows
        mode = {"off": "zone", "on-demand": "any"}.get(mode, mode)
    plan = launch.attempts(spec.extra.get("spot"), mode, start.places, start.prices)
    ws = start.ws
    return launch.ordered(
        plan, first=ws.volume["AvailabilityZone"] if ws.volume else "", last=avoid
    )


class _RegionFull(Exception):
    """A --cheapest start found no capacity in a region that is not its last (internal)."""

    fresh_volume = ""  # the empty workspace volume this start made there, to remove


def _zones_allowed(extra: dict) -> bool:
    """May a kept workspace volume move to another zone for this start (by snapshot)?"""
    return bool(extra.get("avoid_zone")) or launch.fallback_mode(extra) in ("zone", "any")


def _why(attempt: launch.Attempt, avoid: str) -> str:
    """Why a recovery launches where it does, for its start line."""
    if not avoid:
        return ""
    if not attempt.spot:
        return " (on-demand: --fallback allows it after spot)"
    if attempt.subnet.zone == avoid:
        return " (the zone of the interruption, tried last)"
    return f" (another zone than {avoid}, where the spot instance was interrupted)"


def _forget_keys(folder, session_id: str) -> None:
    """The session's login key and kernel key files."""
    for name in (session_id, f"{session_id}.kernel"):
        (folder / name).unlink(missing_ok=True)


def _float(value: Any, what: str) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise BadInput(f"{what} must be a number, got {value!r}") from None


def _unavailable(exc: GpuSessionError) -> GpuSessionError:
    return exc if isinstance(exc, (BackendUnavailable, BadInput)) else BackendUnavailable(str(exc))


def _no_capacity_message(
    exc: launch.NoCapacity, instance_type: str, region: str, spec: LaunchSpec
) -> str:
    text = f"no {instance_type} could be launched in {region}: {exc}"
    if exc.quota:
        text += f"; for the quota: {QUOTA_HINT}"
    if launch.fallback_mode(spec.extra) != "any":
        text += (
            "; allow other zones and on-demand with fallback=any, or try another --region or --type"
        )
    else:
        text += "; try another --region or --type, or later"
    return text
