"""The save of a kernel's namespace (gpusession.agent.checkpoint.save) against writing the same
bytes with `numpy.save`, in one run.

    python bench/bench_checkpoint.py [--sizes 1KB,1MB,100MB,1GB,2GB] [--runs 5] [--dir DIR]
                                     [--write docs/benchmarks.md]
    python bench/bench_checkpoint.py --sessions local,docker,aws

--sessions: the round trip of tests/test_saved_arrays.py (arrays made in a real kernel, `stop
--save`, `--resume`, digests compared in the new kernel) with a 2 GB array added, on each backend
named (docker and aws: the image gpusession-ci/py-numpy; aws: moto and the namespace host);
prints passed/failed and the wall time of each.

Per size: a numpy array of random bytes saved by `checkpoint.save` into a workspace folder on
DIR's file system (one variable: its pickle with the array's protocol-5 buffer written as is, the
file fsync'ed, the index and manifest written and fsync'ed, the manifest read back before it
says saved), then restored and compared. The floor is `numpy.save` of the same array into a
file in DIR followed by `fsync` (we fsync: that is the honest floor); plain `numpy.save` (the
page cache, no fsync) is printed beside it. Each figure: median / p99 / max seconds over the
runs, MB/s of the medians, and ratios of throughputs (>= 0.8x against numpy.save + fsync is the
target for the rate from 100 MB up, issue 35; from 1 KB to 1 MB, where the atomic commit's fixed cost
shows, within 3x the floor's time). The machine's 1-minute load after each run is in the table;
--busy [N] runs N `yes > /dev/null` beside (one without N).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from gpusession.agent import checkpoint  # noqa: E402
from stats import Stats, add_busy_argument, busy_beside, load, load_span, write_section  # noqa: E402

UNITS = {"KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30}  # 1024-based: 2GB is 2 GiB


def parse_size(text: str) -> int:
    return int(float(text[:-2]) * UNITS[text[-2:].upper()])


def _numpy_save(arr, path: Path, sync: bool) -> float:
    t0 = time.perf_counter()
    with open(path, "wb") as f:
        np.save(f, arr, allow_pickle=False)
        if sync:
            f.flush()
            os.fsync(f.fileno())
    took = time.perf_counter() - t0
    path.unlink()
    _settle()
    return took


def _settle() -> None:
    """Untimed, after each step: the file system's pending work done (dirty pages written, the
    blocks the step freed committed). With online discard, blocks freed by an unlink are
    discarded by the next journal commit: whichever fsync came next paid for the other side's
    removed gigabyte (the save right after the floor's unlink, the floor right after the
    previous checkpoint's removal). A user's saves are minutes apart: the periodic commit
    (5 s) has done that work by then."""
    os.sync()


def _ours(arr, ws: Path) -> float:
    t0 = time.perf_counter()
    result = checkpoint.save({"a": arr}, str(ws), deadline=time.time() + 600, cap_bytes=None)
    took = time.perf_counter() - t0
    assert result["committed"] and result["saved"] == 1, result
    # the rest of the save comes after its answer (the rename made durable, the previous
    # checkpoint removed: checkpoint._tidy); waited for here, untimed, so that it does not run
    # into the floor's next write nor hold up our next save
    checkpoint.tidied(600)
    _settle()
    return took


def measure(size: int, runs: int, where: Path) -> dict:
    arr = np.frombuffer(os.urandom(min(size, 1 << 24)), dtype=np.uint8)
    arr = np.resize(arr, size)  # random bytes (no file system compresses them away), cheaply
    ws = where / "ws"
    times: dict[str, list[float]] = {"ours": [], "numpy_fsync": [], "numpy": []}
    loads = []
    steps = {
        "numpy_fsync": lambda: _numpy_save(arr, where / "floor.npy", sync=True),
        "ours": lambda: _ours(arr, ws),
        "numpy": lambda: _numpy_save(arr, where / "plain.npy", sync=False),
    }
    order = list(steps)
    for run in range(runs):  # interleaved: the machine's load falls on all three alike; the
        # order turns each run, so that none always follows the removal of the last one's
        # gigabyte (a file system that discards freed blocks is busy with it for a while)
        for name in order[run % 3 :] + order[: run % 3]:
            times[name].append(steps[name]())
        loads.append(load())
    ns: dict = {}
    report = checkpoint.restore(ns, str(ws))
    assert report["restored"] == ["a"] and np.array_equal(ns["a"], arr), report
    shutil.rmtree(ws)
    return dict({k: Stats.of(v) for k, v in times.items()}, loads=loads)


def table(rows: list[tuple[str, int, dict]], runs: int, where: str) -> str:
    lines = [
        f"Save of one numpy array, {runs} runs per size, on {where} (median / p99 / max ms; MB/s of the "
        "medians; ratio: our throughput over the other's).",
        "",
        "| size | checkpoint.save | numpy.save + fsync (floor) | numpy.save (no fsync) | ours MB/s "
        "| vs floor | target | met | vs plain numpy.save | load |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for label, size, s in rows:
        o, f, p = s["ours"], s["numpy_fsync"], s["numpy"]
        aim, met = _target(size, f.median / o.median)
        lines.append(
            f"| {label} | {o.cell()} | {f.cell()} | {p.cell()} | "
            f"{size / o.median / 1e6:.0f} | {f.median / o.median:.2f}x | {aim} | {met} "
            f"| {p.median / o.median:.2f}x | {load_span(s['loads'])} |"
        )
    return "\n".join(lines)


def _target(size: int, ratio: float) -> tuple[str, str]:
    """Issue 35: a save of 1 KB-1 MB within 3x numpy.save + fsync (a ratio >= 0.33x), from
    100 MB up >= 0.9x; between them, no target."""
    if size <= 1 << 20:
        aim, floor = "<= 3x its time (>= 0.33x)", 1 / 3
    elif size >= 100 << 20:
        aim, floor = ">= 0.9x", 0.9
    else:
        return "", ""
    return aim, "yes" if ratio >= floor else "**no**"


SESSION_TESTS = {"local": "local_backend and not 2gb", "docker": "docker_engine", "aws": "on_aws"}


def sessions(backends: list[str]) -> bool:
    ok = True
    for backend in backends:
        t0 = time.monotonic()
        run = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                str(ROOT / "tests" / "test_saved_arrays.py"),
                "-q",
                "-rs",
                "--timeout",
                "1800",
                "-k",
                SESSION_TESTS[backend],
            ],
            cwd=ROOT,
            env=dict(os.environ, GPUSESSION_BENCH_BIG_ARRAY="1"),
            capture_output=True,
            text=True,
        )
        last = (run.stdout.strip().splitlines() or ["?"])[-1]
        print(
            f"{backend}: 1 KB-2 GB arrays, save and resume: {last} ({time.monotonic() - t0:.0f} s wall)",
            flush=True,
        )
        ok = ok and run.returncode == 0 and "passed" in last and "skipped" not in last
        if run.returncode:
            print(run.stdout[-3000:])
    return ok


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--sessions",
        default=None,
        help="backends for the 2 GB round trip through sessions: " + ",".join(SESSION_TESTS),
    )
    ap.add_argument("--sizes", default="1KB,1MB,100MB,1GB,2GB")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--dir", default=None, help="where to write (default: a temporary folder)")
    add_busy_argument(ap)
    ap.add_argument(
        "--write", default=None, help="write the table into this markdown file (docs/benchmarks.md)"
    )
    args = ap.parse_args()
    if args.sessions:
        sys.exit(0 if sessions(args.sessions.split(",")) else 1)
    where = Path(tempfile.mkdtemp(prefix="bench-ckpt-", dir=args.dir))
    try:
        rows = []
        with busy_beside(args.busy):
            _measure_all(args, rows, where)
    finally:
        shutil.rmtree(where, ignore_errors=True)
    _say(args, rows)


def _measure_all(args, rows: list, where: Path) -> None:
    for label in args.sizes.split(","):
        size = parse_size(label)
        rows.append((label, size, measure(size, args.runs, where)))
        print(table(rows[-1:], args.runs, str(where)).splitlines()[-1], flush=True)


def _say(args, rows: list) -> None:
    text = table(
        rows,
        args.runs,
        f"{os.cpu_count()} cores, the file system of {args.dir or tempfile.gettempdir()}",
    )
    print(text)
    ok = all(
        _target(size, s["numpy_fsync"].median / s["ours"].median)[1] != "**no**"
        for _, size, s in rows
    )
    print(
        "targets (1 KB-1 MB within 3x numpy.save + fsync, >= 0.9x from 100 MB up): "
        + ("met" if ok else "NOT met")
    )
    if args.write:
        write_section(Path(args.write), "bench_checkpoint", text)


if __name__ == "__main__":
    main()
