"""The agent's HTTP endpoint, through a real server on loopback, driven by the local-side
client (gpusession.session.AgentClient) and by raw requests for the error cases."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from gpusession.agent.endpoint import AgentServer, agent_token
from gpusession.agent.idle import ActivityTracker
from gpusession.agent.nvml import NvmlReader, RecordedNvml
from gpusession.agent.sampler import Sampler
from gpusession.agent.watchdog import Watchdog
from gpusession.configuration.agentargs import AgentArgs
from gpusession.core.models import KernelEndpoint
from gpusession.core.protocol import StopKind, StopReason
from gpusession.session.agentclient import AgentClient, AgentUnavailable
from gpusession.words.status import status_lines
from gpusession.words.stops import describe_stop, format_summary, warning_texts

DATA = Path(__file__).parent / "data"
T0 = 1_700_000_000.0
KEY = "0123456789abcdef" * 4


class Clock:
    def __init__(self):
        self.t = T0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def agent(tmp_path):
    clock = Clock()
    wd = Watchdog(
        session_id="sess1",
        state_dir=str(tmp_path),
        tracker=ActivityTracker(
            AgentArgs(idle=600, price_per_hour=3.6, max_cost=5.0, keepalive_limit=7200),
            billed_since=T0,
        ),
        sampler=Sampler(NvmlReader(RecordedNvml.from_file(DATA / "nvml_two_t4.json"))),
        stop=lambda reason: None,
        clock=clock,
        read_activity=lambda d: {"busy": False, "last_activity": T0, "cells": 2},
        log=lambda line: None,
    )
    for _ in range(5):
        wd.tick()
        clock.t += 1
    server = AgentServer(wd, token=lambda: agent_token(KEY)).start()
    client = AgentClient.for_endpoint(
        KernelEndpoint(connection_info={"key": KEY}, agent_url=f"http://127.0.0.1:{server.port}")
    )
    yield wd, server, client, clock
    server.close()


def raw(server, method, path, body=None, token=None):
    req = urllib.request.Request(f"http://127.0.0.1:{server.port}{path}", data=body, method=method)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_stats_document(agent):
    wd, server, client, clock = agent
    doc = client.stats()
    assert doc["session_id"] == "sess1" and doc["gpus_visible"] is True and doc["message"] is None
    assert doc["driver_version"] == "550.54.15" and doc["interval_s"] == 1.0
    assert [s["t"] for s in doc["samples"]] == [T0, T0 + 1, T0 + 2, T0 + 3, T0 + 4]
    sample = doc["samples"][1]
    assert set(sample) == {
        "t",
        "gpus_visible",
        "gpus",
        "cpu_percent",
        "memory_used",
        "memory_total",
        "kernel_busy",
    }
    assert set(sample["gpus"][0]) == {
        "index",
        "name",
        "uuid",
        "utilization",
        "memory_used",
        "memory_total",
        "temperature",
        "power_draw",
        "power_limit",
        "sm_clock",
        "processes",
    }
    assert (
        doc["idle"]["timeout_s"] == 600 and doc["idle"]["remaining_s"] == 596
    )  # GPU 0 was busy at T0+1
    assert doc["cost"]["price_per_hour"] == 3.6 and doc["cost"]["max_cost"] == 5.0
    assert doc["cost"]["so_far"] == pytest.approx(0.06)  # the minimum minute
    assert doc["warnings"] == [] and doc["stopping"] is None
    assert [s["t"] for s in client.stats(since=T0 + 2)["samples"]] == [T0 + 3, T0 + 4]
    assert [s["t"] for s in client.stats(limit=1)["samples"]] == [T0 + 4]
    assert client.stats(limit=0)["samples"] == []


def test_keepalive_and_its_cap(agent):
    wd, server, client, clock = agent
    granted = client.keepalive(3600)
    assert granted["granted_s"] == 3600 and granted["capped"] is False
    assert granted["idle"]["remaining_s"] == pytest.approx(3600, abs=1)
    granted = client.keepalive(24 * 3600)
    assert granted["capped"] is True and granted["granted_s"] == 7200 and granted["limit_s"] == 7200
    assert client.stats(limit=0)["idle"]["keepalive_until"] == pytest.approx(clock.t + 7200)


def test_warning_and_summary(agent):
    wd, server, client, clock = agent
    clock.t = T0 + 4000  # $4 of $5 at $3.60/h, and idle long past 600 s: both show
    doc = client.stats(limit=0)
    assert any("spent $4.00 of the $5.00 cap" in w for w in warning_texts(doc["warnings"]))
    assert [w["kind"] for w in doc["warnings"]] == ["max-cost"]
    summary = client.summary()
    assert summary["duration_s"] == 4000 and summary["cost"] == pytest.approx(4.0)
    assert summary["gpu_count"] == 1 and summary["cells"] == 2
    assert summary["mean_gpu_utilization"] == pytest.approx(
        (0 + 50 + 2 + 2 + 2) / 5
    )  # lost GPU left out
    text = format_summary(summary)
    assert text.startswith("ran 1h06m, cost $4.00, 1.111 GPU-hours, mean GPU utilization 11%")


def test_token_and_validation(agent):
    wd, server, client, clock = agent
    status, health = raw(server, "GET", "/health", token=agent_token(KEY))
    assert (
        status == 200
        and health["ok"] is True
        and health["session_id"] == "sess1"
        and health["cpu_s"] > 0
    )
    assert client.health()["session_id"] == "sess1"  # the client sends the token
    assert raw(server, "GET", "/stats")[0] == 401
    assert raw(server, "GET", "/stats", token="wrong")[0] == 401
    assert (
        raw(server, "POST", "/keepalive", b'{"seconds": 60}', token=KEY)[0] == 401
    )  # the raw key is no token
    tok = agent_token(KEY)
    for body in (b"not json", b"[]", b"{}", b'{"seconds": "soon"}', b'{"seconds": -5}'):
        status, doc = raw(server, "POST", "/keepalive", body, token=tok)
        assert status == 400 and doc["error"], body
    assert raw(server, "GET", "/stats?since=yesterday", token=tok)[0] == 400
    assert raw(server, "GET", "/nothing", token=tok)[0] == 404
    assert raw(server, "GET", "/keepalive", token=tok)[0] == 405
    with pytest.raises(AgentUnavailable, match="401"):
        AgentClient(client.url, "bad").stats()


def test_health_asks_for_the_token_and_names_no_session(agent):
    """Another user on the machine reaches the agent's loopback port: without the token it learns
    nothing, not even which session runs there."""
    wd, server, client, clock = agent
    for token in (None, "wrong", KEY):
        status, doc = raw(server, "GET", "/health", token=token)
        assert status in (401, 403) and "sess1" not in json.dumps(doc), (token, doc)


def test_starting_agent_answers_503_until_the_kernel_key_exists(agent):
    wd, server, client, clock = agent
    starting = AgentServer(wd, token=lambda: None).start()
    try:
        assert raw(starting, "GET", "/stats", token="x")[0] == 503
        assert raw(starting, "GET", "/health", token="x")[0] == 503
    finally:
        starting.close()


def test_unreachable_agent_is_a_clear_error():
    with pytest.raises(AgentUnavailable, match="did not answer") as refused:
        AgentClient("http://127.0.0.1:9", "t", timeout=1).stats()
    assert refused.value.refused  # never delivered: a restart may ask again while the agent starts
    with pytest.raises(AgentUnavailable, match="no stats agent"):
        AgentClient.for_endpoint(KernelEndpoint(connection_info={"key": KEY}, agent_url=None))


def test_status_lines_and_stop_sentences(agent):
    wd, server, client, clock = agent
    lines = "\n".join(status_lines(client.stats(), history=True))
    assert (
        "GPU 0 Tesla T4: Util 2%, Mem 10.2/15.0 GiB, Temp 38 °C, Power 10/70 W, SM 1590 MHz"
        in lines
    )
    assert "GPU 1 ?: the GPU is lost: the driver no longer sees it" in lines  # no invented numbers
    assert "pid 424242 python3: 10.2 GiB" in lines
    assert "idle 1s of 10m00s: stops in 9m59s" in lines or "stops in" in lines
    assert "cost $0.0600 at $3.60/h (cap $5.00)" in lines
    assert "GPU 0 util |" in lines
    idle = StopReason(StopKind.IDLE, idle_for_s=5.0, idle_timeout_s=5.0)
    assert (
        describe_stop("t4-1", idle) == "session t4-1 was stopped by its idle watchdog after 5s idle"
    )
    assert (
        describe_stop("t4-1", StopReason(StopKind.MAX_COST, spent=5.0, max_cost=5.0))
        == "session t4-1 was stopped by its cost cap: spent $5.00 of the $5.00 cap"
    )
    assert (
        describe_stop(
            "t4-1", StopReason(StopKind.MAX_RUNTIME, elapsed_s=8 * 3600.0, max_runtime_s=8 * 3600.0)
        )
        == "session t4-1 was stopped by its max-runtime limit after 8h00m"
    )
    assert (
        describe_stop("t4-1", StopReason(StopKind.SIGNAL, signal=15))
        == "session t4-1 ended: its runtime got signal 15"
    )


def test_no_gpu_status_says_so():
    doc = {
        "gpus_visible": False,
        "message": "no NVIDIA GPU visible (LibraryNotFound: ...)",
        "samples": [
            {
                "t": T0,
                "gpus_visible": False,
                "gpus": [],
                "cpu_percent": 3.0,
                "memory_used": 2 * 1024**3,
                "memory_total": 16 * 1024**3,
                "kernel_busy": True,
            }
        ],
        "idle": {"timeout_s": None},
        "cost": {"so_far": 0.0, "price_per_hour": 0.0},
        "runtime": {},
        "warnings": [],
    }
    lines = status_lines(doc)
    assert lines[0].strip().startswith("no NVIDIA GPU visible")
    assert "CPU 3%, RAM 2.0/16.0 GiB, kernel busy" in "\n".join(lines)
    assert "idle stop: off" in "\n".join(lines)


def test_a_fixed_port_that_is_taken_is_tried_again_until_it_is_free(tmp_path, capsys):
    """The agent's fixed port held at its start (a socket in TIME_WAIT, a refused connect that got
    that port as its own): said, tried again every second, served once free; the client reaches
    the agent only there. One that stays taken is said again when the agent gives up."""
    import socket
    import time
    from types import SimpleNamespace as NS

    from gpusession.agent import service
    from gpusession.configuration.agentargs import AgentArgs

    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    rt = NS(connection_file=str(tmp_path / "kernel.json"), state_dir=str(tmp_path), agent_port=-1)
    args = AgentArgs(session_id="s", state_dir=str(tmp_path), agent_port=port)
    service._serve_endpoint(rt, args, watchdog=None, retry_s=10)
    assert rt.agent_port is None
    assert f"port {port} is taken" in capsys.readouterr().out
    holder.close()
    deadline = time.monotonic() + 8
    while rt.agent_port is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert rt.agent_port == port
    with socket.create_connection(("127.0.0.1", port), timeout=2):
        pass  # it listens there now

    again = socket.socket()
    again.bind(("127.0.0.1", 0))
    again.listen()
    rt.agent_port = -1
    args = AgentArgs(session_id="s", state_dir=str(tmp_path), agent_port=again.getsockname()[1])
    service._serve_endpoint(rt, args, watchdog=None, retry_s=1.5)
    said, deadline = "", time.monotonic() + 10
    while "no stats endpoint on port" not in said and time.monotonic() < deadline:
        time.sleep(0.1)  # until the retrying thread says it gave up
        said += capsys.readouterr().out
    assert "no stats endpoint on port" in said
    assert rt.agent_port is None  # never served there
    again.close()
