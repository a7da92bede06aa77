"""A SessionManager for a test, whose active sessions are stopped at its end."""

from __future__ import annotations


def managed():
    """A SessionManager of the test's store; at the end every session it left active is stopped
    (the `manager` fixture, and others that need one after their own setup)."""
    from gpusession.session import SessionManager

    m = SessionManager()
    yield m
    for r in m.list(active_only=True):
        try:
            m.stop(r.id)
        except Exception:  # noqa: BLE001 - teardown must reach every session
            pass
    m.close()
