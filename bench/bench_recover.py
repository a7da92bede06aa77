"""A spot notice -> the first cell answered on the replacement (`--recover`), against the same
steps done by hand (`stop --save`, `start --resume`, the cell), both in one run, interleaved;
median / p99 / max and the ratio of the medians.

    python bench/bench_recover.py [--rounds 5] [--mb 100] [--write docs/benchmarks.md]

Each round starts two sessions on the local backend (its agent and kernel as every backend runs
them) with the same namespace: a numpy array of --mb MB of random bytes, a dict, an import, and
a file of --mb MB in the workspace.
- notice: a spot `instance-action` is written into the agent's notice folder (what an EC2
  instance's boot script does when instance metadata says so). The agent saves the namespace and
  ends the session, recorded as interrupted; the watcher (this process, looking every 0.5 s, as
  the notebook's notifier does between cells) sees it ended, asks `SessionManager.recover` for
  the replacement (what `--recover` runs), and runs a cell that checks the array and the file.
  Timed from the notice to that cell's answer; the part until the session is recorded ended is
  shown beside it.
- by hand: `stop --save`, `start --resume` on the same workspace, the same cell. This is the
  floor: the same save, start and restore with nothing to notice.
A round counts as kept when the cell finds the array (its digest) and the file on the new kernel.
On the local backend the replacement's start is a local kernel's (seconds); on EC2 it is an
instance's boot and pull on top (docs/aws.md), the same on both sides.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_switch import CHECK, MAKE  # noqa: E402
from stats import Stats, write_section  # noqa: E402

NOTICE = {"action": "terminate", "time": "2026-12-01T20:00:00Z"}
WATCH_S = 0.5  # how often the watcher looks


def _notice(manager, session) -> tuple[object, float]:
    """(the replacement, seconds from the notice until the session was recorded ended)."""
    from gpusession.session.recovery import wants_recovery

    notices = Path(session.record.resource["state_dir"]) / "notices"
    notices.mkdir(exist_ok=True)
    t0 = time.monotonic()
    tmp = notices / ".spot.tmp"
    tmp.write_text(json.dumps(NOTICE))
    os.replace(tmp, notices / "spot-instance-action.json")
    deadline = t0 + 300
    while True:
        record = manager.refresh_state(session.id)
        if not record.state.active:
            break
        if time.monotonic() > deadline:
            raise SystemExit("the session did not end within 300 s of the notice")
        time.sleep(WATCH_S)
    ended = time.monotonic() - t0
    if not wants_recovery(record):
        raise SystemExit(f"no recovery wanted: {record.stop_reason} {record.resource.keys()}")
    return manager.recover(session.id), ended


def _by_hand(manager, session):
    old = manager.get(session.id)
    workspace = old.resource["workspace"]
    manager.stop(old.id, save=True)
    spec = manager.switch_spec(old.id, {"name": f"{old.name}-back"})
    spec.extra["resume"] = workspace
    return manager.start(spec)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="rounds (default 5)")
    parser.add_argument("--mb", type=int, default=100, help="MB of array and of file (default 100)")
    parser.add_argument("--write", type=Path, help="write the table into this Markdown file")
    args = parser.parse_args()

    home = tempfile.mkdtemp(prefix="bench-recover-")
    os.chmod(home, 0o700)
    os.environ["GPUSESSION_HOME"] = home
    from gpusession.session import SessionManager

    manager = SessionManager()
    times: dict[str, list[float]] = {"notice": [], "by hand": []}
    ended_s: list[float] = []
    kept = {"notice": 0, "by hand": 0}
    try:
        for i in range(args.rounds):
            for side in ("notice", "by hand") if i % 2 == 0 else ("by hand", "notice"):
                name = f"{'rn' if side == 'notice' else 'rh'}-{i}"
                session = manager.start(
                    manager.spec_from(
                        {"type": "t4", "backend": "local", "idle": "off", "name": name}
                        | ({"recover": "on"} if side == "notice" else {})
                    )
                )
                if session.run(MAKE.format(mb=args.mb))["status"] != "ok":
                    raise SystemExit("cannot make the namespace (numpy in this Python?)")
                t0 = time.monotonic()
                if side == "notice":
                    new, ended = _notice(manager, session)
                    ended_s.append(ended)
                else:
                    new = _by_hand(manager, session)
                ok = new.run(CHECK)["status"] == "ok"
                times[side].append(time.monotonic() - t0)
                kept[side] += ok
                manager.stop(new.id)
            print(
                f"round {i + 1}: notice {times['notice'][-1]:.1f}s "
                f"(ended after {ended_s[-1]:.1f}s), by hand {times['by hand'][-1]:.1f}s",
                flush=True,
            )
    finally:
        manager.stop_all()
        manager.close()
        shutil.rmtree(home, ignore_errors=True)
    ours, floor, ended = Stats.of(times["notice"]), Stats.of(times["by hand"]), Stats.of(ended_s)
    table = (
        f"A spot notice -> the first cell on the replacement (`--recover`), a session with a "
        f"{args.mb} MB array and a {args.mb} MB file on the local backend, {args.rounds} rounds "
        f"per side, interleaved, on {os.cpu_count()} cores (median / p99 / max s).\n\n"
        "| path | kept | notice -> session recorded ended | notice -> first cell answered "
        "| ratio of medians |\n|---|---|---|---|---|\n"
        f"| spot notice, `--recover on` | {kept['notice']}/{args.rounds} | {ended.cell('s', 1)} "
        f"| {ours.cell('s', 1)} | {ours.median / floor.median:.2f}x |\n"
        f"| by hand: stop --save, start --resume, the cell (floor) | {kept['by hand']}/"
        f"{args.rounds} | | {floor.cell('s', 1)} | 1.00x |"
    )
    print(table)
    if args.write:
        write_section(args.write, "bench_recover", table)
    return 0 if kept["notice"] == kept["by hand"] == args.rounds else 1


if __name__ == "__main__":
    raise SystemExit(main())
