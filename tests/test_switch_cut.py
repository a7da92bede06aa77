"""A switch whose driving process dies at each of its steps leaves one truth (issue 30): the next
face that reads the sessions (`gpusession list`, here) settles what the dead process left, and
says in one line what happened and what to do. Per backend, the driver (`gpusession switch`, a
process of its own) is killed before the save, during the save, during the move, during the new
session's start and before the old one stops; the figures - records left in a transient state,
sessions billing without a word, variables lost - are all 0 (tests/support/switchcut.py).

Real parts: local kernels, this machine's Docker engine and the ssh:// namespace engine, the
Slurm cluster, moto's EC2 API with the namespace host playing its instances."""

from __future__ import annotations

import os

import pytest

from gpusession.core.models import State
from support.hosts import product_image
from support.images import image_ready
from support.switchcut import assert_figures, cut_every_step

pytestmark = pytest.mark.integration


def test_local_switch_cut_at_every_step(manager, monkeypatch):
    monkeypatch.setenv("GPUSESSION_BACKEND", "local")
    cases = cut_every_step(
        manager,
        lambda: manager.start(manager.make_spec("t4", backend="local", idle="off", name="cutl")),
        ["--type", "a100"],
        None,
        "local",
    )
    assert_figures(cases)
    assert [c.step for c in cases] == ["before-save", "save", "start", "stop-old"]


@pytest.mark.docker
def test_docker_switch_cut_at_every_step_on_this_engine_and_to_an_ssh_engine(
    manager, engine, remote
):
    if not image_ready(product_image()):
        pytest.skip(f"no Docker engine with {product_image()}")
    cases = cut_every_step(
        manager,
        lambda: manager.start(
            manager.make_spec(
                "t4", backend="docker", image=product_image(), idle="off", name="cutd"
            )
        ),
        ["--type", "a100"],
        ["--host", remote["url"]],
        "docker",
    )
    assert_figures(cases)


@pytest.mark.docker
def test_docker_switch_cut_at_every_step_on_an_ssh_engine_and_back_to_this_one(
    manager, engine, remote
):
    if not image_ready(product_image()):
        pytest.skip(f"no Docker engine with {product_image()}")
    cases = cut_every_step(
        manager,
        lambda: manager.start(
            manager.make_spec(
                "t4",
                backend="docker",
                image=product_image(),
                idle="off",
                name="cutr",
                host=remote["url"],
            )
        ),
        ["--type", "a100"],
        ["--host", ""],
        "docker",
    )
    assert_figures(cases)


def test_keep_old_stops_the_new_session_of_a_cut_switch_and_gc_settles_too(manager, monkeypatch):
    """An administrator's choice (GpuSessionConfig.cut_switch = keep-old, here its env var):
    a switch cut while its new session started ends with the new one stopped and the old one
    running with the variables, said in one line; gc settles a cut switch as list does."""
    from gpusession.session.store import Store
    from support.switchcut import VARIABLE, cli, kill_at

    monkeypatch.setenv("GPUSESSION_CUT_SWITCH", "keep-old")
    env = dict(os.environ)
    store = Store(manager.config.data_path / "sessions.sqlite3")
    old = manager.start(manager.make_spec("t4", backend="local", idle="off", name="keep"))
    assert old.run(VARIABLE)["status"] == "ok"
    new, finished = kill_at(env, store, old.id, ["--type", "a100"], "start")
    assert not finished
    listed = cli(env, "list")
    assert listed.returncode == 0, listed.stderr
    assert (
        f"switch keep -> {new.name} was cut while {new.name} started (the process running it "
        f"died): {new.name} was stopped (GpuSessionConfig.cut_switch = keep-old); keep runs on "
        "with your variables"
    ) in listed.stdout, listed.stdout
    assert store.get(new.id).state == State.STOPPED and store.get(old.id).state == State.RUNNING
    assert store.get(old.id).resource.get("switched_to") is None  # notebooks stay on the old one

    # gc is a face that settles too: the next cut, found by gc alone
    monkeypatch.setenv("GPUSESSION_CUT_SWITCH", "ask")
    env = dict(os.environ)
    new, finished = kill_at(env, store, old.id, ["--type", "a100"], "before-save")
    assert not finished
    dry = cli(env, "gc", "--dry-run")
    assert (
        f"would stop {new.name} unless it answers (left requested by a dead process)" in dry.stdout
    )
    assert store.get(new.id).state == State.REQUESTED  # a dry run changes nothing
    done = cli(env, "gc")
    assert f"settled {new.name} (left requested by a dead process)" not in done.stdout
    assert f"stopped {new.name} (left requested by a dead process)" in done.stdout, done.stdout
    assert store.get(new.id).state == State.FAILED
