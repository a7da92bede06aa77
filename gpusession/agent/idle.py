"""When a session stops itself: idle timeout, hard max runtime, cost cap. Pure policy.

Nothing here reads a clock or a file: the watchdog passes the time and what it observed, so
tests drive it with an injected clock and recorded samples.

Idle means: the kernel runs no cell AND every GPU stays under `gpu_threshold` percent, for
the whole `idle` (AgentArgs: the session's --idle, in seconds). With `gpu_only`, the kernel is ignored (a cell stuck in a loop
while its GPU sits at 0% is idle). With no GPU visible, GPU utilization counts as 0.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..configuration.agentargs import AgentArgs
from ..configuration.cost import cost_for_seconds, seconds_until_cost
from ..core.protocol import (
    StopKind,
    StopReason,
    Warning,
    WarningKind,
)  # standard library only, like cost

WARNING_MAX_S = 300.0  # warn at most this long before a stop ...
WARNING_FRACTION = 0.2  # ... and at most this fraction of the limit before it
COST_WARNING_FRACTION = 0.8  # warn once spending reaches this share of --max-cost
MIG_MEMORY_STEP = (
    64 * 1024 * 1024
)  # bytes a MIG slice's memory must move between readings to count as busy
# the idle clock waits while a kernel starts (boots, then waits for the starting client's first
# kernel_info), at most this long: a client that has not come by then is not coming
START_GRACE_S = 120.0


def warning_lead(limit_s: float) -> float:
    """How long before a stop the warning shows: min(5 min, limit / 5)."""
    return min(WARNING_MAX_S, limit_s * WARNING_FRACTION)


@dataclasses.dataclass
class Verdict:
    """What the watchdog acts on (stop_reason) and what /stats shows (the rest). Data only: the
    local side puts it into words."""

    stop_reason: StopReason | None
    idle: dict[str, Any]
    runtime: dict[str, Any]
    cost: dict[str, Any]
    warnings: list[Warning] = dataclasses.field(default_factory=list)  # cost, runtime, idle order


class ActivityTracker:
    """Remembers when the session was last active and accounts idle time and GPU use.

    Not thread-safe by itself: the watchdog holds its lock around every call.
    """

    def __init__(self, limits: AgentArgs, billed_since: float, active_since: float | None = None):
        self.limits = limits  # the agent's options: idle, gpu_threshold, gpu_only, max_runtime...
        self.billed_since = (
            billed_since  # billing started (the cost meter and max runtime count from it)
        )
        # the idle clock starts when the agent does, not at billing: a slow provision is no idleness
        self.last_active = max(
            billed_since, active_since or billed_since
        )  # last instant of activity
        self.keepalive_until: float | None = None
        self.idle_total_s = 0.0
        self.gpu_util_sum = 0.0
        self.gpu_util_samples = 0
        self._gpu_busy = False  # the latest GPU reading had a GPU at or above the threshold
        self._slice_memory: list[int | None] | None = None  # MIG slices' memory, last reading
        self._last_seen: float | None = None
        self._starting_since: float | None = None  # a kernel starts, not reached yet, since then

    def observe(
        self,
        now: float,
        *,
        kernel_busy: bool,
        kernel_last_activity: float | None,
        gpu_utils: list[float | None] | None = None,
        kernel_starting: bool = False,
        slice_memory: list[int | None] | None = None,
    ) -> bool:
        """Take one observation; returns whether the session counts as active at `now`.

        gpu_utils=None means "no new GPU reading this time" (the previous one still holds);
        [] means no GPU is visible (utilization 0). kernel_starting: the kernel has not loaded,
        or no client reached it yet (its first kernel_info): not idleness, for START_GRACE_S.
        slice_memory: the memory used of each MIG slice in this reading (NVML gives a slice no
        utilization): a slice whose memory moved by MIG_MEMORY_STEP or more since the last reading
        counts as a busy GPU."""
        p = self.limits
        if gpu_utils is not None:
            self._gpu_busy = any(u is not None and u >= p.gpu_threshold for u in gpu_utils)
            self._gpu_busy = self._slices_moved(slice_memory) or self._gpu_busy
            known = [u for u in gpu_utils if u is not None]
            if known:
                self.gpu_util_sum += sum(known) / len(known)
                self.gpu_util_samples += 1
        gpu_busy = self._gpu_busy
        since = self._last_seen if self._last_seen is not None else self.billed_since
        kernel_active = False
        if not p.gpu_only:
            if kernel_busy:
                kernel_active = True
                self.last_active = max(self.last_active, now)
            elif kernel_last_activity is not None:
                activity = min(kernel_last_activity, now)  # never trust a time from the future
                kernel_active = activity > since
                self.last_active = max(self.last_active, activity)
        if gpu_busy:
            self.last_active = max(self.last_active, now)
        if not kernel_starting:
            self._starting_since = None
        elif self._starting_since is None:
            self._starting_since = now
        starting = kernel_starting and now - self._starting_since < START_GRACE_S
        if starting:
            self.last_active = max(self.last_active, now)
        active = gpu_busy or kernel_active or starting
        if self._last_seen is not None and not active and now > self._last_seen:
            self.idle_total_s += now - self._last_seen
        self._last_seen = now
        return active

    def _slices_moved(self, memory: list[int | None] | None) -> bool:
        """Whether a MIG slice's memory moved since the last reading (allocations, frees)."""
        before, self._slice_memory = self._slice_memory, memory
        if not memory or before is None or len(before) != len(memory):
            return False
        return any(
            a is not None and b is not None and abs(a - b) >= MIG_MEMORY_STEP
            for a, b in zip(memory, before)
        )

    def keepalive(self, now: float, seconds: float) -> dict[str, Any]:
        """Postpone the idle stop to now + seconds, at most keepalive_limit_s ahead."""
        if seconds < 0:
            raise ValueError("seconds must not be negative")
        granted = min(float(seconds), self.limits.keepalive_limit)
        until = now + granted
        self.keepalive_until = max(self.keepalive_until or 0.0, until)
        return {
            "requested_s": float(seconds),
            "granted_s": granted,
            "capped": granted < seconds,
            "limit_s": self.limits.keepalive_limit,
            "keepalive_until": self.keepalive_until,
        }

    def evaluate(self, now: float) -> Verdict:
        p = self.limits
        billed = max(0.0, now - self.billed_since)
        idle = self._idle_status(now)
        runtime = {
            "elapsed_s": round(billed, 1),
            "max_runtime_s": p.max_runtime,
            "remaining_s": None,
        }
        cost, cost_warning = self._cost_status(billed)
        warnings = [cost_warning] if cost_warning else []
        reason = None
        if p.max_runtime is not None:
            left = p.max_runtime - billed
            runtime["remaining_s"] = round(max(0.0, left), 1)
            if left <= 0:
                reason = StopReason(
                    StopKind.MAX_RUNTIME, elapsed_s=round(billed, 1), max_runtime_s=p.max_runtime
                )
            elif left <= warning_lead(p.max_runtime):
                warnings.append(
                    Warning(
                        WarningKind.MAX_RUNTIME, remaining_s=round(left, 1), limit_s=p.max_runtime
                    )
                )
        if p.max_cost is not None and cost["so_far"] >= p.max_cost:
            reason = StopReason(StopKind.MAX_COST, spent=cost["so_far"], max_cost=p.max_cost)
        idle_warning = self._idle_warning(now, idle)
        if idle_warning:
            warnings.append(idle_warning)
        if reason is None and idle["remaining_s"] is not None and idle["remaining_s"] <= 0:
            # whole seconds, not rounded up: it stopped within a check interval after the timeout
            reason = StopReason(
                StopKind.IDLE,
                idle_for_s=float(int(idle["idle_for_s"])),
                idle_timeout_s=p.idle,
            )
        return Verdict(stop_reason=reason, idle=idle, runtime=runtime, cost=cost, warnings=warnings)

    def _idle_status(self, now: float) -> dict[str, Any]:
        p = self.limits
        idle_for = max(0.0, now - self.last_active)
        out: dict[str, Any] = {
            "timeout_s": p.idle,
            "idle_for_s": round(idle_for, 1),
            "remaining_s": None,
            "keepalive_until": self.keepalive_until if (self.keepalive_until or 0) > now else None,
            "gpu_only": p.gpu_only,
            "gpu_threshold": p.gpu_threshold,
        }
        if p.idle is None:
            return out
        deadline = max(self.last_active + p.idle, self.keepalive_until or 0.0)
        remaining = deadline - now
        out["remaining_s"] = round(max(0.0, remaining), 1)
        return out

    def _idle_warning(self, now: float, idle: dict[str, Any]) -> Warning | None:
        p = self.limits
        remaining = idle["remaining_s"]
        if p.idle is None or remaining is None:
            return None
        if 0 < remaining <= warning_lead(p.idle):
            return Warning(WarningKind.IDLE, remaining_s=remaining, idle_for_s=idle["idle_for_s"])
        return None

    def _cost_status(self, billed: float) -> tuple[dict[str, Any], Warning | None]:
        p = self.limits
        so_far = cost_for_seconds(p.price_per_hour, billed)
        out: dict[str, Any] = {
            "price_per_hour": p.price_per_hour,
            "billed_s": round(billed, 1),
            "so_far": round(so_far, 6),
            "max_cost": p.max_cost,
            "remaining_s": None,
        }
        warning = None
        if p.max_cost is not None:
            left = seconds_until_cost(p.price_per_hour, p.max_cost, billed)
            out["remaining_s"] = None if left is None else round(left, 1)
            if COST_WARNING_FRACTION * p.max_cost <= so_far < p.max_cost:
                warning = Warning(
                    WarningKind.MAX_COST,
                    remaining_s=out["remaining_s"],
                    spent=round(so_far, 6),
                    max_cost=p.max_cost,
                )
        return out, warning

    def summary(self, now: float, *, gpu_count: int, cells: int | None = None) -> dict[str, Any]:
        """What a stop reports: duration, GPU-hours, cost, mean GPU utilization, minutes idle."""
        billed = max(0.0, now - self.billed_since)
        mean = self.gpu_util_sum / self.gpu_util_samples if self.gpu_util_samples else None
        return {
            "duration_s": round(billed, 1),
            "gpu_count": gpu_count,
            "gpu_hours": round(gpu_count * billed / 3600.0, 4),
            "cost": round(cost_for_seconds(self.limits.price_per_hour, billed), 6),
            "price_per_hour": self.limits.price_per_hour,
            "mean_gpu_utilization": None if mean is None else round(mean, 1),
            "idle_minutes": round(self.idle_total_s / 60.0, 2),
            "cells": cells,
        }
