"""Which GPUs of a shared box a docker session gets (issue 34 §1).

Several people start sessions on one Docker engine. A session asking for N GPUs (`--gpus N`, or
the count of `--type t4:N`) gets N that no other container on the engine holds and that are the
least busy now, pinned by UUID in its device request (`device_ids`) and named in its label
`gpusession.gpus`, so the next start on that engine, by any user, sees them held.

- Who holds what: every container on the engine (any user's, any store's) whose device request
  names GPUs (`DeviceIDs`); a gpusession container is named by its owner and session name (labels),
  another one by its container name.
- How busy a GPU is: a reading of the box's GPUs, `nvidia-smi` run on the box (over the engine's
  SSH login for an `ssh://` engine). A box may hold a recording in the agent's RecordedNvml format
  at `~/.gpusession/box-nvml.json` (the login user's home) that stands in for `nvidia-smi`: demos
  and the tests, on machines without a GPU. A GPU running another process is taken as held.
- No reading (no `nvidia-smi` there): the engine picks, as before (a count, unpinned).

Pure functions over data (`BoxGpu`, `Holder`) apart from `read_box`, which asks the box.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import os
import re
import subprocess
from typing import Any

from .ssh import host_exec

GPUS_LABEL = "gpusession.gpus"  # the GPUs a session's container holds: UUIDs, comma-separated
NAME_LABEL = "gpusession.name"  # its session's name, for the line that says who holds a GPU
RECORDING = ".gpusession/box-nvml.json"  # under the box's $HOME: a stand-in reading
READ_TIMEOUT = 15.0  # seconds a box's reading may take before the start goes on without it
_QUERY_GPUS = (
    "nvidia-smi --query-gpu=index,uuid,name,memory.used,memory.total,utilization.gpu "
    "--format=csv,noheader,nounits"
)
_QUERY_APPS = "nvidia-smi --query-compute-apps=gpu_uuid,pid --format=csv,noheader,nounits"
_LIST = "nvidia-smi -L"  # the MIG slices of split cards, with their UUIDs
_LISTED_GPU = re.compile(r"GPU (\d+): .*\(UUID: (GPU-[^)]+)\)")
_LISTED_SLICE = re.compile(r"\s+MIG (\S+)\s+Device\s+(\d+): \(UUID: (MIG-[^)]+)\)")
# one round trip: the recording when the box has one, else nvidia-smi, else nothing
READ_SCRIPT = (
    f'if [ -r "$HOME/{RECORDING}" ]; then echo recorded; cat "$HOME/{RECORDING}"; '
    f"elif command -v nvidia-smi >/dev/null 2>&1; then echo nvidia-smi; {_QUERY_GPUS} && "
    f"echo ----; {_QUERY_APPS}; echo ----; {_LIST}; true; else echo none; fi"
)


@dataclasses.dataclass(frozen=True)
class BoxGpu:
    """One GPU of the box, as the reading saw it."""

    index: int  # NVML's index on the box
    uuid: str  # GPU-... (what the device request pins)
    name: str | None  # "Tesla T4"
    memory_used: int | None  # bytes
    memory_total: int | None  # bytes
    utilization: float | None  # percent
    processes: int  # compute processes running on it now
    parent: str | None = None  # a MIG slice: its card's UUID
    slot: int | None = None  # a MIG slice: its place on the card
    split: bool = False  # a card in MIG mode: its slices are handed out, never the whole card

    @property
    def label(self) -> str:
        """How the lines name it: 'GPU 3', or 'GPU 0 slice 2' for a MIG slice."""
        return f"GPU {self.index}" + (f" slice {self.slot}" if self.slot is not None else "")

    def busy_key(self) -> tuple:
        """Least busy first: fewest processes, lowest utilization, least memory used."""
        return (self.processes, self.utilization or 0.0, self.memory_used or 0, self.index)


@dataclasses.dataclass(frozen=True)
class Holder:
    """Who holds a GPU: a gpusession session (its owner and name) or another container."""

    owner: str | None  # "alice@laptop:123" for a session; None for another container
    name: str  # the session's name, or the container's


def from_recording(doc: dict) -> list[BoxGpu]:
    """The box's GPUs from a recording in the agent's RecordedNvml format (its first frame; the
    agent's `nvml-record` writes one). A value recorded as an error reads as not reported."""
    frames = doc.get("frames") or [{}]
    found = []
    for index, dev in enumerate(frames[0].get("devices") or []):
        slices = dev.get("mig_devices") or []
        card = _recorded(dev, index, split=bool(slices))
        found.append(card)
        for slot, part in enumerate(slices):
            if part is not None:
                found.append(_recorded(part, index, parent=card.uuid, slot=slot))
    return found


def _recorded(dev: dict, index: int, **placement: Any) -> BoxGpu:
    util, memory = _reported(dev.get("utilization")), _reported(dev.get("memory"))
    return BoxGpu(
        index=index,
        uuid=str(dev.get("uuid") or index),
        name=dev.get("name") if isinstance(dev.get("name"), str) else None,
        memory_used=memory.get("used"),
        memory_total=memory.get("total"),
        utilization=util.get("gpu"),
        processes=len(_reported(dev.get("compute_processes"), [])),
        **placement,
    )


def _reported(value: Any, empty: Any = None) -> Any:
    """A recorded value, or `empty` ({} by default) where the recording holds an error."""
    if isinstance(value, dict) and "error" in value:
        return {} if empty is None else empty
    return value if value is not None else ({} if empty is None else empty)


def from_smi(gpus_csv: str, apps_csv: str) -> list[BoxGpu]:
    """The box's GPUs from nvidia-smi's CSV (MiB and percent, '[N/A]' where not reported)."""
    running: dict[str, int] = {}
    for row in csv.reader(io.StringIO(apps_csv)):
        if row and row[0].strip():
            running[row[0].strip()] = running.get(row[0].strip(), 0) + 1
    found = []
    for row in csv.reader(io.StringIO(gpus_csv)):
        if len(row) < 6 or not row[0].strip().isdigit():
            continue
        index, uuid, name, used, total, util = (cell.strip() for cell in row[:6])
        found.append(
            BoxGpu(
                index=int(index),
                uuid=uuid,
                name=name,
                memory_used=_mib(used),
                memory_total=_mib(total),
                utilization=_number(util),
                processes=running.get(uuid, 0),
            )
        )
    return found


def with_listed_slices(gpus: list[BoxGpu], listing: str) -> list[BoxGpu]:
    """`nvidia-smi -L`'s MIG slices added under their cards (which become split): each slice
    named '<card> MIG <profile>', its memory and processes not known from there."""
    slices: dict[str, list[tuple[int, str, str]]] = {}
    card = None
    for line in listing.splitlines():
        found = _LISTED_GPU.match(line)
        if found:
            card = found.group(2)
            continue
        part = _LISTED_SLICE.match(line)
        if part and card:
            slices.setdefault(card, []).append((int(part.group(2)), part.group(1), part.group(3)))
    out = []
    for g in gpus:
        mine = slices.get(g.uuid, [])
        out.append(dataclasses.replace(g, split=True) if mine else g)
        out += [
            BoxGpu(g.index, uuid, f"{g.name} MIG {profile}", None, None, None, 0, g.uuid, slot)
            for slot, profile, uuid in mine
        ]
    return out


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None  # "[N/A]", "[Not Supported]"


def _mib(text: str) -> int | None:
    value = _number(text)
    return None if value is None else int(value * 1024 * 1024)


def parse_reading(output: str) -> tuple[list[BoxGpu], str] | None:
    """(GPUs, where the reading came from: "recorded" or "nvidia-smi") from READ_SCRIPT's
    output; None when the box has neither."""
    kind, _, rest = output.partition("\n")
    kind = kind.strip()
    if kind == "recorded":
        gpus = from_recording(json.loads(rest))
        return (gpus, kind) if gpus else None
    if kind == "nvidia-smi":
        gpus_csv, _, rest = rest.partition("----")
        apps_csv, _, listing = rest.partition("----")
        gpus = with_listed_slices(from_smi(gpus_csv, apps_csv), listing)
        return (gpus, kind) if gpus else None
    return None


def _readable_here() -> bool:
    """This machine has something for READ_SCRIPT to read: a recording, or nvidia-smi on PATH
    (as the script looks for them, with this process's environment)."""
    import shutil

    home = os.environ.get("HOME") or os.path.expanduser("~")
    return (
        os.access(os.path.join(home, RECORDING), os.R_OK) or shutil.which("nvidia-smi") is not None
    )


def read_box(client: Any, host: str | None) -> tuple[list[BoxGpu], str] | None:
    """The engine's box's GPUs now (this machine for the local engine; over the engine's SSH
    login for an ssh:// one), or None when it cannot say (no nvidia-smi, no login, no answer
    within READ_TIMEOUT: the engine picks then, as without this)."""
    if not host:
        if not _readable_here():
            return None  # what READ_SCRIPT would say, without a process on the way to the start
        try:
            done = subprocess.run(
                ["sh", "-c", READ_SCRIPT],
                capture_output=True,
                text=True,
                timeout=READ_TIMEOUT,
                env=os.environ,
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        output = done.stdout if done.returncode == 0 else ""
    else:
        import paramiko

        try:
            done = host_exec(client, READ_SCRIPT, timeout=READ_TIMEOUT)
        except (OSError, EOFError, TimeoutError, paramiko.SSHException):
            return None
        if done is None:
            return None
        status, out, _ = done
        output = out.decode(errors="replace") if status == 0 else ""
    try:
        return parse_reading(output)
    except (ValueError, KeyError, TypeError):
        return None  # a recording that is no recording: no reading


class Reading:
    """read_box begun in a thread now (a process here, an SSH exec for a remote box: seconds
    where nvidia-smi is slow), its result taken when the GPUs are picked: the image's lookup
    goes on meanwhile."""

    def __init__(self, client: Any, host: str | None):
        import threading

        self._found: tuple[list[BoxGpu], str] | None = None
        self._thread = None
        if not host and not _readable_here():
            return  # nothing here to read (read_box's None): no thread either
        self._thread = threading.Thread(
            target=self._read, args=(client, host), name="gpusession-gpu-reading", daemon=True
        )
        self._thread.start()

    def _read(self, client: Any, host: str | None) -> None:
        try:
            self._found = read_box(client, host)
        except Exception:  # noqa: BLE001 - no reading: the engine picks, as read_box's own failures
            self._found = None

    def result(self) -> tuple[list[BoxGpu], str] | None:
        if self._thread is not None:
            self._thread.join(READ_TIMEOUT + 5)
        return self._found


def holders(containers: list[dict]) -> dict[str, Holder]:
    """Device id (a UUID or an index, as the request wrote it) -> who holds it, from the
    engine's containers' attributes (every container that is not exited or dead)."""
    held: dict[str, Holder] = {}
    for attrs in containers:
        state = (attrs.get("State") or {}).get("Status", "")
        if state in ("exited", "dead", "removing"):
            continue
        labels = (attrs.get("Config") or {}).get("Labels") or {}
        requests = (attrs.get("HostConfig") or {}).get("DeviceRequests") or []
        owner = labels.get("gpusession.owner")
        name = labels.get(NAME_LABEL) or str(attrs.get("Name", "")).lstrip("/")
        for request in requests:
            for device in request.get("DeviceIDs") or []:
                for one in str(device).split(","):
                    if one.strip():
                        held[one.strip()] = Holder(owner, name)
    return held


def holder_of(gpu: BoxGpu, held: dict[str, Holder]) -> Holder | None:
    """Who holds `gpu` (by its UUID or its index; a slice also by its card's), None when no
    container does."""
    found = held.get(gpu.uuid)
    if gpu.slot is None:
        return found or held.get(str(gpu.index))
    return found or held.get(gpu.parent or "") or held.get(str(gpu.index))


def free_gpus(gpus: list[BoxGpu], held: dict[str, Holder]) -> list[BoxGpu]:
    """The GPUs (and MIG slices) no container holds and no process runs on, least busy first;
    a card split into slices is never free as a whole."""
    free = [g for g in gpus if not g.split and holder_of(g, held) is None and g.processes == 0]
    return sorted(free, key=BoxGpu.busy_key)


def pick(gpus: list[BoxGpu], held: dict[str, Holder], count: int) -> list[BoxGpu] | None:
    """`count` free GPUs, least busy first; None when the box has fewer free."""
    free = free_gpus(gpus, held)
    return free[:count] if len(free) >= count else None


def who_holds(gpus: list[BoxGpu], held: dict[str, Holder]) -> list[tuple[str, str]]:
    """(index, who) for each GPU that is not free: "alice's t4-1", "container x", "another
    process"."""
    out = []
    for g in gpus:
        if g.split:
            continue  # its slices say who holds what
        holder = holder_of(g, held)
        if holder is not None:
            who = (
                f"{holder.owner.partition('@')[0]}'s {holder.name}"
                if holder.owner
                else f"container {holder.name}"
            )
            out.append((g.label, who))
        elif g.processes:
            out.append((g.label, "another process"))
    return out


def refusal(where: str, gpus: list[BoxGpu], held: dict[str, Holder], count: int) -> str:
    """The one line said when `where` has fewer than `count` free GPUs."""
    taken = who_holds(gpus, held)
    whole = [g for g in gpus if not g.split]
    free = len(whole) - len(taken)
    listed = ", ".join(f"{label}: {who}" for label, who in taken)
    return (
        f"no {count} free GPU{'s' if count > 1 else ''} on {where}: {free} of its {len(whole)} "
        f"free ({listed}); start later, ask for fewer, share one with --gpus shared, "
        "or name another --host (or a pool: --host pool:NAME)"
    )
