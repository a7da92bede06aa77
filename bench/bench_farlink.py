"""A far link: our tunnel's stream against OpenSSH's through the same added round trip.

    python bench/bench_farlink.py [--rtts 0,20,60] [--runs 5] [--mb 50] [--busy [N]] [--write F]

Our channels open at OpenSSH's 2 MiB window and grow to what the link's round trip needs
(`gpusession/transport/sshlogin.py`: window_for, measured by LinkWindows after the login).
This measures that choice where it matters: a link whose round trip is tens of milliseconds,
where a 2 MiB window lets at most 2 MiB through per round trip.

This machine's links are all near (the namespace hosts answer in well under a millisecond) and
its kernel has no netem, so the round trip is added by a relay of our own between the client and
the namespace host's sshd (scripts/ci-remote-host.sh, 10.200.N.2:22): it holds each piece it
reads for half the added round trip in each direction (a process of its own). The relay ends
the TCP connection, so the kernel's round trip (what the tunnel takes on a direct connection)
would be its first hop's: here the tunnel takes it as through a proxy, by the requests sshd
answers (`sshlogin.round_trip`), which the relay holds like everything else. Both sides go through the same relay to
the same sshd, with the same cipher and key, and stream the same bytes from a server in the
host's namespace (a 127.0.0.1 port there), read here until its end:

- ours: `Tunnel` (a forward of that port), window chosen by the measured round trip;
- ours at 2 MiB: the same, the window kept at 2 MiB (what a fixed OpenSSH-like window gives);
- ours at 16 MiB: the window at 16 MiB from the start (the choice before 6 December);
- floor: OpenSSH `ssh -N -L` with `-c` the cipher ours negotiated (its own window: 2 MiB).

Each figure: MB/s at the median, and seconds per stream as median / p99 / max over the runs,
the sides in turn run by run. The relay is Python: it costs CPU (the same for every side), so
the near row (0 ms added) is not the tunnel's own speed (bench_docker.py has that).
"""

from __future__ import annotations

import argparse
import contextlib
import heapq
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

import paramiko  # noqa: E402

import openssh  # noqa: E402
from gpusession.transport import sshlogin  # noqa: E402
from gpusession.transport.tunnel import HostKeyCheck, SshTarget, Tunnel  # noqa: E402
from openssh import stream_s  # noqa: E402
from stats import Stats, add_busy_argument, beside, busy_beside, load, load_span, write_section  # noqa: E402
from support.hosts import REMOTE_NETNS, ensure_remote_host  # noqa: E402

PIECE = 256 * 1024

SERVER = r"""
import socket, sys, threading
size = int(sys.argv[1])
blob = bytes(range(256)) * (1 << 12)  # 1 MiB
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen(16)
print(s.getsockname()[1], flush=True)
def serve(c):
    try:
        if not c.recv(1):  # a readiness check's connection: nothing asked
            return
        left = size
        while left:
            n = c.send(memoryview(blob)[: min(left, len(blob))])
            left -= n
    finally:
        c.close()
while True:
    c, _ = s.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"""


class DelayRelay:
    """127.0.0.1:<port> relayed to `target`, each piece held `rtt`/2 in each direction."""

    def __init__(self, target: tuple[str, int], rtt: float):
        self.target, self.one_way = target, rtt / 2
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.port = self.listener.getsockname()[1]
        self.socks: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                here, _ = self.listener.accept()
            except OSError:
                return
            there = socket.create_connection(self.target)
            for s in (here, there):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.socks += [here, there]
            for a, b in ((here, there), (there, here)):
                self._pipe(a, b)

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        queue: list = []
        ready = threading.Condition()
        seq = iter(range(1 << 62))

        def read() -> None:
            while True:
                try:
                    data = src.recv(PIECE)
                except OSError:
                    data = b""
                with ready:
                    heapq.heappush(queue, (time.monotonic() + self.one_way, next(seq), data))
                    ready.notify()
                if not data:
                    return

        def write() -> None:
            while True:
                with ready:
                    while not queue:
                        ready.wait()
                    due, _, data = queue[0]
                    wait = due - time.monotonic()
                    if wait > 0:
                        ready.wait(wait)
                        continue
                    heapq.heappop(queue)
                try:
                    if not data:
                        dst.shutdown(socket.SHUT_WR)
                        return
                    dst.sendall(data)
                except OSError:
                    return

        threading.Thread(target=read, daemon=True).start()
        threading.Thread(target=write, daemon=True).start()

    def close(self) -> None:
        self.listener.close()
        for s in self.socks:
            with contextlib.suppress(OSError):
                s.close()


@contextlib.contextmanager
def our_tunnel(remote: dict, relay: RelayProcess, serve_port: int, window: str):
    """Our Tunnel through `relay`; `window`: "chosen" (ours), "2MiB" or "16MiB" (fixed)."""
    key_line = " ".join(Path(remote["known_hosts"]).read_text().split()[1:3])
    target = SshTarget(
        host="127.0.0.1",
        port=relay.port,
        username=remote["user"],
        keys=[paramiko.Ed25519Key.from_private_key_file(remote["key_path"])],
        host_keys=HostKeyCheck.pinned("127.0.0.1", relay.port, key_line, "(bench)"),
    )
    fixed = {"2MiB": sshlogin.NEAR_WINDOW, "16MiB": sshlogin.WINDOW}.get(window)
    chosen, tcp = sshlogin.window_for, sshlogin.tcp_round_trip
    if fixed is not None:
        sshlogin.window_for = lambda rtt: fixed
    # the relay ends the TCP connection: the kernel's figure would be its first hop's, so the
    # round trip is taken as for a login through a proxy, by the requests sshd answers
    sshlogin.tcp_round_trip = lambda sock: None
    try:
        tunnel = Tunnel(target, [serve_port], keepalive=60).start()
        try:
            assert tunnel._windows is not None and tunnel._windows.measured.wait(30)
            yield tunnel, tunnel._windows
        finally:
            tunnel.close()
    finally:
        sshlogin.window_for, sshlogin.tcp_round_trip = chosen, tcp


