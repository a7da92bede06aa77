"""Cost: one formula for the store's numbers and the agent's live meter; the cost cap and its
80% warning with an injected clock; what the agent is told about a session's price."""

from __future__ import annotations

import pytest

from gpusession.agent.idle import ActivityTracker
from gpusession.agent.kernel_runtime import build_parser
from gpusession.configuration.agentargs import AgentArgs
from gpusession.configuration.cost import (
    BILLED_FROM,
    MINIMUM_BILLED_S,
    billing_started_at,
    cost_for_seconds,
    cost_of,
    seconds_until_cost,
)
from gpusession.core.models import Event, LaunchSpec, SessionRecord, State
from gpusession.core.protocol import StopKind, StopReason, WarningKind
from gpusession.words.stops import describe_stop, describe_warning

T0 = 1_700_000_000.0


def args_for(rec) -> list[str]:
    """The agent's options for a record, as a backend writes them (placed in /tmp/x)."""
    return AgentArgs.for_record(rec, session_id="abc", state_dir="/tmp/x").argv()


def build_policy_args(args: list[str]):
    """What the runtime's parser makes of them."""
    return build_parser().parse_args(["run", "--session-id", "abc", "--state-dir", "/tmp/x", *args])


def record(events: list[tuple[State, float]], price: float = 3.6, **spec) -> SessionRecord:
    return SessionRecord(
        id="abc",
        name="t4-1",
        spec=LaunchSpec(gpu_type="t4", **spec),
        state=events[-1][0],
        created_at=events[0][1],
        updated_at=events[-1][1],
        owner="me@here:1",
        price_per_hour=price,
        events=[Event("abc", s, t) for s, t in events],
    )


def test_per_second_with_a_one_minute_minimum():
    assert cost_for_seconds(3.6, 0) == 0.0
    assert cost_for_seconds(3.6, 1) == pytest.approx(
        3.6 * MINIMUM_BILLED_S / 3600
    )  # the minute minimum
    assert cost_for_seconds(3.6, 61) == pytest.approx(0.061)
    assert cost_for_seconds(0.0, 10_000) == 0.0


def test_store_numbers_use_the_same_formula():
    r = record(
        [
            (State.REQUESTED, T0),
            (State.PROVISIONING, T0 + 1),
            (State.RUNNING, T0 + 31),
            (State.STOPPED, T0 + 1801),
        ]
    )
    assert billing_started_at(r) == T0 + 31  # provisioning returned: its resource exists
    assert cost_of(r) == pytest.approx(cost_for_seconds(3.6, 1770)) == pytest.approx(1.77)
    r.resource[BILLED_FROM] = T0 + 20  # the backend saw its container start
    assert cost_of(r) == pytest.approx(1.781)


def test_what_never_ran_costs_nothing_and_says_so():
    """A start that failed in 0.07 s (before any container, instance or job existed) costs $0,
    not the minute minimum, and every face says "never ran"; a session that ran does not."""
    from gpusession.session.views import session_view
    from gpusession.words.status import rest_view, session_table
    from gpusession.words.stops import ended_message

    failed = record(
        [(State.REQUESTED, T0), (State.PROVISIONING, T0 + 0.01), (State.FAILED, T0 + 0.08)]
    )
    failed.error = "image: image x is not on the Docker engine"
    assert cost_of(failed) == 0.0 and billing_started_at(failed) is None
    view = rest_view(session_view(failed))
    assert view["cost_so_far"] == 0.0 and view["never_ran"] and view["ran"] == "never ran"
    row = session_table([view]).splitlines()[1]
    assert "never ran" in row and "0s" not in row and row.endswith("$0.0000"), row
    assert ended_message(failed).endswith("(never ran, cost $0.0000)"), ended_message(failed)
    # stopped while provisioning, its resource created but never started: nothing either
    stopped = record(
        [(State.PROVISIONING, T0), (State.STOPPING, T0 + 5), (State.STOPPED, T0 + 6)],
        backend="docker",
    )
    assert cost_of(stopped) == 0.0 and session_view(stopped)["never_ran"]
    stopped.resource[BILLED_FROM] = T0 + 4  # but its container had started: billed (a minute)
    assert cost_of(stopped) == pytest.approx(cost_for_seconds(3.6, 60))
    assert not session_view(stopped)["never_ran"]
    assert rest_view(session_view(stopped))["ran"] == "ran 0s"  # it never reached running


