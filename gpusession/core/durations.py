"""The one grammar of durations and money, as users and processes write them, and their printing.

Durations: "90s", "15m", "1h30m", "2 h", "1d", ".5h", or a bare number, which means MINUTES
everywhere (SkyPilot's habit): in the magics, the CLI, REST bodies, the forms, and the agent's
own command line. "off" / "none" / "never" / "no" / "0" mean never where a limit may be off.
Every use has its bounds (`DurationRule`: the longest and the shortest it can honour); non-finite
values (inf, nan, 1e999) are refused.

Between our own processes numbers travel exactly: a duration goes as `exact_decimal(s) + "s"`
("1000800s", never "1.0008e+06"), and `parse_duration` reads back the very same float.

Standard library only: the agent, which runs in the user's image, uses this module too.
"""

from __future__ import annotations

import dataclasses
import math
import re
from decimal import Decimal

from .errors import BadInput

MINUTE = 60.0
HOUR = 3600.0
DAY = 86400.0

_UNITS = {
    "s": 1,
    "sec": 1,
    "secs": 1,
    "second": 1,
    "seconds": 1,
    "m": 60,
    "min": 60,
    "mins": 60,
    "minute": 60,
    "minutes": 60,
    "h": 3600,
    "hr": 3600,
    "hrs": 3600,
    "hour": 3600,
    "hours": 3600,
    "d": 86400,
    "day": 86400,
    "days": 86400,
}
_NUMBER = r"(?:\d+(?:\.\d*)?|\.\d+)"
# longest unit names first, so "min" is not read as "m" + "in"
_PART = re.compile(rf"({_NUMBER})({'|'.join(sorted(_UNITS, key=len, reverse=True))})")
_BARE = re.compile(_NUMBER)
_OFF = {"off", "none", "never", "no", "0"}

#: the largest amount of money any option accepts (dollars)
MAX_DOLLARS = 100_000.0
#: durations without a rule of their own are bounded by the widest rule
MAX_DURATION_S = 30 * DAY

_HINT = "write e.g. 90s, 15m, 1h30m (a bare number means minutes)"


