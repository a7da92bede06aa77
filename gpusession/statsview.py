"""Stats in words: `%gpu status`, `%gpu watch`, the stop summary and why a session ended."""

from __future__ import annotations

import time
from typing import Any, Callable

from .durations import format_duration, format_money
from .errors import GpuSessionError

GIB = 1024**3
_SPARK = " ▁▂▃▄▅▆▇█"


# -- words ----------------------------------------------------------------------------------

_STOPPED_BY = {
    "idle": "was stopped by its idle watchdog",
    "max-runtime": "was stopped by its max-runtime limit",
    "max-cost": "was stopped by its cost cap",
}


def is_watchdog_stop(reason: str | None) -> bool:
    """Did the session's own agent stop it (idle, max runtime, cost cap)?"""
    return bool(reason) and reason.partition(": ")[0] in _STOPPED_BY


def describe_stop(name: str, reason: str | None) -> str:
    """'session t4-1 was stopped by its idle watchdog after 5s idle' from the agent's reason
    ('idle: after 5s idle (--idle 5s)')."""
    if not reason:
        return f"session {name} ended (its remote side is gone)"
    kind, _, detail = reason.partition(": ")
    if kind in _STOPPED_BY:
        detail = detail.split(" (--", 1)[0]
        joiner = " " if detail.startswith("after") else ": "
        return f"session {name} {_STOPPED_BY[kind]}{joiner}{detail}"
    return f"session {name} ended: {reason}"


def format_summary(summary: dict) -> str:
    """One line: duration, cost, GPU-hours, mean GPU utilization, minutes idle."""
    mean = summary.get("mean_gpu_utilization")
    parts = [
        f"ran {format_duration(summary.get('duration_s') or 0)}",
        f"cost {format_money(summary.get('cost') or 0.0)}",
        f"{summary.get('gpu_hours') or 0:.3f} GPU-hours",
        "mean GPU utilization " + (f"{mean:.0f}%" if mean is not None else "n/a (no GPU visible)"),
        f"{summary.get('idle_minutes') or 0:.1f} min idle",
    ]
    return ", ".join(parts)


def _gib(n: int | None) -> str:
    return "?" if n is None else f"{n / GIB:.1f}"


def _bytes(n: int | None) -> str:
    if n is None:
        return "?"
    return f"{n / GIB:.1f} GiB" if n >= GIB else f"{n / 1024**2:.0f} MiB"


def _val(v: Any, fmt: str, unit: str = "") -> str:
    return "n/a" if v is None else f"{v:{fmt}}{unit}"


def sparkline(values: list[float | None], width: int = 40) -> str:
    vals = values[-width:]
    return "".join(" " if v is None else _SPARK[min(8, max(0, int(round(v / 100 * 8))))] for v in vals)


def gpu_lines(sample: dict) -> list[str]:
    lines = []
    for g in sample.get("gpus", []):
        lines.append(
            f"  GPU {g['index']} {g.get('name') or '?'}: util {_val(g.get('utilization'), '.0f', '%')}, "
            f"mem {_gib(g.get('memory_used'))}/{_gib(g.get('memory_total'))} GiB, "
            f"{_val(g.get('temperature'), '.0f', 'C')}, "
            f"{_val(g.get('power_draw'), '.0f')}/{_val(g.get('power_limit'), '.0f')} W, "
            f"SM {_val(g.get('sm_clock'), 'd', ' MHz')}"
        )
        for p in g.get("processes", []):
            lines.append(f"      pid {p['pid']} {p.get('name') or '?'}: {_gib(p.get('memory_used'))} GiB")
    return lines


