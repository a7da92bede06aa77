"""What a running session's agent says, as data: its stats document (docs/gpu-agent.md) with the
notices the agent cannot know added to its warnings (a spot interruption the link saw, the
month's spend past 80% of the budget, and the stop an administrator's policy asks for once its
monthly cap is spent), the idle stop postponed (keepalive), the latest document kept for views
(`fresh`), and the agent's summary kept in the record when a session stops (`save_summary`).

`SessionManager` makes one `Stats` (`manager.stats`) and hands it the narrow things it uses;
the faces put what it returns into words (gpusession/words/).
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Callable

from ..configuration.settings import load_policy
from ..core.durations import KEEPALIVE
from ..core.errors import SessionEnded
from ..core.models import SessionRecord, State
from ..core.protocol import Warning, WarningKind
from .agentclient import AgentUnavailable
from .store import Store

if TYPE_CHECKING:
    from ..backends import Backend
    from .handle import Session

FRESH_S = 15.0  # how long a fetched stats document may fill in a view's idle countdown

Stop = Callable[..., SessionRecord]  # stop a session: (key, by=..., save=...) (SessionManager.stop)


class Stats:
    """The agent's stats documents and keepalive for running sessions, and the latest document
    of each kept for views. One per SessionManager (`.stats`).

    store: the records (a spot notice recorded by the link; keepalive noted);
    running: a running session's handle by key, attaching when this process is not connected
      (raises SessionEnded when it has stopped);
    connected: the handle of a session this process is connected to, else None (no attaching);
    refresh_state: a record, checked against its backend (SessionManager.refresh_state);
    budget: this month's spend against the budget, or None (`Spend.budget`: from the one
      reading of the store every face shares, at most spend.READING_S old);
    stop: stops a session (SessionManager.stop), for a policy that stops at its monthly cap;
    saw: tells liveness a session answered (`Liveness.saw`)."""

    def __init__(
        self,
        store: Store,
        *,
        running: Callable[[str], "Session"],
        connected: Callable[[str], "Session | None"],
        refresh_state: Callable[[str], SessionRecord],
        budget: Callable[[], "dict | None"],
        stop: Stop,
        saw: Callable[[str], None],
    ):
        self.store = store
        self._running, self._connected = running, connected
        self._refresh_state, self._budget = refresh_state, budget
        self._stop, self._saw = stop, saw
        self._lock = threading.Lock()
        self._cache: dict[str, tuple[float, dict]] = {}  # id -> (fetched at, stats)

    def fetch(
        self,
        key: str,
        since: float | None = None,
        limit: int | None = None,
        *,
        check_alive: bool = True,
    ) -> dict:
        """The agent's stats document for a running session (docs/gpu-agent.md). Raises
        SessionEnded when the session turns out to have stopped. check_alive=False only asks the
        agent of a session this process is connected to, and never tears down connections (for a
        background poll while a cell runs)."""
        if not check_alive:
            session = self._connected(key)
            if session is None:
                raise AgentUnavailable("not connected to this session")
            return self._with_notices(session.id, session.agent.stats(since, limit))
        session = self._running(key)
        try:
            doc = session.agent.stats(since, limit)
        except AgentUnavailable:
            record = self._refresh_state(session.id)
            if record.state != State.RUNNING:
                raise SessionEnded(record) from None
            raise
        doc = self._with_notices(session.id, doc)
        if any(
            w.get("kind") == WarningKind.BUDGET.value and w.get("action") == "stop"
            for w in doc.get("warnings") or [] if isinstance(w, dict)
        ):  # fmt: skip
            self._stop_at_cap(session.id)
        with self._lock:
            self._cache[session.id] = (time.time(), doc)
        self._saw(session.id)
        return doc

    def keepalive(self, key: str, duration: str | float) -> dict:
        """Postpone the session's idle stop by `duration` (the duration grammar); the agent caps
        it (default 4 h ahead). Returns what the agent granted, plus `asked_s` and `name`."""
        seconds = KEEPALIVE.parse(duration)
        session = self._running(key)
        granted = session.agent.keepalive(seconds)
        self.store.note(session.id, f"keepalive {granted['granted_s']:.0f}s")
        return dict(granted, asked_s=seconds, name=session.name)

    def fresh(self, record: SessionRecord) -> dict | None:
        """Recently fetched stats of a running session (for views), with the idle countdown
        moved on to now; None when there are none fresh enough."""
        with self._lock:
            at, doc = self._cache.get(record.id, (0.0, None))
        if doc is None or time.time() - at > FRESH_S or record.state != State.RUNNING:
            return None
        idle = dict(doc.get("idle") or {})
        if idle.get("remaining_s") is not None:  # it has been counting down since
            idle["remaining_s"] = round(max(0.0, idle["remaining_s"] - (time.time() - at)), 1)
        # the month's spend as every face shows it now, not as it was when these stats came
        kept = [
            w for w in doc.get("warnings") or []
            if not (isinstance(w, dict) and w.get("kind") == WarningKind.BUDGET.value)
        ]  # fmt: skip
        budget = self._budget_warning()
        return dict(doc, idle=idle, warnings=kept + ([budget] if budget else []))

    def _with_notices(self, session_id: str, doc: dict) -> dict:
        """Add what the agent cannot know to the warnings the notebook and the panels show: a
        spot interruption notice (seen by the link and recorded in the store), and the month's
        spend past 80% of the monthly budget while the session runs (docs/cost.md)."""
        warnings = list(doc.get("warnings") or [])
        interrupted = self.store.get(session_id).resource.get("interrupted")
        if interrupted:
            notice = interrupted.get("notice") or {}
            warnings.append(
                Warning(
                    WarningKind.SPOT_INTERRUPTION,
                    action=notice.get("action"),
                    time=notice.get("time"),
                ).to_dict()
            )
        budget = self._budget_warning()
        if budget is not None:
            warnings.append(budget)
        return dict(doc, warnings=warnings) if warnings else doc

    def _budget_warning(self) -> dict | None:
        """The month's spend past 80% of the budget, as a warning (data), from the shared
        reading (`budget()`: every stats poll of every session asks, and summing the month's
        spend reads the whole store); None below 80% or without a budget."""
        budget = self._budget()
        if budget is None or budget["state"] == "ok":
            return None
        stop = budget["state"] == "over" and _stops_at_cap(budget)
        return Warning(
            WarningKind.BUDGET,
            spent=budget["spent"],
            budget=budget["budget"],
            source=budget["source"],
            action="stop" if stop else None,
        ).to_dict()

    def _stop_at_cap(self, session_id: str) -> None:
        """The policy's monthly cap is spent and it says stop (`stop_at_monthly_cap`): stop the
        session, its variables saved into its workspace first when it has one; SessionEnded
        tells the caller (the notebook's poll says so in one line)."""
        record = self.store.get(session_id)
        by = f"your policy's monthly cap ({load_policy().path})"  # type: ignore[union-attr]
        record = self._stop(session_id, by=by, save=bool(record.resource.get("workspace")))
        raise SessionEnded(record)


def _stops_at_cap(budget: dict) -> bool:
    """Whether an administrator's policy stops running sessions once its monthly cap is spent
    (`stop_at_monthly_cap`; else a running session is only warned)."""
    policy = load_policy() if budget.get("policy") else None
    return bool(policy is not None and policy.stop_at_monthly_cap)


def save_summary(
    store: Store,
    record: SessionRecord,
    session: "Session | None" = None,
    backend: "Backend | None" = None,
) -> None:
    """Keep the agent's summary in the record (SessionManager.stop): asked of the agent while it
    still runs (`session`), or what it left behind (the `backend`'s `stop_details`)."""
    summary = None
    if session is not None:
        try:
            summary = session.agent.summary()
        except AgentUnavailable:
            summary = None
    if summary is None and backend is not None:
        details = backend.stop_details(record)
        summary = details.summary if details is not None else None
    if summary:
        store.update_resource(record.id, agent_summary=summary)
