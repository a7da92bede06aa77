"""The agent's command line, one typed value: `AgentArgs`, what `python -m gpusession.agent run`
takes. The local side makes it (`AgentArgs.for_record(record, **placement)`: the record's limits,
and the placement a backend fills in: session id, state dir, kernel ip/sockets, ports, workspace,
billed-since or not) and writes it (`argv()`); the agent reads it with the parser made from the
same fields (`add_arguments`, gpusession/agent/kernel_runtime.py and service.py), so a flag, its
type and its default are written once, here. Below the backends and the agent (standard library, Python
3.9), so both use it without importing each other; it ships in the runtime bundle.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from typing import Any, Callable

from ..core.durations import (
    IDLE,
    MAX_RUNTIME,
    SAVE_TIMEOUT,
    DurationRule,
    exact_decimal,
    format_bound,
    parse_money,
)
from ..core.errors import BadInput
from ..core.models import LaunchSpec
from ..core.protocol import DEFAULT_IDLE_S
from .cost import billing_started_at

# the agent's defaults (the idle one is the session's too: gpusession.core.protocol.DEFAULT_IDLE_S)
DEFAULT_GPU_THRESHOLD = 5.0  # percent; a GPU at or above it counts as busy
DEFAULT_KEEPALIVE_LIMIT_S = 4 * 3600.0  # a keepalive postpones the idle stop at most this far ahead
DEFAULT_SAVE_TIMEOUT_S = 60.0  # the bound of a save before a watchdog stop (and of an asked one)
DEFAULT_SAVE_CAP = 2 * 1024**3  # bytes: a variable whose pickle is larger is skipped
DEFAULT_HISTORY_S = 3600  # seconds of samples kept
DEFAULT_INTERVAL_S = 1.0  # seconds between the watchdog's decisions, and between samples

PLACEMENT = "placement"  # where the backend puts the runtime: options of the `run` command itself
WATCHDOG = "agent: live stats and the watchdog that stops the session"  # their argument group

# kinds of value: how argv() writes one and how the parser reads it back, exactly
TEXT, INT, FLOAT, NUMBER, MONEY, FLAG, RECORDING = (
    "text",
    "int",
    "float",
    "number",
    "money",
    "flag",
    "recording",
)


def _option(
    default: Any,
    kind: Any,
    help: str,
    *,
    group: str = WATCHDOG,
    metavar: str | None = None,
    always: bool = False,
    required: bool = False,
    from_spec: bool = False,
):
    """A field of AgentArgs with its flag's make-up. `kind`: one of the kinds above or a
    DurationRule; `always`: written even at its default (what every backend says explicitly);
    `required`: the command line must give it; `from_spec`: the session's start option of the
    same name gives it (a LaunchSpec field, else `spec.extra[name]`: `for_record`), so a value
    has one name from the face to the agent."""
    meta = {
        "kind": kind,
        "help": help,
        "group": group,
        "metavar": metavar,
        "always": always or required,
        "required": required,
        "from_spec": from_spec,
    }
    return dataclasses.field(default=default, metadata=meta)


def flag_of(name: str) -> str:
    """A field's flag: gpu_only -> --gpu-only (argparse's dest is the field's name)."""
    return "--" + name.replace("_", "-")


