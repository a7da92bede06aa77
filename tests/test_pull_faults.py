"""A pull on this machine's engine that is cut: the registry's link breaks mid-layer (the engine
resumes it), or the user presses Ctrl-C (SIGINT to the CLI) while it runs (nothing is left: no
session that bills, no container, no image). A real engine pulling from a registry on loopback
(tests/support/images.py serve_registry, throttled)."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time

import pytest

from support.hosts import docker_available
from support.images import FOREIGN, serve_registry

pytestmark = [
    pytest.mark.docker,
    pytest.mark.skipif(not docker_available(), reason="needs a Docker engine"),
]
SOURCE = FOREIGN[0].image  # Debian 12 + python3


def _forget(engine, name: str) -> None:
    try:
        engine.images.remove(name, force=True)
    except Exception:  # noqa: BLE001 - not there
        pass


def _ours(engine, store_id: str) -> list:
    return engine.containers.list(
        all=True, ignore_removed=True, filters={"label": [f"gpusession.session.store={store_id}"]}
    )


def test_a_pull_whose_link_breaks_mid_layer_resumes(manager, engine):
    """The registry drops the connection 8 MB into a 20 MB layer: the engine asks again (from
    where it was, a Range request) and the session starts."""
    registry = serve_registry(
        engine, SOURCE, "ci/cut", "v1", extra_layers=(20_000_000,), cut_once_after=8_000_000
    )
    name = f"127.0.0.1:{registry.port}/ci/cut:v1"
    lines: list[str] = []
    try:
        session = manager.start(
            manager.make_spec("t4", backend="docker", idle="off", image=name), report=lines.append
        )
        assert session.run("1 + 1")["status"] == "ok"
        manager.stop(session.id)
    finally:
        registry.close()
        _forget(engine, name)
    state = registry.state
    assert state["cut"], state
    # asked again from where the link broke, not from the start
    assert any(r.startswith("bytes=") and not r.startswith("bytes=0-") for _, r in state["gets"])
    assert any(f"pulled {name} (" in line for line in lines), lines
    print(f"blob requests: {state['gets']}")


def test_ctrl_c_during_a_pull_leaves_nothing(engine, gs_home, nb_env):
    """SIGINT to `gpusession start` while the engine pulls a 40 MB layer at 4 MB/s: the CLI says
    one line and exits 130; the session is recorded failed (interrupted), bills nothing, has no
    container; the engine stops the pull (its connection closed) and keeps no image."""
    from gpusession.session.store import Store

    registry = serve_registry(
        engine, SOURCE, "ci/slow", "v1", extra_layers=(40_000_000,), rate=4_000_000
    )
    name = f"127.0.0.1:{registry.port}/ci/slow:v1"
    out: list[str] = []
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpusession", "start", "--backend", "docker", "--image", name,
         "--idle", "off", "--name", "pulling"],
        env=nb_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    reader = threading.Thread(target=lambda: out.extend(proc.stdout), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 60
        while registry.state["sent"] < 4_000_000:  # the engine is mid-layer
            assert time.monotonic() < deadline and proc.poll() is None, out
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 130, out
        reader.join(10)
        sent_at_stop = registry.state["sent"]
        time.sleep(3)
        sent_after = registry.state["sent"] - sent_at_stop
    finally:
        if proc.poll() is None:
            proc.kill()
        registry.close()
    text = "".join(out)
    assert text.strip().splitlines()[-1] == "gpusession start: interrupted", text
    assert "Traceback" not in text, text
    store = Store(gs_home / "sessions.sqlite3")
    (record,) = store.list()
    assert record.state.value == "failed" and "interrupted" in (record.error or ""), record
    assert _ours(engine, store.store_id) == []
    # the engine's pull ends with its connection: no more bytes asked for, no image kept
    assert sent_after < 1_000_000, sent_after
    with pytest.raises(Exception, match="No such image|not found"):
        engine.images.get(name)
    print(f"sent before Ctrl-C {sent_at_stop / 1e6:.1f} MB, after {sent_after / 1e6:.1f} MB")
    _forget(engine, name)
