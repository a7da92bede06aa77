"""The backend contract: where GPUs come from. A backend can be written from this module alone.

A backend creates, connects to, and removes the remote side of a session. It never imports
`gpusession.session`, the store or another backend. The session layer calls it in this order:

    available()                 -> may it be the default here (no --backend given)?
    check(spec)                 -> before anything is recorded or paid for
    price_per_hour(spec, ...)   -> once, when the session is recorded
    provision(record, progress) -> creates the paid resource, saving its handle early
    connect(record, progress)   -> waits for the kernel, opens any tunnel, returns a Link
    ... cells run through the Link; is_alive(record) while they do ...
    stop(record)                -> idempotent teardown, also of a half-provisioned session
    stop_details(record)        -> when the remote side is found gone: what it left at its end

and `gpusession gc` calls list_resources() and remove_resource(resource).

What it declares about GPUs and money, read without an instance: `gpu_types` (types the catalog
lacks, merged into it while it is installed), `price_list` (its own dollars per GPU-hour),
`gpu_rate` / `catalog_prices` / `catalog_columns` (a table of its own, as aws's EC2 instances:
what advice and --cheapest weigh, what the spend report calls a catalog rate, what `%gpu types`
and GET catalog show beside the catalog); `list_prices` renews its table (`catalog refresh`).

Backends return what must be recorded and the session layer records it: a backend writes only
through its `Recorder` (its handles, timeline notes, a corrected price), never the store. Every
paid resource carries the session id remotely (container labels, instance tags, a process
environment variable), and `list_resources()` finds them, so `gpusession gc` can stop what a
crashed process left behind. What a backend saves with `Recorder.save` comes back as
`record.resource` (like jupyter_client's provisioner `get_provisioner_info` /
`load_provisioner_info`): it is all another process needs to connect or stop.
"""

from __future__ import annotations

import abc
import dataclasses
import logging
import os
import re
import socket
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Iterable, Iterator, Protocol

from ..configuration.cost import CONFIGURED, OWN_HARDWARE, PRICE_LIST
from ..configuration.settings import Setting, section_for, setting_value
from ..core.errors import BadInput
from ..core.models import KernelEndpoint
from ..core.protocol import Marker, StopDetails, StopKind, StopReason, parse_marker

if TYPE_CHECKING:
    from ..configuration.catalog import Catalog, CatalogColumn, GpuType
    from ..configuration.config import GpuSessionConfig
    from ..configuration.options import StartOption
    from ..core.models import LaunchSpec, SessionRecord
    from ..core.progress import Progress

log = logging.getLogger(__name__)


class Recorder(Protocol):
    """Everything a backend may record. The session layer hands one to each backend it builds
    (`gpusession.session.StoreRecorder` writes to the store); a test may hand a fake."""

    store_id: str
    """Which session store this is, among others on a shared engine or account: a label value a
    backend puts on its remote resources so that gc collects only its own store's."""

    def save(self, session_id: str, **values: Any) -> None:
        """Merge `values` (JSON-able) into the session's `record.resource`: the backend's handle
        (container id, instance id, key path...) as soon as it exists, so a crash right after
        leaves it findable, and anything a later `connect`/`stop` in another process needs."""

    def note(self, session_id: str, text: str) -> None:
        """Add a line to the session's timeline (a tunnel reconnect, a capacity fallback...)."""

    def set_price(self, session_id: str, price_per_hour: float, detail: str) -> None:
        """Correct the session's price when the real one differs from `price_per_hour`'s
        estimate (the spot price of the zone that had capacity); `detail` says why."""

    def sessions(self, backend_name: str) -> list["SessionRecord"]:
        """Every recorded session of that backend, any state (which remote engines or regions
        gc must look at)."""

    def failed_hosts(self, backend_name: str) -> set[str]:
        """The hosts of that backend a workspace listing could not reach before: a listing
        skips them (`gpusession workspaces --retry-hosts` asks them again)."""

    def host_failed(self, backend_name: str, host: str, error: str) -> None:
        """A host did not answer a workspace listing: remembered, said once by the face."""