@dataclasses.dataclass(frozen=True)
class AgentArgs:
    """The options of `python -m gpusession.agent run`; the field's name is its flag's dest."""

    # -- placement: the backend's (where the runtime runs and listens)
    session_id: str = _option("", TEXT, "", group=PLACEMENT, required=True)
    state_dir: str = _option("", TEXT, "", group=PLACEMENT, required=True)
    kernel_ip: str = _option(
        "127.0.0.1",
        TEXT,
        "loopback address of the kernel's ports, or a path prefix in a 0700 folder: unix sockets",
        group=PLACEMENT,
    )
    kernel_ports: int = _option(
        0, INT, "first of 5 consecutive ports; 0 = free ports", group=PLACEMENT, always=True
    )
    agent_port: int = _option(
        0,
        INT,
        "agent HTTP port on 127.0.0.1; 0 = a free one (runtime.json says which), -1 = none",
        group=PLACEMENT,
        always=True,
    )
    ready_timeout: float = _option(60.0, FLOAT, "", group=PLACEMENT)
    cwd: str = _option("", TEXT, "", group=PLACEMENT)
    workspace: str = _option(
        "",
        TEXT,
        "the workspace folder: checkpoints are saved there (default: none)",
        group=PLACEMENT,
    )
    restore: bool = _option(
        False, FLAG, "the first kernel restores the workspace's checkpoint", group=PLACEMENT
    )
    notice_dir: str = _option(
        "",
        TEXT,
        "where the machine's notices appear (gpusession.core.protocol.NOTICE_FILES: a spot "
        "interruption, a rebalance recommendation); the agent saves the namespace at once "
        "(default: STATE_DIR/notices)",
        group=PLACEMENT,
    )
    # -- the watchdog and the stats: the session record's
    idle: float | None = _option(
        DEFAULT_IDLE_S,
        IDLE,
        "stop after this long idle (no cell running and every GPU "
        "under --gpu-threshold): 90s, 15m, 2h, a bare number of minutes, or off; default "
        f"{format_bound(DEFAULT_IDLE_S)}",
        metavar="DURATION|off",
        always=True,
        from_spec=True,
    )
    gpu_only: bool = _option(
        False,
        FLAG,
        "only GPU utilization counts as activity (a busy kernel whose GPU idles is idle)",
        from_spec=True,
    )
    gpu_threshold: float = _option(
        DEFAULT_GPU_THRESHOLD,
        NUMBER,
        "a GPU at or above this utilization is busy "
        f"(default {exact_decimal(DEFAULT_GPU_THRESHOLD)})",
        metavar="PERCENT",
        from_spec=True,
    )
    max_runtime: float | None = _option(
        None,
        MAX_RUNTIME,
        "hard stop this long after billing started (8h, 90m; a bare number means minutes)",
        metavar="DURATION",
        from_spec=True,
    )
    max_cost: float | None = _option(
        None,
        MONEY,
        "stop once the session has cost this much (warning at 80%%)",
        metavar="DOLLARS",
        from_spec=True,
    )
    price_per_hour: float = _option(
        0.0,
        NUMBER,
        "price of the whole session, for the cost meter",
        metavar="DOLLARS",
        always=True,
    )
    billed_since: float | None = _option(
        None, NUMBER, "when billing started (default: when the runtime started)", metavar="UNIX"
    )
    gpu_count: int = _option(1, INT, "GPUs billed, for GPU-hours in the summary", always=True)
    gpu_type: str = _option(
        "", TEXT, "the session's GPU type (a replay says when its recording is of another)"
    )
    keepalive_limit: float = _option(
        DEFAULT_KEEPALIVE_LIMIT_S,
        NUMBER,
        "a keepalive postpones the idle stop at most "
        f"this far ahead (default {format_bound(DEFAULT_KEEPALIVE_LIMIT_S)})",
        metavar="SECONDS",
        from_spec=True,
    )
    check_interval: float = _option(
        DEFAULT_INTERVAL_S,
        NUMBER,
        f"how often the watchdog decides (default {exact_decimal(DEFAULT_INTERVAL_S)})",
        metavar="SECONDS",
        from_spec=True,
    )
    sample_interval: float = _option(
        DEFAULT_INTERVAL_S,
        NUMBER,
        f"how often to sample; 0 = never (default {exact_decimal(DEFAULT_INTERVAL_S)})",
        metavar="SECONDS",
    )
    history: float = _option(
        float(DEFAULT_HISTORY_S),
        NUMBER,
        f"seconds of samples kept (default {DEFAULT_HISTORY_S})",
        metavar="SECONDS",
    )
    shutdown_command: str = _option(
        "",
        TEXT,
        "shell command run when the session stops, e.g. 'shutdown -h now' on a cloud instance",
        metavar="CMD",
    )
    termination_log: str = _option(
        "",
        TEXT,
        "a file the agent writes its end's brief into when the session stops (why, when, the "
        "save: JSON, at most 4 KB), e.g. a Kubernetes container's /dev/termination-log, which "
        "the pod's status keeps after its log is gone",
        metavar="PATH",
    )
    save_timeout: float | None = _option(
        DEFAULT_SAVE_TIMEOUT_S,
        SAVE_TIMEOUT,
        "before a watchdog stop, save the "
        "kernel's variables into --workspace for at most this long (default "
        f"{exact_decimal(DEFAULT_SAVE_TIMEOUT_S)}s; off: do not save)",
        metavar="DURATION|off",
        from_spec=True,
    )
    save_cap: int = _option(
        DEFAULT_SAVE_CAP,
        INT,
        "a variable whose pickle is larger is skipped (default "
        f"{DEFAULT_SAVE_CAP // 1024**3} GiB; 0: no cap)",
        metavar="BYTES",
        from_spec=True,
    )
    no_agent: bool = _option(False, FLAG, "no stats, no watchdog (a baseline for benchmarks)")
    nvml_replay: str | None = _option(
        None,
        RECORDING,
        "replay raw NVML values recorded from a driver "
        "(tests/data/nvml_*.json, written by nvml-record), in a loop, instead of this "
        'machine\'s GPUs; the stats say "source": "recorded". For demos and tests '
        "without a GPU; never on by default",
        metavar="FILE",
        from_spec=True,
    )

    @classmethod
    def for_record(cls, record, **placement: Any) -> "AgentArgs":
        """The agent's options for a session record, with the backend's `placement` (session_id
        and state_dir at least; billed_since=None where billing starts with the runtime). Each
        `from_spec` field is the start option of its name: the LaunchSpec field, else
        `spec.extra[name]` when given (a duration's None there: off); the rest, its default."""
        spec, extra = record.spec, record.spec.extra
        taken: dict[str, Any] = {}
        for field in dataclasses.fields(cls):
            if not field.metadata["from_spec"]:
                continue
            if field.name in _SPEC_FIELDS:
                value = getattr(spec, field.name)
            elif field.name in extra:
                value = extra[field.name]
            else:
                continue
            taken[field.name] = _typed(field.metadata["kind"], value)
        taken.update(
            price_per_hour=float(record.price_per_hour or 0.0),
            gpu_count=int(spec.gpu_count or 1),
            gpu_type=str(spec.gpu_type or ""),
            billed_since=billing_started_at(record),
            restore=bool(extra.get("resume")),
        )
        return cls(**{**taken, **placement})

    def argv(self) -> list[str]:
        """The options as words (a shell script passes them on: an instance's boot script, a batch
        job), exact: durations in seconds with their unit ("1000800s"), numbers without an
        exponent, so the agent reads back the very values. A value at its default is left out,
        unless the field is always written."""
        out: list[str] = []
        for field in dataclasses.fields(self):
            value, meta = getattr(self, field.name), field.metadata
            if not meta["always"] and value == field.default:
                continue
            if meta["kind"] == FLAG:
                out += [flag_of(field.name)] if value else []
            else:
                out += [flag_of(field.name), _word(meta["kind"], value)]
        return out

    @classmethod
    def from_namespace(cls, ns: argparse.Namespace) -> "AgentArgs":
        """The `run` command's parsed options (the agent's parser: `add_arguments`)."""
        return cls(**{field.name: getattr(ns, field.name) for field in dataclasses.fields(cls)})


