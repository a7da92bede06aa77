"""What a test's sessions leave on the local engine that a user keeps on purpose (workspace
and incoming volumes), removed after the test."""

from __future__ import annotations

from pathlib import Path


def remove_workspace_volumes(home: Path) -> None:
    """The volumes this test's store left on the local engine: workspaces (every docker session
    makes one, and gc keeps them, as it should for a user) and a switch's incoming volumes; a
    test run should not pile them up. Runtime caches carry no store label and stay."""
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
        for volume in client.volumes.list(filters={"label": [label]}):
            volume.remove(force=True)
    except Exception:  # noqa: BLE001 - a volume still in use (a test's session ends later) stays
        pass
    finally:
        client.close()