@dataclasses.dataclass
class RemoteResource:
    """Something a backend holds that is labelled as ours (what gc looks at)."""

    backend: str  # backend name
    session_id: str  # the label/tag value
    resource_id: str  # container id, instance id, pid...
    description: str  # one line for the user
    running: bool  # still consuming (billing) resources
    details: dict[str, Any] = dataclasses.field(default_factory=dict)  # what remove_resource needs


@dataclasses.dataclass
class Place:
    """A place a session could run, as `Backend.discover` (or gpusession setup's SSH and
    kubeconfig probes) found it: data, put into words by gpusession/words/setup.py."""

    kind: str  # what was looked at: "this machine", "docker engine", "ssh host", "aws", ...
    where: str  # the place in the user's words: "unix:///var/run/docker.sock", "ssh://gpu1"
    gpus: str  # what GPUs it has, as found: "2 x Tesla T4", "none", "unknown"
    backend: str | None  # the backend that would use it; None: none installed for it
    usable: bool  # a GPU session can start there as it is
    note: str = ""  # why not, or what else to know (one line)
    host: str | None = None  # the --host a start there takes (a remote engine, a login node)


PROBE_TIMEOUT_S = 4.0  # each probe's bound: a place that does not answer is listed as such


def run_probe(cmd: list[str], timeout: float = PROBE_TIMEOUT_S) -> tuple[int, str]:
    """Run a local command for a probe: (exit status, its output; the first line of what it
    said when it failed). 127 when it cannot run or does not finish within `timeout`."""
    import subprocess  # noqa: PLC0415 - only the probes of gpusession setup run commands here

    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return 127, str(exc)
    text = (done.stdout or done.stderr).strip()
    return done.returncode, text if done.returncode == 0 else (text.splitlines() or [""])[0]


def gpu_words(listing: str) -> str:
    """`nvidia-smi -L` lines ('GPU 0: Tesla T4 (UUID: ...)') as '2 x Tesla T4'; 'none'."""
    names = [
        line.split(":", 1)[1].split("(")[0].strip()
        for line in listing.splitlines()
        if line.startswith("GPU ") and ":" in line
    ]
    if not names:
        return "none"
    return ", ".join(f"{names.count(n)} x {n}" for n in dict.fromkeys(names))


@dataclasses.dataclass
class LocalImage:
    """An image a backend's machine already has: what the start forms offer for --image."""

    reference: str  # as --image takes it: repo:tag
    size_bytes: int | None  # None: the engine does not say
    runtime_cached: bool  # a session started from it here before: its Python is known (no probe)


@dataclasses.dataclass
class Workspace:
    """A session's workspace that outlives it (a Docker volume, a folder, an EBS volume)."""

    backend: str  # backend name
    name: str  # the workspace's name (--workspace, --resume)
    where: str  # one line for the user: "volume gpusession-ws-x on the local engine", a path
    size_bytes: int | None = None  # None: unknown (an engine that does not say)
    monthly_cost: float | None = None  # dollars a month it costs while kept; None: nothing billed
    in_use_by: list[str] = dataclasses.field(
        default_factory=list
    )  # session ids whose remote side uses it now
    details: dict[str, Any] = dataclasses.field(
        default_factory=dict
    )  # what remove_workspace needs (host...)


@dataclasses.dataclass
class WorkspaceExport:
    """A workspace read out as a tar stream, to be written where another session mounts it
    (`%gpu switch` between engines). Its entries are under `workspace/` (the folder itself
    first), with their owners and modes."""

    size_bytes: int | None  # what moves, as the backend knows it before reading; None: unknown
    chunks: Iterator[bytes]  # the tar stream
    close: Callable[[], None] = lambda: None  # lets go of what the reading holds (a helper)


@dataclasses.dataclass(frozen=True)
class ListedPrices:
    """What `Backend.list_prices` found (`gpusession catalog refresh`)."""

    rates: dict[str, float]  # GPU type -> on-demand dollars per GPU-hour: the catalog's rates
    kept: dict[str, Any]  # what it keeps in the user's snapshot, read back by its own table
    asked: list[str]  # the rows of its table it asked for, in its own terms ("g4dn.xlarge")
    priced: list[str]  # ... those the price list priced
    changed: list[str]  # ... those whose price is not the package's
    rows: str = "prices"  # what a row is, in words: "instance types"
    region: str = ""  # where the prices are for


