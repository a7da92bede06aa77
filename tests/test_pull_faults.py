"""A pull on this machine's engine that is cut: the registry's link breaks mid-layer (the engine
resumes it), or the user presses Ctrl-C (SIGINT to the CLI) while it runs (nothing is left: no
session that bills, no container, no image). A real engine pulling from a registry on loopback
(tests/support/images.py serve_registry, throttled)."""

from __future__ import annotations

import threading
import time

import pytest

from support.hosts import docker_available
from support.images import FOREIGN, serve_registry, start_pulled
from support.procs import start_interrupted

pytestmark = [
    pytest.mark.docker,
    pytest.mark.skipif(not docker_available(), reason="needs a Docker engine"),
]
SOURCE = FOREIGN[0].image  # Debian 12 + python3


@pytest.fixture(scope="module")
def registry():
    """SOURCE and a 40 MB layer of random bytes (which no engine has) as ci/slow:v1."""
    import docker

    client = docker.from_env()
    served = serve_registry(client, SOURCE, "ci/slow", "v1", extra_layers=(40_000_000,))
    served.name = f"127.0.0.1:{served.port}/ci/slow:v1"
    yield served
    served.close()
    _forget(client, served.name)
    client.close()


def _forget(engine, name: str) -> None:
    try:
        engine.images.remove(name, force=True)
    except Exception:  # noqa: BLE001 - not there
        pass


def _ours(engine, store_id: str) -> list:
    return engine.containers.list(
        all=True, ignore_removed=True, filters={"label": [f"gpusession.session.store={store_id}"]}
    )


def test_a_pull_whose_link_breaks_mid_layer_resumes(manager, engine, registry):
    """The registry drops the connection 8 MB into the 40 MB layer: the engine asks again (from
    where it was, a Range request) and the session starts."""
    registry.state.update(rate=0, cut_once_after=8_000_000, cut=False, gets=[])
    name = registry.name
    _forget(engine, name)
    try:
        lines = start_pulled(manager, name)
    finally:
        _forget(engine, name)
    state = registry.state
    assert state["cut"], state
    # asked again from where the link broke, not from the start
    assert any(r.startswith("bytes=") and not r.startswith("bytes=0-") for _, r in state["gets"])
    assert any(f"pulled {name} (" in line for line in lines), lines
    print(f"blob requests: {state['gets']}")


def _cli_start(name: str, env: dict, interrupt) -> str:
    """`gpusession start` in its own process, SIGINT when `interrupt()` says: its output."""
    return start_interrupted(
        ["--backend", "docker", "--image", name, "--idle", "off", "--name", "pulling"],
        env,
        interrupt,
    )


def _magic_start(name: str, notebook, interrupt) -> str:
    """`%gpu start` in a notebook's kernel, interrupted as the notebook's stop button does."""
    ran: dict = {}
    cell = f"%gpu start --backend docker --image {name} --idle off --name pulling"
    worker = threading.Thread(target=lambda: ran.update(run=notebook.run(cell, timeout=300)))
    worker.start()
    interrupt(worker.is_alive, notebook.km.interrupt_kernel)
    worker.join(120)
    run = ran["run"]
    assert run.error is not None and run.error["ename"] == "UsageError", run.text
    assert "start of pulling interrupted" in run.error["evalue"], run.error
    assert "nothing is left running" in run.error["evalue"], run.error
    return run.text


@pytest.mark.parametrize("face", ["cli", "magic"])
def test_ctrl_c_during_a_pull_leaves_nothing(face, engine, registry, gs_home, nb_env, request):
    """Ctrl-C while the engine pulls a 40 MB layer at 4 MB/s (SIGINT to `gpusession start`;
    the notebook's stop button during `%gpu start`): one line, no traceback; the session is
    recorded failed (interrupted), bills nothing, has no container; the engine stops the pull
    (its connection closed) and keeps no image."""
    from gpusession.session.store import Store

    registry.state.update(rate=4_000_000, cut_once_after=0, sent=0)
    name = registry.name
    _forget(engine, name)
    stopped: dict = {}

    def interrupt(running, press) -> None:
        deadline = time.monotonic() + 120
        while registry.state["sent"] < 4_000_000:  # the engine is mid-layer
            assert time.monotonic() < deadline and running(), "the pull did not start"
            time.sleep(0.1)
        press()
        stopped["sent"] = registry.state["sent"]

    try:
        if face == "cli":
            text = _cli_start(name, nb_env, interrupt)
        else:
            text = _magic_start(name, request.getfixturevalue("notebook"), interrupt)
        time.sleep(3)
        sent_after = registry.state["sent"] - stopped["sent"]
    finally:
        registry.state.update(rate=0)  # a pull still running ends at once
    assert "Traceback" not in text, text
    store = Store(gs_home / "sessions.sqlite3")
    (record,) = store.list()
    assert record.state.value == "failed" and "interrupted" in (record.error or ""), record
    assert _ours(engine, store.store_id) == []
    # the engine's pull ends with its connection: no more bytes asked for, no image kept
    assert sent_after < 1_000_000, sent_after
    with pytest.raises(Exception, match="No such image|not found"):
        engine.images.get(name)
    print(
        f"{face}: sent before Ctrl-C {stopped['sent'] / 1e6:.1f} MB, after {sent_after / 1e6:.1f} MB"
    )
    _forget(engine, name)
