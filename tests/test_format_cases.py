"""The number formats of the notebook (gpusession.core.durations, gpusession.configuration.metrics) and of the
JupyterLab sidebar (labextension/src/format.ts) are one set of rules: tests/data/format_cases.json holds inputs and
the text they must give, written by the Python functions; this test holds Python to it and
labextension/test/format.test.ts holds the TypeScript functions to it.

The metric table travels in the file too ("metrics"), as `GET options` serves it: the TypeScript
formats each case with the row the server would send.

After changing a rule in gpusession/core/durations.py or a row of gpusession/configuration/metrics.py, rewrite the file and rerun both:
    python tests/test_format_cases.py --write
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

from gpusession.configuration.metrics import METRICS, metric_rows, metric_text
from gpusession.core.durations import format_duration, format_money
from gpusession.core.protocol import StopKind

CASES = Path(__file__).resolve().parent / "data" / "format_cases.json"

# Inputs worth pinning: rounding ties (Python rounds half to even, on the exact binary value),
# unit boundaries, clamping, thousands separators, signs, and numbers JavaScript prints in
# exponent form.
DURATION_INPUTS = [
    None,
    0,
    0.4,
    0.5,
    1.5,
    2.5,
    42,
    59.4,
    59.5,
    60,
    108,
    599.5,
    3599.4,
    3599.5,
    3599.6,
    3600,
    3661,
    86400,
    90061,
    1e7,
    -5,
    -0.4,
]
MONEY_INPUTS = [
    0,
    0.0001,
    0.00005,
    0.00015,
    0.03125,
    0.125,
    0.5,
    0.526,
    0.99994,
    0.999949,
    0.99995,
    1,
    1.005,
    1.015,
    1.125,
    2.675,
    12.3,
    999.995,
    1234.5,
    1234567.891,
    -0.0,
    -0.5,
    -1234.5,
    1e21,
    1.2345678901234567e19,
]

# Per metric (its key): (value, limit) in the stats document's units. Every row has cases: rounding
# ties, a value without its limit, a board that does not report it, memory below a GiB.
METRIC_INPUTS: dict[str, list[list[float | None]]] = {
    "util": [[97.0, None], [0.5, None], [1.5, None], [100.0, None], [None, None]],
    "memory": [
        [10450 * 2**20, 15360 * 2**20],
        [76 * 2**20, 15360 * 2**20],
        [2**30, 80 * 2**30],
        [10450 * 2**20, None],
        [None, 15360 * 2**20],
    ],
    "temp": [[70.0, None], [38.0, None], [38.5, None], [None, None]],
    "power": [[67.2, 70.0], [67.5, 70.0], [250.0, 400.0], [67.2, None], [None, 70.0]],
    "sm-clock": [[1590, None], [210, None], [None, None]],
    "cpu": [[3.0, None], [250.4, None], [None, None]],
    "ram": [[76 * 2**20, int(23.5 * 2**30)], [2 * 2**30, 16 * 2**30], [None, 16 * 2**30]],
}


def _metric_cases() -> list[list]:
    by_key = {m.key: m for m in METRICS}
    return [
        [key, value, limit, metric_text(by_key[key], value, limit)]
        for key, inputs in METRIC_INPUTS.items()
        for value, limit in inputs
    ]


def _cases() -> dict:
    if not CASES.exists():  # only while --write makes it; the first test then fails
        return {"duration": [], "money": [], "metrics": {"table": [], "cases": []}}
    return json.loads(CASES.read_text(encoding="utf-8"))


def test_the_file_covers_the_inputs_listed_here():
    cases = _cases()
    assert [c[0] for c in cases["duration"]] == DURATION_INPUTS
    assert [c[0] for c in cases["money"]] == MONEY_INPUTS
    assert any(
        c[0] is not None and math.copysign(1, c[0]) < 0 and c[0] == 0 for c in cases["money"]
    )


def test_the_stop_kinds_are_the_protocols():
    """labextension/test/format.test.ts holds the sidebar's STOP_KINDS to the same list."""
    assert _cases()["stop_kinds"] == [k.value for k in StopKind]


def test_the_file_holds_the_metric_table_as_served():
    """The TypeScript formats with the rows of this file: they must be the table GET options serves."""
    assert _cases()["metrics"]["table"] == metric_rows()
    assert sorted(METRIC_INPUTS) == sorted(m.key for m in METRICS), "every metric needs its cases"


@pytest.mark.parametrize(
    "key, value, limit, expected", _cases().get("metrics", {}).get("cases", [])
)
def test_metric_text(key, value, limit, expected):
    metric = next(m for m in METRICS if m.key == key)
    assert metric_text(metric, value, limit) == expected


@pytest.mark.parametrize("seconds, expected", _cases()["duration"])
def test_format_duration(seconds, expected):
    assert format_duration(seconds) == expected


@pytest.mark.parametrize("dollars, expected", _cases()["money"])
def test_format_money(dollars, expected):
    assert format_money(dollars) == expected


def _write() -> None:
    cases = {
        "duration": [[x, format_duration(x)] for x in DURATION_INPUTS],
        "money": [[x, format_money(x)] for x in MONEY_INPUTS],
        "stop_kinds": [k.value for k in StopKind],
    }
    metric_cases = {"table": metric_rows(), "cases": _metric_cases()}
    lines = ["{"]
    for key in cases:
        lines.append(f'  "{key}": [')
        rows = [f"    {json.dumps(row, ensure_ascii=False)}" for row in cases[key]]
        lines.append(",\n".join(rows))
        lines.append("  ],")
    lines.append('  "metrics": {')
    for i, key in enumerate(metric_cases):
        lines.append(f'    "{key}": [')
        rows = [f"      {json.dumps(row, ensure_ascii=False)}" for row in metric_cases[key]]
        lines.append(",\n".join(rows))
        lines.append("    ]" + ("," if i < len(metric_cases) - 1 else ""))
    lines.append("  }")
    lines.append("}")
    CASES.write_text("\n".join(lines) + "\n", encoding="utf-8")


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit(__doc__)
    _write()
    print(f"wrote {CASES}")
