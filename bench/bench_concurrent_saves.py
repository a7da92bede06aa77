"""Two saves into one workspace at once, in a loop: the fault figures of concurrent saves.

    python bench/bench_concurrent_saves.py [--rounds 100] [--write docs/benchmarks.md]

Each round, two processes run `gpusession.agent.checkpoint.save` into the same workspace folder
at the same instant (12 variables of 300 kB each and a tag naming the process); then a restore
reads the workspace. Figures: rounds that landed (the restore is one of the two saves, whole),
saves that said saved but lost what they saved (must be 0), saves that said they did not land
(allowed: said, not silent), and the median / p99 / max seconds of one save. (Two *sessions*
never share a workspace: the store refuses the second; these are the saves of kernels that
share it anyway, e.g. a session's save and a restarted kernel's.) tests/test_checkpoint.py runs a
bounded slice.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from gpusession.agent import checkpoint  # noqa: E402

SAVER = """
import sys, time
from gpusession.agent import checkpoint
ws, tag, at = sys.argv[1], sys.argv[2], float(sys.argv[3])
ns = {f"v{i}": bytes([i]) * 300_000 for i in range(12)}
ns["tag"] = tag
while time.time() < at:
    time.sleep(0.001)
t0 = time.perf_counter()
r = checkpoint.save(ns, ws, deadline=time.time() + 60, cap_bytes=None)
print(int(r["committed"]), time.perf_counter() - t0, flush=True)
"""


def concurrent_saves(ws: Path, rounds: int) -> dict:
    """Two processes save into `ws` at once, `rounds` times; the figures (and `seconds`, one per save)."""
    figures: dict = {
        "rounds": rounds,
        "landed": 0,
        "said_saved_but_lost": 0,
        "said_not_saved": 0,
        "seconds": [],
    }
    code = textwrap.dedent(SAVER)
    env_path = str(ROOT)
    for _ in range(rounds):
        at = (
            time.time() + 0.8
        )  # both processes are up by then: they start saving at the same instant
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", code, str(ws), tag, str(at)],
                stdout=subprocess.PIPE,
                text=True,
                env={"PYTHONPATH": env_path},
            )
            for tag in ("A", "B")
        ]
        said = [p.communicate(timeout=120)[0].split() for p in procs]
        ns: dict = {}
        report = checkpoint.restore(ns, str(ws))
        whole = (
            not report["failed"]
            and ns.get("tag") in ("A", "B")
            and len(ns) == 13
            and all(ns[f"v{i}"] == bytes([i]) * 300_000 for i in range(12))
        )
        saids = [bool(s) and s[0] == "1" for s in said]
        figures["seconds"] += [float(s[1]) for s in said if len(s) == 2]
        figures["said_not_saved"] += saids.count(False)
        if whole:
            figures["landed"] += 1
        elif any(saids):
            figures["said_saved_but_lost"] += 1
    return figures


def main() -> None:
    from stats import Stats, write_section

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument(
        "--write",
        default=None,
        help="write the figures into this markdown file (docs/benchmarks.md)",
    )
    args = ap.parse_args()
    ws = Path(tempfile.mkdtemp(prefix="bench-concurrent-saves-"))
    try:
        f = concurrent_saves(ws, args.rounds)
    finally:
        shutil.rmtree(ws, ignore_errors=True)
    s = Stats.of(f["seconds"])
    text = (
        f"Two saves into one workspace at once, {f['rounds']} rounds: {f['landed']} landed whole, "
        f"{f['said_saved_but_lost']} said saved but lost, {f['said_not_saved']} said not saved; "
        f"one save (3.6 MB, 13 variables) {s.cell()}."
    )
    print(text)
    if args.write:
        write_section(Path(args.write), "bench_concurrent_saves", text)
    sys.exit(1 if f["said_saved_but_lost"] else 0)


if __name__ == "__main__":
    main()
