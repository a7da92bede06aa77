"""Docker backend against its floor, on any image, measured in one run on one engine.

    python bench/bench_docker.py [--runs 9] [--remote] [--write docs/benchmarks.md]

1. start to first result, per image: `SessionManager.start` + `1+1` with a cold runtime cache (a
   gpusession build and an ipykernel site the engine has not seen: the image probed, the volumes
   filled and compiled) and with a warm one, against a bare `docker run` of the same image until a
   plain kernel in it answers the same `1+1` (ipykernel_launcher on the host's loopback; for an
   image without ipykernel, the one from the same site volume on PYTHONPATH).
   Images: gpusession/cuda:ci (its own ipykernel) and gpusession-ci/py-bookworm (python3 only).
2. `1+1` round trip: the local engine's session (its ports on this machine's loopback) against
   the bare container's kernel.
3. with --remote (the namespace host of scripts/ci-remote-host.sh): the same round trip, a cell
   printing 50 MB and a raw 50 MB stream through our tunnel to the engine host's sshd, against
   OpenSSH `ssh -L` to the same sshd with the same key.
Targets: warm start <= 1.15x the floor on a quiet machine, <= 1.2x at load 3 and over (issue 35;
the 1-minute load after each start is printed and said in the row; --busy [N]: N `yes > /dev/null`
beside, one without N, begun once the load shows them, 15 starts of each kind; `--busy 4` for
issue 35's load 4), round trip p99 <= 1.3x, throughput >= 0.5x OpenSSH.
The PyPI download of a site's wheels (once per Python version, per user) is not in the cold
start; it is shown on its own.
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import os
import shutil
import statistics
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import docker

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

from gpusession.backends.docker import container_setup  # noqa: E402
from gpusession.core.errors import GpuSessionError  # noqa: E402
from gpusession.core.listening import kernel_listens  # noqa: E402
from gpusession.core.progress import Progress  # noqa: E402
from gpusession.session import SessionManager  # noqa: E402
from gpusession.transport import bundle  # noqa: E402
from gpusession.transport.kernel.client import KernelClient  # noqa: E402
from gpusession.transport.pulls import format_bytes  # noqa: E402
from openssh import KERNEL_PORTS as PORTS  # noqa: E402
from openssh import free_port, kernel_sockets_there, ssh_forward, stream_s  # noqa: E402
from stats import Stats, add_busy_argument, busy_beside, load, load_span, report  # noqa: E402
from support.leftovers import remove_workspace_volumes  # noqa: E402

IMAGES = ("gpusession/cuda:ci", "gpusession-ci/py-bookworm")
BUSY_LOAD = 3.0  # a median 1-minute load from here on is a loaded machine (issue 35: at load 4)
MB50 = 50_000_000
SERVE_50MB = (
    """
import socket, threading
def _serve():
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", 0)); s.listen()
    blob = b"x" * %d
    global SERVE_PORT; SERVE_PORT = s.getsockname()[1]
    while True:
        c, _ = s.accept()
        try:
            if c.recv(1):
                c.sendall(blob)
        except OSError:
            pass
        c.close()
threading.Thread(target=_serve, daemon=True).start()
import time; time.sleep(0.2)
"""
    % MB50
)


class Quiet:
    def stream(self, name, text):
        pass

    def display(self, *a, **k):
        pass

    def clear(self, wait):
        pass


def connection_file(ports: list[int]) -> dict:
    return {
        **dict(zip(PORTS, ports)),
        "ip": "127.0.0.1",
        "key": os.urandom(16).hex(),
        "transport": "tcp",
        "signature_scheme": "hmac-sha256",
        "kernel_name": "python3",
    }


def floor_start(client, image: str, site_volume: str | None) -> tuple[float, object, KernelClient]:
    """A bare `docker run` of the image until a plain kernel in it answers `1+1`: host network,
    a connection file we wrote, ipykernel_launcher (the image's, else the site volume's)."""
    options = {}
    env = {}
    if site_volume:
        options["volumes"] = {site_volume: {"bind": bundle.SITE_DIR, "mode": "ro"}}
        env["PYTHONPATH"] = f"{bundle.SITE_DIR}/deps"
    return floor_kernel(
        lambda script: client.containers.run(
            image,
            ["-c", script],
            entrypoint=["/bin/sh"],
            detach=True,
            init=True,
            network_mode="host",
            environment=env,
            labels={"gpusession.bench": "floor"},
            device_requests=[docker.types.DeviceRequest(count=-1, capabilities=[["gpu"]])],
            **options,
        ),
        60,
    )


def floor_kernel(run, timeout: float) -> tuple[float, object, KernelClient]:
    """(seconds, container, kernel) of a floor: `run(script)` starts a container with host
    network whose `/bin/sh -c script` writes a connection file and execs ipykernel_launcher on
    it; timed until the kernel answers `1+1`. A kernel that finds a port we picked taken
    (another process bound it between our pick and its own bind) is started again on others,
    timed from its own start: the floor is a bare `docker run`'s time, not our port picking's.
    A container that failed is removed."""
    for _ in range(3):
        info = connection_file([free_port() for _ in PORTS])
        script = f"printf '%s' '{json.dumps(info)}' >/tmp/k.json && exec python3 -m ipykernel_launcher -f /tmp/k.json"
        t0 = time.perf_counter()
        c = run(script)
        try:
            listening(info, timeout, c)
            kernel = KernelClient(info)
            kernel.wait_ready(timeout)
            kernel.evaluate("1+1")
        except PortTaken:
            c.remove(force=True)
            continue
        except BaseException:
            c.remove(force=True)
            raise
        return time.perf_counter() - t0, c, kernel
    raise RuntimeError("the floor's kernel found a port taken three times in a row")


class PortTaken(Exception):
    """The floor's kernel exited because a port of its connection file was taken meanwhile."""


