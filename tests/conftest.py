"""Shared fixtures. Every test gets its own session store (GPUSESSION_HOME in a tmp dir)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))


@pytest.fixture
def gs_home(tmp_path, monkeypatch) -> Path:
    home = tmp_path / "gshome"
    home.mkdir(mode=0o700)  # as gpusession makes it: an open one is warned about
    monkeypatch.setenv("GPUSESSION_HOME", str(home))
    monkeypatch.delenv("GPUSESSION_BACKEND", raising=False)
    yield home
    _remove_workspace_volumes(home)


def _remove_workspace_volumes(home: Path) -> None:
    """The workspace volumes this test's store left on the local engine (every docker session
    makes one, and gc keeps them, as it should for a user; a test run should not pile them up)."""
    if not (home / "sessions.sqlite3").exists():
        return
    try:
        import docker

        from gpusession.session.store import Store

        client = docker.from_env(timeout=5)
    except Exception:  # noqa: BLE001 - no SDK or no engine: nothing to clean
        return
    try:
        label = f"gpusession.session.store={Store(home / 'sessions.sqlite3').store_id}"
        for volume in client.volumes.list(filters={"label": ["gpusession.workspace", label]}):
            volume.remove(force=True)
    except Exception:  # noqa: BLE001 - a volume still in use (a test's session ends later) stays
        pass
    finally:
        client.close()


@pytest.fixture
def manager(gs_home):
    from gpusession.session import SessionManager

    m = SessionManager()
    yield m
    for r in m.list(active_only=True):
        try:
            m.stop(r.id)
        except Exception:  # noqa: BLE001 - teardown must reach every session
            pass
    m.close()


@pytest.fixture
def engine():
    """A docker SDK client for the local engine (tests that need one skip without it)."""
    import docker

    client = docker.from_env()
    yield client
    client.close()


@pytest.fixture
def remote(tmp_path, monkeypatch):
    """The namespace Docker host reached over ssh:// (scripts/ci-remote-host.sh), with a HOME whose
    ~/.ssh knows it; the test skips where that host cannot run."""
    from support.hosts import ensure_remote_host, ssh_home

    host = ensure_remote_host()
    if host is None:
        pytest.skip(
            "the namespace Docker host cannot run here (needs root; scripts/ci-remote-host.sh)"
        )
    monkeypatch.setenv("HOME", ssh_home(host, tmp_path / "home"))
    return host


@pytest.fixture
def nb_env(gs_home) -> dict[str, str]:
    env = dict(os.environ)
    env["GPUSESSION_HOME"] = str(gs_home)
    env.setdefault("GPUSESSION_BACKEND", "local")
    env["PYTHONUNBUFFERED"] = "1"
    return env


@pytest.fixture
def notebook(nb_env, tmp_path):
    """A real notebook kernel with gpusession loaded."""
    from support.notebook_kernel import NotebookKernel

    nk = NotebookKernel(nb_env, cwd=str(tmp_path))
    r = nk.run("%load_ext gpusession")
    assert r.status == "ok", r.text
    yield nk
    nk.close()


# --- jupyter server (pytest-jupyter) ------------------------------------------------------
pytest_plugins = ["pytest_jupyter.jupyter_server"]


@pytest.fixture
def jp_server_config(gs_home):
    return {"ServerApp": {"jpserver_extensions": {"gpusession": True}}}
