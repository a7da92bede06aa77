"""Which GPUs of a shared box a docker session gets (issue 34 §1), on data: the box's reading (a
recording of an 8-GPU box, nvidia-smi's CSV), the engine's containers as the API lists them, the
pick, the one-line refusal; and the agent reading only the GPUs it was pinned to. The real engine
and the namespace host: tests/test_docker_placement.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from gpusession.agent.gpuvisible import visible_indices
from gpusession.agent.nvml import NvmlReader, RecordedNvml
from gpusession.backends.docker import gpus
from gpusession.configuration import options
from gpusession.configuration.catalog import load_catalog

DATA = Path(__file__).parent / "data"
EIGHT = json.loads((DATA / "nvml_eight_a100.json").read_text())


def _box() -> list[gpus.BoxGpu]:
    return gpus.from_recording(EIGHT)


def _container(name: str, devices: list[str], *, owner: str | None = None, state="running"):
    labels = {"gpusession.owner": owner, gpus.NAME_LABEL: name} if owner else {}
    return {
        "Name": f"/{name}",
        "State": {"Status": state},
        "Config": {"Labels": labels},
        "HostConfig": {"DeviceRequests": [{"DeviceIDs": devices, "Capabilities": [["gpu"]]}]},
    }


def test_the_recording_reads_as_the_box():
    box = _box()
    assert [g.index for g in box] == list(range(8))
    assert box[3].utilization == 35 and box[3].memory_used == 20 * 1024**3
    assert box[0].uuid.startswith("GPU-") and box[0].processes == 0


def test_the_least_busy_free_gpus_are_picked_first():
    chosen = gpus.pick(_box(), {}, 3)
    assert [g.index for g in chosen] == [0, 1, 2]
    # the warm one (35% busy) and the one with memory in use come last
    assert [g.index for g in gpus.free_gpus(_box(), {})][-2:] == [6, 3]


def test_held_gpus_are_never_picked_by_uuid_or_by_index():
    box = _box()
    held = gpus.holders(
        [
            _container("alice-1", [box[0].uuid], owner="alice@lab:1"),
            _container(
                "bobs-job", ["1,2"]
            ),  # another user's plain `docker run --gpus '"device=1,2"'`
            _container("old", [box[4].uuid], state="exited"),  # ended: holds nothing
        ]
    )
    assert [g.index for g in gpus.pick(box, held, 2)] == [4, 5]


def test_a_gpu_running_another_process_is_not_free():
    doc = json.loads(json.dumps(EIGHT))
    doc["frames"][0]["devices"][0]["compute_processes"] = [{"pid": 7, "usedGpuMemory": 1}]
    box = gpus.from_recording(doc)
    assert gpus.pick(box, {}, 1)[0].index == 1
    assert ("GPU 0", "another process") in gpus.who_holds(box, {})


def test_no_free_gpu_is_one_line_naming_the_box_its_gpus_and_who_holds_them():
    box = _box()
    held = gpus.holders(
        [_container(f"t4-{i}", [g.uuid], owner=f"u{i}@lab:1") for i, g in enumerate(box[:7])]
        + [_container("train", ["7"])]
    )
    assert gpus.pick(box, held, 1) is None
    line = gpus.refusal("ssh://gpu1", box, held, 1)
    assert "\n" not in line
    assert line.startswith("no 1 free GPU on ssh://gpu1: 0 of its 8 free (GPU 0: u0's t4-0,")
    assert "GPU 7: container train)" in line
    assert "--gpus shared" in line and "pool:NAME" in line


def test_nvidia_smi_csv_reads_as_the_box():
    box = gpus.from_smi(
        "0, GPU-aaa, Tesla T4, 3, 15360, 0\n1, GPU-bbb, Tesla T4, 10450, 15360, 97\n",
        "GPU-bbb, 4242\n",
    )
    assert [(g.index, g.uuid, g.processes) for g in box] == [(0, "GPU-aaa", 0), (1, "GPU-bbb", 1)]
    assert box[1].memory_used == 10450 * 1024 * 1024 and box[1].utilization == 97
    assert gpus.parse_reading("none\n") is None
    reading = gpus.parse_reading("nvidia-smi\n0, GPU-a, T4, [N/A], 15360, [N/A]\n----\n")
    assert reading[1] == "nvidia-smi" and reading[0][0].utilization is None


def test_the_box_script_prefers_its_recording(tmp_path, monkeypatch):
    (tmp_path / ".gpusession").mkdir()
    (tmp_path / gpus.RECORDING).write_text(json.dumps(EIGHT))
    monkeypatch.setenv("HOME", str(tmp_path))
    box, source = gpus.read_box(None, None)
    assert source == "recorded" and len(box) == 8


def test_a_box_with_nothing_to_read_starts_no_process_and_one_with_nvidia_smi_runs_it(
    tmp_path, monkeypatch
):
    """Neither a recording nor nvidia-smi here: no reading, and no process started for it (a
    start waits for the reading); an nvidia-smi on PATH (a stand-in printing a T4) is read."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path / "bin") + os.pathsep + "/usr/bin:/bin")
    started = []
    real_run = gpus.subprocess.run
    monkeypatch.setattr(
        gpus.subprocess, "run", lambda *a, **k: started.append(a) or real_run(*a, **k)
    )
    assert gpus.read_box(None, None) is None
    assert started == []
    (tmp_path / "bin").mkdir()
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.write_text(
        "#!/bin/sh\ncase \"$1\" in --query-gpu*) echo '0, GPU-aaa, Tesla T4, 3, 15360, 0';; esac\n"
    )
    smi.chmod(0o755)
    box, source = gpus.read_box(None, None)
    assert source == "nvidia-smi" and [g.uuid for g in box] == ["GPU-aaa"]
    assert len(started) == 1


