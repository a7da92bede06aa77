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
import time
from pathlib import Path

import pytest

from gpusession.backends.docker.gpus import GPUS_LABEL, RECORDING
from gpusession.core.errors import NoCapacity
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


SECOND_SLOT = 12  # the pool's second box: another namespace host (scripts/ci-remote-host.sh)
SILENT = "ssh://root@10.200.15.2"  # an address no host answers on (no slot 15 host is made)


@pytest.fixture
def pool_of_two(eight_gpu_box, monkeypatch):
    """Pool `lab`: this worker's namespace host (6 of its 8 GPUs running others' processes), a
    second one (8 free), and a box that does not answer."""
    second = _second_host()
    busy = json.loads(json.dumps(EIGHT))
    for dev in busy["frames"][0]["devices"][:6]:
        dev["compute_processes"] = [{"pid": 4242, "usedGpuMemory": 1 << 30}]
    (REMOTE_STATE / "home" / RECORDING).write_text(json.dumps(busy))
    recording = second["state"] / "home" / RECORDING
    recording.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(DATA / "nvml_eight_a100.json", recording)
    ssh = Path(os.environ["HOME"]) / ".ssh"
    with open(ssh / "config", "a") as f:
        f.write("\n" + (second["state"] / "ssh_config").read_text())
    with open(ssh / "known_hosts", "a") as f:
        f.write((second["state"] / "known_hosts").read_text())
    boxes = [eight_gpu_box["url"], second["url"], SILENT]
    monkeypatch.setenv("GPUSESSION_DOCKER_POOLS", json.dumps({"lab": boxes}))
    yield eight_gpu_box, second
    recording.unlink(missing_ok=True)
    _remove_remote_volumes({"docker_host_env": second["docker_host_env"]})


def _second_host() -> dict:
    env = dict(os.environ, GPUSESSION_TEST_SLOT=str(SECOND_SLOT))
    script = Path(__file__).resolve().parents[1] / "scripts" / "ci-remote-host.sh"
    done = subprocess.run(
        ["bash", str(script), "up"], capture_output=True, text=True, timeout=300, env=env
    )
    if done.returncode != 0:
        pytest.skip(f"the second namespace host did not come up: {done.stderr[-300:]}")
    state = REMOTE_STATE.parent / f"remote-{SECOND_SLOT}"
    return {
        "url": f"ssh://root@10.200.{SECOND_SLOT}.2",
        "state": state,
        "docker_host_env": f"unix:///run/gpus-remote-{SECOND_SLOT}/docker.sock",
    }


def test_a_pool_start_takes_the_box_with_free_gpus_after_its_list_passes_a_type_none_has(
    pool_of_two, manager, monkeypatch
):
    """--host pool:lab --type h100,a100: no box of the pool has an h100, so the list moves on to
    a100; the box with the most free a100 is taken, the silent one skipped in one line."""
    first, second = pool_of_two
    monkeypatch.setenv("GPUSESSION_IMAGE", product_image())
    lines: list[str] = []
    began = time.monotonic()
    spec = manager.make_spec("h100,a100", backend="docker", host="pool:lab", idle="off", name="p")
    session = manager.start(spec, report=lines.append)
    record = manager.store.get(session.record.id)
    assert record.spec.extra["host"] == second["url"] and record.spec.gpu_type == "a100"
    assert record.spec.extra["pool"] == "pool:lab"
    (passed,) = record.spec.extra["passed_over"]
    assert passed["type"] == "h100:1"
    assert passed["why"].startswith(
        f"no box of pool lab has 1 free h100 ({first['url']}: skipped, no h100 there"
    )
    text = "\n".join(lines)
    assert f"pool lab: {SILENT} skipped:" in text
    assert (
        f"pool lab: {second['url']}, the most free a100 (8 of 8) ({first['url']}: 2 free; "
        f"{SILENT}: skipped," in text
    )
    assert "took a100:1 of h100:1, a100:1 (passed over h100:1: no box of pool lab" in text
    assert time.monotonic() - began < 200  # the silent box held nothing up past its deadline
    from gpusession.words.status import placement_line

    said = placement_line(manager.view(record))
    assert f"pool lab: {second['url']}" in said and f"holds GPU 0 of {second['url']}" in said
    # `gpusession types` ends with what each box of the pool has free now (issue 34 §2)
    from test_cli import cli

    listed = cli(dict(os.environ), "types")
    assert listed.returncode == 0, listed.stderr
    tail = listed.stdout.splitlines()[-4:]
    assert tail[0] == "free now on shared boxes:", listed.stdout
    assert tail[1] == f"  pool lab  {first['url']}  2 of 8 free (2 x NVIDIA A100-SXM4-80GB)"
    assert tail[2] == f"  pool lab  {second['url']}  7 of 8 free (7 x NVIDIA A100-SXM4-80GB)"
    assert tail[3].startswith(f"  pool lab  {SILENT}  skipped: "), tail
    manager.stop(record.id)


def test_a_mig_type_starts_on_a_free_slice_of_a_split_a100(remote, manager, monkeypatch):
    """The namespace host stands for a box with one A100 split into 7 1g.10gb slices, two of
    them running others' processes: an a100-1g.10gb session is pinned to the third, by its MIG
    UUID; a whole-card type finds no card there."""
    import docker

    recording = REMOTE_STATE / "home" / RECORDING
    recording.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(DATA / "nvml_a100_mig.json", recording)
    monkeypatch.setenv("GPUSESSION_IMAGE", product_image())
    slices = json.loads((DATA / "nvml_a100_mig.json").read_text())["frames"][0]["devices"][0]
    third = slices["mig_devices"][2]["uuid"]
    lines: list[str] = []
    try:
        spec = manager.make_spec("a100-1g.10gb", backend="docker", host=remote["url"], idle="off")
        session = manager.start(spec, report=lines.append)
        record = manager.store.get(session.record.id)
        assert record.resource["gpus"] == [third]
        assert any("GPU 0 slice 2 (13 MiB used, utilization n/a: MIG)" in line for line in lines)
        far = docker.DockerClient(base_url=remote["docker_host_env"])
        try:
            attrs = far.containers.get(record.resource["container_id"]).attrs
            assert attrs["HostConfig"]["DeviceRequests"][0]["DeviceIDs"] == [third]
        finally:
            far.close()
        price = manager.catalog.get("a100-80gb").rate / 7
        assert record.price_per_hour == pytest.approx(price, abs=1e-4)
        manager.stop(record.id)
        with pytest.raises(NoCapacity) as err:
            manager.start(manager.make_spec("a100-2g.20gb", backend="docker", host=remote["url"]))
        assert "no a100-2g.20gb MIG slice on" in str(err.value)
    finally:
        recording.unlink(missing_ok=True)
        _remove_remote_volumes(remote)
