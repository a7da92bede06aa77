"""What the agent costs and how fresh its numbers are when they arrive.

    .venv/bin/python bench/bench_agent.py [--seconds 20] [--requests 200] [--no-docker] [--json OUT]

1. CPU: the runtime process (`python -m gpusession.agent run`, kernel started, idle) is measured
   from /proc/<pid>/stat (utime+stime of all its threads, 10 ms ticks) over --seconds, once with the agent
   sampling at 1 Hz and serving, once with --no-agent (the baseline). Target: the difference is
   under 1% of one core. The agent's /health also reports the process's own CPU clock (ns),
   which resolves what ticks cannot.
2. Latency: GET /stats?limit=1 as a client does. Round trip per request, and the age of the
   newest sample when it reaches the client while polling at 1 Hz (sampling is 1 Hz, so about
   half a second on average is inherent). Through the SSH tunnel of a docker session when a
   Docker engine answers, else on loopback.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of every thread of pid (10 ms ticks)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def precise_cpu_seconds(state_dir: str) -> float | None:
    """The runtime's own CPU clock (ns), from the agent's /health; None without an agent."""
    try:
        port = json.loads(Path(state_dir, "runtime.json").read_text())["agent_port"]
        if not port:
            return None
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as resp:
            return json.loads(resp.read())["cpu_s"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def start_runtime(state_dir: str, *extra: str) -> subprocess.Popen:
    cmd = [
        sys.executable,
        "-m",
        "gpusession.agent",
        "run",
        "--session-id",
        "bench",
        "--state-dir",
        state_dir,
        "--idle",
        "off",
        *extra,
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            if json.loads(Path(state_dir, "runtime.json").read_text()).get("ready"):
                return proc
        except (OSError, ValueError):
            pass
        time.sleep(0.05)
    proc.kill()
    raise SystemExit("runtime did not become ready")


def measure_cpu(seconds: float, *extra: str) -> tuple[float, float | None]:
    """Percent of one core used by the runtime process over `seconds`: from /proc ticks, and
    from the process's own ns clock when an agent can be asked."""
    with tempfile.TemporaryDirectory() as d:
        proc = start_runtime(d, *extra)
        try:
            time.sleep(2)  # past the start-up
            p0 = precise_cpu_seconds(d)
            c0, t0 = cpu_seconds(proc.pid), time.monotonic()
            time.sleep(seconds)
            c1, t1 = cpu_seconds(proc.pid), time.monotonic()
            p1 = precise_cpu_seconds(d)
        finally:
            proc.terminate()
            proc.wait(15)
    precise = None if p0 is None or p1 is None else 100.0 * (p1 - p0) / (t1 - t0)
    return 100.0 * (c1 - c0) / (t1 - t0), precise


def measure_latency(client, requests: int, poll_seconds: float) -> dict:
    trips = []
    for _ in range(requests):
        t0 = time.perf_counter()
        client.stats(limit=1)
        trips.append((time.perf_counter() - t0) * 1000)
    ages = []
    end = time.time() + poll_seconds
    while time.time() < end:
        doc = client.stats(limit=1)
        if doc["samples"]:
            ages.append((time.time() - doc["samples"][-1]["t"]) * 1000)
        time.sleep(1.0)
    trips.sort()
    return {
        "requests": requests,
        "round_trip_ms": {
            "p50": round(statistics.median(trips), 2),
            "p95": round(trips[int(0.95 * len(trips)) - 1], 2),
            "max": round(trips[-1], 2),
        },
        "sample_age_at_client_ms": {
            "mean": round(statistics.mean(ages), 1),
            "max": round(max(ages), 1),
            "polls": len(ages),
        }
        if ages
        else None,
    }


def loopback_client():
    from gpusession.core.protocol import agent_token
    from gpusession.session.agentclient import AgentClient

    d = tempfile.mkdtemp()
    proc = start_runtime(d)
    runtime = json.loads(Path(d, "runtime.json").read_text())
    key = json.loads(Path(d, "kernel.json").read_text())["key"]
    client = AgentClient(f"http://127.0.0.1:{runtime['agent_port']}", agent_token(key))

    def close():
        proc.terminate()
        proc.wait(15)
        shutil.rmtree(d, ignore_errors=True)

    return client, close, "loopback (local runtime)"


def docker_client():
    sys.path.insert(0, str(ROOT / "tests"))
    from support.hosts import docker_available, product_image
    from support.leftovers import remove_workspace_volumes

    if not docker_available():
        return None
    from gpusession.session import SessionManager
    from gpusession.session.agentclient import AgentClient

    home = tempfile.mkdtemp(prefix="gs-agent-")
    os.environ["GPUSESSION_HOME"] = home
    os.environ["GPUSESSION_IMAGE"] = product_image()  # the test image, not the default's pull
    m = SessionManager()

    def close() -> None:
        for view in m.list(active_only=True):
            m.stop(view.id)
        m.close()
        remove_workspace_volumes(Path(home))  # its session's workspace (gc keeps a user's)
        shutil.rmtree(home, ignore_errors=True)

    try:
        session = m.start(m.make_spec("t4", backend="docker", idle="off", name="bench"))
    except BaseException:
        close()
        raise
    client = AgentClient.for_endpoint(session.link.endpoint)
    return client, close, f"SSH tunnel into a docker container ({product_image()})"


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=20.0, help="CPU measuring window per run")
    p.add_argument("--requests", type=int, default=200, help="requests for the round-trip figure")
    p.add_argument(
        "--poll-seconds", type=float, default=10.0, help="1 Hz polling window for the sample age"
    )
    p.add_argument("--no-docker", action="store_true", help="loopback only")
    p.add_argument("--json", default="", help="also write the results here")
    args = p.parse_args()

    with_agent, with_agent_precise = measure_cpu(args.seconds)
    baseline, _ = measure_cpu(args.seconds, "--no-agent")
    results: dict = {
        "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]},
        "cpu": {
            "window_s": args.seconds,
            "runtime_with_agent_percent_of_one_core": round(with_agent, 4),
            "runtime_with_agent_percent_ns_clock": None
            if with_agent_precise is None
            else round(with_agent_precise, 4),
            "runtime_baseline_no_agent_percent": round(baseline, 4),
            "agent_cost_percent_of_one_core": round(with_agent - baseline, 4),
            "tick_resolution_percent": round(100.0 / CLK_TCK / args.seconds, 4),
            "target_percent": 1.0,
        },
    }
    made = None if args.no_docker else docker_client()
    for maker in ([made] if made else []) + [None]:
        client, close, path = maker or loopback_client()
        try:
            results.setdefault("latency", {})[path] = measure_latency(
                client, args.requests, args.poll_seconds
            )
        finally:
            close()
    text = json.dumps(results, indent=1)
    print(text)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
