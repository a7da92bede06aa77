"""gc keeps working when one record or host is bad, and owner liveness is exact (issue: one bad
input never breaks gc; a zombie or a reused pid is no live owner)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpusession.core.models import LaunchSpec, State
from gpusession.session.gc import owner_is_dead
from gpusession.session.store import Store, owner_id
from support.procs import alive, wait_dead


def cli(env, *args, timeout=120):
    return subprocess.run(
        [sys.executable, "-m", "gpusession", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.integration
def test_gc_survives_a_record_whose_host_cannot_even_be_encoded(nb_env):
    """A record left by an old version with a 64-letter host label (IDNA refuses it) must not
    stop gc from removing a real leftover in the same run."""
    store = Store(Path(nb_env["GPUSESSION_HOME"]) / "sessions.sqlite3")
    bad = store.create(
        LaunchSpec(gpu_type="t4", backend="docker", extra={"host": "ssh://" + "a" * 64}),
        price_per_hour=0.5,
    )
    for state in (State.PROVISIONING, State.STARTING, State.RUNNING):
        store.transition(bad.id, state)
    # a real leftover: a session recorded as stopped whose process still runs
    r = cli(
        nb_env, "start", "--type", "t4", "--backend", "local", "--idle", "off", "--name", "left"
    )
    assert r.returncode == 0, r.stderr
    left = store.get("left")
    pid = left.resource["pid"]
    store.transition(left.id, State.STOPPED, "recorded stopped, process kept running")
    assert alive(pid)
    for _ in range(2):  # and again: the bad record is still there the second time
        gc = cli(nb_env, "gc")
        assert gc.returncode == 0, gc.stderr
        assert "Traceback" not in gc.stdout + gc.stderr
    assert wait_dead(pid), "gc did not remove the leftover process"
    # reported (its engine is skipped, saying why), and the rest goes on
    assert "skipping Docker engine ssh://aaaa" in gc.stderr and "no valid DNS name" in gc.stderr, (
        gc.stderr
    )


@pytest.mark.integration
def test_owner_liveness_tells_zombies_and_reused_pids_from_live_owners():
    me = owner_id()
    assert me.count(":") == 2, me  # user@host:pid:start
    assert not owner_is_dead(me)
    host = socket.gethostname()
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    time.sleep(0.5)  # exited, not reaped: a zombie
    assert owner_is_dead(f"u@{host}:{child.pid}"), "a zombie owner counts as alive"
    child.wait()
    assert owner_is_dead(f"u@{host}:{child.pid}")
    pid = me.split(":")[1]
    assert owner_is_dead(f"u@{host}:{pid}:1"), "a pid with another start time is another process"
    assert not owner_is_dead(f"u@{host}:{pid}"), "old owner ids (no start time) still work"
    assert not owner_is_dead(f"u@elsewhere:{child.pid}"), (
        "another host's owner is never judged from here"
    )


def test_gc_asks_only_the_engines_that_may_still_hold_a_container(manager, monkeypatch):
    """Failed and stopped records pile up; gc must not re-probe their hosts forever (issue 10
    item 9): only active records, and ended ones whose container's removal was never confirmed."""
    from gpusession.backends.docker import DockerBackend

    store = manager.store

    def record(host: str, state: State, **resource):
        r = store.create(
            LaunchSpec(gpu_type="t4", backend="docker", extra={"host": host}), price_per_hour=0.5
        )
        if resource:
            store.update_resource(r.id, **resource)
        return store.transition(r.id, state)

    record("ssh://never-reached", State.FAILED)  # its start failed before it reached the engine
    record(
        "ssh://removed", State.STOPPED, engine="ssh://removed", container_id="c1", removed_at=1.0
    )
    unsure = record(
        "ssh://unsure", State.FAILED, engine="ssh://unsure", container_id="c2"
    )  # cleanup failed
    asked: list[str] = []

    class Containers:
        def list(self, **filters):
            return []

    class Client:
        containers = Containers()

    def client(self, host):
        asked.append(host or "")
        return Client()

    monkeypatch.setattr(DockerBackend, "client", client)
    assert manager.gc(backends=["docker"]) == []
    assert sorted(set(asked)) == [
        "",
        "ssh://unsure",
    ]  # the local engine twice: containers, runtime volumes
    assert store.get(unsure.id).resource.get("removed_at"), (
        "an engine that answered without it confirms removal"
    )
    asked.clear()
    manager.gc(backends=["docker"])
    assert set(asked) == {""}


def test_a_start_that_never_reached_its_engine_is_cleaned_up_without_asking_it(
    manager, monkeypatch
):
    from gpusession.backends.docker import DockerBackend

    def client(self, host):
        raise AssertionError(f"asked the engine {host}")

    monkeypatch.setattr(DockerBackend, "client", client)
    rec = manager.store.create(
        LaunchSpec(gpu_type="t4", backend="docker", extra={"host": "ssh://gone.example"}),
        price_per_hour=1,
    )
    manager.backend("docker").stop(rec)
    assert manager.get(rec.id).resource.get("removed_at")
