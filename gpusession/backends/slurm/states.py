"""What Slurm says about a job, as data: its queue state (squeue), how it ended (sacct, or
scontrol while the controller still remembers it), and the stop reason that makes. Pure
functions of the commands' text, so they are tested on recorded output."""

from __future__ import annotations

import dataclasses
import re
import time

from ...core.protocol import StopDetails, StopKind, StopReason

#: squeue -o for one job: state|reason|expected start|nodes|partition
QUEUE_FORMAT = "%T|%r|%S|%N|%P"
#: the states in which the job holds (or is about to hold) its allocation
RUNNING = ("RUNNING", "CONFIGURING")
WAITING = ("PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "SUSPENDED")
ENDING = ("COMPLETING", "STAGE_OUT", "SIGNALING", "STOPPED", "RESIZING")
#: sacct: one line per job (-X), fields in this order
SACCT_FIELDS = "JobIDRaw,State,ExitCode,ElapsedRaw,TimelimitRaw,End"


@dataclasses.dataclass(frozen=True)
class QueueState:
    """One line of squeue for our job."""

    state: str  # PENDING, RUNNING, COMPLETED, TIMEOUT...
    reason: str = ""  # Resources, Priority, None...
    start: str = ""  # expected (pending) or actual start, ISO; "" when Slurm does not know
    nodes: str = ""  # node list once it runs
    partition: str = ""

    @property
    def running(self) -> bool:
        return self.state in RUNNING

    @property
    def waiting(self) -> bool:
        return self.state in WAITING

    @property
    def ended(self) -> bool:
        return not (self.running or self.waiting or self.state in ENDING)


def parse_queue(text: str) -> QueueState | None:
    """The first squeue line in QUEUE_FORMAT; None when squeue shows no such job."""
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) >= 5 and parts[0]:
            start = parts[2] if parts[2] not in ("N/A", "Unknown", "(null)") else ""
            reason = parts[1] if parts[1] not in ("None", "(null)") else ""
            return QueueState(parts[0].strip(), reason, start, parts[3].strip(), parts[4].strip())
    return None


def queue_position(text: str, job_id: str) -> int | None:
    """Our place among the pending jobs (`squeue -h -t PENDING --sort=-p,i -o %i|%P`), counting
    only those of our partition(s); None when it is not among them."""
    rows = [line.strip().split("|") for line in text.splitlines() if line.strip()]
    mine = next((r for r in rows if r[0] == job_id), None)
    if mine is None:
        return None
    ours = set(mine[1].split(",")) if len(mine) > 1 else set()
    ahead = 0
    for row in rows:
        if row[0] == job_id:
            return ahead + 1
        if not ours or (len(row) > 1 and ours & set(row[1].split(","))):
            ahead += 1
    return None


def first_node(nodes: str) -> str:
    """The first host of a Slurm node list: 'n1' for 'n1', 'gpu[03-05,07]' -> 'gpu03'."""
    match = re.match(r"^([^\[,]*)(?:\[([^\],]+))?", nodes.strip())
    if not match:
        return nodes
    prefix, ranges = match.group(1), match.group(2)
    if not ranges:
        return prefix
    return prefix + ranges.split("-", 1)[0]


def node_address(scontrol_node: str, node: str) -> str:
    """NodeAddr from `scontrol -o show node NODE` (the node's name when it gives none)."""
    fields = parse_fields(scontrol_node)
    return fields.get("NodeAddr") or node


# -- how a job ended ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class JobEnd:
    """Slurm's word on a finished job."""

    state: str  # COMPLETED, TIMEOUT, PREEMPTED, CANCELLED, FAILED, NODE_FAIL, OUT_OF_MEMORY...
    reason: str = ""  # scontrol's Reason (TimeLimit, NodeDown...), or the "by UID" of a cancel
    exit_code: str = ""  # "0:0" (code:signal)
    elapsed_s: float | None = None
    time_limit_s: float | None = None
    ended_at: float | None = None  # unix seconds

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data) -> "JobEnd | None":
        if not isinstance(data, dict) or not data.get("state"):
            return None
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


def parse_fields(text: str) -> dict[str, str]:
    """`Key=Value Key=Value` (scontrol -o)."""
    return dict(re.findall(r"(\w+)=(\S*)", text))


def parse_scontrol_job(text: str) -> JobEnd | None:
    """A finished job from `scontrol -o show job ID`; None while it runs or when unknown."""
    fields = parse_fields(text)
    state = fields.get("JobState", "")
    if not state or state in RUNNING or state in WAITING or state in ENDING:
        return None
    return JobEnd(
        state=state,
        reason="" if fields.get("Reason") in (None, "None") else fields["Reason"],
        exit_code=fields.get("ExitCode", ""),
        elapsed_s=slurm_seconds(fields.get("RunTime", "")),
        time_limit_s=slurm_seconds(fields.get("TimeLimit", "")),
        ended_at=slurm_timestamp(fields.get("EndTime", "")),
    )


def parse_sacct(text: str) -> JobEnd | None:
    """A finished job from `sacct -n -P -X -o SACCT_FIELDS -j ID`; None while it runs or when
    accounting does not know it."""
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) < 6 or not parts[1]:
            continue
        words = parts[1].split()
        state = words[0].rstrip("+")
        if state in RUNNING or state in WAITING or state in ENDING:
            return None
        minutes = _number(parts[4])
        return JobEnd(
            state=state,
            reason=" ".join(words[1:]),  # "by 1234" for CANCELLED
            exit_code=parts[2],
            elapsed_s=_number(parts[3]),
            time_limit_s=None if minutes is None else minutes * 60.0,
            ended_at=slurm_timestamp(parts[5]),
        )
    return None