def add_arguments(parser, group: str, types: dict[str, Callable[[str], Any]] | None = None) -> None:
    """AgentArgs' options of `group` (PLACEMENT or WATCHDOG) on `parser` (an argparse parser or
    group), with their defaults. `types` reads a kind otherwise (the agent loads a recording)."""
    for field in dataclasses.fields(AgentArgs):
        meta = field.metadata
        if meta["group"] != group:
            continue
        kind, extra = meta["kind"], {}
        if meta["help"]:
            extra["help"] = meta["help"]
        if meta["metavar"]:
            extra["metavar"] = meta["metavar"]
        if meta["required"]:
            extra["required"] = True
        else:
            extra["default"] = field.default
        if kind == FLAG:
            parser.add_argument(
                flag_of(field.name),
                action="store_true",
                **{k: v for k, v in extra.items() if k != "default"},
            )
            continue
        reader = (types or {}).get(kind) if isinstance(kind, str) else None
        parser.add_argument(flag_of(field.name), type=reader or _reader(kind), **extra)


_SPEC_FIELDS = frozenset(f.name for f in dataclasses.fields(LaunchSpec)) - {"extra"}


def _typed(kind: Any, value: Any) -> Any:
    """A start option's value as the field of `kind` holds it (None, 0 and "" of a duration or an
    amount: off)."""
    if isinstance(kind, DurationRule) or kind == MONEY:
        return value or None
    if kind == FLAG:
        return bool(value)
    if kind == INT:
        return int(value)
    if kind in (FLOAT, NUMBER):
        return float(value)
    return None if value in (None, "") else str(value)


def _word(kind: Any, value: Any) -> str:
    """One value as argv() writes it."""
    if isinstance(
        kind, DurationRule
    ):  # the grammar, exactly: "1000800s" (a bare number would mean minutes)
        return "off" if value is None else exact_decimal(value) + "s"
    if kind == INT:
        return str(int(value))
    if kind in (FLOAT, NUMBER, MONEY):  # a plain decimal: 1000800.0 -> "1000800", 0.1 -> "0.1"
        return exact_decimal(value)
    return str(value)


def _reader(kind: Any) -> Callable[[str], Any]:
    """The argparse type of a kind: its values read back, bad ones in one line."""
    if isinstance(kind, DurationRule):
        return _duration(kind)
    return {TEXT: str, RECORDING: str, INT: int, FLOAT: float, NUMBER: positive, MONEY: _dollars}[
        kind
    ]


def _duration(rule: DurationRule):
    """An argparse type reading `rule`'s durations in the one grammar (gpusession/core/durations.py):
    90s, 15m, 2h, a bare number of minutes, off."""

    def parse(text: str) -> float | None:
        try:
            return rule.parse(text)
        except BadInput as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse.__name__ = rule.what
    return parse


def _dollars(text: str) -> float | None:
    try:
        return parse_money(text, what="max cost")
    except BadInput as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def positive(text: str) -> float:
    """An argparse type: a finite number, not negative."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {text!r}")
    return value


# -- the workspace (what outlives the session: a Docker volume, a folder) ------------------------

WORKSPACE_MOUNT = (
    "/workspace"  # where a container session's workspace is mounted: its working folder
)
WORKSPACE_VOLUME_PREFIX = "gpusession-ws-"
WORKSPACE_LABEL = "gpusession.workspace"  # on the volume and on the session's container: its name


def workspace_name(record) -> str:
    """The session's workspace: --resume NAME, else --workspace NAME, else the session's name."""
    extra = record.spec.extra
    return extra.get("resume") or extra.get("workspace") or record.name


def workspace_volume(name: str, store_id: str) -> str:
    """The Docker volume of workspace `name` of the store `store_id`: two stores (two users of
    one engine) with a workspace of the same name never share a volume."""
    return f"{WORKSPACE_VOLUME_PREFIX}{store_id[:8]}-{name}"
