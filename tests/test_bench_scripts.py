"""Benchmarks as a person runs them (tiny), so they do not rot: bench_tail.py (a `1+1` through
our tunnel, `ssh -L` and directly, on the ssh:// engine) and bench_agent.py (the agent's stats,
on a docker session and a local runtime). Both broke unseen once: bench_tail when kernels moved
to unix sockets (its forwards looked up as TCP ports), bench_agent when the package took layer
folders (its imports). The figures are not checked here, only that each side answered."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"

pytestmark = [
    pytest.mark.integration,  # the namespace host (root, ip netns), a Docker engine
    pytest.mark.skipif(os.geteuid() != 0, reason="the namespace host needs root"),
]


def _run(*argv: str) -> str:
    """The bench's output; it ran to its end. Exit status 1 with its table is a target it did
    not meet (five calls on a loaded machine say nothing of the figures); a crash is not."""
    out = subprocess.run(
        [sys.executable, *argv], capture_output=True, text=True, timeout=240, cwd=BENCH.parent
    )
    said = out.stdout[-3000:] + out.stderr[-3000:]
    assert out.returncode in (0, 1) and "Traceback" not in out.stderr, said
    return out.stdout


def test_the_round_trip_bench_measures_ours_ssh_and_direct():
    from support.hosts import ensure_remote_host

    if ensure_remote_host() is None:
        pytest.skip("the namespace host cannot run here (scripts/ci-remote-host.sh)")
    text = _run(str(BENCH / "bench_tail.py"), "--calls", "5")
    for side in ("direct", r"\*\*ours\*\*", "OpenSSH `ssh -L"):
        assert re.search(rf"^\| {side}.*\| [\d.]+ / [\d.]+ / [\d.]+ ms", text, re.M), text


def test_the_agent_bench_measures_a_docker_session_and_a_local_runtime():
    from support.hosts import docker_available

    if not docker_available():
        pytest.skip("no Docker engine")
    text = _run(str(BENCH / "bench_agent.py"), "--seconds", "1", "--requests", "10")
    latency = json.loads(text[text.index("{") :])["latency"]
    assert len(latency) == 2, latency  # the docker session's tunnel and the local runtime
    for side in latency.values():
        assert side["requests"] == 10 and side["round_trip_ms"]["p50"] > 0, side


def test_the_start_floor_whose_port_was_taken_meanwhile_starts_its_kernel_on_others(monkeypatch):
    """bench_docker's floor (a bare `docker run` of a plain kernel on ports picked free) once
    waited its 60 s and crashed the bench, leaving the dead container, when another process
    took a picked port before the kernel bound it. Now that kernel starts again on others."""
    import socket

    import docker

    from support.hosts import docker_available

    if not docker_available():
        pytest.skip("no Docker engine")
    sys.path.insert(0, str(BENCH))
    import bench_docker

    client = docker.from_env()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        picks = iter([taken.getsockname()[1]])  # the first port picked: shell's
        real = bench_docker.free_port
        monkeypatch.setattr(bench_docker, "free_port", lambda: next(picks, None) or real())
        seconds, container, kernel = bench_docker.floor_start(client, bench_docker.IMAGES[0], None)
    try:
        assert kernel.evaluate("1+1") == "2" and seconds < 60
        floors = client.containers.list(all=True, filters={"label": "gpusession.bench=floor"})
        assert [c.id for c in floors] == [container.id]  # the one that found its port taken: gone
    finally:
        kernel.close()
        container.remove(force=True)