@pytest.mark.parametrize(
    "value, parsed",
    [
        ("2", 2),
        ("shared", "shared"),
        ("ALL", "all"),
        ("device=3", "device=3"),
        ("device=GPU-8a1e, MIG-1f2e-3d", "device=GPU-8a1e,MIG-1f2e-3d"),
    ],
)
def test_the_gpus_option_takes_a_count_shared_all_or_named_devices(value, parsed):
    got = options.parse_values({"gpus": value}, catalog=load_catalog(), backends=None)
    assert got["gpus"] == parsed


@pytest.mark.parametrize("value", ["0", "device=", "device=a;b", "some"])
def test_a_bad_gpus_value_says_what_to_write(value):
    with pytest.raises(options.BadOptions) as err:
        options.parse_values({"gpus": value}, catalog=load_catalog(), backends=None)
    assert "device=0,1 or device=MIG-" in str(err.value)


def test_the_agent_of_a_pinned_session_reads_only_its_own_gpus():
    """The container's NVIDIA_VISIBLE_DEVICES names its GPUs by UUID: where NVML sees the whole
    box (here a replay of it), the agent's stats, idle rule and advice see the session's own."""
    mine = EIGHT["frames"][0]["devices"][3]["uuid"]
    env = {"NVIDIA_VISIBLE_DEVICES": mine}
    assert visible_indices(env, 8, lambda i: EIGHT["frames"][0]["devices"][i]["uuid"])[0] == [3]
    visible, _, read = NvmlReader(RecordedNvml(EIGHT), env=env).read()
    assert visible and [g["uuid"] for g in read] == [mine] and read[0]["utilization"] == 35.0
    # 'all' or indices (a runtime's own numbering) select nothing of their own
    assert (
        len(NvmlReader(RecordedNvml(EIGHT), env={"NVIDIA_VISIBLE_DEVICES": "all"}).read()[2]) == 8
    )


def test_containers_are_ordered_by_creation_to_the_nanosecond():
    """Two starts on one box that picked the same GPU: the one created first keeps it. Docker's
    listing gives whole seconds, so two containers of one second were ordered by id, and a later
    one with a smaller id kept a GPU the earlier one had kept already (both held it)."""
    from gpusession.backends.docker.backend import created_ns

    earlier, later = "2026-12-03T14:20:01.1Z", "2026-12-03T14:20:01.12Z"  # trailing zeros dropped
    assert created_ns(earlier) < created_ns(later) < created_ns("2026-12-03T14:20:02Z")
    assert created_ns("2026-12-03T14:20:01.000000001Z") - created_ns("2026-12-03T14:20:01Z") == 1
    assert created_ns(1796307601) == created_ns("2026-12-03T14:20:01Z")  # a listing's seconds
    assert created_ns(None) == 0
