"""`%gpu switch` against the same move done by hand: stop --save, (the workspace moved, where the
new session cannot mount it), start --resume; median / p99 / max and the ratio of the medians
(target <= 1.1x), both measured in the same run, interleaved.

    python bench/bench_switch.py [--rounds 5] [--mb 100] [--mode type|ssh|local-docker]
                                 [--write docs/benchmarks.md]

Two chains of sessions run side by side, each with the same namespace (a numpy array of --mb MB
of random bytes, a dict, an import) and a file of --mb MB in its workspace. Each round moves
each chain once: one with `SessionManager.switch` (what `%gpu switch` runs), the other by hand
with the calls a user makes (`stop --save`, then `start --resume`; for a move between engines,
the same export/import of the workspace in between, as nothing else moves a volume). A round
counts as kept when the new kernel has the array (its digest) and the file, on both sides.

Modes: `type`: docker on this engine, t4 <-> a100 (the workspace stays where it is); `ssh`:
this engine <-> the ssh:// namespace engine (scripts/ci-remote-host.sh; the workspace moves
through this machine each time); `local-docker`: local -> docker and back.
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
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests"))

from stats import Stats, write_section  # noqa: E402

IMAGE = "gpusession-ci/py-numpy"

MAKE = """
import numpy as np, os, hashlib
a = np.frombuffer(os.urandom({mb} << 20), dtype=np.uint8)
meta = {{'n': len(a), 'tag': 'bench'}}
with open('data.bin', 'wb') as f:
    f.write(os.urandom({mb} << 20))
digest = hashlib.sha256(a.tobytes()).hexdigest()
file_digest = hashlib.sha256(open('data.bin', 'rb').read()).hexdigest()
"""
CHECK = """
import hashlib
assert hashlib.sha256(a.tobytes()).hexdigest() == digest and meta['tag'] == 'bench'
assert hashlib.sha256(open('data.bin', 'rb').read()).hexdigest() == file_digest
"""


def _places(mode: str, remote_url: str | None) -> list[dict]:
    """The two specs' options a chain alternates between."""
    if mode == "type":
        return [
            {"backend": "docker", "image": IMAGE, "type": "t4"},
            {"backend": "docker", "image": IMAGE, "type": "a100"},
        ]
    if mode == "ssh":
        return [
            {"backend": "docker", "image": IMAGE, "host": ""},
            {"backend": "docker", "image": IMAGE, "host": remote_url},
        ]
    return [{"backend": "local"}, {"backend": "docker", "image": IMAGE}]


def _by_hand(manager, session, values: dict, progress_lines: list[str]):
    """stop --save, the workspace moved when it must, start --resume: a user's own switch."""
    from gpusession.core.progress import Progress
    from gpusession.session.workspace_ops import workspace_place

    old = manager.get(session.id)
    workspace = old.resource["workspace"]
    manager.stop(old.id, save=True)
    spec = manager.switch_spec(old.id, dict(values))
    spec.extra["resume"] = workspace
    if (old.spec.backend, workspace_place(old.spec)) != (spec.backend, workspace_place(spec)):
        record = manager.create(spec)
        export = manager.backend(old.backend).export_workspace(old, Progress())
        try:
            manager.backend(spec.backend).import_workspace(record, export.chunks, Progress())
        finally:
            export.close()
        return manager.launch(record, progress_lines.append)
    return manager.start(spec, progress_lines.append)


