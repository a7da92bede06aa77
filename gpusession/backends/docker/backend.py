"""`docker`: the session kernel runs in a GPU container on a Docker engine, from any image with a
python3 (3.9 or newer).

The engine is this machine's (DOCKER_HOST or the default socket) or a remote one at
`ssh://user@host[:port]` (the user's key and known_hosts, as `ssh` would use them). The image is
pulled when the engine lacks it; the runtime (the agent, and ipykernel when the image has none)
comes in read-only volumes (`runtime`, `gpusession.transport.bundle`) and the kernel runs with the
image's own Python. The container needs no sshd: it runs on the host's network; the kernel
listens on unix sockets in a folder of the host's /tmp bind-mounted into the container, setgid
2770 and of the group of the user who connects (`kernel_socket_dir`), and the agent on a free port
of the host's 127.0.0.1 (it asks for a token). The local engine's are reached directly; a remote
engine's through a `gpusession.transport.tunnel.Tunnel` to that host's own sshd (its key pinned by
known_hosts), which forwards to the sockets as the SSH login.

Labels on every container: gpusession.session (the session id), gpusession.session.store (which session
store started it; gc only collects its own store's), gpusession.owner, gpusession.type,
gpusession.image, gpusession.started (unix seconds).
"""

from __future__ import annotations

import calendar
import functools
import logging
import re
import threading
import time
from typing import Any

from ...configuration.agentargs import WORKSPACE_LABEL, WORKSPACE_MOUNT, AgentArgs
from ...configuration.catalog import load_catalog
from ...configuration.cost import BILLED_FROM
from ...configuration.options import StartOption
from ...configuration.settings import (
    BUILTIN_IMAGE,
    ConfigError,
    Setting,
    load_policy,
    setting_value,
)
from ...core import textvalues
from ...core.errors import BackendUnavailable, BadInput, GpuSessionError, NoCapacity, StageError
from ...core.models import LaunchSpec, SessionRecord, State
from ...core.progress import Progress
from ...core.protocol import (
    ENV_KERNEL_KEY,
    ENV_RUNTIME_BRINGS,
    ENV_RUNTIME_PYTHON,
    ENV_SESSION_ID,
    Marker,
    StopDetails,
    StopKind,
    StopReason,
)
from ...core.textvalues import POOL_PREFIX, host_or_pool
from ..base import (
    Backend,
    DirectLink,
    Link,
    LocalImage,
    Place,
    RemoteResource,
    TunnelLink,
    stop_details_from_log,
)
from .engine import (
    HELPER_LABEL,
    LABEL,
    STATE_DIR,
    STORE_LABEL,
    container_logs,
    container_states,
    create_container,
    docker_sdk,
    engine_client,
    engine_errors,
    get_container,
    local_engine_states,
    owning_session,
    read_json_from,
    remove_container,
    short_error,
    wait_for_marker,
)
from .engine_probe import endpoints, engine_place, gives_gpus, on_this_machine
from .gpus import GPUS_LABEL, NAME_LABEL, Reading, holders, pick, read_box, refusal
from .pools import ask_pool, best_box, chosen_line, free_by_name, full_line, type_matches
from .runtime_volumes import remove_copy, stale_resources
from .workspace_volumes import EngineWorkspaces

# What starts and connects a session (container_setup.py's helpers, the bundle, the SDK) is imported
# where it is used: `gpusession list` loads this backend only to ask the local engine one question
# (docs/architecture.md#imports-kept-inside-functions).

log = logging.getLogger(__name__)

START_TIMEOUT = 120.0
START_LOG_BYTES = 4096  # the end of a failed start's container log kept in its record
START_LOG_LINES = 200
PLACE_TRIES = 3  # picks after losing a race for a GPU to another start on the same box
QUICK_TIMEOUT = 3.0  # seconds a listing waits for a remote engine's answer
NO_NVIDIA = (
    "this Docker engine has no NVIDIA runtime, so the container cannot get a GPU ({detail}). "
    "On the GPU host: install the NVIDIA driver and nvidia-container-toolkit, run "
    "`sudo nvidia-ctk runtime configure --runtime=docker`, restart dockerd (`sudo systemctl restart docker`); "
    "check with `docker run --rm --gpus all IMAGE nvidia-smi`. Without a GPU, use --backend local"
)


