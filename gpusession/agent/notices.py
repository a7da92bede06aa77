"""Notices that the session's capacity goes away soon, and the agent's answer: save the kernel's
namespace into the workspace at once, within NOTICE_SAVE_S (well inside the shortest notice:
GCP's 30 s; AWS gives 2 minutes), and mark the checkpoint as taken for that notice.

Notices are files in the --notice-dir (gpusession.core.protocol.NOTICE_FILES), so the agent needs no
cloud SDK, no network and no signal of its own (its SIGUSR1 disposition is the kernel's to inherit,
gpusession.agent.kernelspawn):
- an instance's boot script polls instance metadata (spot/instance-action,
  events/recommendations/rebalance) and writes what it said there;
- a Slurm job's batch shell writes one when Slurm sends it `--signal=B:USR1@GRACE`, before the
  job's time limit or a preemption with a grace time (gpusession/backends/slurm/jobs.py);
- a Kubernetes pod's preStop hook writes one when the cluster ends the pod (an eviction, a
  preemption, a drained node) and waits for NAME.done before the container gets its SIGTERM
  (gpusession/backends/kubernetes/pods.py).

After a spot interruption's save the agent stops the session itself (StopKind.SPOT_INTERRUPTION):
whatever ran after the save would be lost with the machine, and the stop leaves the summary, with
the checkpoint, where the local side reads it (the console output). A rebalance recommendation
and a scheduler's signal only save: the session goes on until the capacity goes.

Standard library only; Python 3.9 syntax.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Callable

from ..core.protocol import (
    NOTICE_FILES,
    Marker,
    Notice,
    StopKind,
    StopReason,
    marker_line,
    say_line,
)

DONE = ".done"  # NOTICE_FILE.done: written when the agent has answered that notice


def read_notice(path: str) -> dict:
    """What a notice file says (the cloud's JSON), {} when it is not JSON."""
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {"raw": doc}


class NoticeWatcher:
    """Looks for NOTICE_FILES in `folder` every `interval_s`; answers each notice once with
    `on_notice(kind, notice)`, on its own thread (a save must not hold the next look). A notice
    file written again later (Slurm: a preemption after a requeue's signal) is a new notice."""

    def __init__(
        self,
        folder: str,
        on_notice: Callable[[Notice, dict], None],
        interval_s: float = 0.5,
    ):
        self.folder, self.on_notice, self.interval_s = folder, on_notice, interval_s
        self.seen: dict = {}  # kind -> the mtime of the notice file answered
        self._stop = threading.Event()

    def look(self) -> list:
        """The notices that appeared since the last look (each answered on a thread of its own)."""
        found = []
        for name, kind in NOTICE_FILES.items():
            try:
                mtime = os.stat(os.path.join(self.folder, name)).st_mtime_ns
            except OSError:
                continue
            if self.seen.get(kind) == mtime:
                continue
            self.seen[kind] = mtime
            found.append(kind)
            self.answer(kind, read_notice(os.path.join(self.folder, name)))
        return found

    def answer(self, kind: Notice, notice: dict) -> threading.Thread:
        """`on_notice` on a thread of its own; then NAME.done beside the notice file: what waits
        for the save says so (a Kubernetes pod's preStop hook holds its SIGTERM until then)."""

        def answered() -> None:
            try:
                self.on_notice(kind, notice)
            finally:
                name = next(n for n, k in NOTICE_FILES.items() if k is kind)
                try:
                    with open(os.path.join(self.folder, name + DONE), "w") as f:
                        f.write(str(time.time()))
                except OSError:
                    pass

        thread = threading.Thread(target=answered, name=f"gpusession-notice-{kind.value}")
        thread.daemon = True
        thread.start()
        return thread

    def run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.look()

    def close(self) -> None:
        self._stop.set()


def save_for_notice(
    kind: Notice,
    notice: dict,
    *,
    save: Callable[[Notice], dict],
    stop: Callable[[StopReason], None],
    log: Callable[[str], None] = say_line,
    clock: Callable[[], float] = time.time,
) -> dict:
    """The agent's answer to a notice: save (the caller bounds it), say so in a CHECKPOINT
    marker (the runtime's log, an instance's console), and stop when the notice ends the session."""
    noticed_at = clock()
    try:
        result = save(kind)
    except Exception as exc:  # noqa: BLE001 - said in the marker; a spot stop must still happen
        result = {"committed": False, "error": f"{type(exc).__name__}: {exc}"[:300]}
    result = dict(result, notice=notice, noticed_at=round(noticed_at, 3))
    result["for"] = kind.value
    log(marker_line(Marker.CHECKPOINT, result))
    if kind.ends_session:
        when = notice.get("time")
        detail = f"notice: {notice.get('action', 'terminate')} at {when}" if when else None
        stop(StopReason(StopKind.SPOT_INTERRUPTION, detail=detail))
    return result
