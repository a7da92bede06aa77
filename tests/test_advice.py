"""Right-sizing advice (gpusession/configuration/advice.py): recorded NVML series (tests/data/usage_*.json,
in `nvml-record`'s format) through the agent's real sampler and usage tracker, then the rules and
the one formatter; and the faces (`gpusession advice`, the stop line, the card) on real local
sessions whose agent replays those recordings."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from test_cli import cli  # the command line as a user runs it

from gpusession.agent.nvml import NvmlReader, RecordedNvml
from gpusession.agent.sampler import Sampler
from gpusession.agent.usage import UsageTracker
from gpusession.configuration.advice import MIN_SAMPLES, advice_document
from gpusession.configuration.catalog import load_catalog
from gpusession.core.errors import RemoteError
from gpusession.core.protocol import is_out_of_memory
from gpusession.words.spend import advice_line, advice_lines
from support.waits import wait_until

DATA = Path(__file__).parent / "data"


def replayed_usage(recording: str, samples: int = 40, oom_errors: int = 0) -> dict:
    """The `usage` an agent's summary carries after `samples` seconds of `recording`."""
    sampler = Sampler(NvmlReader(RecordedNvml.from_file(DATA / recording), env={}))
    usage = UsageTracker()
    for i in range(samples):
        usage.add(sampler.sample(1000.0 + i, kernel_busy=True))
    usage.saw_activity({"oom_errors": oom_errors})
    return usage.summary()


def advice_for(recording: str, gpu_type: str, count: int = 1, hours: float = 2.0, **kw) -> dict:
    summary = {"usage": replayed_usage(recording, **kw), "duration_s": hours * 3600}
    return advice_document(
        summary, gpu_type=gpu_type, gpu_count=count, spot=False, catalog=load_catalog()
    )


def test_idle_a100_is_told_a_t4_would_have_held_it():
    doc = advice_for("usage_idle_a100.json", "a100")
    assert doc["advice"]["kind"] == "smaller"
    assert advice_line(doc) == (
        "advice: peak 3.1 GiB and 3% mean utilization on 1 x a100 ($2.75/h): "
        "1 x t4 ($0.5260/h) would have held it: $2.22/h less ($4.44 less over this session). "
        "`%gpu start --type t4` next time"
    )


def test_saturated_t4_is_told_the_faster_type_it_needed():
    doc = advice_for("usage_saturated_t4.json", "t4")
    assert doc["advice"]["kind"] == "faster"
    line = advice_line(doc)
    assert line.startswith("advice: utilization stayed at 98% on 1 x t4 ($0.5260/h)")
    assert "1 x l4 ($0.8048/h), 1.86x the FP16 throughput" in line
    assert "$0.2788/h more" in line and "--type l4" in line


def test_memory_at_the_top_suggests_the_next_size_up():
    doc = advice_for("usage_oom_t4.json", "t4")
    assert doc["advice"]["kind"] == "bigger"
    assert "memory reached 14.9 GiB of 15.0 GiB on 1 x t4" in advice_line(doc)
    assert "the next size up is 1 x l4" in advice_line(doc)


def test_oom_errors_suggest_the_next_size_up_even_with_memory_to_spare():
    doc = advice_for("usage_saturated_t4.json", "t4", oom_errors=2)
    assert doc["advice"]["kind"] == "bigger"
    assert advice_line(doc).startswith("advice: 2 cell(s) ran out of GPU memory on 1 x t4")


def test_four_gpus_with_one_busy_are_told_one_would_have_done():
    doc = advice_for("usage_four_t4_one_busy.json", "t4", count=4)
    assert doc["advice"]["kind"] == "fewer"
    assert doc["advice"]["suggested_count"] == 1
    line = advice_line(doc)
    assert line.startswith("advice: 1 of 4 GPUs used (peak 9.0 GiB and 95% mean utilization)")
    assert "1 x t4 ($0.5260/h) would have done: $1.58/h less" in line


def test_no_advice_where_the_type_fitted_or_too_little_was_sampled():
    fitted = advice_for("usage_idle_a100.json", "t4")  # 3.1 GiB on a T4: the cheapest that holds it
    assert fitted["advice"] is None and advice_line(fitted) is None
    assert advice_lines("x", fitted)[1].startswith("no advice: no cheaper type")
    early = advice_for("usage_idle_a100.json", "a100", samples=MIN_SAMPLES - 1)
    assert early["figures"] is None
    assert advice_lines("x", early) == [
        f"x: no advice yet: {MIN_SAMPLES - 1} GPU sample(s), at least {MIN_SAMPLES} needed "
        "(one a second while a GPU is visible)"
    ]