class Link(abc.ABC):
    """A live connection to a session's kernel (and agent). Owned by one process."""

    endpoint: "KernelEndpoint"

    @abc.abstractmethod
    def close(self) -> None:
        """Called by the session layer when this process lets go (stop, or interpreter exit).
        Closes tunnels; never stops the remote kernel by itself."""

    def healthy(self) -> bool:
        """Called while a cell runs: False when the link is down beyond repair."""
        return True

    def failure(self) -> str | None:
        """Called by the session layer when healthy() is False and the session still runs: why
        the link is down beyond repair (a refused login, unreachable for N s), or None."""
        return None

    @property
    def reconnects(self) -> int:
        """How often the link came back after dropping (0 for links that cannot drop). Read by the
        session before each cell: after a reconnect each ZMQ socket reconnects on its own, and a
        request sent before iopub is subscribed again would lose its output."""
        return 0

    streams: bool = False
    """It reaches a socket beside the kernel's unix sockets (`open_stream`): a download's bytes
    then come on a stream of their own (gpusession.agent.transfer_raw), not as ZMQ frames."""

    def open_stream(self, path: str) -> Any:
        """A connection (recv, sendall, settimeout, close) to the kernel's unix socket `path`
        (beside its own), or None when it cannot be made now (a tunnel that is down)."""
        return None

    _folder = ""  # the folder of the kernel's unix sockets, where it has them

    def _beside(self, path: str) -> bool:
        """`path` is in the kernel's socket folder: the only place a stream is opened to."""
        return self.streams and os.path.dirname(path) == self._folder


class DirectLink(Link):
    """A Link to a kernel whose ports are on this machine's loopback already, or its unix sockets
    (a container of the local Docker engine on the host network): nothing to open, nothing that
    can drop."""

    def __init__(
        self, kernel_info: dict, agent_port: int | None, alive: "Callable[[], bool] | None" = None
    ):
        """`kernel_info`: the runtime's kernel.json (ports on 127.0.0.1); `agent_port`: the
        agent's (runtime.json), None when it has none; `alive`: is the remote side still there
        (asked at most once a second; a kernel that dies while it starts is noticed by it)."""
        agent_url = f"http://127.0.0.1:{int(agent_port)}" if agent_port else None
        ip = (
            kernel_info["ip"] if kernel_info.get("transport") == "ipc" else "127.0.0.1"
        )  # unix sockets: their path
        self.endpoint = KernelEndpoint(
            connection_info=dict(kernel_info, ip=ip), agent_url=agent_url
        )
        self._alive = alive
        self._checked = (0.0, True)
        self.streams = kernel_info.get("transport") == "ipc"
        self._folder = os.path.dirname(ip)

    def close(self) -> None:
        pass

    def open_stream(self, path: str) -> Any:
        if not self._beside(path):
            return None
        conn = socket.socket(socket.AF_UNIX)
        try:
            conn.connect(path)
        except OSError:
            conn.close()
            return None
        return conn

    def healthy(self) -> bool:
        import time

        at, answer = self._checked
        if self._alive is not None and time.monotonic() - at > 1.0:
            answer = bool(self._alive())
            self._checked = (time.monotonic(), answer)
        return answer


class TunnelLink(Link):
    """A Link through a `gpusession.transport.tunnel.Tunnel` to a kernel's loopback ports on the machine the
    tunnel logs in to (a Docker host, an EC2 instance); closing it closes the tunnel and leaves the
    remote side running."""

    def __init__(self, tunnel, kernel_info: dict, agent_port: int | None = -1):
        """`tunnel`: started; `kernel_info`: the remote kernel.json, whose ports (and
        `agent_port`: -1 for the fixed `tunnel.CONTAINER_AGENT_PORT`, None for no agent) the
        tunnel forwards to local ones."""
        # lazy: docs/architecture.md#imports-kept-inside-functions
        from ..transport.tunnel import CONTAINER_AGENT_PORT, tunneled_endpoint

        self.tunnel = tunnel
        self.endpoint = tunneled_endpoint(
            tunnel, kernel_info, CONTAINER_AGENT_PORT if agent_port == -1 else agent_port
        )
        self.streams = kernel_info.get("transport") == "ipc"  # its sockets by streamlocal
        self._folder = os.path.dirname(str(kernel_info.get("ip", "")))

    def open_stream(self, path: str) -> Any:
        return self.tunnel.open_stream(path) if self._beside(path) else None

    def close(self) -> None:
        self.tunnel.close()

    def healthy(self) -> bool:
        return self.tunnel.healthy()

    def failure(self) -> str | None:
        failure = self.tunnel.failure
        return str(failure) if failure is not None else None

    @property
    def reconnects(self) -> int:
        return self.tunnel.reconnects


