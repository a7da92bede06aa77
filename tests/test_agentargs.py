"""The agent's command line as one typed value (gpusession.configuration.agentargs.AgentArgs): every field
goes through `argv()` and back through the agent's own parser (`python -m gpusession.agent run`)
exactly, the parser has no option the value lacks, and each default is the same on both sides."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from gpusession.agent.kernel_runtime import build_parser, run_args
from gpusession.configuration.agentargs import (
    FLAG,
    FLOAT,
    INT,
    MONEY,
    NUMBER,
    RECORDING,
    TEXT,
    AgentArgs,
)
from gpusession.configuration.settings import BUILTIN_IDLE
from gpusession.core.durations import IDLE, DurationRule
from gpusession.core.models import Event, LaunchSpec, SessionRecord, State

DATA = Path(__file__).parent / "data"
RECORDED = str(DATA / "nvml_two_t4.json")
PLACED = AgentArgs(session_id="abc", state_dir="/tmp/x")
T0 = 1_700_000_000.0


def samples(field: dataclasses.Field) -> list:
    """Values of `field` the agent must read back exactly, by the field's kind (a new kind needs
    its samples here)."""
    kind = field.metadata["kind"]
    if isinstance(kind, DurationRule):
        return [
            kind.min_s + 1 / 3,
            kind.max_s,
            1000800.5 if kind.max_s > 1000800.5 else kind.max_s - 0.1,
            *([None] if kind.allow_off else []),
        ]
    by_kind = {
        TEXT: ["/tmp/some folder/k", "shutdown -h now"],
        INT: [7, -1, 2 * 1024**3 + 1],
        FLOAT: [0.1 + 0.2, 90.5],
        NUMBER: [1 / 7, T0 + 0.123456, 12.345678901234, 0.0],
        MONEY: [0.01, 12.345678901234, 99_999.99],
        FLAG: [True],
        RECORDING: [RECORDED],
    }
    assert kind in by_kind, f"no samples for {field.name}'s kind {kind!r}: add them here"
    return by_kind[kind]


def agent_reads(args: AgentArgs) -> AgentArgs:
    """What the agent's parser makes of args.argv(), as the agent reads it (run_args)."""
    return run_args(args.argv())


@pytest.mark.parametrize("field", dataclasses.fields(AgentArgs), ids=lambda f: f.name)
def test_every_field_round_trips_exactly_through_the_agent_parser(field):
    for value in samples(field):
        args = dataclasses.replace(PLACED, **{field.name: value})
        words = args.argv()
        assert not any("e+" in w or "e-" in w for w in words if w[:1].isdigit()), (
            words
        )  # no exponent
        assert agent_reads(args) == args, (field.name, value, words)


def test_the_agent_parser_has_no_option_the_value_lacks():
    run = build_parser()._subparsers._group_actions[0].choices["run"]
    options = {a.dest for a in run._actions if a.dest != "help"}
    assert options == {f.name for f in dataclasses.fields(AgentArgs)}


def test_the_defaults_are_the_agents():
    """Nothing given: the agent's parser gives the value's defaults, and argv() writes only the
    placement and what every backend says explicitly."""
    assert agent_reads(PLACED) == PLACED
    assert PLACED.argv() == [
        "--session-id",
        "abc",
        "--state-dir",
        "/tmp/x",
        "--kernel-ports",
        "0",
        "--agent-port",
        "0",
        "--idle",
        "1800s",
        "--price-per-hour",
        "0",
        "--gpu-count",
        "1",
    ]


def test_one_idle_default_for_the_session_the_settings_and_the_agent():
    assert LaunchSpec("t4").idle == AgentArgs().idle == PLACED.idle == IDLE.parse(BUILTIN_IDLE)
    assert BUILTIN_IDLE == "30m"


def test_a_record_with_its_placement_and_billing_left_to_the_runtime():
    """What a backend fills in is only its placement; billed_since=None (Slurm: billing starts
    with the job, not in the queue) leaves the flag out, and the agent counts from its start."""
    rec = SessionRecord(
        id="abc",
        name="t4-1",
        spec=LaunchSpec("t4", gpu_count=2, idle=None, extra={"save_timeout": None, "resume": "ws"}),
        state=State.PROVISIONING,
        created_at=T0,
        updated_at=T0,
        owner="me@here:1",
        price_per_hour=1 / 7,
        events=[Event("abc", State.REQUESTED, T0), Event("abc", State.PROVISIONING, T0 + 1)],
        resource={"billed_from": T0 + 1.25},  # the backend's resource exists from then
    )
    billed = AgentArgs.for_record(rec, session_id="abc", state_dir="/tmp/x")
    assert billed.billed_since == T0 + 1.25 and agent_reads(billed) == billed
    assert (billed.idle, billed.save_timeout, billed.restore, billed.gpu_count) == (
        None,
        None,
        True,
        2,
    )
    queued = AgentArgs.for_record(rec, session_id="abc", state_dir="/tmp/x", billed_since=None)
    assert "--billed-since" not in queued.argv() and agent_reads(queued).billed_since is None
    assert dataclasses.replace(queued, billed_since=billed.billed_since) == billed


def test_the_first_steps_quick_read_takes_the_same_placement():
    """The bundle's first step reads the kernel's placement without argparse (it starts the
    kernel before the runtime loads): from argv() it reads what the agent reads."""
    from gpusession.agent.kernelspawn import _options

    args = AgentArgs(
        session_id="abc",
        state_dir="/tmp/x",
        kernel_ip="/tmp/s/k",
        kernel_ports=7,
        cwd="/w",
        workspace="/ws",
        restore=True,
        agent_port=9,
        ready_timeout=30.0,
    )
    opts = _options(args.argv())
    assert opts == {
        "--session-id": "abc",
        "--state-dir": "/tmp/x",
        "--kernel-ip": "/tmp/s/k",
        "--kernel-ports": "7",
        "--cwd": "/w",
        "--workspace": "/ws",
        "--restore": "",
        "--agent-port": "9",  # the port it binds ahead, for KERNEL and READY to name
        "--ready-timeout": opts["--ready-timeout"],
    }
    assert float(opts["--ready-timeout"]) == 30.0
    assert _options(AgentArgs(session_id="a", state_dir="/s").argv())["--agent-port"] == "0"
