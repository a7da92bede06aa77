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


class CellNotices:
    """Where the lines a background thread has to say go (a warning, a session's end, a switch
    followed): into the cell that is running, or, while none runs, held and said at the start of
    the next cell. Never under an old cell's output, which is where a thread's print lands in
    ipykernel (the last cell's parent header) while no cell runs. Knows what it said in the
    running cell, so a cell that has to say it too (a session's end) does not say it twice."""

    def __init__(self, shell: Any, write: Callable[[str], None], *, running: bool = True):
        self._write = write
        self._lock = threading.Lock()
        self._running = running  # made by `%load_ext`, itself a cell
        self._held: list[str] = []
        self._said: list[str] = []  # in the running cell
        self._events = getattr(shell, "events", None)
        if self._events is not None:
            self._events.register("pre_run_cell", self._cell_starts)
            self._events.register("post_run_cell", self._cell_ends)

    def say(self, line: str) -> None:
        with self._lock:
            if not self._running:
                self._held.append(line)
                return
            self._said.append(line)
            self._write(line)

    def said_in_this_cell(self, line: str) -> bool:
        with self._lock:
            return self._running and line in self._said

    def close(self) -> None:
        """Stop following cells (`%unload_ext`); what is held is said now."""
        if self._events is not None:
            for event, hook in (
                ("pre_run_cell", self._cell_starts),
                ("post_run_cell", self._cell_ends),
            ):
                try:
                    self._events.unregister(event, hook)
                except ValueError:  # not registered any more
                    pass
        with self._lock:
            held, self._held, self._running = self._held, [], True
        for line in held:
            self._write(line)

    def _cell_starts(self, *_: Any) -> None:
        with self._lock:
            held, self._held, self._said, self._running = self._held, [], [], True
            for line in held:  # on the cell's own thread: its output, first
                self._said.append(line)
                self._write(line)

    def _cell_ends(self, *_: Any) -> None:
        with self._lock:
            self._running, self._said = False, []


class WarningNotifier:
    """Polls a session's stats in the background and says, once each, the warnings that come
    up (idle stop soon, cost cap near) and how the session ended, so they reach the notebook
    while nobody runs a cell. Polls every 20 s, faster when the idle warning lead is short."""

    def __init__(
        self,
        fetch: Callable[[bool], dict],
        say: Callable[[str], None],
        on_end: Callable[[str], None],
        backend: str | None = None,
        in_use: Any = None,
    ):
        self._fetch = fetch  # fetch(checked): checked may find the end (and let go of the session)
        self._backend = backend  # the session's: its own words for a notice of its capacity
        self._say = say
        self._on_end = on_end
        # held while a magic or a cell uses the session (the magics' lock): a look that can find
        # the end takes it for the whole look, the end said and forgotten included, so a cell
        # never picks up a session whose connections the look has just let go of
        self._in_use = in_use if in_use is not None else threading.RLock()
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

        def fetch(checked: bool) -> dict:
            return manager.stats.fetch(session_id, limit=0, check_alive=checked)

        return cls(fetch, say, on_end, backend=manager.get(session_id).backend, in_use=in_use)

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
                doc = self._look()
            except GpuSessionError:
                continue  # tunnel hiccup: the agent decides anyway; try again later
            if doc is None:  # it ended (said) or this notifier was stopped meanwhile
                return
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

    def _look(self) -> dict | None:
        """One look at the session: the stats document, or None once it ended (said here) or
        this notifier was stopped. While a cell holds `in_use`, only its agent is asked."""
        if not self._in_use.acquire(blocking=False):
            return self._fetch(False)
        try:
            if self._stopped.is_set():  # the cell that held the lock said the end itself
                return None
            return self._fetch(True)
        except SessionEnded as exc:
            self._stopped.set()
            self._on_end(error_text(exc))
            return None
        finally:
            self._in_use.release()