class Backend(abc.ABC):
    """One place GPUs come from, registered under the `gpusession.backends` entry-point group
    (`gpusession.configuration.registry.backend_classes`). One instance per backend name and process, built by
    the session layer; it may be called from several threads."""

    name: ClassVar[str]  # the --backend word, also in every record's spec.backend

    # -- its surface: read from the class (never an instance) by the option table, the faces,
    # the docs and gc, so adding a backend is its package and its entry point, nothing else --

    start_options: ClassVar[tuple["StartOption", ...]] = ()
    """The start options only this backend reads (`gpusession.configuration.options.StartOption` rows, their
    `backends` left None): `gpusession.configuration.options` gathers them from every registered class into
    the one option table behind the magic, the CLI, the REST body and both start forms, with
    `backends` set to this backend's name. A backend reads their values from `spec.extra` (or
    the row's `spec_field`). Two backends may declare the same row; it then applies to both."""

    keeps_workspaces: ClassVar[bool] = False
    """Its workspaces outlive the session (--workspace, --resume, --save-timeout, --save-cap
    apply to it; `gpusession workspaces` asks its `list_workspaces`)."""

    shares_workspaces: ClassVar[bool] = True
    """Two sessions may mount one of its workspaces at once (a Docker volume, a folder); False
    where one session at a time can (an EBS volume attaches to one instance): a switch then
    needs the backend's `take_workspace_over(session_id, release)` (aws), which calls
    `release()` (the old session saves and stops) once the new session's machine is there."""

    takes_host: ClassVar[bool] = False
    """It runs on a machine the user names with --host (an engine, a login node); the value is
    `spec.extra["host"]`."""

    host_help: ClassVar[str] = ""
    """What --host means for it, in --help and the forms ("the cluster's login node, ...")."""

    takes_image: ClassVar[bool] = False
    """It runs the session in a container image the user may name with --image
    (`spec.extra["image"]`; see `default_image` for the one it takes when none is named)."""

    image_help: ClassVar[str] = ""
    """What --image means for it, and its default, in --help and the forms."""

    settings: ClassVar[tuple[Setting, ...]] = ()
    """Its own settings: `c.<its class name>.<name>` (config files, `%config`), else the
    setting's env var, else its built-in value (configuration/settings.py `Setting`); read with
    `self.setting(name)`. docs/reference/configuration.md lists every backend's."""

    stop_words: ClassVar[dict[str, str]] = {}
    """Its own phrases for how its capacity ends and is warned of (gpusession.core.protocol
    StopKind values, "warning:" + WarningKind values; `{action}` and `{time}` filled in for a
    notice): a cloud names itself ("AWS took the spot instance back"); the core's words are
    neutral ("its cloud took the spot capacity back")."""

    place_option: ClassVar[str | None] = None
    """The start option that says where its workspaces live (docker and slurm: "host", aws:
    "region"; None: one place): two sessions of it on the same place mount the same workspaces,
    and a switch to another backend leaves it behind (that backend's place is another machine)."""

    place_here: ClassVar[str] = "this machine"
    """Where its workspaces live when that option is not given, in words."""

    def setting(self, name: str) -> Any:
        """Its setting `name` (`settings`), as this process's faces give it."""
        return setting_value(type(self).__name__, type(self).settings, name, self.config)

    def settings_section(self):
        """The traitlets section of its settings under this process's config (`%config
        DockerBackend.image = ...` reaches it; a Python caller may set its traits), None where
        the config is no traitlets one (the CLI: env vars only) or it declares none."""
        if not type(self).settings or not hasattr(self.config, "parent"):
            return None
        return section_for(type(self).__name__, type(self).settings, self.config)

    @classmethod
    def workspace_where(cls, place: str) -> str:
        """Where a workspace of it on `place` lives, in words for a switch's lines ("docker
        ssh://gpu1", "aws (the default region)")."""
        return f"{cls.name} {place}" if place else f"{cls.name} ({cls.place_here})"

    agent_beside_us: ClassVar[bool] = False
    """Its agent runs on this machine and reads this machine's files: GPUSESSION_NVML_REPLAY
    (GpuSessionConfig.nvml_replay) replays a recording in its sessions."""

    default_rank: ClassVar[int | None] = None
    """Its place when no backend was named or configured: the session layer asks `available()`
    of the backends with a rank, lowest first, and takes the first that answers yes (docker 10,
    local 90: docker when an engine answers, else local). None: used only when named."""

    order: ClassVar[int] = 100
    """Its place in listings (workspaces, an option's backends, the docs): lowest first."""

    price_source: ClassVar[str] = (
        "GpuSessionConfig.price_per_hour, else the catalog's on-demand rate"
    )
    """Where `price_per_hour` takes its price from, in words (the docs' backend table, and
    every face that shows its `price_list`)."""

    price_list: ClassVar[dict[str, float]] = {}
    """Its own price, dollars per GPU-hour, of the GPU types it prices (a site's internal rates,
    a provider's list): the default `price_per_hour` takes it over the catalog's, and every face
    shows it beside the catalog (GET catalog's `backend_prices`, `%gpu types`, the start form)."""

    gpu_types: ClassVar[dict[str, dict[str, Any]]] = {}
    """GPU types it gives that the package's catalog lacks, as the catalog's data file writes
    one (gpusession/data/catalog.json): name -> {"description", "memory_gb", "rate" (the
    reference dollars per GPU-hour), "fp16_tflops", "fp32_tflops"}. The catalog merges them
    while this backend is installed: every face lists them (`%gpu types`, GET catalog, the
    forms' type choices) and --type takes them. A name the package has stays the package's;
    what it charges for a package's type goes in `price_list`."""

    def __init__(self, config: "GpuSessionConfig", recorder: Recorder):
        self.config = config
        self.recorder = recorder

    @classmethod
    def discover(cls, timeout: float = PROBE_TIMEOUT_S) -> list[Place]:
        """Called by `gpusession setup`: the places this backend finds where GPUs could be (this
        machine's GPU, its engines, credentials, a cluster), each probed within about `timeout`
        seconds. Creates nothing, costs nothing, never raises (a place that does not answer is a
        Place that says so). The default: none."""
        return []

    @classmethod
    def available(cls, timeout: float = 2.0) -> bool:
        """Called by the session layer when no backend was named, to pick the default: can this
        backend serve here without more setup (an engine answers, nothing to install)? Answers
        within about `timeout` seconds, creates nothing, costs nothing, never raises.
        The default is False: such a backend is used only when named."""
        return False

    def cannot_give(self, spec: "LaunchSpec") -> str | None:
        """Called by the session layer before a start on a backend nobody named (the default
        picked by `default_rank`): None when it can give `spec`'s GPUs, else why not, in a few
        words ("this machine's Docker engine gives containers no GPU (no nvidia runtime)"), so
        the start is refused before anything is pulled or paid for. Asks quickly, creates
        nothing. The default: None (it says nothing it does not know)."""
        return None

    def check(self, spec: "LaunchSpec") -> None:
        """Called before the session is recorded: raise BadInput / BackendUnavailable with an
        actionable message when this backend cannot serve `spec` (no engine, no SDK, no
        credentials...). Must not create or pay for anything."""

    def price_per_hour(self, spec: "LaunchSpec", catalog: "Catalog") -> float:
        """Called once when a session is recorded (after `check`), for its cost meter and the
        agent's cost cap: dollars per hour for `spec`. Must not create anything. Own hardware:
        the configured price, or the catalog's on-demand rate for the same GPUs when none is
        configured."""
        if self.config.price_per_hour >= 0:
            return self.config.price_per_hour
        if spec.gpu_type in type(self).price_list:
            return type(self).price_list[spec.gpu_type] * spec.gpu_count
        gpu = catalog.get(spec.gpu_type)
        return catalog.price_per_hour(gpu, spec.gpu_count)

    def live_prices(
        self, catalog: "Catalog", types: list[str] | None = None
    ) -> list[dict[str, Any]]:
        """Called by `%gpu types --live` / `gpusession types --live`: the current prices this
        backend can ask its cloud for, per GPU type (of `types` only, when given: the forms'
        line asks for one) and zone of each region it compares (its own settings), as rows
        {"type", "instance", "region", "zone", "spot", "on_demand"}. Own hardware has none: [].
        Must not create anything; may be cached a few minutes."""
        return []

    @classmethod
    def places(cls, config: "GpuSessionConfig") -> list[str]:
        """Called by the start forms (GET options' `places`): the named places a start of it may
        give as --host, offered beside the field (docker: `pool:NAME` of each configured pool).
        Reads settings only: quick, never raises. Default: none."""
        return []

    def free_now(self) -> list[dict[str, Any]]:
        """Called by `%gpu types` / `gpusession types`: what each place it shares among people
        has free now (docker: every box of each configured pool), as rows {"place": "pool lab",
        "host": "ssh://gpu1", "free": {"NVIDIA A100-SXM4-40GB": 2}, "gpus": 8, "skipped": None
        or why the box was not asked}. Quick (bounded by a deadline), creates nothing, never
        raises. Default: nothing to say."""
        return []

    def list_prices(self, catalog: "Catalog") -> "ListedPrices | None":
        """Called by `gpusession catalog refresh`: its cloud's current on-demand list prices of
        its own table's rows (a cloud's machines), and the reference rate per GPU they give
        the catalog's types; None: this backend has no price list (own hardware). What it
        returns in `ListedPrices.kept` is written in the user's snapshot, for its table to read
        back (`configuration.catalog.backend_snapshot`). Raises BackendUnavailable (one line)
        without credentials."""
        return None

    @classmethod
    def gpu_rate(
        cls, catalog: "Catalog", gpu: "GpuType", count: int, *, spot: bool = False
    ) -> float | None:
        """Called by advice and --cheapest to weigh types against each other: dollars per hour
        of `count` x `gpu` here (`spot`: a spot start's typical price, where it has one); None
        when it cannot give them. The default: its `price_list`, else the catalog's rate."""
        return round(cls.price_list.get(gpu.name, gpu.rate) * count, 6)

    @classmethod
    def catalog_prices(
        cls, catalog: "Catalog", gpu: "GpuType", count: int, *, spot: bool = False
    ) -> tuple[float, ...]:
        """Called by the spend report: the prices that a session of `count` x `gpu` priced from
        a table (not told by its cloud, not configured) has, so the report says "catalog rate"
        of it. The default: the catalog's rate."""
        return (catalog.price_per_hour(gpu, count),)

    @classmethod
    def catalog_columns(cls, catalog: "Catalog") -> list["CatalogColumn"]:
        """Called by `%gpu types` and GET catalog: its own columns beside the catalog's rate (a
        cloud's machines and spot prices per type, configuration.catalog.CatalogColumn). The
        default: none."""
        return []

    def price_basis(self, spec: "LaunchSpec") -> str | None:
        """Called with `price_per_hour`: where its price comes from, one of gpusession.configuration.cost's
        CLOUD (what a cloud bills), OWN_HARDWARE (the catalog's cloud rate applied to the user's
        own machine: every face says so), CONFIGURED (a price the user set); None: unsaid.
        The default matches the default `price_per_hour`."""
        if self.config.price_per_hour >= 0:
            return CONFIGURED
        return PRICE_LIST if spec.gpu_type in type(self).price_list else OWN_HARDWARE

    def default_image(self) -> str | None:
        """Called by `provision` (and the docs): the image a session runs when --image names
        none; None when the backend runs no image of its own choosing (the node's Python)."""
        return None

    def place(self, record: "SessionRecord", progress: "Progress") -> dict[str, Any] | None:
        """Called before `provision` (and again before each type of a fallback list: the
        record's type is the one tried): where, within what the user allowed, the session goes;
        the spec.extra fields to record before provisioning (docker: the box of a pool it chose
        as `host`), or None. Raise NoCapacity when nowhere allowed has room for the type. Must not
        create anything. Default: nothing to choose."""
        return None

    @abc.abstractmethod
    def provision(self, record: "SessionRecord", progress: "Progress") -> None:
        """Called after the record exists (state provisioning). Create the remote side, labelled
        with `record.id`, and save its handle with `self.recorder.save(record.id, ...)` as soon as
        it exists, so a crash right after leaves it findable. Report steps on `progress`. Raise
        StageError (or BackendUnavailable) on failure; the caller then calls `stop`, so leave what
        was made findable rather than cleaning up half-way."""

    @abc.abstractmethod
    def connect(self, record: "SessionRecord", progress: "Progress") -> Link:
        """Called after provision (state starting), or by any process that wants to use a running
        session (from `record.resource` alone). Wait until the kernel answers on its ports and
        return a Link whose endpoint's connection info points at ports on this machine. Raise
        StageError when it cannot; never stop the remote side."""

    @abc.abstractmethod
    def is_alive(self, record: "SessionRecord") -> bool:
        """Called while cells run, when a process attaches, and by gc: does the remote side still
        exist and run? Answer True when the backend cannot tell now (the engine or cloud does not
        answer): False makes the caller record the session as ended and tear it down."""

    def check_alive(self, records: list["SessionRecord"]) -> dict[str, bool]:
        """Called when sessions are listed (`gpusession list`, REST `GET sessions`, often): which
        of these running sessions are alive (True) or gone (False), from what this backend sees
        cheaply for all of them at once - well under a second, no login, no cloud API call.
        Leave out those it cannot tell that cheaply: they are shown as unverified. Must not
        change anything. The default tells nothing."""
        return {}

    def stop_details(self, record: "SessionRecord") -> "StopDetails | None":
        """Called when the remote side is found gone (and at stop, for the agent's summary): what
        it left at its end - why it stopped, when, the agent's summary - read from the runtime's
        stopped.json, its log markers, or what the backend itself knows (an exit code, the
        cloud's state reason). None when it left nothing to read. Must not change or remove
        anything, and never raises for a session that is half-provisioned or already removed."""
        return None

    @abc.abstractmethod
    def stop(self, record: "SessionRecord") -> None:
        """Called by stop, by a failed start, and by gc. Remove everything the session holds
        (found by saved handle and by label); succeed when it is already gone; work for a
        half-provisioned session. Raise only when something may still be held (the caller keeps
        the session recorded as stopping, for gc to retry)."""

    @abc.abstractmethod
    def list_resources(self) -> list[RemoteResource]:
        """Called by gc: every resource labelled as ours (this store's) that this backend can see,
        any session's, running or not. Raise BackendUnavailable when nothing could be asked."""

    @abc.abstractmethod
    def remove_resource(self, resource: RemoteResource) -> None:
        """Called by gc for a resource from `list_resources` whose session is stopped or unknown
        to the store. Remove it only when it still carries `resource.session_id`; gone is fine."""

    def runtime_copies(self, remote: bool = False) -> list[RemoteResource]:
        """Called by `gpusession gc`, after `list_resources`: copies of the runtime this backend
        keeps on its machines (Docker volumes of other gpusession builds) that no session uses,
        each with `details["why"]`. Only this machine's (or, with `remote`, every machine this
        store's sessions used). gc removes them with `remove_resource` under --volumes, and
        otherwise only counts them in a note: they cost disk, not money. Must not change
        anything. The default: none."""
        return []

    def local_images(self, host: str | None) -> list[LocalImage]:
        """Called by the start forms when a backend that `takes_image` is chosen (and its host
        typed): the images the machine at `host` (None: this machine's) already has, which a start
        runs without a pull. Quick, creates nothing. Raise BackendUnavailable when nothing could
        be asked. The default: none known."""
        return []

    # -- workspaces (optional: a backend without them keeps nothing after a stop) -------------

    def list_workspaces(self) -> list[Workspace]:
        """Called by `gpusession workspaces` and gc's report: the workspaces this backend keeps
        (never removed by gc). Raise BackendUnavailable when nothing could be asked."""
        return []

    def remove_workspace(self, workspace: Workspace) -> None:
        """Called by `gpusession workspaces rm` only (the user confirmed): delete it and what is
        in it. Raise BadInput when a session uses it now."""
        raise NotImplementedError(f"the {self.name} backend keeps no workspaces")

    def export_workspace(self, record: "SessionRecord", progress: "Progress") -> WorkspaceExport:
        """Called by `SessionManager.switch` when the next session cannot mount the workspace of
        `record` (a session of this backend, still running: its files are read as they are).
        Raise BadInput when this backend cannot hand its workspaces out."""
        raise BadInput(f"the {self.name} backend cannot move its workspaces")

    def import_workspace(
        self, record: "SessionRecord", chunks: Iterable[bytes], progress: "Progress"
    ) -> None:
        """Called by `SessionManager.switch` before `provision(record)`: make the workspace that
        `record` resumes (`--resume NAME`) hold exactly what the tar stream `chunks` holds (the
        format of `WorkspaceExport`), replacing an older copy of it there. Raise BadInput when
        this backend cannot take a workspace in."""
        raise BadInput(f"the {self.name} backend cannot take a workspace in")

    # -- for subclasses ---------------------------------------------------------------------

    def _note(self, session_id: str, text: str) -> None:
        """Record a timeline note from any thread (a tunnel's); never raises."""
        try:
            self.recorder.note(session_id, text)
        except Exception:  # noqa: BLE001 - a note must never break the thread that makes it
            log.debug("could not record %r", text, exc_info=True)