@contextlib.contextmanager
def ssh_forward(remote: dict, relay: RelayProcess, serve_port: int, cipher: str):
    """OpenSSH's `ssh -L` of the server's port, through `relay`: its local port."""
    ssh, local = openssh.ssh_forward(remote, [serve_port], cipher, via=relay.port)
    try:
        yield local[serve_port]
    finally:
        ssh.terminate()
        ssh.wait(10)


class RelayProcess:
    """A DelayRelay in a process of its own (this script with --relay): its threads do not share
    a GIL with our tunnel's, as a router on a real link shares nothing with either side."""

    def __init__(self, target: tuple[str, int], rtt: float):
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--relay", f"{target[0]}:{target[1]}:{rtt}"],
            stdout=subprocess.PIPE,
            text=True,
        )
        self.port = int(self.proc.stdout.readline())

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def relay_main(spec: str) -> int:
    host, port, rtt = spec.rsplit(":", 2)
    relay = DelayRelay((host, int(port)), float(rtt))
    print(relay.port, flush=True)
    threading.Event().wait()
    return 0


def measure(remote: dict, serve_port: int, rtt_ms: float, runs: int, size: int) -> dict:
    relay = RelayProcess((remote["address"], remote["port"]), rtt_ms / 1000)
    times: dict[str, list[float]] = {}
    seen: dict[str, str] = {}
    loads = []
    try:
        with contextlib.ExitStack() as stack:
            ports = {}
            cipher = None
            for side in ("chosen", "2MiB", "16MiB"):
                tunnel, windows = stack.enter_context(our_tunnel(remote, relay, serve_port, side))
                ports[side] = tunnel.local_port(serve_port)
                cipher = tunnel._transport.remote_cipher
                seen[side] = (
                    f"round trip {windows.rtt * 1000:.1f} ms, window {windows.window >> 20} MiB"
                )
            ports["ssh"] = stack.enter_context(ssh_forward(remote, relay, serve_port, cipher))
            order = list(ports)
            for run in range(runs):  # the sides in turn, the first one turning each run
                for side in order[run % len(order) :] + order[: run % len(order)]:
                    times.setdefault(side, []).append(stream_s(ports[side], size))
                loads.append(load())
    finally:
        relay.close()
    return {"times": times, "seen": seen, "loads": loads, "cipher": cipher}


def mb_s(times: list[float], size: int) -> str:
    s = Stats.of(times)
    return f"{size / s.median / 1e6:.0f} MB/s ({s.cell('s', 1)})"


def table(results: list[tuple[float, dict]], runs: int, size: int, busy: int) -> str:
    lines = [
        "| round trip added | ours (window by the round trip) | ours at 2 MiB | ours at 16 MiB "
        "| OpenSSH `ssh -L` (floor) | ours vs floor | target | met | load |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for rtt_ms, r in results:
        t = r["times"]
        ratio = statistics.median(t["ssh"]) / statistics.median(t["chosen"])
        lines.append(
            f"| {rtt_ms:g} ms ({r['seen']['chosen']}) | {mb_s(t['chosen'], size)} "
            f"| {mb_s(t['2MiB'], size)} | {mb_s(t['16MiB'], size)} | {mb_s(t['ssh'], size)} "
            f"| {ratio:.2f}x | >= 0.9x | {'yes' if ratio >= 0.9 else '**no**'} "
            f"| {load_span(r['loads'])} |"
        )
    cipher = results[0][1]["cipher"]
    lines += [
        "",
        f"{size / 1e6:.0f} MB per stream, {runs} runs per side; MB/s at the median, seconds as "
        f"median / p99 / max (nearest rank: under 100 runs, p99 is the max); cipher {cipher} "
        f"(ours negotiated; `ssh -L -c` the same); {beside(busy) or 'no load added'}.",
    ]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rtts", default="0,20,60", help="round trips to add, ms")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--mb", type=int, default=50)
    add_busy_argument(ap)
    ap.add_argument("--write", help="put the table into this markdown file between markers")
    ap.add_argument("--relay", help=argparse.SUPPRESS)  # HOST:PORT:RTT_S: be the relay process
    args = ap.parse_args()
    if args.relay:
        return relay_main(args.relay)
    remote = ensure_remote_host()
    if remote is None:
        print("the namespace host is not up: bash scripts/ci-remote-host.sh up (as root)")
        return 2
    size = args.mb * 1_000_000
    server = subprocess.Popen(
        ["ip", "netns", "exec", REMOTE_NETNS, sys.executable, "-c", SERVER, str(size)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        serve_port = int(server.stdout.readline())
        results = []
        with busy_beside(args.busy):
            for rtt_ms in (float(x) for x in args.rtts.split(",")):
                r = measure(remote, serve_port, rtt_ms, args.runs, size)
                print(f"{rtt_ms:g} ms added: {r['seen']}", flush=True)
                results.append((rtt_ms, r))
    finally:
        server.terminate()
        server.wait(10)
    text = table(results, args.runs, size, args.busy)
    print(text)
    if args.write:
        write_section(Path(args.write), "bench_farlink", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
