"""What the JupyterLab front end reads beyond a session's view, through a real server where it
matters: the history listing (`GET sessions?history=N`) with how each session ended, the
start's progress lines, the body that starts a session again, the kernel that started a
session; the agent's labelled replay of recorded NVML values (`--nvml-replay`); and a notebook
session stopped elsewhere, which the next cell reports as stopped (by whom), not as a crash."""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path

import pytest
import tornado.httpclient

from gpusession.agent import service
from gpusession.agent.nvml import NvmlReader, RecordedNvml
from gpusession.agent.sampler import Sampler
from gpusession.configuration import options
from gpusession.configuration.agentargs import AgentArgs
from gpusession.configuration.catalog import load_catalog
from gpusession.configuration.config import GpuSessionConfig
from gpusession.core.errors import SessionEnded
from gpusession.core.models import LaunchSpec, State
from gpusession.core.protocol import StopKind, StopReason
from gpusession.server.sidebar_state import StartProgress, owner_pid, with_history
from gpusession.session.views import restart_body
from gpusession.words.status import RECORDED_WORDS, status_lines
from gpusession.words.stops import ended_line, error_text

DATA = Path(__file__).resolve().parent / "data"


async def fetch_json(jp_fetch, *path, method="GET", body=None, **params):
    kwargs = {"method": method}
    if body is not None:
        kwargs["body"] = json.dumps(body)
    if params:
        kwargs["params"] = params
    r = await jp_fetch("gpusession", "api", *path, **kwargs)
    return r.code, json.loads(r.body)


# -- the sidebar's history and the start's stages, through a real server ----------------------


@pytest.mark.integration
async def test_history_listing_says_how_sessions_ended(jp_fetch, manager):
    code, view = await fetch_json(
        jp_fetch,
        "sessions",
        method="POST",
        body={"type": "t4", "backend": "local", "idle": "90s", "name": "api-hist"},
    )
    assert code == 202 and view["ended"] is None and view["kernel_id"] is None
    assert view["restart"] == {
        "type": "t4",
        "backend": "local",
        "idle": "90s",
        "workspace": "api-hist",
    }
    deadline = time.monotonic() + 60
    while view["state"] != "running" and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
        _, view = await fetch_json(jp_fetch, "sessions", view["id"])
    assert view["state"] == "running", view
    # the start's stages, as %gpu start prints them, kept for the card
    assert view["progress"][0].endswith("session api-hist: 1 x t4 on local")
    assert any("provision" in line for line in view["progress"])
    assert any(line.endswith("running: session api-hist is ready") for line in view["progress"])

    await fetch_json(jp_fetch, "sessions", view["id"], method="DELETE")
    failed = manager.create(
        manager.make_spec(
            "t4",
            backend="local",
            idle="off",
            name="api-broken",
            nvml_replay="/no/such/recording.json",
        )
    )
    with pytest.raises(Exception):
        manager.launch(failed)

    _, live = await fetch_json(jp_fetch, "sessions")
    assert live["sessions"] == []
    _, listing = await fetch_json(jp_fetch, "sessions", history="1")
    assert [s["name"] for s in listing["sessions"]] == ["api-broken"]  # the one that ended last
    _, listing = await fetch_json(jp_fetch, "sessions", history="10")
    by_name = {s["name"]: s for s in listing["sessions"]}
    assert by_name["api-hist"]["ended"] == "stopped by the JupyterLab sidebar"
    assert by_name["api-hist"]["stop_reason"]["by"] == "the JupyterLab sidebar"
    broken = by_name["api-broken"]
    assert broken["state"] == "failed" and broken["ended"].startswith(
        "failed: connect: kernel process exited"
    )
    assert "cannot read the NVML recording" in broken["ended"]
    # starting it again: its restart body is a good POST body (the replay is no option: not in it)
    assert broken["restart"] == {
        "type": "t4",
        "backend": "local",
        "idle": "off",
        "workspace": "api-broken",
    }
    _, errors = await fetch_json(
        jp_fetch, "options", "check", method="POST", body=broken["restart"]
    )
    assert errors == {"errors": {}}

    with pytest.raises(tornado.httpclient.HTTPClientError) as bad:
        await fetch_json(jp_fetch, "sessions", history="lots")
    assert bad.value.code == 400 and b"'history'" in bad.value.response.body


def args_for(rec) -> list[str]:
    """The agent's options for a record, as a backend writes them (placed in /tmp/x)."""
    return AgentArgs.for_record(rec, session_id="abc", state_dir="/tmp/x").argv()


