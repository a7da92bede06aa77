"""The figures every benchmark reports (bench/stats.py): a tail cannot hide behind a median."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from stats import Stats, percentile, write_section  # noqa: E402


def test_a_bimodal_tail_shows_in_p99_max_and_the_slow_share():
    times = [0.004] * 67 + [0.045] * 33  # a third of calls stall: the median alone looks fine
    s = Stats.of(times, direct_median=0.004)
    assert (s.median, s.p99, s.max) == (0.004, 0.045, 0.045)
    assert s.slow_share == 0.33
    assert s.cell() == "4.00 / 45.00 / 45.0 ms, 33% > 2x direct"
    assert percentile(list(range(1, 201)), 99) == 198  # nearest rank: a measured value


def test_write_section_replaces_only_its_block(tmp_path):
    doc = tmp_path / "b.md"
    doc.write_text("intro\n<!-- x:begin -->\nold\n<!-- x:end -->\nrest\n")
    write_section(doc, "x", "new")
    write_section(doc, "y", "other")
    assert (
        doc.read_text()
        == "intro\n<!-- x:begin -->\nnew\n<!-- x:end -->\nrest\n\n<!-- y:begin -->\nother\n<!-- y:end -->\n"
    )
