"""Where the notebook's background lines go (issue 32 §4, §5): the notifier's warnings, a
session's end, a switch followed are said in the cell that runs, or held for the next cell's
start; never under an older cell's output (where ipykernel puts a thread's print while no cell
runs). IPython's own event manager fires the cells' events, as a kernel's shell does."""

from __future__ import annotations

import threading
from types import SimpleNamespace

from IPython.core.events import EventManager, available_events

from gpusession.faces.notify import CellNotices


def _shell() -> SimpleNamespace:
    return SimpleNamespace(events=EventManager(SimpleNamespace(), available_events))


def test_a_line_said_while_no_cell_runs_waits_for_the_next_cell():
    shell, written = _shell(), []
    notices = CellNotices(shell, written.append)
    shell.events.trigger("post_run_cell", None)  # the `%load_ext` cell ends
    notices.say("[gpusession] session t4-1 was stopped by its idle watchdog")
    assert written == []  # not under the old cell
    shell.events.trigger("pre_run_cell", None)
    assert written == ["[gpusession] session t4-1 was stopped by its idle watchdog"]
    assert notices.said_in_this_cell(written[0])  # the cell need not say it again
    shell.events.trigger("post_run_cell", None)
    assert not notices.said_in_this_cell(written[0])


def test_a_line_said_while_a_cell_runs_goes_to_it_at_once_from_any_thread():
    shell, written = _shell(), []
    notices = CellNotices(shell, written.append)
    shell.events.trigger("pre_run_cell", None)
    thread = threading.Thread(target=notices.say, args=("[gpusession] WARNING: idle stop in 30s",))
    thread.start()
    thread.join()
    assert written == ["[gpusession] WARNING: idle stop in 30s"]


def test_unloading_says_what_is_held_and_follows_cells_no_more():
    shell, written = _shell(), []
    notices = CellNotices(shell, written.append)
    shell.events.trigger("post_run_cell", None)
    notices.say("held")
    notices.close()
    assert written == ["held"]
    shell.events.trigger("pre_run_cell", None)
    assert written == ["held"]