def listening(info: dict, timeout: float, container=None) -> None:
    """Until the kernel listens, a look every 5 ms, by the runtime's own check before it says
    READY (core.listening.kernel_listens): the floor's client connects then, as ours does. A ZMQ
    socket connected sooner retries only every 100 ms (its reconnect interval), which cost the
    floor 0-100 ms (median 60 ms on a quiet machine) and, 3 times in 20, a lost first
    kernel_info (2 s more): a floor slower than a bare `docker run` is. `container`: the
    kernel's, looked at after 3 s without an answer (never in a start that listens sooner, so
    the look costs the floor nothing): PortTaken when it exited on a taken port, RuntimeError
    with its last line when it exited otherwise."""
    t0 = time.monotonic()
    deadline, look = t0 + timeout, t0 + 3
    while not kernel_listens(info):
        now = time.monotonic()
        if now > deadline:
            raise TimeoutError(f"the floor's kernel did not listen within {timeout:.0f}s")
        if container is not None and now > look:
            look = now + 0.5
            container.reload()
            if container.status in ("exited", "dead"):
                said = container.logs(tail=3).decode(errors="replace").strip()
                if "Address already in use" in said:
                    raise PortTaken(said)
                raise RuntimeError(f"the floor's kernel exited: {said.splitlines()[-1:]}")
        time.sleep(0.005)


def ours_start(
    manager: SessionManager, image: str, host: str | None = None
) -> tuple[float, object]:
    t0 = time.perf_counter()
    session = manager.start(
        manager.make_spec("t4", backend="docker", idle="off", image=image, host=host)
    )
    session.kernel.evaluate("1+1")
    return time.perf_counter() - t0, session


class NewBuild:
    """This process's runtime as a gpusession build (and ipykernel site) no engine has seen: the
    archives get a marker file, so their digests, and the volumes named by them, are new."""

    def __init__(self):
        self.code = _with_marker(bundle.code_archive())
        self.sites: dict[str, bundle.Archive] = {}
        self._site_archive = bundle.site_archive
        self._code_archive = bundle.code_archive
        bundle.code_archive = lambda: self.code  # compiled ahead by the start, as a new build's
        bundle._CODE_FOR.clear()
        container_setup.site_archive = self.site

    def end(self, client, manager: SessionManager) -> None:
        """Its volumes removed and this process's own runtime back, with the engine's volumes
        asked again: the next start (the round trip's) found the removed volume still known and
        mounted it empty (`boot.sh: No such file`)."""
        for name in self.volumes():
            try:
                client.volumes.get(name).remove(force=True)
            except docker.errors.DockerException:
                pass
        bundle.code_archive = self._code_archive
        bundle._CODE_FOR.clear()
        container_setup.site_archive = self._site_archive
        manager.backend("docker")._known.clear()

    def site(self, python, cache, say):
        if python.site_tag not in self.sites:
            self.sites[python.site_tag] = _with_marker(self._site_archive(python, cache, say))
        return self.sites[python.site_tag]

    def volumes(self) -> list[str]:
        # the code's copy is one per Python version (its bytecode): named with the version's tag
        tags = {f"-cp{t.split('-')[0][2:]}" for t in self.sites} | {"-cp311", "-cp313"}
        names = [self.code.copy_name + tag for tag in tags]
        names += [a.copy_name for a in self.sites.values()]
        return names + [n + "-ok" for n in names]


def _with_marker(archive: bundle.Archive) -> bundle.Archive:
    with tarfile.open(fileobj=io.BytesIO(archive.data), mode="r:gz") as tar:
        files = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}
    files[".bench-build"] = str(time.time()).encode()
    return dataclasses.replace(bundle._archive(archive.kind, files), bytecode=archive.bytecode)