def test_every_face_says_when_a_price_is_the_cloud_rate_on_own_hardware():
    """The catalog's rate applied to this machine (local, docker here or on an ssh:// host) is
    said to be that; a configured price says so; a cloud's price needs no note."""
    from gpusession.backends.aws import AwsBackend
    from gpusession.backends.docker import DockerBackend
    from gpusession.backends.local import LocalBackend
    from gpusession.configuration.config import GpuSessionConfig
    from gpusession.configuration.cost import PRICE_BASIS
    from gpusession.session.views import session_view
    from gpusession.widgets.card import SessionCard
    from gpusession.words.status import rate_text, rest_view, session_table

    spec = LaunchSpec(gpu_type="t4", extra={"host": "ssh://me@gpu-box"})
    catalog_rate, configured = GpuSessionConfig(), GpuSessionConfig(price_per_hour=0.25)
    assert DockerBackend(catalog_rate, None).price_basis(spec) == "own_hardware"
    assert LocalBackend(catalog_rate, None).price_basis(spec) == "own_hardware"
    assert DockerBackend(configured, None).price_basis(spec) == "configured"
    assert AwsBackend(catalog_rate, None).price_basis(spec) == "cloud"
    r = record([(State.PROVISIONING, T0), (State.RUNNING, T0 + 1)], price=0.526)
    r.resource[PRICE_BASIS] = "own_hardware"
    view = session_view(r)
    assert rate_text(view) == "$0.5260/h (cloud rate, own hardware)"
    assert "0.526 (cloud rate, own hardware)" in session_table([view])
    assert rest_view(view)["price_note"] == "cloud rate, own hardware"  # the sidebar's
    card = SessionCard(view, on_stop=print, on_keepalive=print)  # the %gpu panel's
    assert card.price.value == "$0.5260/h (cloud rate, own hardware)"
    r.resource[PRICE_BASIS] = "configured"
    assert rate_text(session_view(r)) == "$0.5260/h (configured price)"
    r.resource[PRICE_BASIS] = "cloud"
    assert rate_text(session_view(r)) == "$0.5260/h"
    assert rest_view(session_view(r))["price_note"] is None


def test_a_queued_job_is_billed_from_its_start_not_from_its_submit():
    """A Slurm job waits 100 s in the queue (PROVISIONING), runs from T0+100 (the backend saves
    BILLED_FROM), stops at T0+400: 300 s billed, as the agent's meter counts; nothing while queued."""
    from gpusession.configuration.cost import BILLED_FROM, record_billed_seconds
    from gpusession.session.views import session_view

    r = record(
        [
            (State.PROVISIONING, T0),
            (State.STARTING, T0 + 101),
            (State.RUNNING, T0 + 102),
            (State.STOPPED, T0 + 400),
        ],
        price=36.0,
        backend="slurm",
    )
    r.resource[BILLED_FROM] = None  # submitted, still queued
    assert record_billed_seconds(r, at=T0 + 90) == 0.0 and cost_of(r, at=T0 + 90) == 0.0
    assert billing_started_at(r) is None
    r.resource[BILLED_FROM] = T0 + 100
    assert record_billed_seconds(r) == pytest.approx(300.0)
    assert cost_of(r) == pytest.approx(3.0)  # 300 s at $36/h; from the submit it would be $4.00
    assert billing_started_at(r) == T0 + 100
    assert session_view(r)["cost_so_far"] == pytest.approx(
        3.0
    )  # what REST, the sidebar and the CLI show
    del r.resource[BILLED_FROM]  # a backend that does not say: from when provisioning returned
    assert cost_of(r) == pytest.approx(2.99)