def before_the_last(spec: "LaunchSpec") -> bool:
    """Whether the spec's type is one of a fallback list (`--type a100,t4`) that is not its last:
    a queueing backend (Slurm, Kubernetes) takes such a type only when it has capacity now, and
    queues only for the last (their `place`)."""
    listed = [t.partition(":") for t in spec.extra.get("types") or []]
    order = [(name, int(count or 1)) for name, _, count in listed]
    return len(order) > 1 and order[-1] != (spec.gpu_type, spec.gpu_count)


def failure_detail(payload: Any) -> str:
    """The text of a FAILED marker's payload ({"stage", "error"}, or plain text)."""
    if isinstance(payload, dict):
        stage, error = payload.get("stage"), payload.get("error")
        return f"{stage}: {error}" if stage else str(error)
    return str(payload or "")


# Where a marker starts, wherever it is in a line: the kernel shares the runtime's stdout and
# prints "To connect another client to this kernel, use:" and its newline as two writes, so
# the runtime's READY line can land between them (about one start in ninety, under load).
_MARKER_AT = re.compile(
    "(?=(?:"
    + "|".join(sorted((re.escape(m.value) for m in Marker), key=len, reverse=True))
    + r")(?:\s|$))"
)


def marker_lines(text: str) -> list[str]:
    """The log's lines, each split again where a marker starts in its middle."""
    out: list[str] = []
    for line in text.splitlines():
        out += (
            [part for part in _MARKER_AT.split(line) if part] if "GPUSESSION_" in line else [line]
        )
    return out


