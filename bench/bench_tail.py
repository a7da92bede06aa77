"""`1+1` round trips through our tunnel, against the same kernel reached directly and through
OpenSSH `ssh -L` with the same cipher: median, p99, max, and the share of calls over 2x the
direct median (the tail a user feels as stalls).

    python bench/bench_tail.py [--calls 500] [--write docs/benchmarks.md]

Needs the namespace host of scripts/ci-remote-host.sh (root). One session on the ssh:// engine;
per client, `--calls` round trips on one connection after 20 warm-up calls:
- direct: a client inside the engine host's network namespace, on the kernel's loopback ports;
- ours: the session's own kernel client, through our tunnel (paramiko) to the host's sshd;
- ssh -L: OpenSSH forwarding the same ports, `-c` the cipher our tunnel negotiated.
The three run interleaved in rounds of 100 calls, so they see the same machine; each round of
a client begins with one untimed call (`timed`).
Target: p99 <= 1.3x direct, no call over 2x direct median more often than direct itself.
"""

from __future__ import annotations

import argparse
import json
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
from gpusession.transport.kernel.client import KernelClient  # noqa: E402
from openssh import KERNEL_PORTS as PORTS  # noqa: E402
from openssh import kernel_sockets_there, ssh_forward  # noqa: E402
from stats import Stats, write_section  # noqa: E402

NAMESPACE = "gpus-remote"
IMAGE = os.environ.get("GPUSESSION_TEST_IMAGE", "gpusession/cuda:ci")
# a client in the engine host's network namespace: round trips on the kernel's own loopback ports
DIRECT = """
import json, sys, time
from gpusession.transport.kernel.client import KernelClient
info, calls = json.loads(sys.argv[1]), int(sys.argv[2])
k = KernelClient(info); k.wait_ready(30)
for _ in range(20): k.evaluate("1+1")
print("ready", flush=True)
for line in sys.stdin:
    out = []
    k.evaluate("1+1")  # untimed: what the other clients' calls left queued on its iopub (timed)
    for _ in range(int(line)):
        t = time.perf_counter(); k.evaluate("1+1"); out.append(time.perf_counter() - t)
    print(json.dumps(out), flush=True)
"""


def timed(kernel: KernelClient, n: int) -> list[float]:
    """`n` round trips, after one untimed call: every client is subscribed to the kernel's
    iopub, so while the other two make their rounds this one's socket queues their 800
    messages, which its next call reads through first (28-40 ms here, once a round: 15 calls of
    1,500, the p99's own rank, so the row measured that instead of the path). A user's notebook
    is the only client of its kernel."""
    kernel.evaluate("1+1")
    out = []
    for _ in range(n):
        t = time.perf_counter()
        kernel.evaluate("1+1")
        out.append(time.perf_counter() - t)
    return out


def measure(calls: int) -> tuple[dict[str, list[float]], str, str]:
    from support.hosts import ensure_remote_host, ssh_home
    from support.leftovers import remove_workspace_volumes

    remote = ensure_remote_host()
    if remote is None:
        raise SystemExit("needs the namespace host of scripts/ci-remote-host.sh (root, Docker)")
    work = Path(tempfile.mkdtemp(prefix="gs-tail-"))
    os.environ["GPUSESSION_HOME"] = str(work)
    os.environ["HOME"] = ssh_home(remote, work / "home")
    manager = SessionManager()
    session = manager.start(
        manager.make_spec("t4", backend="docker", idle="off", image=IMAGE, host=remote["url"])
    )
    direct = ssh = via_ssh = None
    try:
        tunnel = session.link.tunnel
        cipher = tunnel.transport.remote_cipher
        info = dict(session.link.endpoint.connection_info)
        there = kernel_sockets_there(tunnel, info)
        if (
            info.get("transport") == "ipc"
        ):  # the kernel's own socket paths on the host, `<its ip>-<n>` with the same n
            remote_info = dict(info, ip=there["shell_port"].rsplit("-", 1)[0])
        else:
            remote_info = dict(info, **there)
        ssh, local = ssh_forward(remote, list(there.values()), cipher)
        via_ssh = KernelClient(  # ssh -L's side: loopback ports
            dict(info, transport="tcp", ip="127.0.0.1", **{n: local[there[n]] for n in PORTS})
        )
        via_ssh.wait_ready(30)
        direct = subprocess.Popen(
            [
                "ip",
                "netns",
                "exec",
                NAMESPACE,
                sys.executable,
                "-c",
                DIRECT,
                json.dumps(remote_info),
                str(calls),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=dict(os.environ, PYTHONPATH=str(ROOT)),
        )
        assert direct.stdout.readline().strip() == "ready", "the direct client did not start"
        for k in (session.kernel, via_ssh):
            timed(k, 20)
        times: dict[str, list[float]] = {"direct": [], "ours": [], "ssh -L": []}
        left = calls
        while left > 0:  # interleaved rounds: all three see the same machine
            n = min(100, left)
            direct.stdin.write(f"{n}\n")
            direct.stdin.flush()
            times["direct"] += json.loads(direct.stdout.readline())
            times["ours"] += timed(session.kernel, n)
            times["ssh -L"] += timed(via_ssh, n)
            left -= n
        return times, cipher, remote["address"]
    finally:
        if direct is not None:
            direct.stdin.close()
            direct.wait(10)
        if via_ssh is not None:
            via_ssh.close()
        if ssh is not None:
            ssh.terminate()
        session.stop()
        remove_workspace_volumes(work)  # its session's workspace, on the host's engine
        shutil.rmtree(work, ignore_errors=True)  # its store and session keys: it leaves nothing


def table(times: dict[str, list[float]], cipher: str, calls: int) -> str:
    d = Stats.of(times["direct"])
    stats = {name: Stats.of(v, d.median) for name, v in times.items()}
    ours, ssh, direct = stats["ours"], stats["ssh -L"], stats["direct"]
    rows = [
        "| `1+1` round trip, one connection | median / p99 / max, share > 2x direct median | p99 vs direct | "
        "median vs direct | target | met |",
        "|---|---|---|---|---|---|",
    ]
    for name, s in (
        ("direct (client in the engine host's network)", direct),
        ("**ours** (paramiko tunnel)", ours),
        (f"OpenSSH `ssh -L -c {cipher}`", ssh),
    ):
        ratio_p99, ratio_med = s.p99 / direct.p99, s.median / direct.median
        target = "p99 <= 1.3x direct" if s is ours else ""
        met = ("yes" if ratio_p99 <= 1.3 else "NO") if s is ours else ""
        rows.append(
            f"| {name} | {s.cell()} | {ratio_p99:.2f}x | {ratio_med:.2f}x | {target} | {met} |"
        )
    return (
        "\n".join(rows)
        + f"\n\n{calls} calls each, interleaved in rounds of 100; cipher `{cipher}` (ours negotiated; ssh -L told the same)."
    )


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=500)
    ap.add_argument(
        "--runs", type=int, default=1, help="repeat the whole measurement; each run is one table"
    )
    ap.add_argument(
        "--write", default=None, help="update the bench_tail block of this markdown file"
    )
    args = ap.parse_args()
    tables, ok = [], True
    for run in range(1, args.runs + 1):
        times, cipher, _ = measure(args.calls)
        text = table(times, cipher, args.calls)
        print(f"run {run}\n{text}\n", flush=True)
        tables.append(f"Run {run}:\n\n{text}")
        ok = ok and Stats.of(times["ours"]).p99 <= 1.3 * Stats.of(times["direct"]).p99
    if args.write:
        write_section(Path(args.write), "bench_tail", "\n\n".join(tables))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
