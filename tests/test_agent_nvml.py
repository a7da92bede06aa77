"""The NVML reader through its one seam: raw values recorded from a driver (tests/data), replayed
by RecordedNvml; and the real pynvml on this machine, which has no NVIDIA driver."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpusession.agent.nvml import NO_GPU_MESSAGE, NvmlReader, RecordedNvml
from gpusession.agent.sampler import Sampler
from gpusession.configuration.metrics import nvml_kind

DATA = Path(__file__).parent / "data"
MiB = 1024**2


def reader(name: str) -> NvmlReader:
    return NvmlReader(RecordedNvml.from_file(DATA / name))


def test_two_gpus_in_our_units():
    r = reader("nvml_two_t4.json")
    visible, message, gpus = r.read()  # frame 0: both idle
    assert visible and message is None and r.driver_version == "550.54.15"
    assert [g["index"] for g in gpus] == [0, 1]
    assert gpus[0]["utilization"] == 0.0 and gpus[0]["sm_clock"] == 300
    visible, _, gpus = r.read()  # frame 1: GPU 0 busy
    g0, g1 = gpus
    assert g0 == {
        "index": 0,
        "name": "Tesla T4",
        "uuid": "GPU-6f1c2e4a-0b7d-4c8e-9a1f-000000000000",
        "utilization": 97.0,
        "memory_used": 10450 * MiB,  # bytes
        "memory_total": 15360 * MiB,
        "temperature": 70.0,  # deg C
        "power_draw": 67.2,  # W from 67200 mW
        "power_limit": 70.0,
        "sm_clock": 1590,  # MHz
        "processes": [{"pid": 424242, "name": "python3", "memory_used": 10440 * MiB}],
    }
    # NotSupported fields stay None: no invented numbers
    assert g1["power_draw"] is None and g1["power_limit"] == 70.0
    # NVML's "not available" process memory stays None too
    assert g1["processes"] == [{"pid": 424243, "name": "python3", "memory_used": None}]


def test_a_real_h200s_recording_reads_in_our_units():
    """tests/data/nvml_one_h200.json: `nvml-record --frames 2` on a real NVIDIA H200 (driver
    580.159.04, idle), by scripts/device-check.sh: the hand-made recordings have its shape."""
    r = reader("nvml_one_h200.json")
    visible, message, (gpu,) = r.read()
    assert visible and message is None and r.driver_version == "580.159.04"
    assert gpu == {
        "index": 0,
        "name": "NVIDIA H200",
        "uuid": "GPU-45322b5b-bd11-7249-5530-219780e74211",
        "utilization": 0.0,
        "memory_used": 644939776,
        "memory_total": 150754820096,  # 143771 MiB, as nvidia-smi says
        "temperature": 38.0,
        "power_draw": 79.2,
        "power_limit": 700.0,
        "sm_clock": 345,
        "processes": [],
    }
    hand_made = json.loads((DATA / "nvml_two_t4.json").read_text())["frames"][0]["devices"][0]
    real = json.loads((DATA / "nvml_one_h200.json").read_text())["frames"][0]["devices"][0]
    assert set(hand_made) == set(real)


def test_a_lost_gpu_is_reported_and_the_others_kept():
    r = reader("nvml_two_t4.json")
    for _ in range(2):
        r.read()
    visible, _, gpus = r.read()  # frame 2: GPU 1 fell off the bus
    assert visible
    assert gpus[0]["utilization"] == 2.0
    assert gpus[1]["index"] == 1 and gpus[1]["error"] == "GpuIsLost"  # data: the faces say it
    assert gpus[1]["utilization"] is None and gpus[1]["processes"] == []


LOST = "the GPU is lost: the driver no longer sees it"


def test_a_lost_gpu_is_said_in_the_same_words_by_every_face():
    """The notebook's words, the ipywidgets card and the REST stats the sidebar shows."""
    from gpusession.widgets.card import GpuGauges
    from gpusession.words.status import status_lines, with_error_texts

    r = reader("nvml_two_t4.json")
    for _ in range(2):
        r.read()
    _, _, gpus = r.read()
    sample = {"t": 1.0, "gpus": gpus, "cpu_percent": 1.0, "memory_used": None}
    stats = {"gpus_visible": True, "samples": [sample], "idle": {}, "cost": {}, "runtime": {}}
    (lost,) = [line for line in status_lines(stats) if line.startswith("  GPU 1 ")]
    assert lost == f"  GPU 1 ?: {LOST}", lost
    card = GpuGauges(1)
    card.show(gpus[1])
    assert card.title.value.endswith(f" · {LOST}"), card.title.value
    served = with_error_texts(sample)["gpus"]
    assert served[1]["error_text"] == LOST and "error_text" not in served[0]
    for said in (lost, card.title.value, served[1]["error_text"]):
        assert "NVMLError" not in said and "GpuIsLost" not in said


