"""The one duration grammar (and money), in one place: every form, 'off', the bounds, non-finite
input, and the exact round trip of args_for through the agent's own command line."""

from __future__ import annotations

import math
import re

import pytest

from gpusession.agent.kernel_runtime import build_parser
from gpusession.configuration.agentargs import AgentArgs
from gpusession.core.durations import (
    IDLE,
    KEEPALIVE,
    MAX_RUNTIME,
    WATCH,
    exact_decimal,
    format_bound,
    parse_duration,
    parse_money,
)
from gpusession.core.errors import BadInput
from gpusession.core.models import Event, LaunchSpec, SessionRecord, State

T0 = 1_700_000_000.0


def args_for(rec) -> list[str]:
    """The agent's options for a record, as a backend writes them (placed in /tmp/x)."""
    return AgentArgs.for_record(rec, session_id="abc", state_dir="/tmp/x").argv()


@pytest.mark.parametrize(
    "text, seconds",
    [
        ("90s", 90),
        ("90 sec", 90),
        ("45 seconds", 45),
        ("15m", 900),
        ("15 min", 900),
        ("2 minutes", 120),
        ("1h30m", 5400),
        ("1h 30m", 5400),
        ("2h", 7200),
        ("2 hours", 7200),
        ("1.5h", 5400),
        (".5h", 1800),
        ("1d", 86400),
        ("1d2h", 93600),
        ("2H", 7200),
        # a bare number means minutes, written or as a number
        ("10", 600),
        ("2.5", 150),
        (10, 600),
        (0.5, 30),
    ],
)
def test_every_form(text, seconds):
    assert parse_duration(text) == seconds
    assert IDLE.parse(text) == seconds


@pytest.mark.parametrize("text", ["off", "OFF", "none", "never", "no", "0", "0.0", 0, 0.0, None])
def test_off_means_never_where_a_limit_may_be_off(text):
    assert IDLE.parse(text) is None
    assert MAX_RUNTIME.parse(text) is None


@pytest.mark.parametrize("rule", [KEEPALIVE, WATCH])
def test_a_keepalive_or_a_watch_cannot_be_off(rule):
    with pytest.raises(BadInput, match=f"bad {rule.what} 'off'"):
        rule.parse("off")
    with pytest.raises(BadInput, match=f"{rule.what} must be positive"):
        rule.parse("0")
    assert rule.parse("1m") == 60


@pytest.mark.parametrize(
    "text, needle",
    [
        (
            "abc",
            "bad idle timeout 'abc': write e.g. 90s, 15m, 1h30m (a bare number means minutes) or 'off'",
        ),
        ("5x", "bad idle timeout '5x'"),
        ("1h-2m", "bad idle timeout '1h-2m'"),
        ("m", "bad idle timeout 'm'"),
        ("1e3", "bad idle timeout '1e3'"),  # no exponents: nobody writes minutes that way
        (True, "bad idle timeout True"),
        ("-3", "idle timeout must not be negative, got '-3'"),
        ("-3m", "idle timeout must not be negative"),
        (-3, "idle timeout must not be negative"),
    ],
)
def test_bad_durations_name_what_was_asked(text, needle):
    with pytest.raises(BadInput) as e:
        IDLE.parse(text)
    assert needle in str(e.value)


@pytest.mark.parametrize(
    "text", ["inf", "-inf", "Infinity", "nan", "NaN", "1e999", math.inf, -math.inf, math.nan]
)
def test_non_finite_input_is_refused(text):
    with pytest.raises(BadInput, match="idle timeout must be a finite number"):
        IDLE.parse(text)


@pytest.mark.parametrize(
    "rule, longest, too_long, bound",
    [
        (IDLE, "7d", "8d", "7d"),
        (IDLE, "10080", "10081", "7d"),  # minutes
        (MAX_RUNTIME, "30d", "720h1s", "30d"),
        (KEEPALIVE, "24h", "25h", "1d"),
        (WATCH, "1d", "1441m", "1d"),
    ],
)
def test_every_use_has_its_bound_and_names_it(rule, longest, too_long, bound):
    assert rule.parse(longest) == rule.max_s
    with pytest.raises(BadInput) as e:
        rule.parse(too_long)
    assert str(e.value) == f"{rule.what} must be at most {bound}, got {too_long!r}"


def test_numbers_too_large_for_a_float_hit_the_bound_and_long_input_is_cut_short():
    with pytest.raises(BadInput, match="must be at most 7d"):
        IDLE.parse(10**400)  # a JSON body may carry such an int
    with pytest.raises(BadInput) as e:
        IDLE.parse("9" * 400)
    assert "must be at most 7d" in str(e.value) and len(str(e.value)) < 100


@pytest.mark.parametrize(
    "text, dollars",
    [
        ("$5", 5.0),
        ("5", 5.0),
        (5, 5.0),
        ("2.50", 2.5),
        (" $ 0.75 ", 0.75),
        ("100000", 100_000.0),
        ("0", None),
        (0, None),
        ("off", None),
        (None, None),
    ],
)
def test_money(text, dollars):
    assert parse_money(text, what="max cost") == dollars