@pytest.mark.parametrize(
    "text, oom",
    [
        (
            "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
            "capacity of 14.58 GiB of which 1.06 GiB is free.",
            True,
        ),
        ("RuntimeError: CUDA error: out of memory", True),
        (
            "ResourceExhaustedError: OOM when allocating tensor with shape[8192,8192] "
            "and type float on /job:localhost/replica:0/task:0/device:GPU:0",
            True,
        ),
        ("XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate", True),
        ("ValueError: index out of range", False),
        ("MemoryError: ", False),  # host memory: no bigger GPU helps
    ],
)
def test_out_of_memory_texts(text, oom):
    assert is_out_of_memory(text) is oom


def test_catalog_names_its_throughput_source():
    catalog = load_catalog()
    assert "NVIDIA data sheets" in catalog.throughput_source
    assert catalog.relative_throughput(catalog.get("t4")) == 1.0
    assert catalog.relative_throughput(catalog.get("a100")) == 4.8
    assert "FP16/FP32: per GPU, relative to the slowest type; NVIDIA data sheets" in catalog.table()


# -- the faces, on real local sessions whose agents replay the recordings ----------------------


@pytest.mark.integration
def test_advice_from_the_cli_the_stop_and_the_card(manager, nb_env):
    from gpusession.widgets.card import SessionCard

    def start(name, gpu_type, recording=None):
        extra = {"nvml_replay": str(DATA / recording)} if recording else {}
        return manager.start(
            manager.make_spec(gpu_type, backend="local", idle="off", name=name, **extra)
        )

    with ThreadPoolExecutor(3) as pool:  # three sessions at once: seconds, not three times that
        idle, oom, plain = pool.map(
            lambda args: start(*args),
            [
                ("idle-a100", "a100", "usage_idle_a100.json"),
                ("oom-t4", "t4", "usage_saturated_t4.json"),
                ("no-gpu", "t4"),  # no GPU visible: nothing to advise on
            ],
        )
    with pytest.raises(RemoteError, match="CUDA out of memory"):
        oom.run(
            "raise type('OutOfMemoryError', (RuntimeError,), {})("
            "'CUDA out of memory. Tried to allocate 2.00 GiB')"
        )

    # the replay climbs to its peak of 3.1 GiB in 13 samples (one a second, fewer on a busy
    # machine): the advice below is read once the agent has sampled that far
    def peak_gib() -> float:
        figures = manager.spend.advice("idle-a100").get("figures") or {}
        return (figures.get("memory_peak") or 0) / 2**30

    wait_until(lambda: peak_gib() >= 3.05, 90, "the replay to reach its 3.1 GiB peak", 0.5)

    r = cli(nb_env, "advice", "idle-a100")
    assert r.returncode == 0, r.stderr
    assert "idle-a100: peak 3.1 GiB (95th percentile" in r.stdout, r.stdout
    assert "1 x t4 ($0.5260/h) would have held it" in r.stdout
    assert "only advice: nothing changes by itself" in r.stdout
    assert "1 cell(s) ran out of GPU memory on 1 x t4" in advice_line(
        manager.spend.advice("oom-t4")
    )

    names = ("idle-a100", "oom-t4", "no-gpu")
    with ThreadPoolExecutor(3) as pool:
        stopped = dict(zip(names, pool.map(lambda name: cli(nb_env, "stop", name), names)))
    assert "advice: peak 3.1 GiB" in stopped["idle-a100"].stdout
    assert "would have held it" in stopped["idle-a100"].stdout
    assert "advice: 1 cell(s) ran out of GPU memory" in stopped["oom-t4"].stdout
    assert stopped["no-gpu"].returncode == 0 and "advice" not in stopped["no-gpu"].stdout

    card = SessionCard(manager.view(manager.get("idle-a100")), lambda c: None, lambda c: None)
    assert "1 x t4 ($0.5260/h) would have held it" in card.advice.value
    assert manager.view(manager.get(plain.id))["advice"] is None


@pytest.mark.integration
def test_the_magics_advice_and_report(notebook):
    """`%gpu advice` and `%gpu report` in a real notebook kernel (no GPU here: nothing sampled)."""
    assert notebook.run("%gpu start --type t4 --backend local --idle off --name m1").status == "ok"
    advice = notebook.run("%gpu advice")
    assert advice.text.strip() == (
        f"m1: no advice yet: 0 GPU sample(s), at least {MIN_SAMPLES} needed "
        "(one a second while a GPU is visible)"
    )
    report = notebook.run("%gpu report --by backend --since 1d")
    lines = report.text.strip().splitlines()
    assert lines[0].endswith("UTC, by backend") and lines[2].split()[:2] == ["local", "1"]
    assert "1 still running (counted up to now), 0 failed" in report.text
    bad = notebook.run("%gpu report --by colour")
    assert bad.status == "error" and "invalid choice: 'colour'" in bad.text
    stop = notebook.run("%gpu stop")
    assert "stopped m1" in stop.text and "advice" not in stop.text
