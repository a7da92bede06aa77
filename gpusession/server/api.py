"""What the REST handlers share (`BaseHandler.api`): the server's one SessionManager and the
sessions it starts in the background. Apart from the handlers, so that `base` needs no handler."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..configuration import options
from ..session import SessionManager
from .sidebar_state import StartProgress, panel_view

#: how many of the handlers' blocking calls run at once
THREADS = 64


class Api:
    """What the handlers share: one SessionManager for the server process, and the threads
    that start sessions in the background."""

    def __init__(self, manager: SessionManager | None = None, unavailable: str | None = None):
        # unavailable: why no manager could be made (its store cannot be opened); every call answers it
        self.unavailable = unavailable
        self.manager = manager or (SessionManager() if unavailable is None else None)
        self.starting: dict[str, threading.Thread] = {}
        self.progress = StartProgress()  # the starts' latest lines, shown on their cards
        # the handlers' blocking calls: their own threads, more than the default pool's (six on
        # a two-core machine), so that stops, switches and slow cloud answers in progress do not
        # queue the sidebar's quick reads (the list, stats) behind them
        self.threads = ThreadPoolExecutor(max_workers=THREADS, thread_name_prefix="gpusession-rest")

    def view(self, record, kernels: dict[int | str, str] | None = None) -> dict:
        """A session as the sidebar shows it: the REST view, its start progress and kernel."""
        return panel_view(self.manager, record, self.progress, kernels)

    def start_in_background(self, body: dict[str, Any]) -> dict:
        """Record the session from a POST body (`options.body_problems` passed), start it in a thread."""
        m = self.manager
        spec = m.spec_from(body, options.REST)
        record = m.create(spec)
        report = self.progress.reporter(record.id)

        def run() -> None:
            try:
                m.launch(record, report=report)
            except BaseException:  # noqa: BLE001 - launch recorded the failure and cleaned up
                pass
            finally:
                self.starting.pop(record.id, None)

        thread = threading.Thread(target=run, name=f"gpusession-start-{record.name}", daemon=True)
        self.starting[record.id] = thread
        thread.start()
        return self.view(record)
