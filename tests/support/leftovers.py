"""What a test's sessions leave on the local engine and this worker's namespace engines that a
user keeps on purpose (workspace and incoming volumes), removed after the test."""

from __future__ import annotations

from pathlib import Path


def remove_workspace_volumes(home: Path) -> None:
    """The volumes this test's store left on the local engine and on this worker's namespace
    engines (its ssh:// and EC2 hosts, through their sockets here): workspaces (every docker
    session makes one, and gc keeps them, as it should for a user) and a switch's incoming
    volumes; a test run should not pile them up, and the namespace engines' volumes outlive the
    run (their data is in the CI state folder). Runtime caches carry no store label and stay."""
    if not (home / "sessions.sqlite3").exists():
        return
    try:
        import docker

        from gpusession.session.store import Store
        from support.ec2_platform import NS_DOCKER
        from support.hosts import REMOTE_RUN
    except Exception:  # noqa: BLE001 - no SDK: nothing to clean
        return
    label = f"gpusession.session.store={Store(home / 'sessions.sqlite3').store_id}"
    sockets = (f"unix://{REMOTE_RUN / 'docker.sock'}", NS_DOCKER)
    engines = [None] + [url for url in sockets if Path(url[len("unix://") :]).exists()]
    for url in engines:
        try:
            client = (
                docker.from_env(timeout=5) if url is None else docker.DockerClient(url, timeout=5)
            )
        except Exception:  # noqa: BLE001 - no engine there: nothing to clean
            continue
        try:
            for volume in client.volumes.list(filters={"label": [label]}):
                volume.remove(force=True)
        except Exception:  # noqa: BLE001 - a volume still in use (a test's session ends later) stays
            pass
        finally:
            client.close()
