"""Right-sizing advice: every rule that turns what a session's GPUs held and did (the `usage` the
agent keeps in its summary, gpusession/agent/usage.py) into "a smaller / bigger / faster type
would have done", with the money difference. Data only: `gpusession.words.spend` makes the sentence.

Only advice: nothing here changes a session. Prices are the session's backend's rates
(`Backend.gpu_rate`: its own price list, or the catalog's reference rate per GPU x count; a
cloud's typical spot rate when the session asked for spot), for the current type and the
suggestion alike, so the difference compares like with like whatever the backend charged at
the time (docs/cost.md).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from ..core.errors import BadInput
from . import registry
from .catalog import Catalog, GpuType

MIN_SAMPLES = 10  # fewer samples than this (seconds at the agent's 1 Hz): too little to judge
GB = 1e9  # the catalog's memory_gb is in decimal gigabytes, as the data sheets give it
HEADROOM = 1.2  # a suggested type must hold the peak memory plus 20%
FULL = 0.95  # peak memory at or above this fraction of a GPU's total: the next size up
SATURATED = 90  # median utilization at or above this (percent): the GPU was the bottleneck
FASTER = 1.5  # a "faster" suggestion has at least this much more FP16 throughput
COMPUTE_MATTERED = 50  # 95th-percentile utilization at or above this: keep the throughput
UNUSED_UTIL = 5  # a GPU whose 95th-percentile utilization stayed below this ...
UNUSED_MEMORY = 0.1  # ... and whose peak memory stayed below this fraction was not used
MIN_SAVING = 0.05  # dollars per hour: a smaller difference is not worth a line


@dataclasses.dataclass(frozen=True)
class UsageFigures:
    """The numbers a face shows, over every GPU of the session (from the agent's `usage`)."""

    samples: int  # samples seen (about one a second)
    gpus: int  # GPUs sampled
    busy_gpus: int  # GPUs that were used (utilization or memory), at least 1
    memory_peak: int  # bytes: the highest any GPU held
    memory_p95: int  # bytes: the highest 95th percentile of any GPU
    memory_total: int  # bytes: the total of that GPU
    utilization_mean: float | None  # percent: mean over the used GPUs
    utilization_p50: int | None  # percent: the highest median of the used GPUs
    utilization_p95: int | None  # percent: the highest 95th percentile
    oom_errors: int  # cells that failed for want of GPU memory

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Advice:
    """One suggestion. `kind`: smaller (a cheaper type held it), fewer (fewer GPUs were used),
    bigger (memory ran out or nearly), faster (the GPU was saturated)."""

    kind: str
    gpu_type: str  # what the session ran
    gpu_count: int
    price_per_hour: float  # catalog dollars per hour of what it ran
    suggested_type: str
    suggested_count: int
    suggested_price: float  # catalog dollars per hour of the suggestion
    hourly_difference: float  # suggested - current, dollars per hour (negative: saves)
    session_difference: float  # the same over this session's billed time
    speedup: float | None  # suggested / current FP16 throughput (per GPU x count)
    figures: UsageFigures

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def figures(usage: dict | None) -> UsageFigures | None:
    """The usage in a summary as figures; None when too little was sampled to judge."""
    if not usage or int(usage.get("samples") or 0) < MIN_SAMPLES:
        return None
    gpus = [g for g in usage.get("gpus") or [] if g.get("memory_total")]
    if not gpus:
        return None
    used = [g for g in gpus if _was_used(g)] or gpus[:1]
    peak = max(used, key=lambda g: g.get("memory_peak") or 0)
    means = [g["utilization_mean"] for g in used if g.get("utilization_mean") is not None]
    return UsageFigures(
        samples=int(usage["samples"]),
        gpus=len(gpus),
        busy_gpus=len(used),
        memory_peak=int(peak.get("memory_peak") or 0),
        memory_p95=max(int(g.get("memory_p95") or 0) for g in used),
        memory_total=int(peak["memory_total"]),
        utilization_mean=round(sum(means) / len(means), 1) if means else None,
        utilization_p50=_highest(used, "utilization_p50"),
        utilization_p95=_highest(used, "utilization_p95"),
        oom_errors=int(usage.get("oom_errors") or 0),
    )


def _was_used(gpu: dict) -> bool:
    util = gpu.get("utilization_p95") or 0
    return (
        util >= UNUSED_UTIL or (gpu.get("memory_peak") or 0) >= UNUSED_MEMORY * gpu["memory_total"]
    )


def _highest(gpus: list[dict], key: str) -> int | None:
    values = [g[key] for g in gpus if g.get(key) is not None]
    return max(values) if values else None


def advise(
    usage: dict | None,
    *,
    gpu_type: str,
    gpu_count: int,
    billed_s: float,
    catalog: Catalog,
    spot: bool = False,
    backend: str | None = None,
) -> Advice | None:
    """The one suggestion the usage supports, or None (it fitted; or too little was sampled).
    Priced by `backend`'s rates (the catalog's when None or not installed)."""
    f = figures(usage)
    if f is None:
        return None
    try:
        current = catalog.get(gpu_type)
    except BadInput:  # a type the catalog no longer has
        return None
    choice = _Choice(catalog, current, gpu_count, billed_s, f, rater(catalog, backend, spot))
    # memory ran out, or nearly
    if f.oom_errors or f.memory_peak >= FULL * f.memory_total:
        return _bigger(choice)
    # every GPU used, and the bottleneck
    count = min(f.busy_gpus, gpu_count)
    if count == gpu_count and f.utilization_p50 is not None and f.utilization_p50 >= SATURATED:
        return _faster(choice)
    # room to spare (or GPUs nobody used)
    return _smaller(choice, count)


@dataclasses.dataclass
class _Choice:
    """What a suggestion is weighed against: the session's type and count, its usage figures and
    the session's backend's rates (spot when the session was)."""

    catalog: Catalog
    current: GpuType
    gpu_count: int
    billed_s: float
    figures: UsageFigures
    price: Callable[[GpuType, int], float | None]  # None: the backend cannot give them

    def __post_init__(self) -> None:
        self.now_price = self.price(self.current, self.gpu_count) or 0.0

    def cheapest(self, count: int, fits) -> tuple[GpuType, float] | None:
        """The cheapest whole card that fits, on `count` GPUs (a MIG slice is never suggested:
        what a box is split into is its owner's)."""
        priced = [(g, self.price(g, count)) for g in self.catalog.whole_types() if fits(g)]
        found = [(g, p) for g, p in priced if p is not None]
        return min(found, key=lambda gp: (gp[1], gp[0].memory_gb)) if found else None

    def advice(self, kind: str, gpu: GpuType, count: int, cost: float) -> Advice:
        current, gpu_count = self.current, self.gpu_count
        hourly = round(cost - self.now_price, 6)
        speed = None
        if current.fp16_tflops and gpu.fp16_tflops:
            speed = round(gpu.fp16_tflops * count / (current.fp16_tflops * gpu_count), 2)
        return Advice(
            kind=kind,
            gpu_type=current.name,
            gpu_count=gpu_count,
            price_per_hour=self.now_price,
            suggested_type=gpu.name,
            suggested_count=count,
            suggested_price=cost,
            hourly_difference=hourly,
            session_difference=round(hourly * self.billed_s / 3600.0, 6),
            speedup=speed,
            figures=self.figures,
        )


def _bigger(choice: _Choice) -> Advice | None:
    """Memory ran out, or nearly: the cheapest type with more memory per GPU."""
    f = choice.figures
    found = choice.cheapest(choice.gpu_count, lambda g: g.memory_gb * GB > f.memory_total * 1.05)
    return choice.advice("bigger", found[0], choice.gpu_count, found[1]) if found else None


def _faster(choice: _Choice) -> Advice | None:
    """Every GPU used, and the bottleneck: the cheapest type that is clearly faster and holds it."""
    f = choice.figures
    floor = (choice.current.fp16_tflops or 0) * FASTER
    found = choice.cheapest(
        choice.gpu_count,
        lambda g: (g.fp16_tflops or 0) >= floor and g.memory_gb * GB >= f.memory_peak * HEADROOM,
    )
    return choice.advice("faster", found[0], choice.gpu_count, found[1]) if found else None


def _smaller(choice: _Choice, count: int) -> Advice | None:
    """Room to spare (or GPUs nobody used): the cheapest type, on the `count` GPUs that were
    used, that holds the peak with headroom, as fast as this one where the compute mattered;
    None when it saves too little."""
    f, current = choice.figures, choice.current
    need_speed = (
        f.utilization_p95 is not None and f.utilization_p95 >= COMPUTE_MATTERED
    ) and current.fp16_tflops
    found = choice.cheapest(
        count,
        lambda g: (
            g.memory_gb * GB >= f.memory_peak * HEADROOM
            and (not need_speed or (g.fp16_tflops or 0) >= (current.fp16_tflops or 0))
        ),
    )
    if found is None or found[1] > choice.now_price - MIN_SAVING:
        return None
    gpu, cost = found
    return choice.advice("fewer" if gpu.name == current.name else "smaller", gpu, count, cost)


def rater(
    catalog: Catalog, backend: str | None, spot: bool = False
) -> Callable[[GpuType, int], float | None]:
    """How `backend` prices `count` x `gpu` for a comparison (`Backend.gpu_rate`), the
    catalog's reference rate when it is None or not installed here."""
    cls = None
    if backend:
        try:
            cls = registry.load_backend_class(backend)
        except BadInput:  # a backend no longer installed: the catalog's rate
            cls = None
    if cls is None or not hasattr(cls, "gpu_rate"):
        return catalog.price_per_hour
    return lambda gpu, count: cls.gpu_rate(catalog, gpu, count, spot=bool(spot))


def could_save(
    summary: dict | None,
    *,
    gpu_type: str,
    gpu_count: int,
    catalog: Catalog,
    spot: bool,
    backend: str | None = None,
) -> float:
    """Dollars a smaller or fewer-GPU suggestion would have saved over the session (0 without one),
    from a stored agent summary: what the spend report adds up."""
    if not summary:
        return 0.0
    advice = advise(
        summary.get("usage"),
        gpu_type=gpu_type,
        gpu_count=gpu_count,
        billed_s=float(summary.get("duration_s") or 0.0),
        catalog=catalog,
        spot=spot,
        backend=backend,
    )
    if advice is None or advice.kind not in ("smaller", "fewer"):
        return 0.0
    return -advice.session_difference


def advice_document(
    summary: dict | None,
    *,
    gpu_type: str,
    gpu_count: int,
    spot: bool,
    catalog: Catalog,
    backend: str | None = None,
) -> dict[str, Any]:
    """What `%gpu advice`, the stop line, the card and REST show, from an agent summary (live or
    stored): {"figures": UsageFigures or None, "advice": Advice or None, "samples": n}."""
    usage = (summary or {}).get("usage")
    found = figures(usage)
    advice = advise(
        usage,
        gpu_type=gpu_type,
        gpu_count=gpu_count,
        billed_s=float((summary or {}).get("duration_s") or 0.0),
        catalog=catalog,
        spot=spot,
        backend=backend,
    )
    return {
        "samples": int((usage or {}).get("samples") or 0),
        "min_samples": MIN_SAMPLES,
        "figures": None if found is None else found.to_dict(),
        "advice": None if advice is None else advice.to_dict(),
    }