@pytest.mark.parametrize(
    "name, why",
    [
        (
            "nvml_no_library.json",
            "no NVIDIA driver here: libnvidia-ml.so is not found",
        ),
        ("nvml_driver_not_loaded.json", "the NVIDIA driver is not loaded on this machine"),
        ("nvml_zero_devices.json", "0 devices"),
    ],
)
def test_no_gpu_is_said_plainly(name, why):
    r = reader(name)
    for _ in range(3):  # and keeps saying it, without retrying nvmlInit every second
        visible, message, gpus = r.read()
        assert (visible, gpus) == (False, [])
        assert message == f"{NO_GPU_MESSAGE} ({why})" or (why == "0 devices" and why in message), (
            message
        )
    if name != "nvml_zero_devices.json":
        assert r._api.init_calls == 1


def test_sampler_keeps_cpu_and_memory_without_a_gpu():
    s = Sampler(reader("nvml_no_library.json"), history_s=5, interval_s=1)
    for t in range(8):
        sample = s.sample(1000.0 + t, kernel_busy=t == 3)
    assert s.gpus_visible is False and NO_GPU_MESSAGE in s.message
    assert sample["gpus"] == [] and sample["gpus_visible"] is False
    assert sample["memory_used"] > 0 and sample["memory_total"] >= sample["memory_used"]
    assert sample["cpu_percent"] is not None
    # one hour at 1 Hz in production; 5 samples here
    assert [x["t"] for x in s.samples()] == [1003.0, 1004.0, 1005.0, 1006.0, 1007.0]
    assert [x["kernel_busy"] for x in s.samples()][0] is True
    assert [x["t"] for x in s.samples(since=1005.0)] == [1006.0, 1007.0]
    assert [x["t"] for x in s.samples(limit=1)] == [1007.0]
    assert s.samples(limit=0) == []


def test_real_pynvml_on_this_machine_without_a_driver():
    """The real seam: pynvml, imported lazily; no NVIDIA driver here, so no GPU and no crash."""
    if Path("/dev/nvidiactl").exists():
        pytest.skip("this machine has an NVIDIA driver; scripts/device-check.sh covers it")
    r = NvmlReader()
    visible, message, gpus = r.read()
    assert visible is False and gpus == []
    assert message.startswith(NO_GPU_MESSAGE), message


@pytest.mark.integration
def test_importing_the_agent_does_not_touch_nvml():
    code = "import sys, gpusession.agent.service, gpusession.agent.kernel_runtime; print('pynvml' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.integration
