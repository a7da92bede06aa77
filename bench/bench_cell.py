"""The `%%gpu 1+1` cell as a user runs it: a real notebook kernel with `%load_ext gpusession`, a
session started with `%gpu start`, and cells `%%gpu\\n1+1` sent as a notebook front end sends them
(time: execute_request sent -> the cell's kernel idle again, its `2` shown).

    python bench/bench_cell.py [--cells 200] [--runs 3] [--write docs/benchmarks.md]

Sessions, each in its own notebook kernel, all alive at once and measured interleaved in rounds
of 25 cells:
- local backend (no container, no tunnel): the honest baseline of the magic itself;
- docker backend, local engine (the kernel's ports on this machine's loopback, no tunnel);
- docker backend, ssh:// engine (the namespace host of scripts/ci-remote-host.sh): through our
  tunnel to that host's sshd.
Targets: docker <= 1.5x the local backend's median and <= 2x its p99.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

from stats import Stats, write_section  # noqa: E402
from support.leftovers import remove_workspace_volumes  # noqa: E402
from support.notebook_kernel import NotebookKernel  # noqa: E402

IMAGE = os.environ.get("GPUSESSION_TEST_IMAGE", "gpusession/cuda:ci")
ROUND = 25


def notebook(env: dict, cwd: Path, start: str) -> NotebookKernel:
    nk = NotebookKernel(env, cwd=str(cwd))
    for code in ("%load_ext gpusession", start):
        r = nk.run(code, timeout=300)
        assert r.status == "ok" and not r.error, f"{code}: {r.text}"
    for _ in range(20):  # warm: imports, first messages
        cell(nk)
    return nk


def cell(nk: NotebookKernel) -> float:
    t = time.perf_counter()
    r = nk.run("%%gpu\n1+1", timeout=60)
    took = time.perf_counter() - t
    assert r.status == "ok" and r.text.strip() == "2", r.text
    return took


def measure(cells: int, remote_ok: bool) -> dict[str, list[float]]:
    work = Path(tempfile.mkdtemp(prefix="gs-cell-"))
    env = dict(
        os.environ,
        GPUSESSION_HOME=str(work / "home"),
        PYTHONUNBUFFERED="1",
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    )
    starts = {
        "local backend": "%gpu start --backend local --idle off",
        "docker, local engine": f"%gpu start --backend docker --image {IMAGE} --idle off",
    }
    if remote_ok:
        from support.hosts import ensure_remote_host, ssh_home

        remote = ensure_remote_host()
        if remote is not None:
            env["HOME"] = ssh_home(remote, work / "sshhome")
            starts["docker, ssh:// engine (our tunnel)"] = (
                f"%gpu start --backend docker --image {IMAGE} --idle off --host {remote['url']}"
            )
    books: dict[str, NotebookKernel] = {}
    try:
        for name, start in starts.items():
            books[name] = notebook(env, work, start)
        times: dict[str, list[float]] = {name: [] for name in books}
        left = cells
        while left > 0:
            n = min(ROUND, left)
            for name, nk in books.items():
                times[name] += [cell(nk) for _ in range(n)]
            left -= n
        return times
    finally:
        for nk in books.values():
            nk.close()
        remove_workspace_volumes(work / "home")  # its sessions' workspaces (gc keeps a user's)
        shutil.rmtree(work, ignore_errors=True)  # its store and session keys: it leaves nothing


def table(times: dict[str, list[float]], cells: int) -> tuple[str, bool]:
    base = Stats.of(times["local backend"])
    rows = [
        "| `%%gpu 1+1` cell, one notebook | median / p99 / max, share > 2x local median | median vs local | "
        "p99 vs local | target | met |",
        "|---|---|---|---|---|---|",
    ]
    ok = True
    for name, values in times.items():
        s = Stats.of(values, base.median)
        rm, rp = s.median / base.median, s.p99 / base.p99
        if name == "local backend":
            rows.append(
                f"| {name} (baseline: the magic, no container) | {s.cell(base='local')} | 1.00x | 1.00x |  |  |"
            )
            continue
        met = rm <= 1.5 and rp <= 2.0
        ok = ok and met
        rows.append(
            f"| {name} | {s.cell(base='local')} | {rm:.2f}x | {rp:.2f}x | <= 1.5x median, <= 2x p99 | {'yes' if met else 'NO'} |"
        )
    return (
        "\n".join(rows)
        + f"\n\n{cells} cells per session, interleaved in rounds of {ROUND}, after 20 warm-up cells.",
        ok,
    )


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cells", type=int, default=200)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--no-remote", action="store_true")
    ap.add_argument(
        "--write", default=None, help="update the bench_cell block of this markdown file"
    )
    args = ap.parse_args()
    out, ok = [], True
    for run in range(1, args.runs + 1):
        text, met = table(measure(args.cells, not args.no_remote), args.cells)
        ok = ok and met
        print(f"run {run}\n{text}\n", flush=True)
        out.append(f"Run {run}:\n\n{text}")
    if args.write:
        write_section(Path(args.write), "bench_cell", "\n\n".join(out))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
