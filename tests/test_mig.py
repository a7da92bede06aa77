"""MIG slices (issue 34 §4) on data: the catalog's slice types with their share of the card and
of its price; the box side picking a free slice of an A100 split into 7 (a recording stands in,
tests/data/nvml_a100_mig.json); the agent reading only its slice, with memory and no
utilization; 'n/a (MIG)' in the words; the idle rule counting a slice's memory activity."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpusession.agent.idle import MIG_MEMORY_STEP, ActivityTracker
from gpusession.agent.nvml import NvmlReader, RecordedNvml
from gpusession.backends.aws.instances import instance_table
from gpusession.backends.docker import gpus
from gpusession.backends.docker.pools import type_matches
from gpusession.configuration.agentargs import AgentArgs
from gpusession.configuration.catalog import load_catalog
from gpusession.core.errors import BadInput
from gpusession.words.status import MIG_UTILIZATION, gpu_lines

DATA = Path(__file__).parent / "data"
MIG = json.loads((DATA / "nvml_a100_mig.json").read_text())
SLICES = MIG["frames"][0]["devices"][0]["mig_devices"]


def test_slice_types_have_their_share_of_the_card_and_of_its_price():
    cat = load_catalog()
    one = cat.get("a100-1g.10gb")
    card = cat.get("a100-80gb")
    assert one.is_mig and one.mig_of == "a100-80gb" and one.share == pytest.approx(1 / 7)
    assert one.memory_gb == 10
    assert cat.price_per_hour(one, 1) == pytest.approx(card.rate / 7, abs=1e-6)
    assert cat.get("h100-3g.40gb").rate == pytest.approx(cat.get("h100").rate * 3 / 7, abs=1e-6)
    assert "MIG slice: 1/7 of a100-80gb" in cat.table()
    # no cloud sells a slice: aws refuses it by name, --gpu-mem lists never offer one
    with pytest.raises(BadInput, match="MIG slice of a100-80gb: no cloud instance"):
        instance_table().instance_for(one, 1)
    assert all(not t.is_mig for t in cat.whole_types())
    # the whole cards' relative speeds are as before (the slowest whole card is 1.0)
    assert cat.relative_throughput(cat.get("t4")) == 1.0


@pytest.mark.parametrize(
    "name, gpu_type, matches",
    [
        ("NVIDIA A100-SXM4-80GB MIG 1g.10gb", "a100-1g.10gb", True),
        ("NVIDIA A100-SXM4-80GB MIG 1g.10gb", "a100-2g.20gb", False),
        ("NVIDIA A100-SXM4-80GB MIG 1g.10gb", "a100-80gb", False),  # a slice is no card
        ("NVIDIA A100-SXM4-80GB", "a100-1g.10gb", False),
    ],
)
def test_a_slice_is_of_its_profile_only(name, gpu_type, matches):
    assert type_matches(name, gpu_type) is matches


def test_a_free_slice_is_picked_and_the_split_card_never_whole():
    box = gpus.from_recording(MIG)
    assert box[0].split and [g.slot for g in box[1:]] == list(range(7))
    slices = [g for g in box if type_matches(g.name, "a100-1g.10gb")]
    held = gpus.holders(
        [
            {
                "Name": "/bob",
                "State": {"Status": "running"},
                "Config": {"Labels": {"gpusession.owner": "bob@lab:1", gpus.NAME_LABEL: "s"}},
                "HostConfig": {"DeviceRequests": [{"DeviceIDs": [SLICES[2]["uuid"]]}]},
            }
        ]
    )
    (chosen,) = gpus.pick(slices, held, 1)
    assert chosen.uuid == SLICES[3]["uuid"] and chosen.label == "GPU 0 slice 3"
    # slices 0 and 1 run others' processes, 2 is bob's: the line names each slice
    line = gpus.refusal("ssh://a100box", slices, held, 5)
    assert "GPU 0 slice 0: another process" in line and "GPU 0 slice 2: bob's s" in line
    assert "4 of its 7 free" in line
    # a container pinned to the whole card holds every slice of it
    card = gpus.holders(
        [
            {
                "State": {"Status": "running"},
                "Name": "/x",
                "HostConfig": {"DeviceRequests": [{"DeviceIDs": [box[0].uuid]}]},
            }
        ]
    )
    assert gpus.pick(slices, card, 1) is None


def test_the_agent_of_a_slice_reads_its_memory_and_no_utilization():
    env = {"NVIDIA_VISIBLE_DEVICES": SLICES[4]["uuid"]}
    visible, _, read = NvmlReader(RecordedNvml(MIG), env=env).read()
    (mine,) = read
    assert visible and mine["uuid"] == SLICES[4]["uuid"] and mine["mig"] == "1g.10gb"
    assert mine["utilization"] is None and mine["memory_total"] == 9984 * 1024 * 1024
    assert mine["parent"] == 0 and mine["slot"] == 4
    (line,) = gpu_lines({"gpus": [dict(mine, processes=[])]})
    assert line.startswith("  GPU 0 slice 4 NVIDIA A100-SXM4-80GB MIG 1g.10gb:")
    assert f"Util {MIG_UTILIZATION}" in line and "Util 0%" not in line
    # a slice nobody has: said, not a GPU made up
    gone = NvmlReader(RecordedNvml(MIG), env={"NVIDIA_VISIBLE_DEVICES": "MIG-0000"}).read()
    assert gone[0] is False and "no MIG slice of MIG-0000" in gone[1]


def test_idle_counts_a_slices_memory_activity_under_gpu_only():
    """--gpu-only on a slice (no utilization to read): memory moving by MIG_MEMORY_STEP is GPU
    work, memory held still is not; the idle clock runs from the last move."""
    t0 = 1_000_000.0
    tr = ActivityTracker(AgentArgs(idle=60, gpu_only=True), billed_since=t0)
    base = 100 << 20

    def seen(at, memory):
        tr.observe(
            at, kernel_busy=False, kernel_last_activity=None, gpu_utils=[], slice_memory=[memory]
        )
        return tr.evaluate(at)

    seen(t0, base)
    seen(t0 + 30, base + 1024)  # a few KiB: noise
    assert seen(t0 + 50, base + MIG_MEMORY_STEP + 1024).stop_reason is None  # a tensor came
    assert seen(t0 + 100, base + MIG_MEMORY_STEP + 1024).stop_reason is None  # 50 s since
    assert seen(t0 + 111, base + MIG_MEMORY_STEP + 1024).stop_reason.kind.name == "IDLE"


def test_the_widget_card_says_n_a_mig_for_a_slices_utilization():
    from gpusession.widgets.card import MetricGauges

    visible, _, (mine,) = NvmlReader(
        RecordedNvml(MIG), env={"NVIDIA_VISIBLE_DEVICES": SLICES[4]["uuid"]}
    ).read()
    gauges = MetricGauges("gpu")
    gauges.show(mine)
    assert gauges.gauges["util"].text.value == MIG_UTILIZATION
    assert gauges.gauges["memory"].text.value == "13 MiB/9.8 GiB"


def test_a_real_box_lists_its_slices_with_nvidia_smi():
    output = (
        "nvidia-smi\n"
        "0, GPU-aaa, NVIDIA A100-SXM4-80GB, 12000, 81920, [N/A]\n"
        "1, GPU-bbb, NVIDIA A100-SXM4-80GB, 3, 81920, 0\n"
        "----\n"
        "----\n"
        "GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-aaa)\n"
        "  MIG 1g.10gb     Device  0: (UUID: MIG-111)\n"
        "  MIG 1g.10gb     Device  1: (UUID: MIG-222)\n"
        "GPU 1: NVIDIA A100-SXM4-80GB (UUID: GPU-bbb)\n"
    )
    box, source = gpus.parse_reading(output)
    assert source == "nvidia-smi"
    assert [(g.uuid, g.split, g.slot) for g in box] == [
        ("GPU-aaa", True, None),
        ("MIG-111", False, 0),
        ("MIG-222", False, 1),
        ("GPU-bbb", False, None),
    ]
    slices = [g for g in box if type_matches(g.name, "a100-1g.10gb")]
    assert [g.uuid for g in gpus.pick(slices, {}, 2)] == ["MIG-111", "MIG-222"]
    whole = [g for g in box if not g.split and type_matches(g.name, "a100-80gb")]
    assert [g.uuid for g in whole] == ["GPU-bbb"]


def test_the_box_script_runs_nvidia_smi_where_there_is_no_recording(tmp_path, monkeypatch):
    """A stand-in nvidia-smi on PATH (what the driver's would print for these queries)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(
        "#!/bin/sh\n"
        'case "$1" in\n'
        "  --query-gpu=*) echo '0, GPU-aaa, NVIDIA A100-SXM4-80GB, 3, 81920, [N/A]' ;;\n"
        "  --query-compute-apps=*) ;;\n"
        "  -L) echo 'GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-aaa)';"
        " echo '  MIG 3g.40gb     Device  0: (UUID: MIG-333)' ;;\n"
        "esac\n"
    )
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    monkeypatch.setenv("HOME", str(tmp_path))  # no recording there
    box, source = gpus.read_box(None, None)
    assert source == "nvidia-smi"
    assert [(g.uuid, g.name) for g in box if not g.split] == [
        ("MIG-333", "NVIDIA A100-SXM4-80GB MIG 3g.40gb")
    ]
