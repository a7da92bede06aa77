"""Latency figures the benchmarks report: never a median alone.

s = Stats.of(times_s, direct_median_s)   # seconds in, figures out
s.cell()  -> "8.51 / 60.2 / 71.0 ms, 33% > 2x direct"
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import re
import statistics
import subprocess
import time
from pathlib import Path


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100), nearest-rank: a value that was measured, never interpolated."""
    if not values:
        raise ValueError("no values")
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


@dataclasses.dataclass(frozen=True)
class Stats:
    n: int
    median: float
    p99: float
    max: float
    slow_share: (
        float | None
    )  # share of calls over 2x the direct median (None: no direct median given)

    @classmethod
    def of(cls, values: list[float], direct_median: float | None = None) -> "Stats":
        slow = (
            None
            if direct_median is None
            else sum(v > 2 * direct_median for v in values) / len(values)
        )
        return cls(
            len(values), statistics.median(values), percentile(values, 99), max(values), slow
        )

    def cell(self, unit: str = "ms", scale: float = 1e3, base: str = "direct") -> str:
        """median / p99 / max [, share over 2x direct] as one table cell."""
        text = f"{self.median * scale:.2f} / {self.p99 * scale:.2f} / {self.max * scale:.1f} {unit}"
        if self.slow_share is not None:
            text += f", {self.slow_share:.0%} > 2x {base}"
        return text


def load() -> float:
    """The machine's 1-minute load average now (printed beside each run: a ratio measured on a
    busy machine says so)."""
    return os.getloadavg()[0]


def load_span(values: list[float]) -> str:
    """'load 2.1-4.3 on 2 cores' for the loads seen over some runs."""
    low, high = min(values), max(values)
    span = f"{low:.1f}" if round(low, 1) == round(high, 1) else f"{low:.1f}-{high:.1f}"
    return f"load {span} on {os.cpu_count()} cores"


def add_busy_argument(ap) -> None:
    """`--busy [N]`: N busy CPU processes (`yes > /dev/null`) beside the runs; `--busy` alone is
    one (issue 35's loaded runs), `--busy 4` its load 4 for the warm start."""
    ap.add_argument(
        "--busy",
        nargs="?",
        type=int,
        const=1,
        default=0,
        metavar="N",
        help="N `yes > /dev/null` beside the runs (1 when no N is given); the runs begin once "
        "the 1-minute load shows them",
    )


def beside(count: int) -> str:
    """'one `yes > /dev/null` beside' / 'four ...' for a table's note; '' for none."""
    if not count:
        return ""
    words = {1: "one", 2: "two", 3: "three", 4: "four", 5: "five", 6: "six"}
    return f"{words.get(count, str(count))} `yes > /dev/null` beside"


@contextlib.contextmanager
def busy_beside(count: int, settle_s: float = 300.0):
    """`count` busy CPU processes (`yes > /dev/null`) beside the runs, as issue 35 measures;
    killed on the way out. The 1-minute load average each row prints takes minutes to show
    them: the runs begin once it is within 0.3 of `count` (at most `settle_s`), else a run begun
    at once printed the idle machine's load beside `yes` (4 busy processes: ~3 minutes)."""
    if count <= 0:
        yield
        return
    busy = [subprocess.Popen(["yes"], stdout=subprocess.DEVNULL) for _ in range(count)]
    try:
        deadline = time.monotonic() + settle_s
        said = 0.0
        while load() < count - 0.3 and time.monotonic() < deadline:
            if time.monotonic() - said > 30:
                print(f"  waiting for the load to show {count} busy: {load():.1f}", flush=True)
                said = time.monotonic()
            time.sleep(1)
        yield
    finally:
        for one in busy:
            one.kill()
            one.wait()


def write_section(path: Path, name: str, body: str) -> None:
    """Replace the generated block `name` (between <!-- name:begin/end --> markers) in `path`."""
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    text = path.read_text() if path.exists() else ""
    block = f"{begin}\n{body}\n{end}"
    if begin in text:
        text = re.sub(re.escape(begin) + ".*?" + re.escape(end), lambda _: block, text, flags=re.S)
    else:
        text += ("\n" if text else "") + block + "\n"
    path.write_text(text)


def report(rows: list[tuple], note: str, write: str | None, name: str) -> int:
    """Print rows (measure, ours, floor, ratio, target, met) as the benchmarks' table and `note`,
    and write them into the `name` block of `write` when given; the exit status: 0 when every
    row with a target met it. A row without a target is a figure, not a check."""
    table = ["| measure | ours | floor | ratio | target | met |", "|---|---|---|---|---|---|"]
    table += [
        f"| {a} | {b} | {c} | {r:.2f}x | {t} | {'yes' if ok else ('NO' if t else '')} |"
        for a, b, c, r, t, ok in rows
    ]
    print("\n".join(table))
    print(note)
    if write:
        write_section(Path(write), name, "\n".join(table) + "\n\n" + note)
    return 0 if all(r[-1] for r in rows) else 1