def status_lines(stats: dict, *, history: bool = False) -> list[str]:
    """The live part of `%gpu status` / `%gpu watch`: latest sample, cost, idle countdown."""
    samples = stats.get("samples") or []
    latest = samples[-1] if samples else None
    lines: list[str] = []
    if not stats.get("gpus_visible"):
        lines.append(f"  {stats.get('message') or 'no NVIDIA GPU visible'}")
    if latest is not None:
        lines += gpu_lines(latest)
        cpu = latest.get("cpu_percent")
        lines.append(
            f"  CPU {_val(cpu, '.0f', '%')}, memory {_bytes(latest.get('memory_used'))} of {_bytes(latest.get('memory_total'))}, "
            f"kernel {'busy' if latest.get('kernel_busy') else 'idle'}"
        )
        if history and len(samples) > 1:
            if stats.get("gpus_visible"):
                for i in range(len(latest.get("gpus", []))):
                    utils = [next((g.get("utilization") for g in s["gpus"] if g["index"] == i), None) for s in samples]
                    lines.append(f"  GPU {i} util |{sparkline(utils)}|")
            lines.append(f"  CPU      |{sparkline([min(100.0, s.get('cpu_percent') or 0.0) for s in samples])}|")
    else:
        lines.append("  no sample yet")
    cost, idle, runtime = stats.get("cost") or {}, stats.get("idle") or {}, stats.get("runtime") or {}
    money = f"  cost {format_money(cost.get('so_far') or 0.0)} at {format_money(cost.get('price_per_hour') or 0.0)}/h"
    if cost.get("max_cost"):
        money += f" (cap {format_money(cost['max_cost'])})"
    lines.append(money)
    if idle.get("timeout_s"):
        line = (f"  idle {format_duration(idle.get('idle_for_s'))} of {format_duration(idle['timeout_s'])}"
                f"{' (GPU only)' if idle.get('gpu_only') else ''}: stops in {format_duration(idle.get('remaining_s'))}")
        if idle.get("keepalive_until"):
            line += f", kept alive until {time.strftime('%H:%M:%S', time.localtime(idle['keepalive_until']))}"
        lines.append(line)
    else:
        lines.append("  idle stop: off")
    if runtime.get("max_runtime_s"):
        lines.append(f"  max runtime {format_duration(runtime['max_runtime_s'])}: {format_duration(runtime.get('remaining_s'))} left")
    lines += [f"  WARNING: {w}" for w in stats.get("warnings") or []]
    return lines


def watch(
    fetch: Callable[[], dict],
    header: Callable[[], str],
    *,
    duration: float | None = None,
    interval: float = 1.0,
    display: Callable[..., Any] | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Show one live-updating block (IPython display_id) until `duration` ends or Ctrl-C.
    Returns the number of updates shown."""
    from .stats import AgentUnavailable  # here: stats imports this module

    if display is None:
        from IPython.display import display
    handle = None
    end = None if duration is None else clock() + duration
    shown = 0
    try:
        while True:
            ended = False
            try:
                text = "\n".join([header(), *status_lines(fetch(), history=True)])
            except AgentUnavailable as exc:
                text = f"{header()}\n  stats unavailable: {exc}"
            except GpuSessionError as exc:  # the session is gone: say why, stop watching
                text, ended = f"{header()}\n  {exc}", True
            bundle = {"text/plain": text}
            if handle is None:
                handle = display(bundle, raw=True, display_id=True)
            else:
                handle.update(bundle, raw=True)
            shown += 1
            if ended or end is not None and clock() + interval > end:
                break
            sleep(interval)
    except KeyboardInterrupt:
        pass
    return shown


class WarningNotifier:
    """Polls a session's stats in the background and says, once each, the warnings that come
    up (idle stop soon, cost cap near) and how the session ended, so they reach the notebook
    while nobody runs a cell. Polls every 20 s, faster when the idle warning lead is short."""

    def __init__(self, fetch: Callable[[], dict], say: Callable[[str], None], on_end: Callable[[str], None]):
        import threading

        self._fetch = fetch
        self._say = say
        self._on_end = on_end
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpusession-notifier", daemon=True)

    @classmethod
    def for_session(cls, manager, session_id: str, in_use, say: Callable[[str], None],
                    on_end: Callable[[str], None]) -> "WarningNotifier":
        """Poll `manager.stats`. While `in_use` (a lock the magics hold around cells) is taken,
        only ask the agent: never tear down connections a running cell reads from."""

        def fetch() -> dict:
            if not in_use.acquire(blocking=False):
                return manager.stats(session_id, limit=0, check_alive=False)
            try:
                return manager.stats(session_id, limit=0)
            finally:
                in_use.release()

        return cls(fetch, say, on_end)

    def start(self) -> "WarningNotifier":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()

    def _run(self) -> None:
        from .errors import NoSession

        shown: set[str] = set()
        interval = 1.0  # the first look comes soon: it learns the timeout, which sets the pace
        while not self._stopped.wait(interval):
            try:
                doc = self._fetch()
            except NoSession as exc:
                if not self._stopped.is_set():
                    self._on_end(str(exc))
                return
            except GpuSessionError:
                continue  # tunnel hiccup: the agent decides anyway; try again later
            kinds = {w.split(" ", 1)[0]: w for w in doc.get("warnings") or []}  # idle / spent / max
            for kind, warning in kinds.items():
                if kind not in shown:  # once while it lasts; again if it comes back
                    self._say(f"[gpusession] WARNING: {warning}")
            shown = set(kinds)
            timeout = (doc.get("idle") or {}).get("timeout_s")
            interval = 20.0 if not timeout else max(1.0, min(20.0, min(300.0, timeout * 0.2) / 2))