class DockerBackend(EngineWorkspaces, Backend):
    name = "docker"
    keeps_workspaces = True  # a volume per workspace
    takes_host = True  # a remote engine: ssh://user@host[:port]
    host_help = (
        "a remote engine, ssh://user@host[:port], or pool:NAME (the box of a configured pool "
        "with the most free GPUs of the type); this machine's engine by default"
    )
    place_option = "host"  # each engine keeps its own volumes
    place_here = "this machine's engine"
    takes_image = True
    image_help = "pytorch/pytorch, CUDA 12.6 by default (DockerBackend.image)"
    settings = (
        Setting(
            "image",
            "GPUSESSION_IMAGE",
            BUILTIN_IMAGE,
            "Image for docker sessions (and aws ones, unless AwsBackend.image) when --image names "
            "none: any image with a python3 (3.9 or newer), pulled on first use. Empty means the "
            "built-in.",
            legacy="GpuSessionConfig.docker_image",
        ),
        Setting(
            "pools",
            "GPUSESSION_DOCKER_POOLS",
            "",
            "Pools of boxes for --host pool:NAME, as a JSON object: pool name -> the boxes' "
            'ssh:// addresses, e.g. {"lab": ["ssh://gpu1", "ssh://gpu2"]}; a start on a pool '
            "goes to the box with the most free GPUs of its type. Empty means none.",
            parse=textvalues.pools_text,
        ),
    )
    default_rank = 10  # the default when an engine answers
    order = 20
    start_options = (
        StartOption(
            "gpus",
            ("--gpus",),
            "gpus",
            "GPUs",
            "docker: GPUs to request: a number (default: the count in --type) of free GPUs no "
            "other session on the box holds, the least busy; 'shared' (the engine's first, "
            "whoever holds them); 'all'; or device=IDS (indices or GPU-/MIG- UUIDs)",
            "GPU request",
        ),
    )

    def default_image(self) -> str | None:
        return self.setting("image")

    def __init__(self, config, recorder):
        super().__init__(config, recorder)
        self._clients: dict[str, Any] = {}
        self._known: dict[str, Any] = {}  # engine -> runtime.KnownVolumes
        # session id -> its container as provision started it, taken by connect (one inspect less)
        self._started: dict[str, Any] = {}

    @classmethod
    def available(cls, timeout: float = 2.0) -> bool:
        """True when the SDK is installed and the local engine (DOCKER_HOST) answers quickly."""
        try:
            docker = docker_sdk()
            client = docker.from_env(timeout=timeout)
            try:
                return bool(client.ping())
            finally:
                client.close()
        except Exception:  # noqa: BLE001 - any failure means "not available" here
            return False

    # -- engines ------------------------------------------------------------------------

    def client(self, host: str | None):
        """The engine for a session's --host ('' or None: the local engine), cached; a remote
        engine's again when its SSH connection died (a network blip, a laptop that slept)."""
        key = host or ""
        # lazy: docs/architecture.md#imports-kept-inside-functions
        from .container_setup import ssh_alive

        if key in self._clients and host and not ssh_alive(self._clients[key]):
            self._clients.pop(key).close()
        if key not in self._clients:
            self._clients[key] = engine_client(host)
        return self._clients[key]

    def local_images(self, host: str | None) -> list[LocalImage]:
        """The engine's tagged images, by reference, with their size and whether a session
        started from them here before (what the probe found of their Python is cached)."""
        # lazy: docs/architecture.md#imports-kept-inside-functions
        from ...transport.bundle import cache_dir
        from .container_setup import probe_path

        client = self.client(host)
        with engine_errors("while listing its images"):
            # one listing (GET /images/json): the SDK's images.list() then inspects each image,
            # and one removed in between (a prune, another session's cleanup) failed it all
            images = client.api.images()
        found = [
            LocalImage(tag, image.get("Size"), probe_path(cache_dir(), image["Id"]).exists())
            for image in images
            for tag in image.get("RepoTags") or []
            if tag != "<none>:<none>"
        ]
        return sorted(found, key=lambda i: i.reference)

    @classmethod
    def discover(cls, timeout: float = 4.0) -> list[Place]:
        """DOCKER_HOST or the local socket, and each docker context: answers? gives GPUs?"""
        return [engine_place(what, address, timeout) for what, address in endpoints()]

    def cannot_give(self, spec: LaunchSpec) -> str | None:
        """A GPU session needs an engine that gives containers GPUs: the nvidia runtime, NVIDIA
        devices by CDI, or (this machine's engine) the toolkit's hook with a GPU here. A recording of NVML values (--nvml-replay) stands for a GPU."""
        if spec.extra.get("nvml_replay"):
            return None
        try:
            info = self.client(spec.extra.get("host")).info()
        except Exception:  # noqa: BLE001 - an engine that does not answer says so at the start
            return None
        if gives_gpus(info, here=on_this_machine(spec.extra.get("host"))):
            return None
        where = spec.extra.get("host") or "this machine's Docker engine"
        return f"{where} gives containers no GPU (no nvidia runtime)"

    def check(self, spec: LaunchSpec) -> None:
        docker_sdk()
        if spec.extra.get(
            "host"
        ):  # the option table has read it; a LaunchSpec made by hand has not
            try:
                host = host_or_pool(spec.extra.get("host"))
            except BadInput as exc:
                raise BadInput(f"Docker host: {exc}") from None
            if host.startswith(POOL_PREFIX):
                self.pool_boxes(host[len(POOL_PREFIX) :])
        gpus = spec.extra.get("gpus")
        if not (
            gpus is None
            or str(gpus) in ("all", "shared")
            or str(gpus).isdigit()
            or str(gpus).startswith("device=")
        ):
            raise BadInput(f"gpus={gpus!r}: use a number of GPUs, 'shared', 'all' or device=IDS")

    # -- pools --------------------------------------------------------------------------

    @classmethod
    def all_pools(cls, config) -> dict[str, list[str]]:
        """The pools of DockerBackend.pools, and over them those of an administrator's policy
        (`pools`); BadInput when the setting cannot be read."""
        pools = textvalues.pools(setting_value(cls.__name__, cls.settings, "pools", config) or "")
        policy = load_policy()
        return {**pools, **{k: list(v) for k, v in ((policy and policy.pools) or {}).items()}}

    def pool_boxes(self, pool: str) -> list[str]:
        """The boxes of a configured pool (DockerBackend.pools, a policy's); BadInput naming them."""
        pools = self.all_pools(self.config)
        if pool not in pools:
            known = ", ".join(sorted(pools)) or "none is configured"
            raise BadInput(
                f"no pool {pool!r} (pools: {known}); name them in DockerBackend.pools "
                '(env GPUSESSION_DOCKER_POOLS), e.g. {"lab": ["ssh://gpu1", "ssh://gpu2"]}'
            )
        return list(pools[pool])

    @classmethod
    def places(cls, config) -> list[str]:
        """`pool:NAME` of each configured pool, for the forms' host field."""
        try:
            pools = cls.all_pools(config)
        except (BadInput, ConfigError):
            return []
        return [f"{POOL_PREFIX}{name}" for name in sorted(pools)]

    def free_now(self) -> list[dict[str, Any]]:
        """Every box of each configured pool, asked at once (each pool's deadline): its free
        GPUs by name, or why it was skipped."""
        try:
            pools = self.all_pools(self.config)
        except (BadInput, ConfigError):
            return []  # a start says what is wrong with the setting or the policy
        rows = []
        for name, boxes in sorted(pools.items()):
            for answer in ask_pool(self.client, list(boxes), None):
                rows.append(
                    {
                        "place": f"pool {name}",
                        "host": answer.host,
                        "free": free_by_name(answer) if answer.skipped is None else {},
                        "gpus": answer.gpus,
                        "skipped": answer.skipped,
                    }
                )
        return rows

    def place(self, record: SessionRecord, progress: Progress) -> dict[str, Any] | None:
        """--host pool:NAME (again for each type of a fallback list: `pool` keeps the name):
        the box with the most free GPUs of the type (backends/docker/pools.py) becomes the
        session's host; NoCapacity when none has enough."""
        spec = record.spec
        host = spec.extra.get("pool") or spec.extra.get("host") or ""
        if not host.startswith(POOL_PREFIX):
            return None
        pool = host[len(POOL_PREFIX) :]
        boxes = self.pool_boxes(pool)
        wanted = spec.extra.get("gpus")
        count = int(wanted) if str(wanted or "").isdigit() else spec.gpu_count
        progress.step(
            f"asking the {len(boxes)} boxes of pool {pool} for {count} free {spec.gpu_type}"
        )
        answers = ask_pool(self.client, boxes, spec.gpu_type)
        for skipped in (a for a in answers if a.skipped):
            progress.step(f"pool {pool}: {skipped.host} skipped: {skipped.skipped}")
        chosen = best_box(answers, count)
        if chosen is None:
            raise NoCapacity(full_line(pool, answers, spec.gpu_type, count), where=host)
        why = chosen_line(pool, chosen, answers, spec.gpu_type)
        progress.step(why)
        return {"host": chosen.host, "pool": host, "pool_choice": why}

    # -- start --------------------------------------------------------------------------

    def provision(self, record: SessionRecord, progress: Progress) -> None:
        # lazy: docs/architecture.md#imports-kept-inside-functions
        from .container_setup import find_or_pull_image, kernel_socket_dir, local_image

        spec = record.spec
        progress.step(f"connecting to the Docker engine {spec.extra.get('host') or '(local)'}")
        client = self.client(spec.extra.get("host"))
        self.recorder.save(
            record.id, engine=spec.extra.get("host") or ""
        )  # from here its engine may hold something (stop, gc)
        reading = self._begin_reading(client, spec)  # while the image is looked up
        name = spec.extra.get("image") or self.default_image()
        labels = {LABEL: record.id, STORE_LABEL: self.recorder.store_id}
        image = local_image(client, name)  # None: pulled once a GPU is known to be free
        devices = self._place(client, record, progress, reading)  # before anything is made there
        image = image or find_or_pull_image(client, name, progress)
        runtime = self._prepare_runtime(client, spec.extra.get("host"), image, labels, progress)
        workspace, volumes = self.workspace_volume(
            client, record, image, labels, progress
        )  # kept after the container
        # the kernel on unix sockets in a folder of the host bind-mounted at the same path: only
        # the session's owner (and the kernel's user) may connect, not every user of the host as
        # to a loopback port
        sockets, group = kernel_socket_dir(client, spec.extra.get("host"))
        self.recorder.save(
            record.id,
            engine=spec.extra.get("host") or "",
            image=name,
            python=runtime.python.executable,
            workspace=workspace,
            sockets=sockets,
        )
        create = functools.partial(
            self._create_container,
            client,
            record,
            progress,
            image,
            runtime,
            labels=labels,
            workspace=workspace,
            mounts={**runtime.volumes, **volumes, sockets: {"bind": sockets, "mode": "rw"}},
            sockets=sockets,
            group=group,
        )
        container = self._settle(client, record, progress, create, devices)
        self._start_container(record, progress, container, sockets)

    def _settle(self, client, record: SessionRecord, progress: Progress, create, devices):
        """The container, created with the GPUs picked for it; when another start on the box
        picked one of them at the same time and created its container first, this one gives them
        up and picks again (PLACE_TRIES times), so two sessions never share a GPU by a race."""
        container = create(devices=devices)
        picked = not str(record.spec.extra.get("gpus") or "").startswith("device=")
        for _ in range(PLACE_TRIES):
            if not (
                devices
                and picked
                and _lost_race(
                    client, record.spec.extra.get("host") or "(local engine)", container.id, devices
                )
            ):
                return container
            remove_container(container)
            progress.step("another start took the same GPU first: picking again")
            devices = self._place(client, record, progress)
            container = create(devices=devices)
        return container

    @staticmethod
    def _begin_reading(client, spec: LaunchSpec) -> Reading | None:
        """This machine's GPU reading (nvidia-smi's process), begun now where the start picks
        GPUs itself (_place). A remote box is read when it is picked, as before: its reading
        shares the engine's SSH connection with the image's lookup, whose pool it may trim."""
        wanted = spec.extra.get("gpus")
        if (
            spec.extra.get("host")
            or wanted in ("all", "shared")
            or (isinstance(wanted, str) and wanted.startswith("device="))
        ):
            return None
        return Reading(client, None)

    def _place(
        self, client, record: SessionRecord, progress: Progress, begun: Reading | None = None
    ) -> list[str] | None:
        """The GPUs the session's container is pinned to (their UUIDs), chosen on its box: free
        ones, least busy first (backends/docker/gpus.py), recorded (`gpus`, `gpu_indices`);
        None where the engine picks (--gpus all or shared, or a box without a reading).
        `begun`: the box's reading, begun earlier (_begin_reading)."""
        spec = record.spec
        wanted = spec.extra.get("gpus")
        if isinstance(wanted, str) and wanted.startswith("device="):
            named = [d.strip() for d in wanted[len("device=") :].split(",") if d.strip()]
            self.recorder.save(record.id, gpus=named)
            return named
        if wanted in ("all", "shared"):
            return None
        count = int(wanted) if wanted is not None else spec.gpu_count
        host = spec.extra.get("host")
        where = host or "this machine"
        progress.step(f"looking for {count} free GPU{'s' if count > 1 else ''} on {where}")
        reading = begun.result() if begun is not None else read_box(client, host)
        if reading is None:
            return None
        chosen = self._pick(client, spec, where, reading[0], count)
        line = ", ".join(
            f"{g.label} ({(g.memory_used or 0) >> 20} MiB used, utilization n/a: MIG)"
            if g.slot is not None
            else f"{g.label} ({g.utilization or 0:.0f}% busy, {(g.memory_used or 0) >> 20} MiB used)"
            for g in chosen
        )
        progress.step(f"on {where}: {line}, free and the least busy ({reading[1]})")
        self.recorder.save(
            record.id, gpus=[g.uuid for g in chosen], gpu_indices=[g.index for g in chosen]
        )
        return [g.uuid for g in chosen]

    def _pick(self, client, spec: LaunchSpec, where: str, box: list, count: int) -> list:
        """`count` free GPUs of the box (backends/docker/gpus.py): of the type where the box names
        it (else any of its GPUs), a MIG type's slices only; NoCapacity in one line if too few."""
        of_type = [g for g in box if not g.split and type_matches(g.name, spec.gpu_type)]
        if not of_type and load_catalog().get(spec.gpu_type).is_mig:
            cards = sorted({g.name or "?" for g in box if g.slot is None})
            raise NoCapacity(
                f"no {spec.gpu_type} MIG slice on {where} (its GPUs: {', '.join(cards)}); "
                "name a box whose cards are split so, or another --type",
                where=where,
            )
        box = of_type or box
        with engine_errors(spec.extra.get("host") or "(local engine)"):
            held = holders([c.attrs for c in client.containers.list(all=True)])
        chosen = pick(box, held, count)
        if chosen is None:
            raise NoCapacity(refusal(where, box, held, count), where=where)
        return chosen

    def _prepare_runtime(self, client, host: str | None, image, labels: dict, progress: Progress):
        """The image's own Python runs the kernel; the runtime bundle brings what it lacks, in
        volumes on the engine (container_setup.prepare_runtime)."""
        # lazy: docs/architecture.md#imports-kept-inside-functions
        from ...transport.bundle import cache_dir
        from .container_setup import KnownVolumes, prepare_runtime

        known = self._known.setdefault(host or "", KnownVolumes(client))
        return prepare_runtime(
            client, image, cache_dir=cache_dir(), labels=labels, progress=progress, known=known
        )

    def _create_container(
        self,
        client,
        record: SessionRecord,
        progress: Progress,
        image,
        runtime,
        *,
        labels: dict[str, str],
        workspace: str,
        mounts: dict,
        sockets: str,
        group: int,
        devices: list[str] | None,
    ):
        """The session's container, created (not started) and recorded: the runtime bundle's
        boot with the agent's options as its command, the kernel's key, the GPUs, the volumes."""
        # lazy: docs/architecture.md#imports-kept-inside-functions
        from .container_setup import gpu_request

        spec = record.spec
        name = spec.extra.get("image") or self.default_image()
        entrypoint, command = _boot_command(record, sockets)
        docker = docker_sdk()
        progress.step(f"creating container from {name}")
        try:
            container = create_container(
                client,
                image.id,
                entrypoint=entrypoint,
                command=command,
                detach=True,
                init=True,
                name=f"gpusession-{record.name}-{record.id[:8]}",
                labels={
                    **labels,  # the store's: another user's containers on a shared engine are not ours
                    "gpusession.owner": record.owner,
                    "gpusession.type": f"{spec.gpu_type}:{spec.gpu_count}",
                    "gpusession.image": name,
                    "gpusession.started": str(int(time.time())),
                    WORKSPACE_LABEL: workspace,
                    NAME_LABEL: record.name,
                    **({GPUS_LABEL: ",".join(devices)} if devices else {}),
                },
                environment=_container_environment(record, runtime),
                device_requests=[gpu_request(docker, spec, devices)],
                # no sshd, nothing published: the kernel and agent listen on the host's loopback,
                # reached directly here or through the SSH login to the engine's host
                network_mode="host",
                volumes=mounts,
                group_add=[str(group)],  # the socket folder's group, whoever the image's USER is
            )
        except docker.errors.APIError as exc:
            raise StageError(
                "provision", f"cannot create the container: {short_error(exc)}"
            ) from None
        self.recorder.save(record.id, container_id=container.id)
        return container

    def _start_container(
        self, record: SessionRecord, progress: Progress, container, sockets: str | None = None
    ) -> None:
        """Start it (billed from then); a container that does not start is removed. This
        machine's engine: its log is followed for the kernel from then on (_follow_early)."""
        docker = docker_sdk()
        progress.step(f"starting container {container.short_id}")
        try:
            container.start()
        except docker.errors.APIError as exc:
            remove_container(container)
            text = short_error(exc)
            if "could not select device driver" in text:
                raise BackendUnavailable(NO_NVIDIA.format(detail=text)) from None
            raise StageError("provision", f"cannot start the container: {text}") from None
        billed_from = time.time()
        early = self._follow_early(record, container, sockets)
        self.recorder.save(record.id, **{BILLED_FROM: billed_from})  # billed from its start
        self._started[record.id] = (container, early)

    @staticmethod
    def _follow_early(record: SessionRecord, container, sockets: str | None):
        """This machine's engine, a kernel on unix sockets: its READY (or its sockets taking
        connections, sockets_listen) waited for in a thread from the container's start, which
        connect takes; the start's records (billed from, STARTING) are written meanwhile, not
        between the kernel's readiness and the client's first request (11 ms at load 4). None
        elsewhere: connect waits itself."""
        if record.spec.extra.get("host") or not sockets:
            return None
        # lazy: docs/architecture.md#imports-kept-inside-functions
        from .container_setup import InThread, sockets_listen

        return InThread(
            lambda: wait_for_marker(
                container, Marker.READY, START_TIMEOUT, stage="connect", sooner=sockets_listen
            ),
            late="no GPUSESSION_READY line from the container within {timeout:.0f}s",
        )

    def connect(self, record: SessionRecord, progress: Progress) -> Link:
        # lazy: docs/architecture.md#imports-kept-inside-functions
        from .container_setup import InThread, connection_info

        res = record.resource
        client = self.client(record.spec.extra.get("host"))
        container, early = self._started.pop(record.id, None) or (
            get_container(client, res.get("container_id")),
            None,
        )
        if container is None:
            raise StageError("connect", f"container {res.get('container_id', '?')[:12]} is gone")
        tunnel = opening = None
        if record.spec.extra.get(
            "host"
        ):  # the kernel's ports are on that host's loopback: log in to its sshd
            # lazy: docs/architecture.md#imports-kept-inside-functions
            from ...transport.tunnel import Tunnel, jump_target

            target = jump_target(
                record.spec.extra.get("host")
            )  # known_hosts pins its key, as for the engine
            progress.step(f"opening the SSH tunnel to {target.label}")
            tunnel = Tunnel(
                target,
                [],
                connect_timeout=START_TIMEOUT,
                on_event=lambda text: self._note(record.id, text),
            )
            opening = InThread(tunnel.start)  # log in while the kernel boots
        try:
            progress.step("waiting for the kernel")
            # here the kernel's ports are known once its process started (KERNEL): connecting
            # while it boots; through a tunnel once it listens (READY); unix sockets (their
            # owner's group may use them once the runtime says READY) as _follow_early waits
            early = early or self._follow_early(record, container, res.get("sockets"))
            ready = (
                early.result(START_TIMEOUT + 5)
                if early is not None
                else wait_for_marker(
                    container,
                    Marker.READY if tunnel else Marker.KERNEL,
                    START_TIMEOUT,
                    stage="connect",
                )
            )
            info, agent_port = connection_info(container, ready)
            if tunnel is None:
                return DirectLink(info, agent_port, alive=lambda: self.is_alive(record))
            opening.result(START_TIMEOUT)
            return TunnelLink(tunnel, info, agent_port)
        except BaseException:
            if tunnel is not None:
                tunnel.close()
            self._known.pop(
                record.spec.extra.get("host") or "", None
            )  # a runtime volume gone (a prune)? asked again next time
            raise

    # -- life and teardown --------------------------------------------------------------

    def is_alive(self, record: SessionRecord) -> bool:
        try:
            container = self._find(record)
        except BackendUnavailable:
            return (
                True  # the engine cannot be asked now: unknown is not gone, never tear down blind
            )
        return container is not None and container.status == "running"

    def check_alive(self, records: list[SessionRecord]) -> dict[str, bool]:
        """One question per engine: the local one over its socket; a remote one only when this
        process holds a connection to it already (a new SSH login is no cheap question). A
        paused or restarting container is left out: not running, but not gone either."""
        found: dict[str, bool] = {}
        for host in {r.spec.extra.get("host") or "" for r in records}:
            states = self._container_states(host)
            if states is None:
                continue
            for r in records:
                state = states.get(r.id, "gone")
                if (r.spec.extra.get("host") or "") == host and state in (
                    "running",
                    "exited",
                    "dead",
                    "gone",
                ):
                    found[r.id] = state == "running"
        return found

    def _container_states(self, host: str) -> dict[str, str] | None:
        if not host:
            states = local_engine_states(LABEL)
            if states is not None:
                return states
        client = self._clients.get(host)
        if client is None:
            return None
        answer: list[dict[str, str]] = []

        def ask() -> (
            None
        ):  # in a thread: an engine whose connection hangs must not hold the listing
            try:
                with engine_errors(host or "(local engine)"):
                    listed = client.containers.list(all=True, sparse=True, filters={"label": LABEL})
                answer.append(container_states([c.attrs for c in listed], LABEL))
            except BackendUnavailable:
                pass

        asking = threading.Thread(target=ask, name="gpusession-docker-states", daemon=True)
        asking.start()
        asking.join(QUICK_TIMEOUT)
        return answer[0] if answer else None

    def stop_details(self, record: SessionRecord) -> StopDetails | None:
        """What the runtime left at its end (stopped.json: reason, at, the agent's summary), read
        from the stopped container; else its log markers; else the container's exit code."""
        saved = StopDetails()
        try:
            container = self._find(record)
            if container is None:
                return None
            try:
                saved = StopDetails.from_dict(
                    read_json_from(container, f"{STATE_DIR}/stopped.json")
                )
            except docker_sdk().errors.NotFound:
                pass  # still running, or it never got as far
            if saved.reason is not None:
                return saved
            logged = stop_details_from_log(container_logs(container)) or StopDetails()
        except (BackendUnavailable, ValueError, OSError):
            return None
        reason = logged.reason
        if reason is None and container.status == "exited":
            reason = StopReason(
                StopKind.CONTAINER_EXIT, exit_code=container.attrs["State"].get("ExitCode")
            )
        details = StopDetails(reason=reason, at=saved.at, summary=saved.summary or logged.summary)
        return None if details == StopDetails() else details

    def stop(self, record: SessionRecord) -> None:
        """Remove the container (keeping the end of its log in the record when a start is being
        torn down) and record `removed_at`, so gc stops asking its engine about it. A start that
        never saved `engine` never reached its engine: there is nothing to ask it for."""
        self._started.pop(record.id, None)
        res = record.resource
        if record.spec.backend == self.name and ("engine" in res or res.get("container_id")):
            container = self._find(record)
            if container is not None:
                if record.state in (State.REQUESTED, State.PROVISIONING, State.STARTING):
                    self._keep_start_log(record.id, container)
                remove_container(container)
            for helper in self._labelled(record):  # a helper a cut start left
                remove_container(helper)
            if res.get("sockets"):
                # lazy: docs/architecture.md#imports-kept-inside-functions
                from .container_setup import remove_socket_dir

                remove_socket_dir(
                    self.client(record.spec.extra.get("host")),
                    record.spec.extra.get("host"),
                    res["sockets"],
                )
        (self.config.data_path / "keys" / record.id).unlink(missing_ok=True)
        self.recorder.save(record.id, removed_at=time.time())

    def _keep_start_log(self, session_id: str, container) -> None:
        """The end of a failed start's container log, in the record (`start_log`), bounded."""
        try:
            text = container_logs(container, tail=START_LOG_LINES)
        except Exception as exc:  # noqa: BLE001 - the teardown goes on without it
            log.debug("no start log for %s: %s", session_id, exc)
            return
        data = text.encode()[-START_LOG_BYTES:]
        self.recorder.save(session_id, start_log=data.decode(errors="ignore"))

    def _labelled(self, record: SessionRecord) -> list:
        """The helper containers serving the session (a workspace's import or export, the
        runtime's copy): one a cut start left, its own container gone or never made."""
        client = self.client(record.spec.extra.get("host"))
        with engine_errors(record.spec.extra.get("host") or "(local engine)"):
            return client.containers.list(
                all=True, ignore_removed=True, filters={"label": f"{HELPER_LABEL}={record.id}"}
            )

    def _find(self, record: SessionRecord):
        """The session's container (by saved id, else by label), None when there is none."""
        if record.spec.backend != self.name:
            return None
        client = self.client(record.spec.extra.get("host"))
        container = get_container(client, record.resource.get("container_id"))
        if container is None:
            with engine_errors(record.spec.extra.get("host") or "(local engine)"):
                found = client.containers.list(
                    all=True, ignore_removed=True, filters={"label": f"{LABEL}={record.id}"}
                )
            container = found[0] if found else None
        return container

    # -- gc -----------------------------------------------------------------------------

    def list_resources(self) -> list[RemoteResource]:
        """Containers labelled by this store, on the local engine and on every remote one that
        may still hold one: an active session's, or an ended one's whose removal was never
        confirmed. An engine that answers without an ended session's container confirms it
        (`removed_at`), so a failed record's host is not asked again on every run."""
        records = self.recorder.sessions(self.name)
        unsure = [r for r in records if r.spec.extra.get("host") and _may_hold(r)]
        hosts = [""] + sorted({r.spec.extra.get("host") for r in unsure})
        found: list[RemoteResource] = []
        reached = 0
        for host in hosts:
            try:
                with engine_errors(host or "(local engine)"):
                    mine = {"label": [LABEL, f"{STORE_LABEL}={self.recorder.store_id}"]}
                    containers = self.client(host).containers.list(
                        all=True, ignore_removed=True, filters=mine
                    )
            except Exception as exc:  # noqa: BLE001 - one engine (or a host no resolver takes) never stops the rest
                log.warning("gc: skipping Docker engine %s: %s", host or "(local)", exc)
                continue
            reached += 1
            present = {owning_session(c.labels) for c in containers}
            for r in unsure:
                if r.spec.extra.get("host") == host and not r.state.active and r.id not in present:
                    self.recorder.save(r.id, removed_at=time.time())
            for c in containers:
                if c.status == "removing":  # its stop is removing it (one failing ends "dead")
                    continue
                found.append(
                    RemoteResource(
                        backend=self.name,
                        session_id=owning_session(c.labels),
                        resource_id=c.id,
                        description=f"container {c.name} ({c.short_id}, {c.status}) on {host or 'the local engine'}",
                        running=c.status == "running",
                        details={"host": host},
                    )
                )
        if not reached:
            raise BackendUnavailable("no Docker engine answers")
        return found

    def runtime_copies(self, remote: bool = True) -> list[RemoteResource]:
        """Runtime volumes of other gpusession builds that no container uses, on the local engine
        and (remote) every engine this store's sessions used (volumes)."""
        hosts = [""] + (
            sorted(
                {
                    r.spec.extra.get("host")
                    for r in self.recorder.sessions(self.name)
                    if r.spec.extra.get("host")
                }
            )
            if remote
            else []
        )
        # lazy: docs/architecture.md#imports-kept-inside-functions
        from ...transport.bundle import cache_dir, current_digests

        return stale_resources(self.name, self.client, hosts, current_digests(cache_dir()))

    def remove_resource(self, resource: RemoteResource) -> None:
        if "volumes" in resource.details:
            with engine_errors(resource.details.get("host") or "(local engine)"):
                remove_copy(self.client(resource.details.get("host")), resource.details["volumes"])
            return
        host = resource.details.get("host")
        container = get_container(self.client(host), resource.resource_id)
        if container is not None and owning_session(container.labels) == resource.session_id:
            remove_container(container)
            # lazy: docs/architecture.md#imports-kept-inside-functions
            from .container_setup import SOCKETS_PREFIX, remove_socket_dir

            for mount in (
                container.attrs.get("Mounts") or []
            ):  # its kernel's socket folder goes with it
                if str(mount.get("Source", "")).startswith(SOCKETS_PREFIX):
                    remove_socket_dir(self.client(host), host, mount["Source"])
        (self.config.data_path / "keys" / resource.session_id).unlink(missing_ok=True)
        try:  # its engine is asked no more (list_resources), when the store knows the session
            self.recorder.save(resource.session_id, removed_at=time.time())
        except GpuSessionError:
            pass


