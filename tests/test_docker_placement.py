"""GPUs as people share them, on a real engine (issue 34 §1): the namespace Docker host
(scripts/ci-remote-host.sh, this worker's own) stands for an 8-GPU box through a recording of one
in its login's home (`~/.gpusession/box-nvml.json`, read in place of nvidia-smi). Eight sessions
on it get eight different GPUs, pinned by UUID in their containers' device requests; the ninth
is refused with one line naming the box, its GPUs and who holds them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from gpusession.backends.docker.gpus import GPUS_LABEL, RECORDING
from support.hosts import REMOTE_STATE, product_image

pytestmark = [pytest.mark.integration, pytest.mark.docker]

DATA = Path(__file__).parent / "data"
EIGHT = json.loads((DATA / "nvml_eight_a100.json").read_text())
UUIDS = [d["uuid"] for d in EIGHT["frames"][0]["devices"]]


@pytest.fixture
def eight_gpu_box(remote):
    """The namespace host, with the recording of an 8-GPU box standing in for its nvidia-smi."""
    recording = REMOTE_STATE / "home" / RECORDING
    recording.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(DATA / "nvml_eight_a100.json", recording)
    yield remote
    recording.unlink(missing_ok=True)
    _remove_remote_volumes(remote)


def _remove_remote_volumes(remote) -> None:
    import docker

    from gpusession.session.store import Store

    home = Path(os.environ["GPUSESSION_HOME"])
    far = docker.DockerClient(base_url=remote["docker_host_env"])
    try:
        label = f"gpusession.session.store={Store(home / 'sessions.sqlite3').store_id}"
        for volume in far.volumes.list(filters={"label": ["gpusession.workspace", label]}):
            volume.remove(force=True)
    finally:
        far.close()


def test_eight_sessions_get_eight_gpus_and_the_ninth_is_told_who_holds_them(
    eight_gpu_box, manager, monkeypatch, gs_home
):
    import docker

    monkeypatch.setenv("GPUSESSION_IMAGE", product_image())
    url = eight_gpu_box["url"]
    lines: list[str] = []
    sessions = []
    for n in range(8):
        spec = manager.make_spec("a100", backend="docker", host=url, idle="off", name=f"lab-{n}")
        sessions.append(manager.start(spec, report=lines.append))
    pinned = [r.resource["gpus"] for r in manager_records(manager, sessions)]
    assert sorted(p[0] for p in pinned) == sorted(UUIDS)  # eight different GPUs, one each
    # the least busy first: the warm GPU 3 (35%) and GPU 6 (1 GiB in use) went last
    assert [r.resource["gpu_indices"][0] for r in manager_records(manager, sessions)][-2:] == [6, 3]
    assert any(
        "GPU 0 (0% busy, 3 MiB used), free and the least busy (recorded)" in line for line in lines
    )

    far = docker.DockerClient(base_url=eight_gpu_box["docker_host_env"])
    try:
        for record in manager_records(manager, sessions):
            container = far.containers.get(record.resource["container_id"])
            requests = container.attrs["HostConfig"]["DeviceRequests"]
            assert requests[0]["DeviceIDs"] == record.resource["gpus"]
            assert container.labels[GPUS_LABEL] == record.resource["gpus"][0]
    finally:
        far.close()

    # the ninth, from the CLI as a user would: one line, non-zero, nothing left running
    env = dict(os.environ, GPUSESSION_BACKEND="docker")
    done = subprocess.run(
        [sys.executable, "-m", "gpusession", "start", "--type", "a100", "--host", url,
         "--idle", "off", "--name", "lab-8"],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert done.returncode != 0
    said = [line for line in done.stderr.splitlines() if "no 1 free GPU" in line]
    assert len(said) == 1, done.stderr
    assert f"on {url}: 0 of its 8 free (GPU 0: " in said[0]
    for n in range(8):
        assert f"'s lab-{n}" in said[0]
    assert "--gpus shared" in said[0] and "Traceback" not in done.stderr
    ninth = manager.store.get("lab-8")
    assert ninth.state.name == "FAILED" and "container_id" not in ninth.resource

    # one of them stops: its GPU is free again, and the next start gets that one
    freed = manager_records(manager, sessions)[2].resource["gpus"]
    manager.stop(sessions[2].record.id)
    again = manager.start(
        manager.make_spec("a100", backend="docker", host=url, idle="off", name="lab-9")
    )
    assert manager.store.get(again.record.id).resource["gpus"] == freed


def test_two_starts_at_the_same_moment_get_two_gpus(eight_gpu_box, manager, monkeypatch):
    """Both read the box before either container exists, so both pick GPU 0; the one whose
    container came second gives it up and picks again."""
    from gpusession.session import SessionManager

    monkeypatch.setenv("GPUSESSION_IMAGE", product_image())
    url = eight_gpu_box["url"]
    other = SessionManager()
    lines: list[str] = []
    results: dict[str, object] = {}

    def start(m, name):
        try:
            spec = m.make_spec("a100", backend="docker", host=url, idle="off", name=name)
            results[name] = m.start(spec, report=lines.append).record.id
        except Exception as exc:  # noqa: BLE001 - the assertion below says what failed
            results[name] = exc

    try:
        threads = [
            threading.Thread(target=start, args=(m, name))
            for m, name in ((manager, "race-a"), (other, "race-b"))
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        assert all(isinstance(v, str) for v in results.values()), results
        held = [manager.store.get(results[n]).resource["gpus"] for n in ("race-a", "race-b")]
        assert held[0] != held[1], (held, lines)
    finally:
        other.close()


def manager_records(manager, sessions):
    return [manager.store.get(s.record.id) for s in sessions]
