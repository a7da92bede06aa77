"""Docker backend and SSH tunnel against their floors, measured in one run on one engine.

    python bench/bench_docker.py [--runs 3] [--image gpusession/cuda:ci] [--write docs/benchmarks.md]

1. start to first result: `SessionManager.start` + `1+1` against a bare `docker run` of the same
   image (no sshd, no tunnel: the kernel's ports published directly) until its kernel answers.
2. `1+1` round trip through our tunnel against a direct connection to the same kind of kernel.
3. a cell printing 50 MB, and a raw 50 MB TCP stream out of the container, through our tunnel
   against OpenSSH `ssh -L` to the same sshd with the same key.
Targets: start < 1.5x the floor, round trip < 2x direct, throughput >= 0.5x OpenSSH.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import docker

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpusession.kernel import KernelClient  # noqa: E402
from gpusession.session import SessionManager  # noqa: E402

PORTS = ("shell_port", "iopub_port", "stdin_port", "control_port", "hb_port")
MB50 = 50_000_000
SERVE_50MB = """
import socket, threading
def _serve():
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", 50020)); s.listen()
    blob = b"x" * %d
    while True:
        c, _ = s.accept()
        try:
            if c.recv(1):  # a readiness probe sends nothing
                c.sendall(blob)
        except OSError:
            pass
        c.close()