def _remove_workspaces(manager) -> None:
    """The bench's workspaces (volumes on each engine, folders), so runs do not pile them up."""
    from gpusession.session.workspace_ops import list_all

    for view in list_all(manager.store, manager.backend):
        manager.backend(view.workspace.backend).remove_workspace(view.workspace)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="moves per side (default 5)")
    parser.add_argument("--mb", type=int, default=100, help="MB of array and of file (default 100)")
    parser.add_argument("--mode", choices=("type", "ssh", "local-docker"), default="type")
    parser.add_argument("--write", type=Path, help="write the table into this Markdown file")
    args = parser.parse_args()

    home = tempfile.mkdtemp(prefix="bench-switch-")
    os.chmod(home, 0o700)
    os.environ["GPUSESSION_HOME"] = home
    remote_url = None
    if args.mode == "ssh":
        from support.hosts import ensure_remote_host, ssh_home

        host = ensure_remote_host()
        if host is None:
            print("the namespace Docker host cannot run here", file=sys.stderr)
            return 2
        os.environ["HOME"] = ssh_home(host, Path(home) / "home")
        remote_url = host["url"]
    from gpusession.session import SessionManager

    manager = SessionManager()
    places = _places(args.mode, remote_url)
    lines: list[str] = []
    switch_s, hand_s, kept, moved = [], [], {"switch": 0, "by hand": 0}, []
    chains = {}
    try:
        for side in ("switch", "by hand"):
            first = dict(places[0])
            first.setdefault("type", "t4")
            spec = manager.spec_from(
                dict(first, idle="off", name=f"bench-{side.replace(' ', '')}-0")
            )
            session = manager.start(spec)
            if session.run(MAKE.format(mb=args.mb))["status"] != "ok":
                raise SystemExit("cannot make the namespace (numpy in the image?)")
            chains[side] = session
        for i in range(args.rounds):
            target = dict(places[(i + 1) % 2], name=None)
            for side in ("switch", "by hand") if i % 2 == 0 else ("by hand", "switch"):
                session = chains[side]
                values = {k: v for k, v in target.items() if v is not None}
                values["name"] = f"bench-{side.replace(' ', '')}-{i + 1}"
                t0 = time.monotonic()
                if side == "switch":
                    new, report = manager.switch(
                        session, manager.switch_spec(session.id, values), lines.append
                    )
                    switch_s.append(time.monotonic() - t0)
                    if report.moved_bytes is not None:
                        moved.append(report.moved_bytes)
                else:
                    new = _by_hand(manager, session, values, lines)
                    hand_s.append(time.monotonic() - t0)
                kept[side] += new.run(CHECK)["status"] == "ok"
                chains[side] = new
            print(
                f"round {i + 1}: switch {switch_s[-1]:.1f}s, by hand {hand_s[-1]:.1f}s", flush=True
            )
    finally:
        manager.stop_all()
        _remove_workspaces(manager)
        manager.close()
        shutil.rmtree(home, ignore_errors=True)  # its store and session keys: it leaves nothing
    ours, floor = Stats.of(switch_s), Stats.of(hand_s)
    what = {
        "type": "docker on this engine, t4 <-> a100 (the workspace stays)",
        "ssh": "this engine <-> the ssh:// namespace engine (the workspace moves each time)",
        "local-docker": "local <-> docker on this engine (the workspace moves each time)",
    }[args.mode]
    moved_text = f"; {sum(moved) / len(moved) / 1e6:.0f} MB moved per switch" if moved else ""
    table = (
        f"Switch of a session with a {args.mb} MB array and a {args.mb} MB file, {what}, "
        f"{args.rounds} per side, interleaved, on {os.cpu_count()} cores{moved_text}.\n\n"
        "| move | kept | time median / p99 / max | ratio of medians |\n|---|---|---|---|\n"
        f"| `SessionManager.switch` (`%gpu switch`) | {kept['switch']}/{args.rounds} | "
        f"{ours.cell('s', 1)} | {ours.median / floor.median:.2f}x |\n"
        f"| by hand: stop --save, start --resume (floor) | {kept['by hand']}/{args.rounds} | "
        f"{floor.cell('s', 1)} | 1.00x |"
    )
    print(table)
    if args.write:
        write_section(args.write, f"bench_switch_{args.mode.replace('-', '_')}", table)
    return 0 if kept["switch"] == kept["by hand"] == args.rounds else 1


if __name__ == "__main__":
    raise SystemExit(main())
