"""The stop policy with an injected clock and recorded samples: idle, GPU-only, keepalive,
warnings, max runtime, and the watchdog acting on them."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpusession.agent.idle import ActivityTracker, warning_lead
from gpusession.agent.nvml import NvmlReader, RecordedNvml
from gpusession.agent.sampler import Sampler
from gpusession.agent.watchdog import Watchdog
from gpusession.configuration.agentargs import AgentArgs
from gpusession.core.protocol import Marker, StopKind, StopReason, WarningKind, parse_marker
from gpusession.words.stops import describe_warning


def texts(verdict) -> list[str]:
    return [describe_warning(w) for w in verdict.warnings]


DATA = Path(__file__).parent / "data"
T0 = 1_700_000_000.0


def run(
    tracker: ActivityTracker, seconds: int, *, start: float, busy=False, last=None, gpu=(), step=1.0
):
    """Observe once per `step` from start to start+seconds; returns the verdict at the end."""
    t = start
    verdict = None
    while t <= start + seconds:
        tracker.observe(t, kernel_busy=busy, kernel_last_activity=last, gpu_utils=list(gpu))
        verdict = tracker.evaluate(t)
        if verdict.stop_reason:
            return t, verdict
        t += step
    return t - step, verdict


def test_idle_kernel_and_gpu_stop_after_the_timeout():
    tr = ActivityTracker(AgentArgs(idle=600), billed_since=T0)
    at, verdict = run(tr, 3600, start=T0, last=T0 + 100, gpu=[0.0, 1.0])
    assert at == T0 + 700  # last activity + timeout
    assert verdict.stop_reason == StopReason(StopKind.IDLE, idle_for_s=600.0, idle_timeout_s=600)
    assert verdict.idle["remaining_s"] == 0


def test_busy_cell_with_an_idle_gpu_is_not_idle_by_default():
    tr = ActivityTracker(AgentArgs(idle=600), billed_since=T0)
    at, verdict = run(tr, 3600, start=T0, busy=True, last=T0, gpu=[0.0])
    assert verdict.stop_reason is None and at == T0 + 3600
    assert verdict.idle["idle_for_s"] == 0


def test_busy_cell_with_an_idle_gpu_is_idle_under_gpu_only():
    tr = ActivityTracker(AgentArgs(idle=600, gpu_only=True), billed_since=T0)
    at, verdict = run(tr, 3600, start=T0, busy=True, last=T0, gpu=[0.0])
    assert at == T0 + 600 and verdict.stop_reason.kind is StopKind.IDLE


def test_gpu_over_the_threshold_keeps_it_alive_even_with_gpu_only():
    tr = ActivityTracker(AgentArgs(idle=600, gpu_only=True, gpu_threshold=5), billed_since=T0)
    _, verdict = run(tr, 3600, start=T0, gpu=[0.0, 5.0])  # one of two GPUs at the threshold
    assert verdict.stop_reason is None
    # then the GPU drops under the threshold: the timeout counts from the last busy reading
    at, verdict = run(tr, 3600, start=T0 + 3601, gpu=[4.9, 0.0])
    assert at == T0 + 3600 + 600 and verdict.stop_reason.kind is StopKind.IDLE


def test_no_gpu_visible_counts_as_zero_utilization():
    tr = ActivityTracker(AgentArgs(idle=60), billed_since=T0)
    at, verdict = run(tr, 600, start=T0, last=T0, gpu=[])
    assert at == T0 + 60 and verdict.stop_reason


def test_the_idle_clock_starts_with_the_agent_not_with_billing():
    # provisioning took 10 minutes; a 5-minute idle timeout must not fire at once
    tr = ActivityTracker(AgentArgs(idle=300), billed_since=T0, active_since=T0 + 600)
    tr.observe(T0 + 601, kernel_busy=False, kernel_last_activity=None, gpu_utils=[])
    assert tr.evaluate(T0 + 601).stop_reason is None
    assert tr.evaluate(T0 + 900).stop_reason is not None


def test_a_starting_kernel_is_not_idle_for_the_start_grace():
    """Until the kernel is reached (it boots, then the starting client's first kernel_info) the
    idle clock waits, even under --gpu-only; for START_GRACE_S at most, then it runs."""
    from gpusession.agent.idle import START_GRACE_S

    for gpu_only in (False, True):
        tr = ActivityTracker(AgentArgs(idle=2, gpu_only=gpu_only), billed_since=T0)
        for t in range(0, 60):  # a minute of boot and connect: never a stop
            tr.observe(
                T0 + t,
                kernel_busy=False,
                kernel_last_activity=None,
                gpu_utils=[],
                kernel_starting=True,
            )
            assert tr.evaluate(T0 + t).stop_reason is None, t
        at, verdict = run(tr, 10, start=T0 + 60, last=T0 + 59.5, gpu=[])  # reached at 59.5 s
        # 2 s from the kernel_info (the last starting check under --gpu-only: a kernel_info is no GPU use)
        assert verdict.stop_reason.kind == StopKind.IDLE and at == T0 + (61 if gpu_only else 62), at
        tr = ActivityTracker(AgentArgs(idle=2, gpu_only=gpu_only), billed_since=T0)
        t = T0
        while not tr.evaluate(t).stop_reason:  # never reached: the clock runs after the grace
            t += 1
            tr.observe(
                t, kernel_busy=False, kernel_last_activity=None, gpu_utils=[], kernel_starting=True
            )
        assert T0 + START_GRACE_S < t <= T0 + START_GRACE_S + 3, t - T0


def test_warning_shows_before_the_stop():
    assert warning_lead(1800) == 300 and warning_lead(60) == 12
    tr = ActivityTracker(AgentArgs(idle=1800), billed_since=T0)
    tr.observe(T0, kernel_busy=False, kernel_last_activity=T0, gpu_utils=[0.0])
    assert tr.evaluate(T0 + 1499).warnings == []
    v = tr.evaluate(T0 + 1500)
    assert [w.kind for w in v.warnings] == [WarningKind.IDLE]
    assert "stops in 5m00s" in texts(v)[0] and "keepalive" in texts(v)[0]
    assert tr.evaluate(T0 + 1800).stop_reason


def test_keepalive_postpones_and_is_capped():
    tr = ActivityTracker(AgentArgs(idle=600, keepalive_limit=4 * 3600), billed_since=T0)
    tr.observe(T0, kernel_busy=False, kernel_last_activity=T0, gpu_utils=[])
    granted = tr.keepalive(T0 + 550, 3600)
    assert granted["granted_s"] == 3600 and not granted["capped"]
    assert tr.evaluate(T0 + 600).stop_reason is None
    v = tr.evaluate(T0 + 550 + 3600 - 60)
    assert v.idle["remaining_s"] == 60 and v.warnings  # the warning still comes
    assert tr.evaluate(T0 + 550 + 3600).stop_reason.kind is StopKind.IDLE
    # asking for more than the limit grants the limit
    tr2 = ActivityTracker(AgentArgs(idle=600, keepalive_limit=4 * 3600), billed_since=T0)
    granted = tr2.keepalive(T0, 24 * 3600)
    assert granted["capped"] and granted["granted_s"] == 4 * 3600
    assert tr2.evaluate(T0 + 4 * 3600 - 1).stop_reason is None
    assert tr2.evaluate(T0 + 4 * 3600).stop_reason
    # a shorter keepalive does not cut a longer one
    tr2.keepalive(T0 + 10, 60)
    assert tr2.keepalive_until == T0 + 4 * 3600
    with pytest.raises(ValueError):
        tr2.keepalive(T0, -1)


def test_activity_after_a_keepalive_still_counts():
    tr = ActivityTracker(AgentArgs(idle=600), billed_since=T0)
    tr.keepalive(T0, 60)
    tr.observe(T0 + 500, kernel_busy=False, kernel_last_activity=T0 + 500, gpu_utils=[])
    assert tr.evaluate(T0 + 1099).stop_reason is None
    assert tr.evaluate(T0 + 1100).stop_reason


def test_idle_off_never_stops_for_idleness():
    tr = ActivityTracker(AgentArgs(idle=None), billed_since=T0)
    _, verdict = run(tr, 48 * 3600, start=T0, gpu=[0.0], step=600)
    assert verdict.stop_reason is None and verdict.idle["remaining_s"] is None


def test_max_runtime_is_hard():
    tr = ActivityTracker(AgentArgs(idle=None, max_runtime=3600), billed_since=T0)
    tr.keepalive(T0, 10_000)  # a keepalive postpones only the idle stop
    at, verdict = run(tr, 7200, start=T0, busy=True, gpu=[100.0], step=10)
    assert at == T0 + 3600
    assert verdict.stop_reason == StopReason(
        StopKind.MAX_RUNTIME, elapsed_s=3600.0, max_runtime_s=3600
    )
    v = tr.evaluate(T0 + 3600 - 299)
    assert [w.kind for w in v.warnings] == [WarningKind.MAX_RUNTIME] and "max runtime" in texts(v)[
        0
    ]


def test_idle_minutes_and_mean_utilization_in_the_summary():
    tr = ActivityTracker(AgentArgs(idle=None, price_per_hour=3.6), billed_since=T0)
    for i in range(60):  # a busy minute, GPUs at 90% and 10% (mean 50)
        tr.observe(T0 + i, kernel_busy=True, kernel_last_activity=T0, gpu_utils=[90.0, 10.0])
    for i in range(60, 180):  # two idle minutes, GPUs at 0
        tr.observe(T0 + i, kernel_busy=False, kernel_last_activity=T0 + 59, gpu_utils=[0.0, 0.0])
    s = tr.summary(T0 + 180, gpu_count=2, cells=3)
    assert s["duration_s"] == 180 and s["gpu_hours"] == 0.1
    assert s["cost"] == pytest.approx(0.18)
    assert s["mean_gpu_utilization"] == pytest.approx(50 * 60 / 180, abs=0.1)
    assert s["idle_minutes"] == pytest.approx(2.0, abs=0.05)
    assert (
        ActivityTracker(AgentArgs(), T0).summary(T0 + 5, gpu_count=1)["mean_gpu_utilization"]
        is None
    )


class FakeClock:
    def __init__(self, t: float):
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_watchdog_replays_recorded_samples_and_stops_once(tmp_path):
    """Recorded NVML frames: idle, GPU 0 busy at 97%, then back to 2%. With --gpu-only and a
    kernel that stays busy, the session stops timeout seconds after the busy reading."""
    clock = FakeClock(T0)
    stops: list[StopReason] = []
    logs: list[str] = []
    activity = {"busy": True, "last_activity": T0, "cells": 1}
    wd = Watchdog(
        session_id="s1",
        state_dir=str(tmp_path),
        tracker=ActivityTracker(AgentArgs(idle=10, gpu_only=True), billed_since=T0),
        sampler=Sampler(NvmlReader(RecordedNvml.from_file(DATA / "nvml_two_t4.json"))),
        stop=stops.append,
        clock=clock,
        read_activity=lambda d: activity,
        log=logs.append,
    )
    for _ in range(30):  # what Watchdog.run does, without sleeping
        if wd.done.is_set():
            break
        wd.tick()
        clock.t += 1
    # frame 1 (97%) was sampled at T0+1; idle from then; stop at T0+11
    assert stops == [StopReason(StopKind.IDLE, idle_for_s=10.0, idle_timeout_s=10)]
    assert wd.stop_reason == stops[0]
    warned = [parse_marker(line) for line in logs if line.startswith(Marker.WARNING.value)]
    assert warned and warned[0][1]["kind"] == "idle"
    samples = wd.stats()["samples"]
    assert len(samples) == 12 and clock.t == T0 + 12  # no tick after the stop
    assert samples[1]["gpus"][0]["utilization"] == 97.0 and samples[1]["kernel_busy"] is True


def test_the_first_kernel_info_restarts_the_idle_clock_and_later_ones_do_not(tmp_path, monkeypatch):
    """The starting client's first kernel_info is when the session became usable (a slow connect
    is no idleness); a panel or another process attaching later is only looking."""
    import json
    import time

    from gpusession.agent import activity
    from gpusession.core.envnames import ENV_STATE_DIR

    monkeypatch.setenv(ENV_STATE_DIR, str(tmp_path))
    monkeypatch.setitem(activity._state, "last_activity", time.time() - 100)
    asked = []

    class Kernel:
        shell_handlers = {"kernel_info_request": lambda *args: asked.append(args) or "reply"}

    kernel = Kernel()
    activity._hook_kernel_info(kernel)
    assert kernel.shell_handlers["kernel_info_request"]("stream", "ident", "msg") == "reply"
    first = json.loads((tmp_path / "activity.json").read_text())["last_activity"]
    assert time.time() - first < 5
    time.sleep(1.1)
    assert kernel.shell_handlers["kernel_info_request"]("stream", "ident", "msg") == "reply"
    assert json.loads((tmp_path / "activity.json").read_text())["last_activity"] == first
    assert asked == [("stream", "ident", "msg")] * 2