def log_tail(text: str, lines: int) -> str:
    """The last `lines` lines of a runtime's output, for a message: a FAILED marker as its error,
    every other marker line left out (they are for this side, never for a user), a Python
    traceback as its last line (the exception, not the frames), ' | ' between."""
    said = []
    in_traceback = False
    for line in marker_lines(text):
        parsed = parse_marker(line)
        if line.startswith("Traceback (most recent call last)"):
            in_traceback = True
        elif in_traceback and (line[:1].isspace() or not line.strip()):
            continue  # a frame, its source line or a caret line
        elif parsed is not None and parsed[0] is Marker.FAILED:
            in_traceback = False
            said.append(failure_detail(parsed[1]))
        elif parsed is None and line.strip():
            in_traceback = False
            said.append(line.strip())
    return " | ".join(said[-lines:]) or "(no output)"


def stop_details_from_log(text: str) -> StopDetails | None:
    """What a runtime's log (a container's, an instance's console) says about its end: the last
    STOPPED reason, else the first FAILED start, and the last SUMMARY. None when it says nothing."""
    stopped: StopReason | None = None
    failed: StopReason | None = None
    summary: dict | None = None
    for line in marker_lines(text):
        parsed = parse_marker(line)
        if parsed is None:
            continue
        marker, payload = parsed
        if marker is Marker.STOPPED:
            stopped = StopReason.from_dict(payload) or stopped
        elif marker is Marker.FAILED and failed is None:
            failed = StopReason(StopKind.START_FAILED, detail=failure_detail(payload))
        elif marker is Marker.SUMMARY and isinstance(payload, dict):
            summary = payload
    reason = stopped or failed
    if reason is None and summary is None:
        return None
    return StopDetails(reason=reason, summary=summary)
