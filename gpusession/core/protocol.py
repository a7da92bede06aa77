"""What the agent and the local side tell each other, as data: stop kinds, warnings, log markers,
environment variable names. Defined here once; words are made only by `gpusession.words`.

Standard library only: the agent runtime that goes into a user's image imports this module.

A log marker is one line the runtime prints, `MARKER` or `MARKER {json}`: the local side finds
it with `parse_marker` and never parses prose.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
from typing import Any

# -- environment variables ------------------------------------------------------------------
# defined apart: the runtime's first step (gpusession.agent.firststep) reads them alone
from .envnames import ENV_KERNEL_KEY as ENV_KERNEL_KEY
from .envnames import ENV_RESTORE as ENV_RESTORE
from .envnames import ENV_RUNTIME_BRINGS as ENV_RUNTIME_BRINGS
from .envnames import ENV_RUNTIME_PYTHON as ENV_RUNTIME_PYTHON
from .envnames import ENV_RUNTIME_ROOT as ENV_RUNTIME_ROOT
from .envnames import ENV_SESSION_ID as ENV_SESSION_ID
from .envnames import ENV_STATE_DIR as ENV_STATE_DIR
from .envnames import ENV_WORKSPACE as ENV_WORKSPACE
from .envnames import ENV_ZYGOTE as ENV_ZYGOTE
from .envnames import KERNEL_PORT_NAMES as KERNEL_PORT_NAMES
from .envnames import MARKER_KERNEL, MARKER_READY
from .envnames import READY_FILE as READY_FILE

# the session kernel's side (its cell log, transfers, out-of-memory cells): defined apart, what
# the kernel's extensions import at its start (gpusession.core.kernelwire)
from .kernelwire import CELL_LOG_REPLY as CELL_LOG_REPLY
from .kernelwire import CELL_LOG_REQUEST as CELL_LOG_REQUEST
from .kernelwire import META_CELL_LOG as META_CELL_LOG
from .kernelwire import META_OUTPUTS as META_OUTPUTS
from .kernelwire import META_SEQ as META_SEQ
from .kernelwire import OOM_MARKERS as OOM_MARKERS
from .kernelwire import OUTPUT_MSG_TYPES as OUTPUT_MSG_TYPES
from .kernelwire import TRANSFER_REPLY as TRANSFER_REPLY
from .kernelwire import TRANSFER_REQUEST as TRANSFER_REQUEST
from .kernelwire import is_out_of_memory as is_out_of_memory

# the idle stop when none is given: the session's (LaunchSpec), the settings' ("30m") and the
# agent's default (gpusession.configuration.agentargs); written here alone
DEFAULT_IDLE_S = 1800.0

# -- the agent's HTTP endpoint ----------------------------------------------------------------


def agent_token(connection_key: str) -> str:
    """The bearer token for a session's agent (every route, /health too), from its kernel
    connection key: whoever holds the key may ask; the key itself never goes on the wire."""
    import hashlib
    import hmac

    return hmac.new(connection_key.encode(), b"gpusession-agent-v1", hashlib.sha256).hexdigest()


# -- log markers ----------------------------------------------------------------------------


class Marker(str, enum.Enum):
    """The first word of a line the runtime (or an instance's boot script) prints for the local side."""

    KERNEL = MARKER_KERNEL  # the kernel process started (not yet listening); payload as READY's
    READY = MARKER_READY  # the kernel listens; payload: {"ports": {KERNEL_PORT_NAMES: port}, "agent_port"}
    FAILED = "GPUSESSION_FAILED"  # the start failed; payload: {"stage", "error"}
    STOPPED = "GPUSESSION_STOPPED"  # the runtime is ending; payload: StopReason.to_dict()
    SUMMARY = "GPUSESSION_SUMMARY"  # the agent's summary at the end; payload: summary dict
    WARNING = "GPUSESSION_WARNING"  # a watchdog warning came up; payload: Warning.to_dict()
    AGENT_ERROR = "GPUSESSION_AGENT_ERROR"  # something in the agent failed; payload: {"error"}
    SHUTDOWN = "GPUSESSION_SHUTDOWN"  # the shutdown command runs; payload: {"command"}
    HOSTKEY = "GPUSESSION_HOSTKEY"  # a container's ssh host key (plain text, not JSON)
    BOOT = "GPUSESSION_BOOT"  # an instance's boot script: a stage (plain text)
    POWEROFF = "GPUSESSION_POWEROFF"  # an instance's boot script powers off
    SPOT_NOTICE = "GPUSESSION_SPOT_NOTICE"  # an instance saw a spot interruption notice (JSON)
    PYTHON = "GPUSESSION_PYTHON"  # the runtime bundle's probe of an image: its Python (JSON, gpusession.transport.bundle)
    CHECKPOINT = "GPUSESSION_CHECKPOINT"  # the agent saved for a notice; payload: the save's result + "notice"


def marker_line(marker: Marker, payload: dict[str, Any] | None = None) -> str:
    """The line to print: `MARKER {compact json}` (numbers exact, never NaN)."""
    if payload is None:
        return marker.value
    return f"{marker.value} {json.dumps(payload, separators=(',', ':'), allow_nan=False)}"


def say_line(line: str) -> None:
    """Print `line` to stdout in one write. The kernel and the runtime share a container's
    stdout, and `print` writes the text and its newline apart when stdout is unbuffered (as
    PYTHONUNBUFFERED makes it there): a kernel's line could land between the two, after the
    marker's JSON (a CI run read `READY {...}NOTE: When using the ipython kernel...`)."""
    import sys

    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def parse_marker(line: str) -> tuple[Marker, Any] | None:
    """(marker, payload) for a marker line, else None. The payload is the parsed JSON, the raw
    text when it is not JSON (HOSTKEY, BOOT), or None when the line has no payload."""
    word, _, rest = line.strip().partition(" ")
    try:
        marker = Marker(word)
    except ValueError:
        return None
    rest = rest.strip()
    if not rest:
        return marker, None
    try:
        return marker, json.loads(rest)
    except ValueError:
        return marker, rest


def find_markers(text: str, marker: Marker) -> list[Any]:
    """Every payload of `marker` in a log, oldest first."""
    found = []
    for line in text.splitlines():
        parsed = parse_marker(line)
        if parsed is not None and parsed[0] is marker:
            found.append(parsed[1])
    return found


# -- a kind and its numbers: how stop reasons and warnings travel ----------------------------


def _kind_to_dict(item: Any) -> dict[str, Any]:
    """The set fields, and `kind` as its string."""
    return {k: v for k, v in dataclasses.asdict(item).items() if v is not None} | {
        "kind": item.kind.value
    }


def _kind_from_dict(cls: Any, kinds: type[enum.Enum], data: Any) -> Any:
    """`cls` from such a dict (unknown fields left out), the object itself, or None for
    anything else (no dict, an unknown kind)."""
    if isinstance(data, cls):
        return data
    if not isinstance(data, dict):
        return None
    try:
        kind = kinds(data.get("kind"))
    except ValueError:
        return None
    names = {f.name for f in dataclasses.fields(cls)} - {"kind"}
    return cls(kind=kind, **{k: v for k, v in data.items() if k in names})


# -- why a session stopped ------------------------------------------------------------------


class StopKind(str, enum.Enum):
    IDLE = "idle"  # the watchdog: idle for the whole timeout
    MAX_RUNTIME = "max-runtime"  # the watchdog: the hard runtime limit
    MAX_COST = "max-cost"  # the watchdog: the cost cap
    USER = "user"  # someone stopped it (magic, CLI, panel, REST)
    GC = "gc"  # `gpusession gc` stopped it
    SIGNAL = "signal"  # the runtime got a signal (docker stop, a shutdown)
    KERNEL_EXIT = "kernel-exit"  # the kernel process ended by itself
    START_FAILED = "start-failed"  # the runtime could not start the kernel
    SPOT_INTERRUPTION = "spot-interruption"  # the cloud took the spot instance back
    INSTANCE_ENDED = (
        "instance-ended"  # the instance stopped or terminated, for a reason the cloud gives
    )
    CONTAINER_EXIT = "container-exit"  # the container exited without a word from the runtime
    TIME_LIMIT = "time-limit"  # the scheduler ended the job at its time limit (Slurm TIMEOUT)
    PREEMPTED = "preempted"  # the scheduler took the allocation back for another job
    JOB_ENDED = "job-ended"  # the scheduler ended the job for a reason it gives (NODE_FAIL, OUT_OF_MEMORY...)
    GONE = "gone"  # the remote side is gone and left no word

    @property
    def by_watchdog(self) -> bool:
        """Did the session's own agent decide to stop it (no failure, it saved money)?"""
        return self in (StopKind.IDLE, StopKind.MAX_RUNTIME, StopKind.MAX_COST)

    @property
    def interruption(self) -> bool:
        """Did the capacity go away under the session (the cloud or the scheduler took it back),
        with a notice the agent saves on: the work goes on elsewhere (--resume, --recover)?"""
        return self in (StopKind.SPOT_INTERRUPTION, StopKind.TIME_LIMIT, StopKind.PREEMPTED)


@dataclasses.dataclass(frozen=True)
class StopReason:
    """Why a session ended: a kind and the numbers that go with it (the watchdog's limits)."""

    kind: StopKind
    idle_for_s: float | None = None  # IDLE: how long it was idle
    idle_timeout_s: float | None = None  # IDLE: the timeout it had
    elapsed_s: float | None = None  # MAX_RUNTIME: billed time when it stopped
    max_runtime_s: float | None = None  # MAX_RUNTIME: the limit
    spent: float | None = None  # MAX_COST: dollars spent
    max_cost: float | None = None  # MAX_COST: the cap
    signal: int | None = None  # SIGNAL: the signal number
    exit_code: int | None = None  # KERNEL_EXIT / CONTAINER_EXIT: the exit status
    by: str | None = None  # USER / GC: who (e.g. "the sidebar", "gpusession stop")
    detail: str | None = None  # free text from outside our code (an EC2 state reason, an error)

    def to_dict(self) -> dict[str, Any]:
        return _kind_to_dict(self)

    @classmethod
    def from_dict(cls, data: Any) -> "StopReason | None":
        """Tolerant: None for anything that is not a stop reason."""
        return _kind_from_dict(cls, StopKind, data)

    @property
    def by_watchdog(self) -> bool:
        return self.kind.by_watchdog


@dataclasses.dataclass(frozen=True)
class StopDetails:
    """What a session's remote side left at its end (a backend's `stop_details`)."""

    reason: StopReason | None = None
    at: float | None = None  # unix seconds when it ended, when known
    summary: dict[str, Any] | None = None  # the agent's summary (duration, cost, GPU-hours...)

    @classmethod
    def from_dict(cls, data: Any) -> "StopDetails":
        """From the runtime's stopped.json ({"reason": {...}, "at", "summary"})."""
        if not isinstance(data, dict):
            return cls()
        at = data.get("at")
        summary = data.get("summary")
        return cls(
            reason=StopReason.from_dict(data.get("reason")),
            at=float(at) if isinstance(at, (int, float)) and math.isfinite(at) else None,
            summary=summary if isinstance(summary, dict) else None,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "reason": self.reason.to_dict() if self.reason else None,
            "at": self.at,
            "summary": self.summary,
        }


# -- notices: the machine goes away soon -----------------------------------------------------


class Notice(str, enum.Enum):
    """What the agent saves the namespace for at once, before the capacity goes (the checkpoint's
    `for`): a file of NOTICE_FILES appearing in its --notice-dir."""

    SPOT_INTERRUPTION = "spot-interruption"  # the cloud takes the machine back (AWS: in 2 min)
    REBALANCE = "rebalance"  # the cloud recommends moving (AWS): nothing ends yet
    SCHEDULER_SIGNAL = "scheduler-signal"  # the job's time limit or a preemption comes (Slurm)

    @property
    def ends_session(self) -> bool:
        """The agent stops the session once saved: anything run later would be lost anyway."""
        return self is Notice.SPOT_INTERRUPTION


# the files written into the agent's --notice-dir: by an instance's boot script (what instance
# metadata said, as JSON; another cloud's watcher, GCP's preempted flag, writes the same names),
# by a Slurm job's batch shell when Slurm sends it --signal=B:USR1@GRACE
NOTICE_FILES = {
    "spot-instance-action.json": Notice.SPOT_INTERRUPTION,
    "rebalance-recommendation.json": Notice.REBALANCE,
    "scheduler-signal.json": Notice.SCHEDULER_SIGNAL,
}
# the bound of a notice's save: well inside the shortest notice (GCP gives 30 s, AWS 2 min)
NOTICE_SAVE_S = 20.0


# -- warnings -------------------------------------------------------------------------------


class WarningKind(str, enum.Enum):
    IDLE = "idle"  # the idle stop comes soon
    MAX_RUNTIME = "max-runtime"  # the runtime limit comes soon
    MAX_COST = "max-cost"  # spending reached the warning share of the cap
    SPOT_INTERRUPTION = "spot-interruption"  # the cloud announced it takes the instance back
    BUDGET = "budget"  # the month's spend passed 80% of the monthly budget, or all of it


@dataclasses.dataclass(frozen=True)
class Warning:  # noqa: A001 - the protocol's word; never imported as a bare name beside builtins
    """A warning the notebook and the panels show while it lasts."""

    kind: WarningKind
    remaining_s: float | None = None  # time left until the stop
    idle_for_s: float | None = None  # IDLE
    limit_s: float | None = None  # MAX_RUNTIME: the limit
    spent: float | None = None  # MAX_COST; BUDGET: the month's spend
    max_cost: float | None = None  # MAX_COST
    action: str | None = None  # SPOT_INTERRUPTION: what the cloud will do (stop, terminate)
    budget: float | None = None  # BUDGET: the monthly budget (or a policy's monthly cap)
    source: str | None = None  # BUDGET: where it is set (a policy file: only its admin raises it)
    time: str | None = None  # SPOT_INTERRUPTION: when, as the cloud wrote it

    def to_dict(self) -> dict[str, Any]:
        return _kind_to_dict(self)

    @classmethod
    def from_dict(cls, data: Any) -> "Warning | None":
        """Tolerant: None for anything that is not a warning."""
        return _kind_from_dict(cls, WarningKind, data)
