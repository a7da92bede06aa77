"""Data between the notebook and a session against OpenSSH `scp` to the same machine, in one run.

    python bench/bench_data.py [--runs 5] [--rows download1,downloadN] [--busy [N]] [--no-local]
                               [--write docs/benchmarks.md]

On the ssh:// engine (the namespace host of scripts/ci-remote-host.sh, 10.200.0.2): `Session.push`
and `Session.pull` of a 100 MB bytes object (what `%gpu push/pull` run: pickle, binary frames on
the kernel's shell channel through our tunnel, unpickle), and `Session.upload/download` of 200 MB
as one file and as 2,000 files of 100 kB; the floor is `scp` of the same bytes to and from that
host's disk with the cipher our tunnel negotiated (`-c`, printed), the same key, in the same run.
Each figure: median / p99 / max seconds over the runs, MB/s, and ours/scp ratios of the medians
and of the p99s (ratios of throughputs: >= 0.9x for downloads (issue 35), >= 0.8x for the rest),
with the machine's 1-minute load seen after each run. --busy [N]: N `yes > /dev/null` (one without N) beside
the whole run, begun once the load shows them (issue 35: a user's machine is never idle). --rows: only those rows (scp's floor for
them is measured all the same, in the same run). For reference, the same operations on the local
engine (ports on this machine's loopback, no tunnel, no floor; --no-local leaves it out).
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

from gpusession.session import SessionManager  # noqa: E402
from gpusession.transport.sshlogin import CIPHERS  # noqa: E402
from stats import Stats, add_busy_argument, beside, busy_beside, load, load_span, write_section  # noqa: E402
from support.hosts import ensure_remote_host, product_image, ssh_home  # noqa: E402
from support.leftovers import remove_workspace_volumes  # noqa: E402

MB = 1_000_000
TARGET = 0.8
TARGETS = {"download1": 0.9, "downloadN": 0.9}  # issue 35: median and p99, beside a busy CPU
LOADS: dict[str, list[float]] = {}  # the 1-minute load after each run, by row (ours and scp's)


def _files(root: Path) -> dict[str, Path]:
    """one 200 MB file, 2,000 files of 100 kB, and a 100 MB file (scp's floor for push/pull)."""
    one = root / "one"
    one.mkdir()
    (one / "big.bin").write_bytes(os.urandom(200 * MB))
    many = root / "many"
    many.mkdir()
    chunk = os.urandom(100_000)
    for i in range(2000):
        (many / f"f{i:04d}.bin").write_bytes(chunk[i:] + chunk[:i])
    var = root / "var.bin"
    var.write_bytes(os.urandom(100 * MB))
    return {"one": one / "big.bin", "many": many, "var": var}


def _timed(fn, reset, key: str) -> float:
    if reset:
        reset()
    started = time.perf_counter()
    fn()
    took = time.perf_counter() - started
    LOADS.setdefault(key, []).append(load())
    print(f"  {key}: {took:.2f} s, load {LOADS[key][-1]:.2f}", flush=True)
    return took


def _interleaved(steps: dict[str, dict], runs: int, rows: list[str]) -> dict[str, dict]:
    """Each row's steps ({"ours": (fn, reset), "scp": ...}) run by run in turn, so the machine's
    load falls alike on both, the order turned each run (whichever goes first meets what the
    row before left: the file system's writeback, a cold cache): {side: {row: [seconds]}}."""
    out: dict[str, dict] = {}
    for key in rows:
        for run in range(runs):
            sides = list(steps[key].items())
            for side, (fn, reset) in sides[run % 2 :] + sides[: run % 2]:
                out.setdefault(side, {}).setdefault(key, []).append(
                    _timed(fn, reset, f"{side} {key}")
                )
    return out


def _our_steps(session, files: dict[str, Path], work: Path) -> dict[str, tuple]:
    """(what is timed, what comes before it) per row; what the downloads take is put there."""
    blob = files["var"].read_bytes()
    session.push({"blob": blob})
    session.upload([str(files["one"])], "in1")
    session.upload([str(files["many"])], "inN")

    def clean(folder: str):
        return lambda: session.run(f"import shutil; shutil.rmtree({folder!r}, ignore_errors=True)")

    back = work / "back"

    def rm_back() -> None:
        shutil.rmtree(back, ignore_errors=True)

    return {
        "push": (lambda: session.push({"x": blob}), None),
        "pull": (lambda: session.pull(["blob"]), None),
        "upload1": (lambda: session.upload([str(files["one"])], "up1"), clean("up1")),
        "uploadN": (lambda: session.upload([str(files["many"])], "upN"), clean("upN")),
        "download1": (lambda: session.download(["in1/big.bin"], str(back)), rm_back),
        "downloadN": (lambda: session.download(["inN/many"], str(back)), rm_back),
    }


SCP_CLEAN = "rm -rf /tmp/gsbench"  # the floor's files on the host


def _on_host(remote: dict, command: str, *options: str, check: bool = True) -> None:
    """`command` on the namespace host, through OpenSSH with its config (and `options`)."""
    subprocess.run(
        [
            "ssh",
            "-F",
            remote["ssh_config"],
            "-o",
            "BatchMode=yes",
            *options,
            remote["address"],
            command,
        ],
        check=check,
        capture_output=True,
        timeout=60,
    )


def _scp_steps(remote: dict, cipher: str, files: dict[str, Path], work: Path) -> dict[str, tuple]:
    """The same rows by `scp -O` with our tunnel's cipher, the same key, to the same host."""
    base = ["-F", remote["ssh_config"], "-o", "BatchMode=yes", "-c", cipher]
    host = remote["address"]

    def ssh(command: str) -> None:
        _on_host(remote, command, "-c", cipher)

    def scp(*args: str) -> None:
        # -O: the classic scp protocol (the namespace host's sshd has no sftp subsystem)
        subprocess.run(["scp", "-O", "-q", *base, *args], check=True, capture_output=True)

    ssh(f"{SCP_CLEAN} && mkdir -p /tmp/gsbench/one /tmp/gsbench/many /tmp/gsbench/up")
    scp(str(files["var"]), f"{host}:/tmp/gsbench/var.bin")
    scp(str(files["one"]), f"{host}:/tmp/gsbench/one/")
    scp("-r", str(files["many"]), f"{host}:/tmp/gsbench/many/")
    back = work / "scpback"

    def rm_back() -> None:
        shutil.rmtree(back, ignore_errors=True)
        back.mkdir()

    def rm_up() -> None:
        ssh("rm -rf /tmp/gsbench/up/*")

    return {
        "push": (lambda: scp(str(files["var"]), f"{host}:/tmp/gsbench/up/var.bin"), rm_up),
        "pull": (lambda: scp(f"{host}:/tmp/gsbench/var.bin", str(back / "var.bin")), rm_back),
        "upload1": (lambda: scp(str(files["one"]), f"{host}:/tmp/gsbench/up/"), rm_up),
        "uploadN": (lambda: scp("-r", str(files["many"]), f"{host}:/tmp/gsbench/up/"), rm_up),
        "download1": (lambda: scp(f"{host}:/tmp/gsbench/one/big.bin", str(back)), rm_back),
        "downloadN": (lambda: scp("-r", f"{host}:/tmp/gsbench/many/many", str(back)), rm_back),
    }


ROWS = (
    ("push", "`%gpu push` 100 MB bytes", 100),
    ("pull", "`%gpu pull` 100 MB bytes", 100),
    ("upload1", "upload 200 MB, 1 file", 200),
    ("uploadN", "upload 200 MB, 2,000 files", 200),
    ("download1", "download 200 MB, 1 file", 200),
    ("downloadN", "download 200 MB, 2,000 files", 200),
)


def _cipher(session) -> str:
    """The cipher our tunnel's SSH transport negotiated (scp gets the same with -c)."""
    tunnel = getattr(session.link, "tunnel", None) or getattr(session.link, "_tunnel", None)
    transport = getattr(tunnel, "transport", None) or getattr(tunnel, "_transport", None)
    return getattr(transport, "local_cipher", None) or CIPHERS[0]


def _link(session) -> str:
    """The round trip our tunnel measured after its login and the channels' window it chose."""
    tunnel = getattr(session.link, "tunnel", None) or getattr(session.link, "_tunnel", None)
    windows = getattr(tunnel, "_windows", None)
    if windows is None or not windows.measured.wait(10):
        return "round trip not measured"
    rtt = f"{windows.rtt * 1000:.2f} ms" if windows.rtt is not None else "none"
    return f"round trip {rtt} ({windows.measured_by}), window {windows.window / (1 << 20):.1f} MiB"


def table(ours: dict, floor: dict, local: dict, runs: int, cipher: str, busy: int) -> str:
    loaded = f"{beside(busy)}, " if busy else ""
    lines = [
        f"{runs} runs each, ours and scp's in turn, {loaded}on {os.cpu_count()} cores; seconds as "
        f"median / p99 / max; MB/s of the medians; ratios of throughput (scp's time over ours), of "
        f"the medians and of the p99s; cipher {cipher} on both; the 1-minute load after each run.",
        "",
        "| operation | ours, ssh:// engine | scp to the same host | ours MB/s | scp MB/s "
        "| ratio median | ratio p99 | target | met | load | local engine (no tunnel) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for key, label, size in ROWS:
        if key not in ours:
            continue
        o, f = Stats.of(ours[key]), Stats.of(floor[key])
        ratio, ratio99 = f.median / o.median, f.p99 / o.p99
        target = TARGETS.get(key, TARGET)
        met = ratio >= target and (key not in TARGETS or ratio99 >= target)
        loc = Stats.of(local[key]) if key in local else None
        near = f"{loc.cell('s', 1)} ({size / loc.median:.0f} MB/s)" if loc else "-"
        aim = f">= {target}x" + (" median and p99" if key in TARGETS else " median")
        lines.append(
            f"| {label} | {o.cell('s', 1)} | {f.cell('s', 1)} | {size / o.median:.0f} "
            f"| {size / f.median:.0f} | {ratio:.2f}x | {ratio99:.2f}x | {aim} "
            f"| {'yes' if met else '**no**'} "
            f"| {load_span(LOADS[f'ours {key}'] + LOADS[f'scp {key}'])} | {near} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--rows", default=",".join(k for k, _, _ in ROWS), help="which rows to run")
    add_busy_argument(ap)
    ap.add_argument("--no-local", action="store_true", help="leave the local engine's out")
    ap.add_argument(
        "--write", default=None, help="write the table into this markdown file (docs/benchmarks.md)"
    )
    args = ap.parse_args()
    rows = [k for k, _, _ in ROWS if k in args.rows.split(",")]
    remote = ensure_remote_host()
    if remote is None:
        sys.exit("the namespace host is not up: bash scripts/ci-remote-host.sh up (as root)")
    work = Path(tempfile.mkdtemp(prefix="gsbench-"))
    os.environ["GPUSESSION_HOME"] = str(work / "home")
    os.environ["GPUSESSION_IMAGE"] = product_image()
    os.environ["IPYTHONDIR"] = str(work / "ipython")
    os.environ["HOME"] = ssh_home(remote, work / "userhome")
    manager = SessionManager()
    local: dict = {}
    try:
        files = _files(work)
        far = manager.start(
            manager.make_spec("t4", backend="docker", idle="off", host=remote["url"], name="far")
        )
        cipher = _cipher(far)
        print(
            f"cipher: {cipher} (our tunnel; scp -c {cipher}); {_link(far)}; load {load():.2f}",
            flush=True,
        )
        ours, scp = _our_steps(far, files, work), _scp_steps(remote, cipher, files, work)
        # the setup wrote about 1.4 GB (the files here, their copies in the session and on the
        # host): written back before the first timed step, which would otherwise pay for it
        os.sync()
        with busy_beside(args.busy):
            both = _interleaved(
                {k: {"ours": ours[k], "scp": scp[k]} for k in rows}, args.runs, rows
            )
        far.stop()
        if not args.no_local:
            near = manager.start(manager.make_spec("t4", backend="docker", idle="off", name="near"))
            steps = _our_steps(near, files, work)
            with busy_beside(args.busy):
                local = _interleaved({k: {"local": steps[k]} for k in rows}, args.runs, rows)
            local = local["local"]
            near.stop()
    finally:
        for r in manager.list(active_only=True):
            manager.stop(r.id)
        manager.close()
        remove_workspace_volumes(work / "home")  # its sessions' workspaces, here and on the host
        # scp's copies on the host (300 MB): best effort, the host may be down
        _on_host(remote, SCP_CLEAN, check=False)
        shutil.rmtree(work, ignore_errors=True)
    text = table(both["ours"], both["scp"], local, args.runs, cipher, args.busy)
    print(text)
    if args.write:
        write_section(Path(args.write), "bench_data", text)
        print(f"written into {args.write}")


if __name__ == "__main__":
    main()
