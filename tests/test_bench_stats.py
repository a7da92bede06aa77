"""The figures every benchmark reports (bench/stats.py): a tail cannot hide behind a median."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from stats import (  # noqa: E402
    Stats,
    add_busy_argument,
    beside,
    busy_beside,
    percentile,
    write_section,
)


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


def _our_yes() -> list[int]:
    """The pids of `yes` processes this process started."""
    found = []
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)
        except OSError:
            continue
        if fields[0].endswith("(yes") and int(fields[1].split()[1]) == os.getpid():
            found.append(int(pid))
    return found


def test_busy_takes_a_count_and_starts_and_ends_that_many_busy_processes():
    ap = argparse.ArgumentParser()
    add_busy_argument(ap)
    assert [ap.parse_args(a).busy for a in ([], ["--busy"], ["--busy", "4"])] == [0, 1, 4]
    assert beside(4) == "four `yes > /dev/null` beside" and beside(0) == ""
    with busy_beside(2, settle_s=0.2):  # the load cannot show them in 0.2 s: it goes on
        assert len(_our_yes()) == 2
    assert _our_yes() == []
    with busy_beside(0):
        assert _our_yes() == []