def slurm_seconds(text: str) -> float | None:
    """'1-02:03:04', '02:03:04', '03:04' -> seconds; None for UNLIMITED, INVALID, empty."""
    text = text.strip()
    match = re.fullmatch(r"(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)", text)
    if not match:
        return None
    days, hours, minutes, seconds = (int(g) if g else 0 for g in match.groups())
    return float(((days * 24 + hours) * 60 + minutes) * 60 + seconds)


def slurm_timestamp(text: str) -> float | None:
    """'2026-11-30T21:46:12' (the controller's local time) -> unix seconds."""
    try:
        return time.mktime(time.strptime(text.strip(), "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def end_reason(job: JobEnd | None) -> StopReason | None:
    """The stop reason the scheduler itself gives, when it decided the end (a time limit, a
    preemption, a failed node...); None when the job ended because its runtime did."""
    if job is None:
        return None
    state = job.state
    if state in ("TIMEOUT", "DEADLINE"):
        return StopReason(
            StopKind.TIME_LIMIT,
            elapsed_s=job.elapsed_s,
            max_runtime_s=job.time_limit_s,
            detail=None if state == "TIMEOUT" else "deadline reached",
        )
    if state == "PREEMPTED":
        return StopReason(StopKind.PREEMPTED, elapsed_s=job.elapsed_s)
    if state in ("NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "REVOKED"):
        return StopReason(StopKind.JOB_ENDED, detail=_job_words(job))
    return None


def _job_words(job: JobEnd) -> str:
    """'NODE_FAIL (NodeDown)', 'CANCELLED by 1000': Slurm's own words, for the record."""
    return job.state + (
        f" ({job.reason})"
        if job.reason and not job.reason.startswith("by ")
        else f" {job.reason}"
        if job.reason
        else ""
    )


def combine(job: JobEnd | None, runtime: StopDetails | None) -> StopDetails | None:
    """How the session ended: the scheduler's reason when it ended the job, else what the runtime
    left (its stopped.json: idle, max-runtime, a signal...), else the job's end as Slurm says."""
    runtime = runtime or StopDetails()
    reason = end_reason(job)
    if reason is None:
        reason = runtime.reason
        if job is not None and (reason is None or reason.kind is StopKind.SIGNAL):
            # killed from outside without a word of the runtime's own: Slurm says by whom
            if job.state in ("CANCELLED", "FAILED") or reason is None:
                reason = StopReason(StopKind.JOB_ENDED, detail=_job_words(job))
    at = runtime.at if runtime.at is not None else (job.ended_at if job is not None else None)
    details = StopDetails(reason=reason, at=at, summary=runtime.summary)
    return None if details == StopDetails() else details


# -- what is free now (a fallback list's turn: `SlurmBackend.place`) ---------------------------

#: sinfo, one line per node and partition: its name, configured GRES, GRES in use, state
FREE_FORMAT = "NodeHost:60,Gres:200,GresUsed:200,StateCompact:20"
#: node states in which nothing new starts (drained, down, failing, powered off...)
_UNUSABLE = ("down", "drain", "drng", "fail", "maint", "boot", "powered", "inval", "futr", "reboot")
_GPU_GRES = re.compile(r"gpu(?::([^:(,\s]+))?:(\d+)")


def gpu_counts(text: str) -> dict[str, int]:
    """'gpu:t4:2(S:0-1),shard:4' -> {'t4': 2}; an untyped 'gpu:2' -> {'': 2}."""
    counts: dict[str, int] = {}
    for part in text.split(","):
        match = _GPU_GRES.match(part.strip())
        if match:
            kind = match.group(1) or ""
            counts[kind] = counts.get(kind, 0) + int(match.group(2))
    return counts


def free_gpus(sinfo: str) -> dict[str, dict[str, tuple[int, int]]]:
    """Per node that can start jobs now, per GPU gres type: (free, configured), from
    `sinfo -N -h -O FREE_FORMAT` (a node listed once per partition counts once)."""
    nodes: dict[str, dict[str, tuple[int, int]]] = {}
    for line in sinfo.splitlines():
        fields = line.split()
        if len(fields) < 4 or fields[0] in nodes:
            continue
        name, configured, used, state = fields[0], fields[1], fields[2], fields[3].lower()
        if state.startswith(_UNUSABLE) or state.endswith(("*", "~", "#", "!", "%")):
            continue
        held = gpu_counts(used)
        nodes[name] = {
            kind: (max(0, total - held.get(kind, 0)), total)
            for kind, total in gpu_counts(configured).items()
        }
    return nodes


def free_words(nodes: dict[str, dict[str, tuple[int, int]]], gres_type: str) -> str:
    """'n1: 0 of 2 free; n2: 1 of 1 free' for one gres type (nodes without it left out)."""
    have = [(n, kinds[gres_type]) for n, kinds in sorted(nodes.items()) if gres_type in kinds]
    return (
        "; ".join(f"{n}: {free} of {total} free" for n, (free, total) in have) or "no node has it"
    )
