"""The agent's loop: sample, observe the kernel, decide, and stop the session when a limit is
reached. It runs on the remote side, so it fires while the laptop sleeps or the tunnel is gone.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from ..core.protocol import Marker, StopReason, marker_line, say_line
from . import activity
from .idle import ActivityTracker, Verdict
from .sampler import Sampler
from .usage import UsageTracker

FIRST_SAMPLE_WAIT_S = 5.0  # /stats asked before the first sample waits this long at most for it


class Watchdog:
    """Ticks every `check_interval_s`; samples every `sample_interval_s`; calls `stop(reason)`
    once when the policy says so. Every collaborator is injected (tests pass a clock)."""

    def __init__(
        self,
        *,
        session_id: str,
        state_dir: str,
        tracker: ActivityTracker,
        sampler: Sampler,
        stop: Callable[[StopReason], None],
        gpu_count: int = 1,
        check_interval_s: float = 1.0,
        sample_interval_s: float = 1.0,
        clock: Callable[[], float] = time.time,
        read_activity: Callable[[str], dict] = activity.read_activity,
        log: Callable[[str], None] = say_line,
    ):
        self.session_id = session_id
        self.state_dir = state_dir
        self.tracker = tracker
        self.sampler = sampler
        self.gpu_count = gpu_count
        self.check_interval_s = check_interval_s
        self.sample_interval_s = sample_interval_s
        self.clock = clock
        self._stop = stop
        self._read_activity = read_activity
        self._log = log
        self._lock = threading.Lock()
        self._next_sample = 0.0
        self._cells = 0
        self._warned: set = set()  # warning kinds already logged while they last
        self.usage = UsageTracker()  # the whole session's GPU use, for right-sizing advice
        self.stop_reason: StopReason | None = None
        self.done = threading.Event()
        self.running = False  # its thread runs, or is about to (service.start): it samples

    # -- the loop -------------------------------------------------------------------------

    def tick(self) -> Verdict:
        """One check: read the kernel's activity, sample when due, decide."""
        now = self.clock()
        act = self._read_activity(self.state_dir)
        busy = bool(act.get("busy"))
        gpu_utils = slice_memory = None
        if self.sample_interval_s > 0 and now >= self._next_sample:
            sample = self.sampler.sample(now, kernel_busy=busy)
            gpu_utils = [g.get("utilization") for g in sample["gpus"] if not g.get("mig")]
            slice_memory = [g.get("memory_used") for g in sample["gpus"] if g.get("mig")]
            with self._lock:  # summary() reads it from the endpoint's thread
                self.usage.add(sample)
            # keep the 1 Hz grid; after a long stall, restart it rather than catch up
            self._next_sample = max(
                self._next_sample + self.sample_interval_s, now - self.sample_interval_s / 2
            )
        with self._lock:
            self._cells = int(act.get("cells") or 0)
            self.usage.saw_activity(act)
            self.tracker.observe(
                now,
                kernel_busy=busy,
                kernel_last_activity=act.get("last_activity"),
                gpu_utils=gpu_utils,
                kernel_starting=not act.get("reached", True),
                slice_memory=slice_memory,
            )
            verdict = self.tracker.evaluate(now)
        for warning in verdict.warnings:
            if warning.kind not in self._warned:  # once per kind, in the runtime's log
                self._warned.add(warning.kind)
                self._log(marker_line(Marker.WARNING, warning.to_dict()))
        if not verdict.warnings:
            self._warned.clear()
        if verdict.stop_reason and self.stop_reason is None:
            self.stop_reason = verdict.stop_reason
            self._stop(verdict.stop_reason)
            self.done.set()
        return verdict

    def run(self, stop_event: threading.Event | None = None) -> None:
        """The thread body: tick until a stop was decided (or stop_event is set)."""
        stop_event = stop_event or threading.Event()
        self.running = True
        while not self.done.is_set() and not stop_event.is_set():
            try:
                self.tick()
            except Exception as exc:  # noqa: BLE001 - one bad reading must not end the watchdog
                self._log(
                    marker_line(
                        Marker.AGENT_ERROR, {"error": f"tick failed: {type(exc).__name__}: {exc}"}
                    )
                )
            stop_event.wait(self.check_interval_s)

    # -- what the endpoint serves -----------------------------------------------------------

    def keepalive(self, seconds: float) -> dict[str, Any]:
        now = self.clock()
        with self._lock:
            granted = self.tracker.keepalive(now, seconds)
            granted["idle"] = self.tracker.evaluate(now).idle
        return granted

    def stats(self, since: float | None = None, limit: int | None = None) -> dict[str, Any]:
        """The /stats document (docs/gpu-agent.md describes every field). Asked before the
        first sample (right after the start: the endpoint serves before the watchdog's first
        tick), it waits for it, FIRST_SAMPLE_WAIT_S at most: a document without a reading says
        nothing."""
        if self.running:  # (a watchdog driven by hand, a test's, samples when it is told)
            self.sampler.sampled.wait(FIRST_SAMPLE_WAIT_S)
        now = self.clock()
        with self._lock:
            verdict = self.tracker.evaluate(now)
        return {
            "session_id": self.session_id,
            "t": round(now, 3),
            "gpus_visible": self.sampler.gpus_visible,
            "message": self.sampler.message,
            "driver_version": self.sampler.nvml.driver_version,
            "source": self.sampler.nvml.source,  # "nvml", or "recorded" (--nvml-replay)
            # a replay's recording: {gpu_name, gpu_count, of_this_type}; None for live values
            "recording": getattr(self.sampler.nvml, "recording", None),
            "interval_s": self.sample_interval_s,
            "samples": self.sampler.samples(since, limit),
            "idle": verdict.idle,
            "runtime": verdict.runtime,
            "cost": verdict.cost,
            "warnings": [w.to_dict() for w in verdict.warnings],
            "stopping": self.stop_reason.to_dict() if self.stop_reason else None,
        }

    def summary(self) -> dict[str, Any]:
        now = self.clock()
        cells = self._read_activity(self.state_dir).get(
            "cells"
        )  # fresh: a cell may have run since the last tick
        with self._lock:
            out = self.tracker.summary(
                now, gpu_count=self.gpu_count, cells=int(cells or self._cells)
            )
            out["usage"] = self.usage.summary()
        out["session_id"] = self.session_id
        out["reason"] = self.stop_reason.to_dict() if self.stop_reason else None
        out["at"] = round(now, 3)
        return out
