"""Live output in the notebook: `%gpu watch` (one block updated in place) and the background
notifier that prints warnings and a session's end while no cell runs. Words from `words`."""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from ..core.errors import GpuSessionError, SessionEnded
from ..core.protocol import Warning, WarningKind
from ..session.agentclient import AgentUnavailable
from ..words.status import status_lines
from ..words.stops import budget_level, describe_warning, error_text


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
                text, ended = f"{header()}\n  {error_text(exc)}", True
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

    def __init__(
        self,
        fetch: Callable[[], dict],
        say: Callable[[str], None],
        on_end: Callable[[str], None],
        backend: str | None = None,
    ):
        self._fetch = fetch
        self._backend = backend  # the session's: its own words for a notice of its capacity
        self._say = say
        self._on_end = on_end
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpusession-notifier", daemon=True)

    @classmethod
    def for_session(
        cls,
        manager,
        session_id: str,
        in_use,
        say: Callable[[str], None],
        on_end: Callable[[str], None],
    ) -> "WarningNotifier":
        """Poll `manager.stats.fetch`. While `in_use` (a lock the magics hold around cells) is
        taken, only ask the agent: never tear down connections a running cell reads from."""

        def fetch() -> dict:
            if not in_use.acquire(blocking=False):
                return manager.stats.fetch(session_id, limit=0, check_alive=False)
            try:
                return manager.stats.fetch(session_id, limit=0)
            finally:
                in_use.release()

        return cls(fetch, say, on_end, backend=manager.get(session_id).backend)

    def start(self) -> "WarningNotifier":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()

    def _run(self) -> None:
        shown: set = set()
        interval = 1.0  # the first look comes soon: it learns the timeout, which sets the pace
        while not self._stopped.wait(interval):
            try:
                doc = self._fetch()
            except SessionEnded as exc:
                if not self._stopped.is_set():
                    self._on_end(error_text(exc))
                return
            except GpuSessionError:
                continue  # tunnel hiccup: the agent decides anyway; try again later
            current = {}
            for item in doc.get("warnings") or []:
                w = Warning.from_dict(item)
                if w is not None:  # a budget's 80% and 100% are each said once
                    current[(w.kind, budget_level(w) if w.kind is WarningKind.BUDGET else "")] = w
            for kind, warning in current.items():
                if kind not in shown:  # once while it lasts; again if it comes back
                    text = describe_warning(warning, backend=self._backend)
                    self._say(f"[gpusession] WARNING: {text}")
            shown = set(current)
            timeout = (doc.get("idle") or {}).get("timeout_s")
            interval = 20.0 if not timeout else max(1.0, min(20.0, min(300.0, timeout * 0.2) / 2))