@pytest.mark.parametrize(
    "text, needle",
    [
        ("five", "bad max cost 'five': write dollars, e.g. 5 or 2.50"),
        ("-1", "max cost must be positive"),
        (-1, "max cost must be positive"),
        ("inf", "max cost must be a finite number"),
        ("nan", "max cost must be a finite number"),
        ("1e999", "max cost must be a finite number"),
        (math.nan, "max cost must be a finite number"),
        (math.inf, "max cost must be a finite number"),
        (100_001, "max cost must be at most $100,000"),
        ("1" + "0" * 400, "max cost must be at most $100,000"),
        (True, "bad max cost True"),
    ],
)
def test_bad_money(text, needle):
    with pytest.raises(BadInput) as e:
        parse_money(text, what="max cost")
    assert needle in str(e.value)


@pytest.mark.parametrize(
    "value, text",
    [
        (1000800.0, "1000800"),
        (0.1, "0.1"),
        (1e-05, "0.00001"),
        (1e16, "10000000000000000"),
        (3.0, "3"),
        (0.1 + 0.2, "0.30000000000000004"),
        (2592000.0, "2592000"),
    ],
)
def test_exact_decimal_has_no_exponent_and_reads_back_the_same_float(value, text):
    assert exact_decimal(value) == text
    assert float(text) == value


def test_format_bound():
    assert [format_bound(s) for s in (7 * 86400, 86400, 3600 * 5, 90 * 60, 45, 1.5)] == [
        "7d",
        "1d",
        "5h",
        "90m",
        "45s",
        "1.5s",
    ]


# -- between our processes: args_for -> the agent's parser ---------------------------------------


def record(price: float = 0.526, **spec) -> SessionRecord:
    return SessionRecord(
        id="abc",
        name="t4-1",
        spec=LaunchSpec(gpu_type="t4", **spec),
        state=State.PROVISIONING,
        created_at=T0,
        updated_at=T0,
        owner="me@here:1",
        price_per_hour=price,
        events=[  # billed from when provisioning returned (the resource exists): T0 + 1.25
            Event("abc", State.REQUESTED, T0),
            Event("abc", State.PROVISIONING, T0 + 0.5),
            Event("abc", State.STARTING, T0 + 1.25),
        ],
    )


def agent_reads(args: list[str]):
    return build_parser().parse_args(["run", "--session-id", "abc", "--state-dir", "/tmp/x", *args])


@pytest.mark.parametrize(
    "idle, runtime, cost, price",
    [
        (
            IDLE.max_s,
            278 * 3600.0,
            99_999.99,
            98.32,
        ),  # --max-runtime 278h broke the container start with `:g`
        (1800.0, MAX_RUNTIME.max_s, 5.0, 0.526),
        (
            2 + 0.1 + 0.2,
            2 + 1 / 3,
            0.01,
            1 / 7,
        ),  # fractions (the watchdog's limits are 2s at least)
        (90.5, 1000800.5, 12.345678901234, 0.0),
        (2.001, 86399.999, 1e-05, 123456.789),
    ],
)
def test_args_for_round_trips_exactly_through_the_agent_parser(idle, runtime, cost, price):
    args = args_for(
        record(price=price, idle=idle, max_runtime=runtime, max_cost=cost, gpu_only=True)
    )
    assert all(" " not in a and not re.search(r"\d[eE][-+]?\d", a) for a in args), args
    assert args[args.index("--idle") + 1].endswith("s") and args[
        args.index("--max-runtime") + 1
    ].endswith("s")
    ns = agent_reads(args)
    assert (ns.idle, ns.max_runtime, ns.max_cost, ns.price_per_hour) == (idle, runtime, cost, price)
    assert ns.gpu_only and ns.billed_since == T0 + 1.25


def test_the_agent_reads_the_same_grammar():
    assert agent_reads(["--idle", "60"]).idle == 3600.0  # a bare number means minutes here too
    assert agent_reads(["--idle", "off", "--max-runtime", "1h30m"]).max_runtime == 5400.0
    assert agent_reads(["--idle", "off"]).idle is None
    assert agent_reads([]).idle == 1800.0


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--idle", "abc"], "bad idle timeout 'abc'"),
        (["--idle", "8d"], "idle timeout must be at most 7d"),
        (["--max-runtime", "1e999"], "max runtime must be a finite number"),
        (["--max-cost", "nan"], "max cost must be a finite number"),
        (["--price-per-hour", "inf"], "expected a finite number"),
        (["--gpu-threshold", "nan"], "expected a finite number"),
    ],
)
def test_the_agent_refuses_what_the_grammar_refuses(args, needle, capsys):
    with pytest.raises(SystemExit):
        agent_reads(args)
    assert needle in capsys.readouterr().err