def test_live_meter_counts_from_billing_start():
    tr = ActivityTracker(AgentArgs(price_per_hour=3.6, idle=None), billed_since=T0)
    assert tr.evaluate(T0 + 10).cost["so_far"] == pytest.approx(0.06)  # minimum minute
    c = tr.evaluate(T0 + 1800).cost
    assert (
        c["so_far"] == pytest.approx(1.8) and c["billed_s"] == 1800 and c["price_per_hour"] == 3.6
    )


def test_max_cost_warns_at_80_percent_and_stops_at_the_cap():
    tr = ActivityTracker(AgentArgs(price_per_hour=3.6, max_cost=5.0, idle=None), billed_since=T0)
    # $5 at $3.60/h is 5000 s; 80% ($4) at 4000 s
    assert tr.evaluate(T0 + 3999).warnings == []
    v = tr.evaluate(T0 + 4000)
    assert v.stop_reason is None
    text = describe_warning(v.warnings[0])
    assert "spent $4.00 of the $5.00 cap" in text and "in about 16m40s" in text
    assert v.cost["remaining_s"] == pytest.approx(1000)
    assert [w.kind for w in v.warnings] == [WarningKind.MAX_COST]
    assert tr.evaluate(T0 + 4999).stop_reason is None
    v = tr.evaluate(T0 + 5000)
    assert v.stop_reason == StopReason(StopKind.MAX_COST, spent=5.0, max_cost=5.0)
    assert (
        describe_stop("t4-1", v.stop_reason)
        == "session t4-1 was stopped by its cost cap: spent $5.00 of the $5.00 cap"
    )
    assert seconds_until_cost(0.0, 5.0, 100) is None  # free sessions never reach a cap


def test_the_cap_wins_over_idle_and_runtime_when_several_fire():
    tr = ActivityTracker(
        AgentArgs(price_per_hour=36.0, max_cost=1.0, max_runtime=60, idle=60),
        billed_since=T0,
    )
    assert tr.evaluate(T0 + 100).stop_reason.kind is StopKind.MAX_COST


def test_args_for_carries_price_billing_start_and_limits():
    r = record(
        [(State.REQUESTED, T0), (State.PROVISIONING, T0 + 2.5)],
        price=0.526,
        idle=300.0,
        max_cost=5.0,
        max_runtime=8 * 3600.0,
        gpu_only=True,
        gpu_count=2,
    )
    args = args_for(r)
    assert all(" " not in a for a in args), "words only: the container entrypoint splits on spaces"
    ns = build_policy_args(args)
    assert (
        ns.idle == 300 and ns.price_per_hour == 0.526 and ns.billed_since is None
    )  # from its start
    assert ns.max_cost == 5.0 and ns.max_runtime == 8 * 3600 and ns.gpu_only and ns.gpu_count == 2
    off = args_for(record([(State.REQUESTED, T0)], idle=None))
    ns = build_policy_args(off)
    assert ns.idle is None and ns.max_cost is None and ns.billed_since is None and not ns.gpu_only


def test_the_minimum_charge_is_said_while_it_applies():
    """At uptime 0 the cost is already a minute's: the card says why (issue 32)."""
    from gpusession.words.status import cost_text, rest_view

    view = {"cost_so_far": 0.0088, "billed_s": 3.0, "price_per_hour": 0.526, "max_cost": None}
    assert cost_text(view) == "$0.0088 (60-second minimum)"
    assert cost_text(dict(view, billed_s=61.0, cost_so_far=0.009)) == "$0.0090"
    assert cost_text(dict(view, billed_s=0.0, cost_so_far=0.0)) == "$0.0000"  # not billed yet
    assert cost_text(dict(view, price_per_hour=0.0, cost_so_far=0.0)) == "$0.0000"  # free
    assert cost_text(dict(view, max_cost=5.0)) == "$0.0088 (60-second minimum) of $5.00"
    assert rest_view(dict(view, idle={}))["cost_note"] == (
        "the first minute is billed in full (60-second minimum)"
    )