threading.Thread(target=_serve, daemon=True).start()
""" % MB50


class Quiet:
    def stream(self, name, text):
        pass

    def display(self, *a, **k):
        pass

    def clear(self, wait):
        pass


def floor_start(client, image: str) -> tuple[float, object, dict]:
    """A bare `docker run` of the image until its kernel answers kernel_info (ports published)."""
    t0 = time.perf_counter()
    c = client.containers.run(
        image, detach=True, init=True, labels={"gpusession.bench": "floor"},
        entrypoint=["/opt/gpusession/venv/bin/python", "-m", "gpusession.agent", "run", "--session-id", "floor",
                    "--state-dir", "/run/floor", "--kernel-ip", "0.0.0.0", "--kernel-ports", "50001", "--no-agent"],
        device_requests=[docker.types.DeviceRequest(count=-1, capabilities=[["gpu"]])],
        ports={f"{p}/tcp": ("127.0.0.1", None) for p in range(50001, 50006)},
    )
    while True:
        try:
            stream, _ = c.get_archive("/run/floor/kernel.json")
            with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
                info = json.loads(tar.extractfile(tar.getmembers()[0]).read())
            break
        except (docker.errors.NotFound, ValueError, tarfile.TarError):
            time.sleep(0.01)
    c.reload()
    info["ip"] = "127.0.0.1"
    for name in PORTS:
        info[name] = int(c.ports[f"{info[name]}/tcp"][0]["HostPort"])
    kernel = KernelClient(info)
    kernel.wait_ready(60)
    kernel.evaluate("1+1")
    return time.perf_counter() - t0, c, kernel


def ours_start(manager: SessionManager) -> tuple[float, object]:
    t0 = time.perf_counter()
    session = manager.start(manager.make_spec("t4", backend="docker", idle="off"))
    session.kernel.evaluate("1+1")
    return time.perf_counter() - t0, session


def round_trip(kernel: KernelClient, n: int = 200) -> float:
    for _ in range(10):
        kernel.evaluate("1+1")
    times = []
    for _ in range(n):
        t = time.perf_counter()
        kernel.evaluate("1+1")
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def cell_mb_s(kernel: KernelClient) -> float:
    t = time.perf_counter()
    kernel.execute(f"print('x' * {MB50 - 1})", sink=Quiet())
    return MB50 / (time.perf_counter() - t) / 1e6


def raw_mb_s(port: int) -> float:
    t = time.perf_counter()
    n = 0
    with socket.create_connection(("127.0.0.1", port)) as c:
        c.sendall(b"g")
        while chunk := c.recv(1 << 20):
            n += len(chunk)
    assert n == MB50, n
    return n / (time.perf_counter() - t) / 1e6


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def openssh_forward(session, ports: list[int], workdir: Path) -> tuple[subprocess.Popen, dict[int, int]]:
    """`ssh -L` for each remote port, to the session container's sshd, with the session's key."""
    res = session.record.resource
    known = workdir / "known_hosts"
    known.write_text(f"[127.0.0.1]:{res['ssh_port']} {res['host_key']}\n")
    local = {p: free_port() for p in ports}
    cmd = ["ssh", "-N", "-o", "BatchMode=yes", "-o", f"UserKnownHostsFile={known}", "-o", "StrictHostKeyChecking=yes",
           "-o", "ExitOnForwardFailure=yes", "-i", res["key_path"], "-p", str(res["ssh_port"])]
    for remote, here in local.items():
        cmd += ["-L", f"127.0.0.1:{here}:127.0.0.1:{remote}"]
    proc = subprocess.Popen(cmd + ["root@127.0.0.1"])
    deadline = time.monotonic() + 20
    for here in local.values():
        while True:
            try:
                socket.create_connection(("127.0.0.1", here), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline and proc.poll() is None, "ssh -L did not come up"
                time.sleep(0.05)
    return proc, local


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--image", default=os.environ.get("GPUSESSION_TEST_IMAGE", "gpusession/cuda:ci"))
    ap.add_argument("--write", default=None, help="update the docker section of this markdown file")
    args = ap.parse_args()
    os.environ["GPUSESSION_HOME"] = tempfile.mkdtemp(prefix="gs-bench-")
    os.environ["GPUSESSION_IMAGE"] = args.image
    client = docker.from_env()
    manager = SessionManager()
    work = Path(os.environ["GPUSESSION_HOME"])

    floors, ours = [], []
    for _ in range(args.runs):  # alternate, so both see the same machine state
        t, c, k = floor_start(client, args.image)
        floors.append(t)
        k.close()
        c.remove(force=True)
        t, s = ours_start(manager)
        ours.append(t)
        s.stop()
    floor, our = statistics.median(floors), statistics.median(ours)

    t, floor_c, direct = floor_start(client, args.image)
    session = ours_start(manager)[1]
    try:
        rt_direct, rt_tunnel = round_trip(direct), round_trip(session.kernel)
        session.kernel.execute(SERVE_50MB, sink=Quiet())
        tunnel_raw_port = session.link.tunnel.add_forward(50020)
        kernel_ports = [50001, 50002, 50003, 50004, 50005]
        ssh, local = openssh_forward(session, kernel_ports + [50020], work)
        try:
            info = dict(session.link.endpoint.connection_info)
            for name, remote in zip(PORTS, kernel_ports):
                info[name] = local[remote]
            via_openssh = KernelClient(info)
            via_openssh.wait_ready(30)
            cell_ours, cell_ssh, raw_ours, raw_ssh = [], [], [], []
            for _ in range(args.runs):
                cell_ours.append(cell_mb_s(session.kernel))
                cell_ssh.append(cell_mb_s(via_openssh))
                raw_ours.append(raw_mb_s(tunnel_raw_port))
                raw_ssh.append(raw_mb_s(local[50020]))
            via_openssh.close()
        finally:
            ssh.terminate()
        cell_direct = statistics.median(cell_mb_s(direct) for _ in range(args.runs))
    finally:
        session.stop()
        direct.close()
        floor_c.remove(force=True)

    m = statistics.median
    rows = [
        ("start to first `1+1`", f"{our:.2f} s", f"{floor:.2f} s (bare docker run)", our / floor, "< 1.5x", our / floor < 1.5),
        ("`1+1` round trip", f"{rt_tunnel * 1e3:.2f} ms", f"{rt_direct * 1e3:.2f} ms (direct)", rt_tunnel / rt_direct,
         "< 2x", rt_tunnel / rt_direct < 2),
        ("50 MB cell output", f"{m(cell_ours):.0f} MB/s", f"{m(cell_ssh):.0f} MB/s (ssh -L)", m(cell_ours) / m(cell_ssh),
         ">= 0.5x", m(cell_ours) / m(cell_ssh) >= 0.5),
        ("50 MB raw TCP stream", f"{m(raw_ours):.0f} MB/s", f"{m(raw_ssh):.0f} MB/s (ssh -L)", m(raw_ours) / m(raw_ssh),
         ">= 0.5x", m(raw_ours) / m(raw_ssh) >= 0.5),
    ]
    table = ["| measure | ours | floor | ratio | target | met |", "|---|---|---|---|---|---|"]
    table += [f"| {a} | {b} | {c} | {r:.2f}x | {t} | {'yes' if ok else 'NO'} |" for a, b, c, r, t, ok in rows]
    note = (f"Runs: {args.runs} (medians; round trip over 200 calls). For context, the same 50 MB cell straight "
            f"to the kernel's published ports: {cell_direct:.0f} MB/s. Starts: ours {[round(x, 2) for x in ours]} s, "
            f"floor {[round(x, 2) for x in floors]} s.")
    print("\n".join(table))
    print(note)
    if args.write:
        write_section(Path(args.write), "\n".join(table) + "\n\n" + note)
    return 0 if all(r[-1] for r in rows) else 1


def write_section(path: Path, body: str) -> None:
    """Replace the generated block of the docker section (kept between markers) in `path`."""
    begin, end = "<!-- bench_docker:begin -->", "<!-- bench_docker:end -->"
    text = path.read_text() if path.exists() else ""
    block = f"{begin}\n{body}\n{end}"
    if begin in text:
        text = re.sub(re.escape(begin) + ".*?" + re.escape(end), lambda _: block, text, flags=re.S)
    else:
        text += ("\n" if text else "") + block + "\n"
    path.write_text(text)


if __name__ == "__main__":
    sys.exit(main())
