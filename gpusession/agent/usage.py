"""What the session's GPUs held and did over its whole life, for right-sizing advice
(gpusession/configuration/advice.py reads it from the agent's summary).

The sampler keeps only the last hour of samples; this keeps, per GPU, numbers that cover every
sample since the start in constant memory: the peak memory, histograms of memory (percent of the
GPU's total) and utilization (percent) with one bucket per percent, from which the 95th
percentile is read, and the mean utilization.
"""

from __future__ import annotations

from typing import Any

BUCKETS = 101  # 0..100 percent


def _percentile(histogram: list[int], fraction: float) -> int | None:
    """The smallest bucket at or below which `fraction` of the counts lie."""
    total = sum(histogram)
    if not total:
        return None
    wanted, seen = fraction * total, 0
    for bucket, count in enumerate(histogram):
        seen += count
        if seen >= wanted:
            return bucket
    return len(histogram) - 1


def _bucket(value: float) -> int:
    return max(0, min(BUCKETS - 1, int(round(value))))


class _Gpu:
    def __init__(self, index: int):
        self.index = index
        self.name: str | None = None
        self.memory_total: int | None = None
        self.memory_peak = 0
        self.memory_hist = [0] * BUCKETS
        self.util_hist = [0] * BUCKETS
        self.util_sum = 0.0
        self.util_samples = 0

    def add(self, gpu: dict) -> None:
        self.name = gpu.get("name") or self.name
        total, used, util = gpu.get("memory_total"), gpu.get("memory_used"), gpu.get("utilization")
        if total:
            self.memory_total = int(total)
        if used is not None:
            self.memory_peak = max(self.memory_peak, int(used))
            if self.memory_total:
                self.memory_hist[_bucket(100.0 * used / self.memory_total)] += 1
        if util is not None:
            self.util_hist[_bucket(util)] += 1
            self.util_sum += float(util)
            self.util_samples += 1

    def to_dict(self) -> dict[str, Any]:
        p95 = _percentile(self.memory_hist, 0.95)
        return {
            "index": self.index,
            "name": self.name,
            "memory_total": self.memory_total,
            "memory_peak": self.memory_peak,
            # the bucket's upper edge: never below what was seen 95% of the time
            "memory_p95": None
            if p95 is None or not self.memory_total
            else min(self.memory_peak, int(self.memory_total * (p95 + 0.5) / 100.0)),
            "utilization_mean": round(self.util_sum / self.util_samples, 1)
            if self.util_samples
            else None,
            "utilization_p50": _percentile(self.util_hist, 0.5),
            "utilization_p95": _percentile(self.util_hist, 0.95),
            "utilization_peak": max(
                (b for b, count in enumerate(self.util_hist) if count), default=None
            ),
        }


class UsageTracker:
    """Fed every sample (`add`) and every activity reading (`saw_activity`); `summary()` is the
    `usage` field of the agent's summary (docs/cost.md)."""

    def __init__(self) -> None:
        self.samples = 0
        self._gpus: dict[int, _Gpu] = {}
        self.oom_errors = 0
        self._oom_last = 0  # the kernel's own count, which starts again when the kernel restarts

    def add(self, sample: dict) -> None:
        if not sample.get("gpus_visible"):
            return
        self.samples += 1
        for position, gpu in enumerate(sample.get("gpus") or []):
            index = gpu.get("index", position)
            self._gpus.setdefault(index, _Gpu(index)).add(gpu)

    def saw_activity(self, activity: dict) -> None:
        """The kernel's count of cells that failed for want of GPU memory."""
        count = int(activity.get("oom_errors") or 0)
        self.oom_errors += count - self._oom_last if count >= self._oom_last else count
        self._oom_last = count

    def summary(self) -> dict[str, Any]:
        return {
            "samples": self.samples,
            "oom_errors": self.oom_errors,
            "gpus": [self._gpus[i].to_dict() for i in sorted(self._gpus)],
        }