def test_history_keeps_the_latest_ended(manager):
    records = []
    for name in ("a", "b", "c"):
        record = manager.create(manager.make_spec("t4", backend="local", idle="off", name=name))
        manager.store.transition(record.id, State.FAILED, "test", error="x")
        records.append(manager.get(record.id))
        time.sleep(0.01)
    live = manager.create(manager.make_spec("t4", backend="local", idle="off", name="live"))
    found = with_history(manager.list(), 2)
    assert [r.name for r in found] == ["live", "c", "b"]
    manager.store.transition(live.id, State.FAILED, "test", error="x")


def test_start_progress_is_bounded():
    progress = StartProgress()
    report = progress.reporter("s1")
    for i in range(50):
        report(f"[  {i}.0s] line {i}  ")
    lines = progress.lines("s1")
    assert len(lines) == 20 and lines[-1] == "[  49.0s] line 49"
    assert progress.lines("unknown") is None
    for i in range(250):
        progress.reporter(f"x{i}")
    assert progress.lines("s1") is None  # the oldest starts are forgotten


def test_owner_pid_only_on_this_host():
    import socket

    assert owner_pid(f"me@{socket.gethostname()}:4242:99") == 4242
    assert owner_pid(f"me@{socket.gethostname()}:4242") == 4242
    assert owner_pid("me@elsewhere:4242:99") is None
    assert owner_pid("garbage") is None


@pytest.mark.parametrize(
    "values",
    [
        {"type": "t4"},
        {
            "type": "a100:8",
            "backend": "docker",
            "idle": "1h30m",
            "max_cost": "$2.50",
            "max_runtime": "8h",
            "gpu_only": True,
            "host": "ssh://me@box",
            "gpus": "2",
            "image": "my/image:1",
        },
        {
            "type": "t4",
            "backend": "aws",
            "idle": "off",
            "spot": True,
            "region": "eu-west-1",
            "fallback": "zone",
            "max_price": "0.3",
            "ssh_cidr": "203.0.113.7/32",
        },
        {
            "type": "l4",
            "idle": 0.1,
        },  # 6 s: a bare number means minutes, the body says seconds exactly
        {"type": "t4", "workspace": "ws1", "save_timeout": "off", "save_cap": "1MB"},
        {"type": "t4", "resume": "ws1", "save_timeout": "90s", "save_cap": "off"},
    ],
)
def test_restart_body_starts_the_same_session(values):
    catalog, config = load_catalog(), GpuSessionConfig()
    spec = options.build_spec(values, config=config, catalog=catalog, backend_default="local")
    body = restart_body(spec)
    assert options.check_body(body, catalog=catalog) == {}
    again = options.build_spec(body, config=config, catalog=catalog, backend_default="local")
    assert again == spec


def test_ended_line_says_who_and_why():
    idle = StopReason(StopKind.IDLE, idle_for_s=300, idle_timeout_s=300)
    assert ended_line("stopped", idle, None) == "stopped by its idle watchdog after 5m00s idle"
    assert (
        ended_line("stopped", StopReason(StopKind.USER, by="%gpu stop"), None)
        == "stopped by %gpu stop"
    )
    assert ended_line("stopped", StopReason(StopKind.MAX_COST, spent=5, max_cost=5), None) == (
        "stopped by its cost cap: spent $5.00 of the $5.00 cap"
    )
    assert ended_line("failed", StopReason(StopKind.KERNEL_EXIT, exit_code=1), None) == (
        "failed: its kernel exited with code 1"
    )
    assert ended_line("failed", None, "connect: boom") == "failed: connect: boom"
    assert ended_line("stopped", None, None) == "stopped"
    assert ended_line("running", idle, None) is None


# -- the recorded replay ------------------------------------------------------------------------


def test_replay_is_asked_for_explicitly():
    plain = type(
        "R",
        (),
        {
            "spec": LaunchSpec("t4"),
            "price_per_hour": 0.5,
            "events": [],
            "created_at": 0.0,
            "resource": {},
        },
    )()
    assert "--nvml-replay" not in args_for(plain)
    plain.spec.extra["nvml_replay"] = str(DATA / "nvml_two_t4.json")
    args = args_for(plain)
    assert args[args.index("--nvml-replay") + 1] == str(DATA / "nvml_two_t4.json")


