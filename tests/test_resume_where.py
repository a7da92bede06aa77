"""`--resume NAME` starts where the workspace lives (issue 32 §1): the backend, place and image
of the newest session that ran on it, unless the start names its own. Records in a real store,
the option table reading them as every face does; the start itself is in test_workspaces.py."""

from __future__ import annotations

import pytest

from gpusession.core.models import State
from gpusession.session import SessionManager
from gpusession.words.spend import start_notes


@pytest.fixture
def manager(gs_home, monkeypatch):
    monkeypatch.setenv("GPUSESSION_BACKEND", "docker")  # the default a resume must not follow
    m = SessionManager()
    yield m
    m.close()


def _ran(manager, state=State.RUNNING, **values):
    spec = manager.spec_from(values)
    record = manager.store.create(spec, price_per_hour=0.0)
    manager.store.transition(record.id, State.STARTING)
    manager.store.transition(record.id, state)
    workspace = spec.extra.get("resume") or spec.extra.get("workspace") or record.name
    manager.store.update_resource(record.id, workspace=workspace)
    manager.store.transition(record.id, State.STOPPED)
    return manager.store.get(record.id)


def test_a_resume_of_a_local_workspace_starts_on_local(manager):
    _ran(manager, backend="local", name="t4-3")
    spec = manager.spec_from({"resume": "t4-3"})
    assert spec.backend == "local"
    (note,) = start_notes(manager.store.create(spec, price_per_hour=0.0))
    assert note.startswith("resuming workspace t4-3 where it lives: local (as session t4-3 ran"), (
        note
    )


def test_a_resume_of_an_ssh_engine_workspace_takes_its_host_and_image(manager):
    _ran(manager, backend="docker", host="ssh://me@gpu-box", image="me/cuda-py:1", name="w1")
    # a later start that failed elsewhere (the pull of the default image) is not where it lives
    _ran(manager, state=State.FAILED, backend="local", resume="w1")
    spec = manager.spec_from({"resume": "w1"})
    assert (spec.backend, spec.extra["host"], spec.extra["image"]) == (
        "docker",
        "ssh://me@gpu-box",
        "me/cuda-py:1",
    )
    # what the user names wins; another backend takes nothing of the workspace's
    given = manager.spec_from({"resume": "w1", "image": "other:2"})
    assert (given.extra["host"], given.extra["image"]) == ("ssh://me@gpu-box", "other:2")
    elsewhere = manager.spec_from({"resume": "w1", "backend": "local"})
    assert elsewhere.backend == "local" and "host" not in elsewhere.extra


def test_a_resume_of_a_workspace_no_session_ran_on_takes_the_default(manager):
    assert manager.spec_from({"resume": "never"}).backend == "docker"
