"""A host that failed a workspace listing once is remembered and said once, with how to ask it
again (issue 32 §5): every `gpusession workspaces` retried it, each time with "skipping Docker
engine ssh://...". Here the host is an sshd address that refuses at once (port 1 of this
machine), recorded as a docker session's host, as a host that went away is."""

from __future__ import annotations

import time

import pytest
from test_cli import cli

from gpusession.core.models import LaunchSpec, State
from gpusession.session.store import Store

pytestmark = pytest.mark.integration  # runs the CLI (tests/conftest.py: the fast tier runs none)

GONE = "ssh://root@127.0.0.1:1"


def test_a_host_that_failed_is_said_once_and_asked_again_on_request(nb_env, gs_home):
    store = Store(gs_home / "sessions.sqlite3")
    record = store.create(
        LaunchSpec(gpu_type="t4", backend="docker", name="far", extra={"host": GONE}),
        price_per_hour=0.5,
    )
    store.transition(record.id, State.FAILED, "failed", error="connect: refused")

    first = cli(nb_env, "workspaces")
    said = first.stdout + first.stderr
    assert [line for line in said.splitlines() if GONE in line] == [said.splitlines()[1]], said
    assert f"skipped docker host {GONE}: " in first.stdout, said
    assert "`gpusession workspaces --retry-hosts`" in first.stdout, said
    assert store.failed_hosts("docker").keys() == {("docker", GONE)}

    t0 = time.monotonic()
    second = cli(nb_env, "workspaces")
    assert GONE not in second.stdout + second.stderr, second.stdout + second.stderr  # not again
    assert second.returncode == first.returncode
    assert time.monotonic() - t0 < 30

    again = cli(nb_env, "workspaces", "--retry-hosts")  # asked again, and said again
    assert f"skipped docker host {GONE}: " in again.stdout, again.stdout + again.stderr
    assert store.failed_hosts("docker").keys() == {("docker", GONE)}
    assert store.forget_hosts("docker", GONE) == 1 and not store.failed_hosts()