def _lost_race(client, where: str, mine: str, devices: list[str]) -> bool:
    """Whether another live container holding one of `devices` was created before container
    `mine`, by the engine's creation time to the nanosecond (then id): every start on the box
    orders them alike, and one that checked before the other existed stays the earlier one (by
    the second alone, two containers of the same second were ordered by id, and a later one
    with a smaller id kept the GPU that an earlier one had already kept)."""
    with engine_errors(where):
        listed = [_inspected(client, c.id) for c in _gpu_holders(client)]
    found = [c for c in listed if c is not None]  # one removed meanwhile (a lost race) is gone
    order = {c["Id"]: (created_ns(c.get("Created")), c["Id"]) for c in found}
    if mine not in order:
        return False
    wanted = set(devices)
    return any(
        order[c["Id"]] < order[mine]
        and (c.get("State") or {}).get("Status") not in ("exited", "dead")
        and wanted
        & set(((c.get("Config") or {}).get("Labels") or {}).get(GPUS_LABEL, "").split(","))
        for c in found
        if c["Id"] != mine
    )


def _gpu_holders(client) -> list:
    """The containers of the engine that name the GPUs they hold (their label)."""
    return client.containers.list(all=True, sparse=True, filters={"label": GPUS_LABEL})


def _inspected(client, container_id: str) -> dict | None:
    """A container's inspect (its creation time to the nanosecond), None when it is gone."""
    try:
        return client.api.inspect_container(container_id)
    except docker_sdk().errors.NotFound:
        return None