def format_bound(seconds: float) -> str:
    """A bound as a user would write it: 7d, 24h, 90m, 45s."""
    for unit, size in (("d", DAY), ("h", HOUR), ("m", MINUTE)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{exact_decimal(seconds)}s"


def parse_duration(
    text: str | float | int | None,
    *,
    what: str = "duration",
    allow_off: bool = True,
    max_s: float = MAX_DURATION_S,
    min_s: float = 0.0,
) -> float | None:
    """Seconds from a duration as written (see the module doc); None for "off" (when allow_off)
    or for None. Raises BadInput naming `what` and, past `max_s` or short of `min_s`, the bound."""
    if text is None:
        return None
    if isinstance(text, bool):
        raise BadInput(f"bad {what} {shown(text)}: {_HINT}")
    if isinstance(text, (int, float)):
        return _checked(_as_float(text) * MINUTE, text, what, allow_off, max_s, min_s)
    s = str(text).strip().lower()
    if s in _OFF and allow_off:
        return None
    compact = s.replace(" ", "")
    if _BARE.fullmatch(compact):
        return _checked(float(compact) * MINUTE, text, what, allow_off, max_s, min_s)
    if compact.startswith("-") and (
        _BARE.fullmatch(compact[1:]) or _parts(compact[1:]) is not None
    ):
        raise BadInput(f"{what} must not be negative, got {shown(text)}")
    total = _parts(compact)
    if total is None:
        if _non_finite_number(compact):
            raise BadInput(f"{what} must be a finite number, got {shown(text)}")
        hint = " or 'off'" if allow_off else ""
        raise BadInput(f"bad {what} {shown(text)}: {_HINT}{hint}")
    return _checked(total, text, what, allow_off, max_s, min_s)


def _parts(compact: str) -> float | None:
    """'1h30m' -> 5400.0; None when it is not a sequence of NUMBER UNIT parts."""
    pos, total = 0, 0.0
    for m in _PART.finditer(compact):
        if m.start() != pos:
            return None
        total += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    return total if compact and pos == len(compact) else None


def shown(text: object, limit: int = 40) -> str:
    """The value as typed, in quotes, cut short when it is long: a message never echoes a huge
    value whole."""
    quote = "'" if isinstance(text, str) else ""
    text = repr(text[: limit + 10] if isinstance(text, str) else text)
    return text if len(text) <= limit else text[: limit - 4] + "..." + quote


def _as_float(number: int | float) -> float:
    try:
        return float(number)
    except OverflowError:  # an int too large for a float (JSON allows it)
        return math.inf


def _non_finite_number(text: str) -> bool:
    try:
        return not math.isfinite(float(text))
    except ValueError:
        return False


def _checked(
    seconds: float, text: object, what: str, allow_off: bool, max_s: float, min_s: float
) -> float | None:
    if math.isnan(seconds) or (isinstance(text, float) and not math.isfinite(text)):
        raise BadInput(f"{what} must be a finite number, got {shown(text)}")
    if seconds < 0:
        raise BadInput(f"{what} must not be negative, got {shown(text)}")
    if seconds == 0:
        if allow_off:
            return None
        raise BadInput(f"{what} must be positive, got {shown(text)}")
    if seconds > max_s:  # inf from a long string of digits lands here too
        raise BadInput(f"{what} must be at most {format_bound(max_s)}, got {shown(text)}")
    if seconds < min_s:
        off = " (or off)" if allow_off else ""
        raise BadInput(f"{what} must be at least {format_bound(min_s)}{off}, got {shown(text)}")
    return seconds


@dataclasses.dataclass(frozen=True)
class DurationRule:
    """How one use of a duration is read: its name in messages, its bounds, whether it may be off."""

    what: str  # in messages: "idle timeout"
    max_s: float  # the longest accepted, in seconds
    allow_off: bool = True  # "off" (or 0) means never; else a positive duration is required
    min_s: float = 1.0  # the shortest accepted (what can be honoured), in seconds; 0 is still off

    def parse(self, text: str | float | int | None) -> float | None:
        return parse_duration(
            text, what=self.what, allow_off=self.allow_off, max_s=self.max_s, min_s=self.min_s
        )


# The watchdog decides once a second and counts from the runtime's start, before the kernel
# boots: an idle or runtime limit under two of its decisions stops the session during its start.
WATCHDOG_MIN_S = 2.0
IDLE = DurationRule("idle timeout", 7 * DAY, min_s=WATCHDOG_MIN_S)
MAX_RUNTIME = DurationRule("max runtime", 30 * DAY, min_s=WATCHDOG_MIN_S)
# the agent grants a keepalive up to its own limit (4 h unless the session says otherwise)
KEEPALIVE = DurationRule("keepalive duration", 1 * DAY, allow_off=False)
SAVE_TIMEOUT = DurationRule("save time bound", 1 * HOUR)  # a save in under a second writes nothing
WATCH = DurationRule("watch duration", 1 * DAY, allow_off=False)
# Slurm: how long a job may wait in the queue (its state is asked every few seconds)
QUEUE_TIMEOUT = DurationRule("queue timeout", 30 * DAY, min_s=10.0)
# Slurm: how long before the job's end (its time limit, a preemption's grace) the agent saves
# (sbatch --signal=B:USR1@GRACE: Slurm's timer may send it up to a minute early)
SIGNAL_GRACE = DurationRule("signal grace", 1 * HOUR, min_s=10.0)
# GPUSESSION_RECONNECT_TIMEOUT: how long a dropped tunnel may stay down (settings.reconnect_give_up)
RECONNECT = DurationRule("reconnect timeout", 1 * DAY)
# the spend report's period (`gpusession report --since 30d`): up to ten years back
REPORT_SINCE = DurationRule("report period", 3660 * DAY, allow_off=False)


def parse_money(
    text: str | float | int | None, *, what: str = "amount", max_dollars: float = MAX_DOLLARS
) -> float | None:
    """Dollars from "5", "$2.50", 5; None for None, "off" or 0 (no limit). Finite, positive and
    at most `max_dollars`, else BadInput naming `what`."""
    if text is None:
        return None
    if isinstance(text, bool):
        raise BadInput(f"bad {what} {shown(text)}: write dollars, e.g. 5 or 2.50")
    if isinstance(text, (int, float)):
        value = _as_float(text)
        if math.isnan(value) or (isinstance(text, float) and math.isinf(value)):
            raise BadInput(f"{what} must be a finite number, got {shown(text)}")
    else:
        s = str(text).strip().lower().replace(" ", "")
        s = s[1:] if s.startswith("$") else s
        if s in _OFF or s == "":
            return None
        negative = s.startswith("-") and _BARE.fullmatch(s[1:])
        if not (_BARE.fullmatch(s) or negative):
            if _non_finite_number(s):
                raise BadInput(f"{what} must be a finite number, got {shown(text)}")
            raise BadInput(f"bad {what} {shown(text)}: write dollars, e.g. 5 or 2.50")
        value = float(s)
    if value == 0:
        return None
    if value < 0:
        raise BadInput(f"{what} must be positive, got {shown(text)}")
    if value > max_dollars:
        raise BadInput(f"{what} must be at most ${max_dollars:,.0f}, got {shown(text)}")
    return value


def exact_decimal(number: float) -> str:
    """A number as a plain decimal, the shortest that reads back to the same float, with no
    exponent: 1000800.0 -> "1000800", 0.1 -> "0.1", 1e-05 -> "0.00001". A duration written for
    another process takes its unit: f"{exact_decimal(s)}s" (a bare number would mean minutes)."""
    value = float(number)
    if not math.isfinite(value):
        raise ValueError(f"not a finite number: {number!r}")
    text = format(Decimal(repr(value)), "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return "0" if text in ("", "-0") else text


def format_duration(seconds: float | None) -> str:
    if seconds is None:
        return "off"
    seconds = max(0, int(round(seconds)))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    if h:
        return f"{h}h{m:02d}m"
    if m:
        return f"{m}m{s:02d}s"
    return f"{s}s"


def format_money(dollars: float) -> str:
    return f"${dollars:,.4f}" if dollars < 1 else f"${dollars:,.2f}"