def test_sample_command_prints_json(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpusession.agent",
            "sample",
            "--count",
            "2",
            "--interval",
            "0.1",
            "--recorded",
            str(DATA / "nvml_two_t4.json"),
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    doc = json.loads(out.stdout)
    assert doc["gpus_visible"] is True and doc["driver_version"] == "550.54.15"
    assert [s["gpus"][0]["utilization"] for s in doc["samples"]] == [0.0, 97.0]
    assert doc["sample_ms"]["mean"] >= 0
    real = subprocess.run(
        [sys.executable, "-m", "gpusession.agent", "sample"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        env=dict(os.environ),
    )
    doc = json.loads(real.stdout)
    if not Path("/dev/nvidiactl").exists():
        assert doc["gpus_visible"] is False and doc["message"].startswith(NO_GPU_MESSAGE)
        assert doc["samples"][0]["memory_used"] > 0


@pytest.mark.integration
def test_nvml_record_writes_the_replay_format():
    out = subprocess.run(
        [sys.executable, "-m", "gpusession.agent", "nvml-record"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    doc = json.loads(out.stdout)
    assert set(doc) >= {"driver_version", "init_error", "frames"}
    replay = NvmlReader(RecordedNvml(doc))
    visible, message, _ = replay.read()
    if doc["init_error"]:  # this machine has no driver: said in words, not NVML's names
        assert not visible and "NVMLError" not in message, message
        assert nvml_kind(doc["init_error"]) not in message, message


@pytest.mark.integration
def test_nvml_record_without_nvidia_ml_py_says_so_in_one_line():
    code = (
        "import sys, runpy; sys.modules['pynvml'] = None; sys.argv = ['x', 'nvml-record']; "
        "runpy.run_module('gpusession.agent', run_name='__main__')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and out.stdout == "", out
    assert out.stderr.strip() == (
        "nvml-record: nvidia-ml-py is not installed: pip install nvidia-ml-py"
    ), out.stderr


# -- the GPUs this session was given (a Slurm job, CUDA_VISIBLE_DEVICES) -----------------------

FOUR = "nvml_four_a100.json"  # another job keeps GPUs 0 and 3 busy; 1 and 2 are idle


def _read_with(env: dict) -> tuple[bool, str | None, list[dict]]:
    return NvmlReader(RecordedNvml.from_file(DATA / FOUR), env=env).read()


@pytest.mark.parametrize(
    "env, indices",
    [
        ({}, [0, 1, 2, 3]),
        ({"CUDA_VISIBLE_DEVICES": "1,2"}, [1, 2]),
        (
            {
                "CUDA_VISIBLE_DEVICES": "GPU-a100c0de-1111-2222-3333-000000000002,GPU-a100c0de-1111-2222-3333-000000000001"
            },
            [2, 1],
        ),
        (
            {"CUDA_VISIBLE_DEVICES": "2,7,1"},
            [2],
        ),  # as CUDA: the list ends at the first GPU that is not there
        ({"SLURM_JOB_GPUS": "1,2"}, [1, 2]),
        ({"SLURM_JOB_GPUS": "0,1,2,3"}, [0, 1, 2, 3]),
        ({"CUDA_VISIBLE_DEVICES": "2", "SLURM_JOB_GPUS": "1,2"}, [2]),  # CUDA's own variable wins
    ],
)
def test_only_the_gpus_given_to_the_session_are_read(env, indices):
    visible, message, gpus = _read_with(env)
    assert visible and message is None
    assert [g["index"] for g in gpus] == indices
    if env:  # the other job's busy GPUs never make this session look busy
        assert all(
            g["utilization"] == 0.0 and g["processes"] == [] for g in gpus if g["index"] in (1, 2)
        )


@pytest.mark.parametrize("value", ["", "NoDevFiles", "-1", "GPU-ffff"])
def test_a_visibility_naming_no_gpu_says_so(value):
    visible, message, gpus = _read_with({"CUDA_VISIBLE_DEVICES": value})
    assert (visible, gpus) == (False, [])
    assert (
        message
        == f"{NO_GPU_MESSAGE} (CUDA_VISIBLE_DEVICES={value} selects none of the 4 the driver sees)"
    )


def test_the_agent_reads_its_visibility_from_its_environment(monkeypatch):
    """What a Slurm job's agent does: no env argument, the process's own variables; the
    samples the watchdog judges idleness by hold the session's GPUs alone."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,2")
    sampler = Sampler(NvmlReader(RecordedNvml.from_file(DATA / FOUR)), interval_s=1.0, history_s=60)
    sample = sampler.sample(1000.0, kernel_busy=False)
    assert [g["index"] for g in sample["gpus"]] == [1, 2]
    assert max(g["utilization"] for g in sample["gpus"]) == 0.0  # idle, whatever GPUs 0 and 3 do
