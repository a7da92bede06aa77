"""Waiting on an event with a deadline, never on a sleep that guesses how fast the machine is."""

from __future__ import annotations

import time


def wait_until(predicate, timeout: float, what: str, interval: float = 0.3):
    """predicate()'s first truthy value, asked every `interval` s; AssertionError naming `what`
    when `timeout` s pass without one."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:.0f}s")
        time.sleep(interval)
