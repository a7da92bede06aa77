"""gc while other processes start sessions (issue 19 item 4): gc lists what the backends hold, then
reads the store, so a start (which records its session before it asks a backend for anything) is
never taken for a leftover; a labelled resource no record explains is still removed."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from gpusession.core.models import State
from support.hosts import docker_available, product_image

LABEL = "gpusession.session"

# gc in a loop, each round as a fresh process's would be (a new manager: backends loaded anew),
# printing what it removed; it runs until its stdin closes
HAMMER = textwrap.dedent("""
    import select, sys
    from gpusession.session import SessionManager
    rounds = 0
    while not select.select([sys.stdin], [], [], 0)[0]:
        m = SessionManager()
        for a in m.gc():
            print(a.verb, a.target, "|", a.why, flush=True)
        m.close()
        rounds += 1
    print("rounds", rounds, flush=True)
""")


@pytest.mark.docker
@pytest.mark.skipif(
    not docker_available(), reason="no Docker engine answers (run scripts/ci-host-setup.sh)"
)
def test_gc_hammering_never_removes_a_session_being_started(nb_env, manager, engine, monkeypatch):
    monkeypatch.setenv("GPUSESSION_IMAGE", product_image())
    env = dict(nb_env, GPUSESSION_IMAGE=product_image())
    hammer = subprocess.Popen(
        [sys.executable, "-c", HAMMER],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    started, failed = [], []
    try:
        for n in range(5):
            try:
                session = manager.start(
                    manager.make_spec("t4", backend="docker", idle="off", name=f"race-{n}")
                )
            except Exception as exc:  # noqa: BLE001 - counted: the figure is how many starts survived
                failed.append(f"race-{n}: {exc}")
                continue
            started.append(session.name)
            assert (
                engine.containers.get(session.record.resource["container_id"]).status == "running"
            )
            manager.stop(session.id)
    finally:
        out, err = hammer.communicate("", timeout=120)
    removed = [line for line in out.splitlines() if line.startswith("remove ")]
    rounds = int(out.rsplit("rounds", 1)[1]) if "rounds" in out else 0
    print(f"starts ok {len(started)}/5, gc rounds {rounds}, removed {removed}")
    assert not failed and not removed, (failed, removed, err[-2000:])
    assert rounds >= 5, f"gc ran only {rounds} rounds while the sessions started: {err[-2000:]}"
    assert all(r.state == State.STOPPED for r in manager.list()), [
        (r.name, r.state) for r in manager.list()
    ]


@pytest.mark.docker
@pytest.mark.skipif(
    not docker_available(), reason="no Docker engine answers (run scripts/ci-host-setup.sh)"
)
def test_gc_still_removes_a_labelled_container_no_record_explains(nb_env, manager, engine):
    """A container of this store whose session the store has never seen (a crashed process, an
    old store): removed, with the reason; its neighbour of another store is left alone."""
    tag = manager.store.store_id
    env = {"GPUSESSION_SESSION_ID": "2" * 32, "GPUSESSION_AUTHORIZED_KEY": "none"}
    stray = engine.containers.create(
        product_image(), labels={LABEL: "2" * 32, "gpusession.session.store": tag}, environment=env
    )
    try:
        gc = subprocess.run(
            [sys.executable, "-m", "gpusession", "gc"],
            env=nb_env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert (
            f"removed container {stray.name}" in gc.stdout and "(unknown to the store)" in gc.stdout
        ), gc.stdout
        assert engine.containers.list(all=True, filters={"label": f"{LABEL}={'2' * 32}"}) == []
    finally:
        if engine.containers.list(all=True, filters={"id": stray.id}):
            stray.remove(force=True)


@pytest.mark.docker
@pytest.mark.skipif(
    not docker_available(), reason="no Docker engine answers (run scripts/ci-host-setup.sh)"
)
def test_a_session_recorded_while_gc_asks_the_engine_is_not_a_leftover(
    manager, engine, monkeypatch
):
    """The window itself, placed exactly: another process records a session and makes its
    container just as gc asks the engine for containers (its answer holds the new container)."""
    from docker.models.containers import ContainerCollection

    from gpusession.core.models import LaunchSpec
    from gpusession.session.store import Store

    other = Store(manager.store.path)  # the starting process's own handle on the same store
    made = []
    real_list = ContainerCollection.list

    def list_while_a_start_lands(self, *args, **kwargs):
        if not made:
            record = other.create(LaunchSpec(gpu_type="t4", backend="docker"), price_per_hour=0.0)
            other.transition(record.id, State.PROVISIONING)
            labels = {LABEL: record.id, "gpusession.session.store": other.store_id}
            made.append(
                self.client.containers.create(
                    product_image(), labels=labels, environment={"GPUSESSION_SESSION_ID": record.id}
                )
            )
        return real_list(self, *args, **kwargs)

    monkeypatch.setattr(ContainerCollection, "list", list_while_a_start_lands)
    try:
        actions = manager.gc(backends=["docker"])
        assert [a for a in actions if a.verb == "remove"] == [], actions
        assert engine.containers.get(made[0].id).status == "created"
    finally:
        for container in made:
            container.remove(force=True)
