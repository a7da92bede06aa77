"""Data between the notebook and a session against OpenSSH `scp` to the same machine, in one run.

    python bench/bench_data.py [--runs 5] [--write docs/benchmarks.md]

On the ssh:// engine (the namespace host of scripts/ci-remote-host.sh, 10.200.0.2): `Session.push`
and `Session.pull` of a 100 MB bytes object (what `%gpu push/pull` run: pickle, binary frames on
the kernel's shell channel through our tunnel, unpickle), and `Session.upload/download` of 200 MB
as one file and as 2,000 files of 100 kB; the floor is `scp` of the same bytes to and from that
host's disk with the cipher our tunnel negotiated (`-c`, printed), the same key, in the same run.
Each figure: median / p99 / max seconds over the runs, and MB/s and ours/scp ratio of the
medians (a ratio of throughputs: >= 0.8x is the target). For reference, the same operations on
the local engine (ports on this machine's loopback, no tunnel, no floor).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
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
from stats import Stats, write_section  # noqa: E402
from support.hosts import ensure_remote_host, product_image, ssh_home  # noqa: E402

MB = 1_000_000
TARGET = 0.8


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


def _timed(fn, runs: int, reset=None) -> list[float]:
    times = []
    for _ in range(runs):
        if reset:
            reset()
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return times


def _ours(session, files: dict[str, Path], runs: int, work: Path) -> dict[str, list[float]]:
    blob = files["var"].read_bytes()
    session.push({"blob": blob})

    def clean(folder: str):
        return lambda: session.run(f"import shutil; shutil.rmtree({folder!r}, ignore_errors=True)")

    out = {
        "push": _timed(lambda: session.push({"x": blob}), runs),
        "pull": _timed(lambda: session.pull(["blob"]), runs),
        "upload1": _timed(lambda: session.upload([str(files["one"])], "in1"), runs, clean("in1")),
        "uploadN": _timed(lambda: session.upload([str(files["many"])], "inN"), runs, clean("inN")),
    }
    back = work / "back"

    def rm_back() -> None:
        shutil.rmtree(back, ignore_errors=True)

    out["download1"] = _timed(lambda: session.download(["in1/big.bin"], str(back)), runs, rm_back)
    out["downloadN"] = _timed(lambda: session.download(["inN/many"], str(back)), runs, rm_back)
    session.run("import shutil; shutil.rmtree('in1'); shutil.rmtree('inN'); del x, blob")
    return out


def _scp(
    remote: dict, cipher: str, files: dict[str, Path], runs: int, work: Path
) -> dict[str, list[float]]:
    base = ["-F", remote["ssh_config"], "-o", "BatchMode=yes", "-c", cipher]
    host = remote["address"]

    def ssh(command: str) -> None:
        subprocess.run(["ssh", *base, host, command], check=True, capture_output=True)

    def scp(*args: str) -> None:
        # -O: the classic scp protocol (the namespace host's sshd has no sftp subsystem)
        subprocess.run(["scp", "-O", "-q", *base, *args], check=True, capture_output=True)

    ssh("rm -rf /tmp/gsbench && mkdir -p /tmp/gsbench/one /tmp/gsbench/many")
    back = work / "scpback"

    def rm_back() -> None:
        shutil.rmtree(back, ignore_errors=True)
        back.mkdir()

    def rm_remote() -> None:
        ssh("rm -rf /tmp/gsbench/one/* /tmp/gsbench/many/*")

    out = {
        "push": _timed(lambda: scp(str(files["var"]), f"{host}:/tmp/gsbench/var.bin"), runs),
        "pull": _timed(
            lambda: scp(f"{host}:/tmp/gsbench/var.bin", str(back / "var.bin")), runs, rm_back
        ),
        "upload1": _timed(
            lambda: scp(str(files["one"]), f"{host}:/tmp/gsbench/one/"), runs, rm_remote
        ),
        "uploadN": _timed(
            lambda: scp("-r", str(files["many"]), f"{host}:/tmp/gsbench/many/"), runs, rm_remote
        ),
    }
    scp(str(files["one"]), f"{host}:/tmp/gsbench/one/")
    scp("-r", str(files["many"]), f"{host}:/tmp/gsbench/many/")
    out["download1"] = _timed(
        lambda: scp(f"{host}:/tmp/gsbench/one/big.bin", str(back)), runs, rm_back
    )
    out["downloadN"] = _timed(
        lambda: scp("-r", f"{host}:/tmp/gsbench/many/many", str(back)), runs, rm_back
    )
    ssh("rm -rf /tmp/gsbench")
    return out


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


def table(ours: dict, floor: dict, local: dict, runs: int, cipher: str) -> str:
    lines = [
        f"{runs} runs each; seconds as median / p99 / max; MB/s of the medians; cipher {cipher} on both.",
        "",
        "| operation | ours, ssh:// engine | scp to the same host | ours MB/s | scp MB/s | ratio | target | met |"
        " local engine (no tunnel) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for key, label, size in ROWS:
        o, f, loc = Stats.of(ours[key]), Stats.of(floor[key]), Stats.of(local[key])
        ratio = f.median / o.median
        lines.append(
            f"| {label} | {o.cell('s', 1)} | {f.cell('s', 1)} | {size / o.median:.0f} | {size / f.median:.0f} "
            f"| {ratio:.2f}x | >= {TARGET}x | {'yes' if ratio >= TARGET else '**no**'} "
            f"| {loc.cell('s', 1)} ({size / loc.median:.0f} MB/s) |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument(
        "--write", default=None, help="write the table into this markdown file (docs/benchmarks.md)"
    )
    args = ap.parse_args()
    remote = ensure_remote_host()
    if remote is None:
        sys.exit("the namespace host is not up: bash scripts/ci-remote-host.sh up (as root)")
    work = Path(tempfile.mkdtemp(prefix="gsbench-"))
    os.environ["GPUSESSION_HOME"] = str(work / "home")
    os.environ["GPUSESSION_IMAGE"] = product_image()
    os.environ["IPYTHONDIR"] = str(work / "ipython")
    os.environ["HOME"] = ssh_home(remote, work / "userhome")
    manager = SessionManager()
    try:
        files = _files(work)
        far = manager.start(
            manager.make_spec("t4", backend="docker", idle="off", host=remote["url"], name="far")
        )
        cipher = _cipher(far)
        print(f"cipher: {cipher} (our tunnel; scp -c {cipher})", flush=True)
        ours = _ours(far, files, args.runs, work)
        far.stop()
        floor = _scp(remote, cipher, files, args.runs, work)
        near = manager.start(manager.make_spec("t4", backend="docker", idle="off", name="near"))
        local = _ours(near, files, args.runs, work)
        near.stop()
    finally:
        for r in manager.list(active_only=True):
            manager.stop(r.id)
        manager.close()
        shutil.rmtree(work, ignore_errors=True)
    text = table(ours, floor, local, args.runs, cipher)
    print(text)
    if args.write:
        write_section(Path(args.write), "bench_data", text)
        print(f"written into {args.write}")
    print(
        "medians ours/scp:",
        {k: round(statistics.median(floor[k]) / statistics.median(ours[k]), 2) for k, _, _ in ROWS},
    )


if __name__ == "__main__":
    main()
