"""Where a download's time goes, on both ends: CPU seconds per thread of this process (the
receiver, the tunnel's threads, ZMQ's), of the session kernel (its handler, its tar thread),
and of the remote host's sshd, for `Session.download` of one 200 MB file and of 2,000 files of
100 kB on the ssh:// engine; `scp -O` with the same cipher beside (its ssh and the host's sshd).

    PYTEST_XDIST_WORKER=gw<N> python bench/profile_download.py [--runs 2] [--busy]

--busy: one `yes > /dev/null` beside, as issue 35 measures. Prints the machine's load.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

from bench_data import _cipher  # noqa: E402

from gpusession.session import SessionManager  # noqa: E402
from support.hosts import REMOTE_NETNS, ensure_remote_host, product_image, ssh_home  # noqa: E402
from support.leftovers import remove_workspace_volumes  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")

KERNEL_THREADS = """
import os as _os
def _gs_threads():
    out = {}
    for tid in _os.listdir('/proc/self/task'):
        try:
            stat = open(f'/proc/self/task/{tid}/stat').read()
        except OSError:
            continue
        name = stat[stat.index('(') + 1 : stat.rindex(')')]
        fields = stat[stat.rindex(')') + 2 :].split()
        out[name + ':' + tid] = (int(fields[11]) + int(fields[12])) / _os.sysconf('SC_CLK_TCK')
    return out
gs_prof = _gs_threads()
gs_prof['process'] = sum(_os.times()[:2])
"""


def _threads(pid: str = "self") -> dict[str, float]:
    names = {t.native_id: t.name for t in threading.enumerate()} if pid == "self" else {}
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        name = names.get(int(tid), comm)
        out[f"{name}:{tid}"] = (int(fields[11]) + int(fields[12])) / TICK
    if pid == "self":
        out["process"] = sum(os.times()[:2])
    return out


def _sshd_cpu() -> float:
    """CPU seconds of every sshd process in the remote host's namespace (children included)."""
    pids = subprocess.run(
        ["ip", "netns", "pids", REMOTE_NETNS], capture_output=True, text=True
    ).stdout.split()
    total = 0.0
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        if "(sshd" not in stat and "(scp" not in stat:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        total += sum(int(f) for f in fields[11:15]) / TICK
    return total


def _delta(after: dict, before: dict) -> dict[str, float]:
    grouped: dict[str, float] = {}
    for key, value in after.items():
        name = key.rsplit(":", 1)[0]
        name = name.split(" (")[-1].rstrip(")") if name.startswith("Thread-") else name
        grouped[name] = grouped.get(name, 0.0) + value - before.get(key, 0.0)
    return {k: round(v, 2) for k, v in sorted(grouped.items(), key=lambda kv: -kv[1]) if v > 0.005}


def _kernel(session) -> dict[str, float]:
    session.run(KERNEL_THREADS)
    return session.pull(["gs_prof"])["gs_prof"]


def profile_ours(session, path: str, back: Path) -> None:
    shutil.rmtree(back, ignore_errors=True)
    here, there, sshd = _threads(), _kernel(session), _sshd_cpu()
    started = time.perf_counter()
    session.download([path], str(back))
    wall = time.perf_counter() - started
    here2, there2, sshd2 = _threads(), _kernel(session), _sshd_cpu()
    print(
        f"  ours {path}: {wall:.2f} s wall, load {os.getloadavg()[0]:.2f}\n"
        f"    client threads: {_delta(here2, here)}\n"
        f"    kernel threads: {_delta(there2, there)}\n"
        f"    remote sshd: {sshd2 - sshd:.2f} s",
        flush=True,
    )


def profile_scp(base: list[str], args: list[str]) -> None:
    before, sshd = resource.getrusage(resource.RUSAGE_CHILDREN), _sshd_cpu()
    started = time.perf_counter()
    subprocess.run(["scp", "-O", "-q", *base, *args], check=True)
    wall = time.perf_counter() - started
    after, sshd2 = resource.getrusage(resource.RUSAGE_CHILDREN), _sshd_cpu()
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    print(
        f"  scp {args[-2]}: {wall:.2f} s wall, load {os.getloadavg()[0]:.2f}; "
        f"scp+ssh here {cpu:.2f} s CPU, remote sshd+scp {sshd2 - sshd:.2f} s",
        flush=True,
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--busy", action="store_true")
    args = ap.parse_args()
    remote = ensure_remote_host()
    work = Path(tempfile.mkdtemp(prefix="gsprof-"))
    os.environ["GPUSESSION_HOME"] = str(work / "home")
    os.environ["GPUSESSION_IMAGE"] = product_image()
    os.environ["IPYTHONDIR"] = str(work / "ipython")
    os.environ["HOME"] = ssh_home(remote, work / "userhome")
    busy = subprocess.Popen(["yes"], stdout=subprocess.DEVNULL) if args.busy else None
    manager = SessionManager()
    try:
        far = manager.start(
            manager.make_spec("t4", backend="docker", idle="off", host=remote["url"], name="far")
        )
        cipher = _cipher(far)
        far.run(
            "import os\nos.makedirs('in1', exist_ok=True)\n"
            "open('in1/big.bin','wb').write(os.urandom(200_000_000))\n"
            "os.makedirs('inN/many', exist_ok=True)\nc = os.urandom(100_000)\n"
            "for i in range(2000): open(f'inN/many/f{i:04d}.bin','wb').write(c[i:] + c[:i])\n"
        )
        base = ["-F", remote["ssh_config"], "-o", "BatchMode=yes", "-c", cipher]
        host = remote["address"]
        subprocess.run(
            [
                "ssh",
                *base,
                host,
                "rm -rf /tmp/gsprof && mkdir -p /tmp/gsprof/many && "
                "head -c 200000000 /dev/urandom > /tmp/gsprof/big.bin && cd /tmp/gsprof/many && "
                "for i in $(seq 1000 2999); do head -c 100000 /dev/urandom > f$i.bin; done",
            ],
            check=True,
        )
        print(f"cipher {cipher}; busy process beside: {bool(busy)}", flush=True)
        for _ in range(args.runs):
            profile_ours(far, "in1/big.bin", work / "back")
            profile_scp(base, [f"{host}:/tmp/gsprof/big.bin", str(work / "scp1")])
            profile_ours(far, "inN/many", work / "back")
            shutil.rmtree(work / "scpN", ignore_errors=True)
            profile_scp(base, ["-r", f"{host}:/tmp/gsprof/many", str(work / "scpN")])
        subprocess.run(["ssh", *base, host, "rm -rf /tmp/gsprof"], check=True)
        far.stop()
    finally:
        if busy is not None:
            busy.kill()
        for r in manager.list(active_only=True):
            manager.stop(r.id)
        manager.close()
        remove_workspace_volumes(work / "home")  # its session's workspace, on the host's engine
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