def test_replay_loops_and_says_it_is_recorded():
    parser = argparse.ArgumentParser()
    service.add_arguments(parser)
    args = parser.parse_args(["--nvml-replay", str(DATA / "nvml_two_t4.json")])
    reader = NvmlReader(service.replayed(args.nvml_replay))
    assert reader.source == "recorded" and NvmlReader().source == "nvml"
    sampler = Sampler(reader)
    utils = [
        sampler.sample(float(t), kernel_busy=False)["gpus"][0]["utilization"] for t in range(7)
    ]
    assert utils == [0.0, 97.0, 2.0, 0.0, 97.0, 2.0, 0.0]  # the 3 recorded frames, over again
    once = NvmlReader(
        RecordedNvml.from_file(DATA / "nvml_two_t4.json")
    )  # the tests' reading: no loop
    assert [Sampler(once).sample(0.0, kernel_busy=False)] and once.source == "recorded"
    with pytest.raises(SystemExit):
        parser.parse_args(["--nvml-replay", "/no/such/file.json"])


@pytest.mark.parametrize(
    "gpu_type, count, of_this_type",
    [("t4", 1, True), ("t4", 4, True), ("a100", 1, False), ("l4", 2, False)],
)
def test_a_replay_is_the_sessions_count_and_says_a_recording_of_another_type(
    gpu_type, count, of_this_type
):
    """Issue 32 §5: with the two-T4 recording, a t4 x 1 session showed two GPUs and an a100
    session "Tesla T4". The replay has the session's count (the recorded GPUs in turn, each
    under a UUID of its own), and the stats say what was recorded and whether it is of the
    session's type; every face says a recording of another machine as such."""
    parser = argparse.ArgumentParser()
    service.add_arguments(parser)
    line = ["--nvml-replay", str(DATA / "nvml_two_t4.json"), "--gpu-count", str(count)]
    args = parser.parse_args([*line, "--gpu-type", gpu_type])
    replay = service.replayed(args.nvml_replay, args.gpu_count, args.gpu_type, env={})
    reader = NvmlReader(replay, env={})
    gpus = Sampler(reader).sample(0.0, kernel_busy=False)["gpus"]
    assert len(gpus) == count
    assert len({g["uuid"] for g in gpus}) == count
    assert reader.recording == {
        "gpu_name": "Tesla T4",
        "gpu_count": 2,
        "of_this_type": of_this_type,
    }
    said = status_lines({"source": "recorded", "recording": reader.recording, "gpus_visible": True})
    if of_this_type:
        assert said[0].strip() == RECORDED_WORDS
    else:
        assert (
            said[0]
            .strip()
            .startswith(
                "GPU values: recorded on another machine (2 x Tesla T4), replayed as this session's"
            )
        ), said


@pytest.mark.parametrize(
    "env, indices",
    [
        ({"CUDA_VISIBLE_DEVICES": "1", "SLURM_JOB_GPUS": "1"}, [1]),
        ({"SLURM_JOB_GPUS": "2"}, [2]),
        ({"NVIDIA_VISIBLE_DEVICES": "all"}, [0]),
    ],
)
def test_a_replay_where_the_environment_names_the_sessions_gpus_is_the_whole_machine(env, indices):
    """A Slurm job given GPU 1 of a node replaying a recorded 4-GPU node (test_slurm_cluster): the
    recording stands for the node, as recorded, and the job's CUDA_VISIBLE_DEVICES picks its GPU
    from it; replayed as the session's one GPU it would pick none. With nothing naming GPUs the
    replay is the session's count (above)."""
    recording = str(DATA / "nvml_four_a100.json")
    reader = NvmlReader(service.replayed(recording, 1, "a100", env=env), env=env)
    gpus = Sampler(reader).sample(0.0, kernel_busy=False)["gpus"]
    assert [g["index"] for g in gpus] == indices, gpus


# -- a notebook session stopped from the sidebar ------------------------------------------------


@pytest.mark.integration
def test_cell_after_a_stop_elsewhere_says_who_stopped_it(manager):
    notebook = manager
    sidebar = type(manager)(manager.config)  # another process's manager: the server's
    session = notebook.start(notebook.make_spec("t4", backend="local", idle="off", name="nb-stop"))
    assert session.run("1 + 1")["status"] == "ok"
    sidebar.stop(session.id, by="the JupyterLab sidebar")
    with pytest.raises(SessionEnded) as ended:
        session.run("1 + 1")
    record = notebook.get(session.id)
    assert record.state == State.STOPPED and record.stop_reason.by == "the JupyterLab sidebar"
    assert error_text(ended.value).startswith(
        "session nb-stop was stopped by the JupyterLab sidebar (ran "
    )
    sidebar.close()
