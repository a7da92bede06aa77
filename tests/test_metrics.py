"""A metric is defined once (gpusession/configuration/metrics.py): a row added to the table is served with
`GET options` (where the sidebar and the charts take it from) and shows in the notebook's words and
on the ipywidgets card, with no other edit. The sampler filling its field is the other half."""

from __future__ import annotations

import dataclasses
import json

import pytest

from gpusession.configuration import metrics
from gpusession.configuration.metrics import Metric
from gpusession.widgets.card import GpuGauges
from gpusession.words.status import status_lines

# What a contributor would add for the fans (NVML nvmlDeviceGetFanSpeed, percent of the maximum).
FAN = Metric("fan_speed", "gpu", "fan", "Fan", "Fan", "%", 1, 0, top=100)
GPU = {
    "index": 0,
    "name": "Tesla T4",
    "utilization": 97.0,
    "memory_used": 10450 * 2**20,
    "memory_total": 15360 * 2**20,
    "temperature": 70.0,
    "power_draw": 67.2,
    "power_limit": 70.0,
    "sm_clock": 1590,
    "fan_speed": 41.6,
    "processes": [],
}
STATS = {
    "gpus_visible": True,
    "samples": [
        {
            "t": 1.0,
            "gpus": [GPU],
            "cpu_percent": 3.0,
            "memory_used": 76 * 2**20,
            "memory_total": 16 * 2**30,
            "kernel_busy": False,
        }
    ],
    "idle": {},
    "cost": {},
    "runtime": {},
    "warnings": [],
}


@pytest.fixture
def fan_row(monkeypatch):
    monkeypatch.setattr(metrics, "METRICS", (*metrics.METRICS, FAN))


def test_the_faces_read_the_table():
    lines = status_lines(STATS)
    assert (
        lines[0]
        == "  GPU 0 Tesla T4: Util 97%, Mem 10.2/15.0 GiB, Temp 70 °C, Power 67/70 W, SM 1590 MHz"
    )
    assert lines[1] == "  CPU 3%, RAM 76 MiB/16.0 GiB, kernel idle"
    gauges = GpuGauges(0)
    gauges.show(GPU)
    assert [g.text.value for g in gauges.gauges.values()] == [
        "97%",
        "10.2/15.0 GiB",
        "70 °C",
        "67/70 W",
    ]


def test_a_new_row_shows_in_the_words_and_on_the_widget(fan_row):
    assert status_lines(STATS)[0].endswith(", SM 1590 MHz, Fan 42%")
    gauges = GpuGauges(0)
    gauges.show(GPU)
    assert gauges.gauges["fan"].text.value == "42%" and gauges.gauges["fan"].bar.max == 100
    assert gauges.gauges["fan"].bar.description == "Fan"


async def test_a_new_row_is_served_with_the_options(fan_row, jp_fetch):
    reply = await jp_fetch("gpusession", "api", "options")
    served = json.loads(reply.body)["metrics"]
    assert served[-1] == dataclasses.asdict(FAN)
    assert [m["key"] for m in served] == [
        "util",
        "memory",
        "temp",
        "power",
        "sm-clock",
        "cpu",
        "ram",
        "fan",
    ]
