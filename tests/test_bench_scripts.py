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
