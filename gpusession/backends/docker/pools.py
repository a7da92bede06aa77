"""A pool of boxes (issue 34 §2): `--host pool:lab` starts on the box of the pool
(`DockerBackend.pools`, `{"lab": ["ssh://gpu1", "ssh://gpu2"]}`) with the most free GPUs of the
type asked, the least busy on a tie. Every box is asked at once, each in a thread of its own
with one deadline for all (POOL_TIMEOUT): a box that does not answer in time, refuses the login
or has no GPU reading is skipped, said in one line, and never holds up the start.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any, Callable

from ...configuration.catalog import mig_profile
from .gpus import BoxGpu, free_gpus, holders, read_box

POOL_TIMEOUT = 20.0  # seconds for every box of a pool to answer, together


@dataclasses.dataclass
class BoxAnswer:
    """What one box of a pool said: its free GPUs of the type, or why it was skipped."""

    host: str
    free: list[BoxGpu] = dataclasses.field(default_factory=list)  # of the type, least busy first
    gpus: int = 0  # GPUs of the type on the box
    skipped: str | None = None  # why it was not considered


def type_matches(gpu_name: str | None, gpu_type: str) -> bool:
    """Whether a GPU NVML names ('NVIDIA A100-SXM4-80GB', 'Tesla T4') is of the catalog type
    ('a100', 'a100-80gb', 't4'): every part of the type's name is a word of the GPU's."""
    if not gpu_name:
        return False
    words = set(gpu_name.lower().replace("-", " ").replace("_", " ").split())
    parts = gpu_type.lower().split("-")
    slice_type = mig_profile(gpu_type.lower()) is not None
    if ("mig" in words) != slice_type:  # a slice is of a slice type only, a card of a card type
        return False
    return all(part in words for part in parts)


def _read(client_for: Callable[[str], Any], host: str) -> tuple[list[BoxGpu], dict] | BoxAnswer:
    """One box's GPU reading and who holds what there, or the skipped answer saying why not."""
    try:
        client = client_for(host)
        reading = read_box(client, host)
        if reading is None:
            return BoxAnswer(host, skipped="no GPU reading (no nvidia-smi there)")
        held = holders([c.attrs for c in client.containers.list(all=True)])
    except Exception as exc:  # noqa: BLE001 - any failure skips the box; the line says which
        return BoxAnswer(host, skipped=_short(exc))
    return reading[0], held


def ask_box(client_for: Callable[[str], Any], host: str, gpu_type: str) -> BoxAnswer:
    """One box: its GPUs of `gpu_type` that no container holds and no process runs on."""
    read = _read(client_for, host)
    if isinstance(read, BoxAnswer):
        return read
    gpus, held = read
    mine = [g for g in gpus if not g.split and type_matches(g.name, gpu_type)]
    if not mine:
        names = sorted({g.name or "?" for g in gpus})
        return BoxAnswer(host, skipped=f"no {gpu_type} there ({', '.join(names)})")
    return BoxAnswer(host, free=free_gpus(mine, held), gpus=len(mine))


def box_free(client_for: Callable[[str], Any], host: str) -> BoxAnswer:
    """One box, every GPU of it (no type asked): its free ones and how many it has, for the
    listing of what each pool has free now (`%gpu types`)."""
    read = _read(client_for, host)
    if isinstance(read, BoxAnswer):
        return read
    cards = [g for g in read[0] if not g.split]
    return BoxAnswer(host, free=free_gpus(cards, read[1]), gpus=len(cards))


def free_by_name(answer: BoxAnswer) -> dict[str, int]:
    """How many GPUs of each name are free on a box that answered."""
    counts: dict[str, int] = {}
    for g in answer.free:
        counts[g.name or "GPU"] = counts.get(g.name or "GPU", 0) + 1
    return counts


def ask_pool(
    client_for: Callable[[str], Any],
    boxes: list[str],
    gpu_type: str | None,
    timeout: float = POOL_TIMEOUT,
) -> list[BoxAnswer]:
    """Every box of the pool, asked at once (for `gpu_type`, or None: every GPU of each box);
    those with no answer by the deadline are skipped."""
    answers: dict[str, BoxAnswer] = {}

    def ask(host: str) -> None:
        answers[host] = (
            box_free(client_for, host) if gpu_type is None else ask_box(client_for, host, gpu_type)
        )

    threads = [
        threading.Thread(target=ask, args=(h,), name="gpusession-pool", daemon=True) for h in boxes
    ]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    return [
        answers.get(h) or BoxAnswer(h, skipped=f"no answer within {timeout:.0f}s") for h in boxes
    ]


def best_box(answers: list[BoxAnswer], count: int) -> BoxAnswer | None:
    """The box with `count` or more free GPUs of the type: the most free, then the least busy."""
    fitting = [a for a in answers if a.skipped is None and len(a.free) >= count]
    if not fitting:
        return None
    return min(fitting, key=lambda a: (-len(a.free), _mean_busy(a.free), a.host))


def _mean_busy(free: list[BoxGpu]) -> float:
    return sum(g.utilization or 0.0 for g in free) / max(1, len(free))


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text[:200]


def chosen_line(pool: str, chosen: BoxAnswer, answers: list[BoxAnswer], gpu_type: str) -> str:
    """The start's line: which box of the pool, and why (the others' free GPUs, the skipped)."""
    others = "; ".join(
        f"{a.host}: skipped, {a.skipped}" if a.skipped else f"{a.host}: {len(a.free)} free"
        for a in answers
        if a is not chosen
    )
    return (
        f"pool {pool}: {chosen.host}, the most free {gpu_type} ({len(chosen.free)} of "
        f"{chosen.gpus})" + (f" ({others})" if others else "")
    )


def full_line(pool: str, answers: list[BoxAnswer], gpu_type: str, count: int) -> str:
    """The one line when no box of the pool has `count` free GPUs of the type."""
    each = "; ".join(
        f"{a.host}: skipped, {a.skipped}"
        if a.skipped
        else f"{a.host}: {len(a.free)} of {a.gpus} free"
        for a in answers
    )
    return (
        f"no box of pool {pool} has {count} free {gpu_type} ({each}); start later, ask for "
        "fewer, give a fallback list (--type a,b) or name a --host"
    )
