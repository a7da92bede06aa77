"""One sample a second: every GPU (through NvmlReader), the session's CPU and memory, and
whether the kernel runs a cell; the last hour of them kept in memory.

CPU and memory are those of the session's process tree (the runtime, the kernel and whatever the
user's code started), from /proc; the memory total is the container's cgroup limit when it has
one, else the machine's memory. The same code serves a container and the local backend.
"""

from __future__ import annotations

import collections
import os
import threading
import time
from typing import Any, Callable

from ..configuration.agentargs import DEFAULT_HISTORY_S
from .nvml import NvmlReader

_CLK_TCK = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _meminfo_total() -> int | None:
    text = _read("/proc/meminfo") or ""
    for line in text.splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    return None


def memory_limit(root: str = "/sys/fs/cgroup") -> int | None:
    """The memory this container may use: its cgroup limit when one is set (v2, then v1),
    else the machine's memory."""
    total = _meminfo_total()
    for path in (
        os.path.join(root, "memory.max"),
        os.path.join(root, "memory", "memory.limit_in_bytes"),
    ):
        text = (_read(path) or "").strip()
        if text.isdigit() and (total is None or int(text) < total):
            return int(text)  # "max" or v1's huge number mean no limit
    return total


class ProcessTreeUsage:
    """CPU time and resident memory of a process and all its descendants (from /proc)."""

    def __init__(self, pid: int):
        self.pid = pid
        self.total = memory_limit()  # read once: a container's limit does not change

    def _tree(self) -> list[int]:
        pids, todo = [], [self.pid]
        while todo:
            pid = todo.pop()
            pids.append(pid)
            try:
                tids = os.listdir(f"/proc/{pid}/task")
            except OSError:
                continue  # exited meanwhile
            for tid in tids:  # a child belongs to the thread that started it
                todo.extend(
                    int(c) for c in (_read(f"/proc/{pid}/task/{tid}/children") or "").split()
                )
        return pids

    def read(self) -> tuple[float, int, int | None]:
        """(CPU seconds, resident bytes, memory total) of the whole tree."""
        cpu, rss = 0.0, 0
        for pid in self._tree():
            text = _read(f"/proc/{pid}/stat")
            if not text:
                continue  # exited between the two reads
            fields = text.rsplit(")", 1)[1].split()
            # utime + stime, plus cutime + cstime: a reaped child's time moves into its parent
            cpu += sum(int(x) for x in fields[11:15]) / _CLK_TCK
            rss += int(fields[21]) * _PAGE
        return cpu, rss, self.total


class Sampler:
    """Builds samples and keeps DEFAULT_HISTORY_S of them. `sample()` is called by the watchdog."""

    def __init__(
        self,
        nvml: NvmlReader | None = None,
        usage: ProcessTreeUsage | None = None,
        *,
        history_s: int = DEFAULT_HISTORY_S,
        interval_s: float = 1.0,
        cpu_clock: Callable[[], float] = time.monotonic,
    ):
        self.nvml = nvml or NvmlReader()
        self.usage = usage or ProcessTreeUsage(os.getpid())
        self.history: collections.deque[dict] = collections.deque(
            maxlen=max(1, int(history_s / max(interval_s, 1e-3)))
        )
        self.gpus_visible = False
        self.message: str | None = None
        self.sampled = threading.Event()  # set by the first sample
        self._cpu_clock = cpu_clock
        self._last_cpu: tuple[float, float] | None = None
        self._lock = threading.Lock()

    def _cpu_percent(self, used: float) -> float | None:
        """Percent of one core since the previous sample (over 100 with several cores busy)."""
        at = self._cpu_clock()
        previous, self._last_cpu = self._last_cpu, (at, used)
        if previous is None or at <= previous[0]:
            return None
        return round(100.0 * max(0.0, used - previous[1]) / (at - previous[0]), 1)

    def sample(self, now: float, *, kernel_busy: bool) -> dict[str, Any]:
        visible, message, gpus = self.nvml.read()
        cpu_s, mem_used, mem_total = self.usage.read()
        sample = {
            "t": round(now, 3),
            "gpus_visible": visible,
            "gpus": gpus,
            "cpu_percent": self._cpu_percent(cpu_s),
            "memory_used": mem_used,
            "memory_total": mem_total,
            "kernel_busy": bool(kernel_busy),
        }
        with self._lock:
            self.gpus_visible, self.message = visible, message
            self.history.append(sample)
        self.sampled.set()
        return sample

    def samples(self, since: float | None = None, limit: int | None = None) -> list[dict]:
        """Samples newer than `since` (unix s), the newest `limit` of them, oldest first."""
        with self._lock:
            items = list(self.history)
        if since is not None:
            # history is in time order: skip from the left
            start = len(items)
            while start > 0 and items[start - 1]["t"] > since:
                start -= 1
            items = items[start:]
        if limit is not None:
            items = items[-limit:] if limit > 0 else []
        return items