def round_trip(kernel: KernelClient, n: int = 200) -> list[float]:
    for _ in range(10):
        kernel.evaluate("1+1")
    times = []
    for _ in range(n):
        t = time.perf_counter()
        kernel.evaluate("1+1")
        times.append(time.perf_counter() - t)
    return times


def cell_s(kernel: KernelClient) -> float:
    """Seconds for a cell printing 50 MB."""
    t = time.perf_counter()
    kernel.execute(f"print('x' * {MB50 - 1})", sink=Quiet())
    return time.perf_counter() - t


def mb_s(times: list[float]) -> str:
    """MB/s at the median, then the seconds per 50 MB as median / p99 / max."""
    s = Stats.of(times)
    return f"{MB50 / s.median / 1e6:.0f} MB/s ({s.cell('s', 1)} per 50 MB)"


def speed_ratio(ours: list[float], theirs: list[float]) -> float:
    """Our speed over theirs, at the medians (time theirs / time ours)."""
    return statistics.median(theirs) / statistics.median(ours)


def starts(client, manager: SessionManager, runs: int) -> list[tuple]:
    rows = []
    for image in IMAGES:
        build = NewBuild()
        cold, session = ours_start(manager, image)
        python = session.record.resource.get("python")
        session.stop()
        prepared = container_setup.prepare_runtime(
            client,
            client.images.get(image),
            cache_dir=bundle.cache_dir(),
            labels={"gpusession.session": "bench"},
            progress=Progress(),
        )
        site = next((v for v, m in prepared.volumes.items() if m["bind"] == bundle.SITE_DIR), None)
        floors, warms, loads = [], [], []
        for _ in range(runs):  # alternate, so both see the same machine state
            t, c, k = floor_start(client, image, site)
            floors.append(t)
            k.close()
            c.remove(force=True)
            t, s = ours_start(manager, image)
            warms.append(t)
            s.stop()
            loads.append(load())
            print(f"  {image}: floor {floors[-1]:.2f} s, ours {t:.2f} s, load {loads[-1]:.2f}")
        build.end(client, manager)
        floor, warm = Stats.of(floors), Stats.of(warms)
        # each warm start against the floor measured just before it: the pair saw the same machine
        paired = statistics.median(w / f for w, f in zip(warms, floors))
        print(
            f"{image}: warm {[round(x, 2) for x in warms]} s, floor {[round(x, 2) for x in floors]} s, "
            f"paired ratios {[round(w / f, 2) for w, f in zip(warms, floors)]}",
            flush=True,
        )
        what = f"{image} ({python}{', no ipykernel' if site else ''})"
        busy = statistics.median(loads) >= BUSY_LOAD  # issue 35: <= 1.2x at load 4, 1.15x quiet
        rows.append(
            (
                f"start to first `1+1`, warm runtime cache: {what}; {load_span(loads)}",
                warm.cell("s", 1),
                f"{floor.cell('s', 1)} (bare docker run)",
                paired,
                "<= 1.2x (loaded)" if busy else "<= 1.15x (quiet)",
                paired <= (1.2 if busy else 1.15),
            )
        )
        rows.append(
            (
                f"start to first `1+1`, cold runtime cache: {what}",
                f"{cold:.2f} s",
                f"{floor.median:.2f} s",
                cold / floor.median,
                "(once per engine)",
                True,
            )
        )
    return rows