def created_ns(created: Any) -> int:
    """A container's creation time in nanoseconds: inspect's RFC 3339 text
    ("2026-12-03T14:20:01.12345Z": Docker drops the fraction's trailing zeros), or the listing's
    whole seconds."""
    if isinstance(created, (int, float)):
        return int(created) * 1_000_000_000
    text = str(created or "")
    match = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?", text)
    if not match:
        return 0
    whole = calendar.timegm(time.strptime(match.group(1), "%Y-%m-%dT%H:%M:%S"))
    return whole * 1_000_000_000 + int((match.group(2) or "0")[:9].ljust(9, "0"))


def _may_hold(record: SessionRecord) -> bool:
    """Whether the session's engine may still hold a container of it: it is active, or it ended
    without its removal confirmed after its start reached the engine (`engine` is saved as soon
    as the engine answers, before anything is made there)."""
    res = record.resource
    return record.state.active or (
        ("engine" in res or bool(res.get("container_id"))) and "removed_at" not in res
    )


def _boot_command(record: SessionRecord, sockets: str) -> tuple[list[str], list[str]]:
    """The container's entrypoint and command: the runtime bundle's boot, with the agent's
    options (the kernel on unix sockets in `sockets`, the workspace as its working folder)."""
    # lazy: docs/architecture.md#imports-kept-inside-functions
    from .container_setup import bundle_command

    return bundle_command(
        AgentArgs.for_record(
            record,
            session_id=record.id,
            state_dir=STATE_DIR,
            kernel_ip=f"{sockets}/k",
            workspace=WORKSPACE_MOUNT,
            cwd=WORKSPACE_MOUNT,
        ).argv()
    )


def _container_environment(record: SessionRecord, runtime) -> dict[str, str]:
    """The session's id, the kernel's key (made here: the log, READY, says where the kernel
    listens, never its key) and how the image's Python runs with the runtime bundle."""
    import secrets

    return {
        ENV_SESSION_ID: record.id,
        ENV_KERNEL_KEY: secrets.token_hex(32),
        ENV_RUNTIME_PYTHON: runtime.python.start_with,
        ENV_RUNTIME_BRINGS: ",".join(runtime.python.brings),
    }
