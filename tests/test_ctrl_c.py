"""cellwait.CtrlC: a Ctrl-C that Python dropped (its KeyboardInterrupt raised inside a `__del__`)
is still seen by the cell's wait; the handler it sets while a cell is waited for goes back after,
and a wait outside the main thread, or under an application's own handler, changes nothing.
The wait itself with a real kernel: tests/test_faults_link.py."""

from __future__ import annotations

import signal
import sys
import threading

import pytest

from gpusession.transport.kernel.cellwait import CtrlC


class Dropped:
    def __del__(self):
        signal.raise_signal(signal.SIGINT)  # its KeyboardInterrupt ends in this __del__


class Failing:
    def __del__(self):
        raise ValueError("a finalizer's own error")


def test_a_ctrl_c_dropped_in_a_finalizer_is_seen_once_and_not_reported(monkeypatch):
    """Python's "Exception ignored ... KeyboardInterrupt" (our frames, into the cell's output)
    is left out for a Ctrl-C the wait takes; any other unraisable error is reported as before."""
    reported = []
    hook = lambda u: reported.append(u.exc_type)  # noqa: E731 - the hook CtrlC must give back
    monkeypatch.setattr(sys, "unraisablehook", hook)
    with CtrlC() as ctrl_c:
        assert not ctrl_c.missed()
        Dropped()
        assert reported == []  # dropped, counted, not reported
        assert ctrl_c.missed() and not ctrl_c.missed()  # once
        Failing()
        assert reported == [ValueError]
        with pytest.raises(KeyboardInterrupt):  # one that arrives still raises as Python's own
            signal.raise_signal(signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert sys.unraisablehook is hook
    Dropped()  # outside a wait: Python's own report again
    assert reported == [ValueError, KeyboardInterrupt]


def test_an_applications_own_handler_and_another_thread_are_left_alone():
    def own(signum, frame):
        pass

    before = signal.signal(signal.SIGINT, own)
    try:
        with CtrlC():
            assert signal.getsignal(signal.SIGINT) is own
        assert signal.getsignal(signal.SIGINT) is own
    finally:
        signal.signal(signal.SIGINT, before)

    seen = []

    def wait_elsewhere():
        with CtrlC():
            seen.append(signal.getsignal(signal.SIGINT))

    worker = threading.Thread(target=wait_elsewhere)
    worker.start()
    worker.join()
    assert seen == [signal.default_int_handler]