def remote_rows(manager: SessionManager, runs: int, work: Path) -> list[tuple]:
    from support.hosts import ensure_remote_host, ssh_home

    remote = ensure_remote_host()
    if remote is None:
        return []
    os.environ["HOME"] = ssh_home(remote, work / "home")
    session = ours_start(manager, IMAGES[0], remote["url"])[1]
    try:
        session.kernel.execute(SERVE_50MB, sink=Quiet())
        serve_port = int(session.kernel.evaluate("SERVE_PORT"))
        raw_ours = session.link.tunnel.add_forward(serve_port)
        info = dict(session.link.endpoint.connection_info)
        tunnel = session.link.tunnel
        remote_ports = list(kernel_sockets_there(tunnel, info).values())  # in PORTS' order
        info = dict(info, transport="tcp", ip="127.0.0.1")  # ssh -L's side: loopback ports
        cipher = tunnel.transport.remote_cipher  # OpenSSH told the same cipher as ours negotiated
        ssh, local = ssh_forward(remote, [*remote_ports, serve_port], cipher)
        try:
            for name, there in zip(PORTS, remote_ports):
                info[name] = local[there]
            via_ssh = KernelClient(info)
            via_ssh.wait_ready(30)
            rt_ours, rt_ssh = Stats.of(round_trip(session.kernel)), Stats.of(round_trip(via_ssh))
            cell_ours, cell_ssh, stream_ours, stream_ssh = [], [], [], []
            for _ in range(runs):  # interleaved: the machine's other load hits both sides alike
                cell_ours.append(cell_s(session.kernel))
                cell_ssh.append(cell_s(via_ssh))
            for i in range(max(runs, 15)):  # who goes first alternates too
                pair = [(stream_ours, raw_ours), (stream_ssh, local[serve_port])]
                for times, port in pair[:: 1 if i % 2 else -1]:
                    times.append(stream_s(port, MB50))
            via_ssh.close()
        finally:
            ssh.terminate()
    finally:
        session.stop()
    return [
        (
            "`1+1` round trip, ssh:// engine (bench_tail.py: vs direct)",
            rt_ours.cell(),
            f"{rt_ssh.cell()} (ssh -L -c {cipher})",
            rt_ours.median / rt_ssh.median,
            "< 2x",
            rt_ours.p99 / rt_ssh.p99 < 2,
        ),
        (
            "50 MB cell output, ssh:// engine",
            mb_s(cell_ours),
            f"{mb_s(cell_ssh)} (ssh -L -c {cipher})",
            speed_ratio(cell_ours, cell_ssh),
            ">= 0.5x",
            speed_ratio(cell_ours, cell_ssh) >= 0.5,
        ),
        (
            "50 MB raw TCP stream, ssh:// engine",
            mb_s(stream_ours),
            f"{mb_s(stream_ssh)} (ssh -L -c {cipher})",
            speed_ratio(stream_ours, stream_ssh),
            ">= 0.95x (issue 12)",
            speed_ratio(stream_ours, stream_ssh) >= 0.95,
        ),
    ]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--runs",
        type=int,
        default=None,
        help="starts of each kind (9; 15 with --busy: at load 4 one pair's ratio spreads from "
        "0.9x to 1.5x, and a median of 7 moved by 0.1 from run to run)",
    )
    ap.add_argument(
        "--remote", action="store_true", help="also the tunnel to the namespace host's engine"
    )
    ap.add_argument("--write", default=None, help="update the docker section of this markdown file")
    add_busy_argument(ap)
    args = ap.parse_args()
    if args.runs is None:
        args.runs = 15 if args.busy else 9
    work = Path(tempfile.mkdtemp(prefix="gs-bench-"))
    os.environ["GPUSESSION_HOME"] = str(work)
    try:
        with busy_beside(args.busy):
            return _run(args, work)
    finally:  # its sessions' workspaces (gc keeps a user's) and its store: it leaves nothing
        remove_workspace_volumes(work)
        shutil.rmtree(work, ignore_errors=True)


def _run(args, work: Path) -> int:
    client = docker.from_env()
    manager = SessionManager()

    t = time.perf_counter()  # the one-time download, kept apart (network, not the engine)
    python = bundle.ImagePython(
        "/usr/bin/python3", (3, 11, 2), "x86_64", ("glibc", "2.36"), None, None, 0, False
    )
    download = bundle.site_archive(
        python,
        work / "wheels",  # in the run's folder: removed with it
        lambda line: None,
    )
    download_s = time.perf_counter() - t

    rows = starts(client, manager, args.runs)
    local = ours_start(manager, IMAGES[0])[1]
    t, floor_c, direct = floor_start(client, IMAGES[0], None)
    try:
        direct_times, ours_times = round_trip(direct), round_trip(local.kernel)
    finally:
        local.stop()
        direct.close()
        floor_c.remove(force=True)
    rt_direct = Stats.of(direct_times, statistics.median(direct_times))
    rt_ours = Stats.of(ours_times, rt_direct.median)
    rows.append(
        (
            "`1+1` round trip, local engine",
            rt_ours.cell(),
            f"{rt_direct.cell()} (bare kernel)",
            rt_ours.median / rt_direct.median,
            "p99 <= 1.3x",
            rt_ours.p99 <= 1.3 * rt_direct.p99,
        )
    )
    if args.remote:
        for attempt in (
            1,
            2,
            3,
        ):  # the namespace host is shared: a test cutting its SSH connections may meet us
            try:
                rows += remote_rows(manager, args.runs, work)
                break
            except GpuSessionError as exc:
                print(f"remote attempt {attempt} failed: {exc}", flush=True)

    note = (
        f"Runs: {args.runs}; times are median / p99 / max (nearest rank: under 100 runs, "
        f"p99 is the max); a warm start's ratio is the median of each start against the floor measured just "
        f"before it; round trip over 200 calls. Once per Python version and user, not in the "
        f"cold start: downloading ipykernel and pip for Python 3.11 from PyPI and packing them, "
        f"{download_s:.1f} s ({format_bytes(len(download.data))})."
    )
    return report(rows, note, args.write, "bench_docker")


if __name__ == "__main__":
    sys.exit(main())
