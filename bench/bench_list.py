"""Listing sessions, against the floor, with 10 running and 200 stopped sessions in the store.

    python bench/bench_list.py [--runs 30] [--calls 200] [--write docs/benchmarks.md]

The store (a fresh GPUSESSION_HOME) holds 200 stopped docker sessions and 10 running ones. Each
running record is backed by a real running container on the local Docker engine, labelled as
our sessions are, so `list` does its real liveness check (one question to the engine over its
unix socket) and finds them alive; the containers run `sleep`, not a kernel: listing never talks
to a kernel. Measured, interleaved so they see the same machine:
- CLI: `gpusession list` (the 10 running) and `gpusession list --all` (all 210), each a new
  process, against the floor `gpusession types` (a process that starts and prints a table).
- REST: GET /gpusession/api/sessions (and ?all=1) on a real jupyter server with the extension,
  one keep-alive connection, against GET /api/status on the same server (authenticated, trivial).
Target: `gpusession list` <= 1.5x the floor (median). Every figure: median / p99 / max.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import docker

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from gpusession.configuration.config import GpuSessionConfig  # noqa: E402
from gpusession.core.models import State  # noqa: E402
from gpusession.session import SessionManager  # noqa: E402
from openssh import free_port  # noqa: E402
from stats import Stats, write_section  # noqa: E402

IMAGE = os.environ.get("GPUSESSION_TEST_IMAGE", "gpusession/cuda:ci")
LABEL = "gpusession.session"


def fill_store(client, running: int, stopped: int) -> list:
    """The records, and the containers standing for the running ones (removed by the caller)."""
    manager = SessionManager(GpuSessionConfig())
    containers = []
    for i in range(running + stopped):
        spec = manager.make_spec("t4", backend="docker", idle="off", image=IMAGE)
        record = manager.store.create(spec, price_per_hour=0.5)
        manager.store.transition(record.id, State.PROVISIONING)
        if i < running:
            c = client.containers.run(
                IMAGE,
                ["infinity"],
                entrypoint=["sleep"],
                detach=True,
                labels={LABEL: record.id, "gpusession.bench": "list"},
            )
            containers.append(c)
            manager.store.update_resource(record.id, container_id=c.id)
            manager.store.transition(record.id, State.STARTING)
            manager.store.transition(record.id, State.RUNNING)
        else:
            manager.store.transition(record.id, State.STOPPED, "bench")
    return containers


def cli(args: list[str], env: dict) -> float:
    t = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-m", "gpusession", *args], env=env, capture_output=True, text=True
    )
    took = time.perf_counter() - t
    assert out.returncode == 0, out.stderr
    return took, out.stdout


def start_server(env: dict, work: Path) -> tuple[subprocess.Popen, int, str]:
    port, token = free_port(), os.urandom(16).hex()
    cmd = [
        sys.executable,
        "-m",
        "jupyter_server",
        "--no-browser",
        f"--port={port}",
        "--ip=127.0.0.1",
        f"--ServerApp.token={token}",
        "--ServerApp.jpserver_extensions={'gpusession': True}",
        f"--ServerApp.root_dir={work}",
        "--allow-root",
    ]
    server = subprocess.Popen(
        cmd, env=env, stdout=subprocess.DEVNULL, stderr=open(work / "server.log", "wb")
    )
    deadline = time.monotonic() + 60
    while True:
        try:
            get(port, token, "/api/status")
            return server, port, token
        except (OSError, AssertionError):
            assert time.monotonic() < deadline and server.poll() is None, (
                work / "server.log"
            ).read_text()[-2000:]
            time.sleep(0.2)


def get(port: int, token: str, path: str, conn: http.client.HTTPConnection | None = None) -> bytes:
    c = conn or http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", path, headers={"Authorization": f"token {token}"})
    reply = c.getresponse()
    body = reply.read()
    if conn is None:
        c.close()
    assert reply.status == 200, (path, reply.status, body[:300])
    return body


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=30, help="CLI processes per command")
    ap.add_argument("--calls", type=int, default=200, help="REST calls per path")
    ap.add_argument("--repeat", type=int, default=1, help="whole runs, each its own table")
    ap.add_argument("--write", default=None)
    args = ap.parse_args()
    texts, ok = [], True
    for run in range(1, args.repeat + 1):
        text, met = one_run(args)
        print(f"run {run}\n{text}\n", flush=True)
        texts.append(f"Run {run}:\n\n{text}")
        ok = ok and met
    if args.write:
        write_section(Path(args.write), "bench_list", "\n\n".join(texts))
    return 0 if ok else 1


def one_run(args) -> tuple[str, bool]:
    work = Path(tempfile.mkdtemp(prefix="gs-list-"))
    os.environ["GPUSESSION_HOME"] = str(work / "home")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    # as installed (pip writes bytecode): with PYTHONDONTWRITEBYTECODE set, each process would compile
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", str(ROOT / "gpusession")],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    client = docker.from_env()
    containers = fill_store(client, running=10, stopped=200)
    server = None
    try:
        _, shown = cli(["list"], env)
        assert shown.count("running") >= 10, shown  # all 10 checked alive, none reconciled away
        times: dict[str, list[float]] = {"types": [], "list": [], "list --all": []}
        for _ in range(args.runs):  # interleaved
            for name in times:
                times[name].append(cli(name.split(), env)[0])
        server, port, token = start_server(env, work)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        paths = {
            "/api/status": "/api/status",
            "sessions": "/gpusession/api/sessions",
            "sessions?all=1": "/gpusession/api/sessions?all=1",
        }
        listed = json.loads(get(port, token, paths["sessions?all=1"], conn))["sessions"]
        assert len(listed) == 210 and sum(s["state"] == "running" for s in listed) == 10, len(
            listed
        )
        rest: dict[str, list[float]] = {name: [] for name in paths}
        for _ in range(args.calls):
            for name, path in paths.items():
                t = time.perf_counter()
                get(port, token, path, conn)
                rest[name].append(time.perf_counter() - t)
    finally:
        if server is not None:
            server.terminate()
            server.wait(20)
        for c in containers:
            c.remove(force=True)
        shutil.rmtree(work, ignore_errors=True)  # its store: it leaves nothing
    floor, api = Stats.of(times["types"]), Stats.of(rest["/api/status"])
    rows = [
        "| measure | ours: median / p99 / max | floor: median / p99 / max | ratio (median) | ratio (p99) | target | met |",
        "|---|---|---|---|---|---|---|",
    ]
    ok = True
    for name, what in (
        ("list", "`gpusession list` (10 running, checked alive)"),
        ("list --all", "`gpusession list --all` (210 rows)"),
    ):
        s = Stats.of(times[name])
        met = s.median <= 1.5 * floor.median
        ok = ok and (met or name != "list")
        rows.append(
            f"| {what} | {s.cell()} | {floor.cell()} (`gpusession types`) | {s.median / floor.median:.2f}x | "
            f"{s.p99 / floor.p99:.2f}x | {'<= 1.5x median' if name == 'list' else '(report)'} | "
            f"{('yes' if met else 'NO') if name == 'list' else ''} |"
        )
    for name, what in (
        ("sessions", "REST GET /gpusession/api/sessions (10 running)"),
        ("sessions?all=1", "REST GET /gpusession/api/sessions?all=1 (210)"),
    ):
        s = Stats.of(rest[name])
        rows.append(
            f"| {what} | {s.cell()} | {api.cell()} (GET /api/status) | {s.median / api.median:.2f}x | "
            f"{s.p99 / api.p99:.2f}x | (report) |  |"
        )
    text = "\n".join(rows) + (
        f"\n\nCLI: {args.runs} processes per command, interleaved; REST: {args.calls} calls per "
        f"path on one keep-alive connection, interleaved. The 10 running records are backed by "
        f"real running containers (`sleep`, labelled as sessions) on the local engine."
    )
    return text, ok


if __name__ == "__main__":
    sys.exit(main())
