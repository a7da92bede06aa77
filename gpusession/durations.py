"""Parsing and printing of durations and money as users type them ("15m", "1h30m", "off", "$5")."""

from __future__ import annotations

import re

from .errors import BadInput

_UNITS = {"s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "hr": 3600, "d": 86400}
_PART = re.compile(r"(\d+(?:\.\d+)?)\s*(s|sec|min|m|hr|h|d)")
_OFF = {"off", "none", "never", "no", "0"}


def parse_duration(text: str | float | int | None, *, what: str = "duration", allow_off: bool = True) -> float | None:
    """'90s', '15m', '1h30m', '2h', a bare number of minutes (SkyPilot's habit) -> seconds.

    'off' / 'none' / '0' -> None (meaning: never) when allow_off.
    """
    if text is None:
        return None
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value = float(text)
        if value < 0:
            raise BadInput(f"{what} must not be negative, got {text}")
        return None if (value == 0 and allow_off) else value * 60
    s = str(text).strip().lower()
    if allow_off and s in _OFF:
        return None
    try:
        minutes = float(s)
    except ValueError:
        pass
    else:
        if minutes < 0:
            raise BadInput(f"{what} must not be negative, got {text!r}")
        return minutes * 60
    pos, total = 0, 0.0
    compact = s.replace(" ", "")
    for m in _PART.finditer(compact):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    if pos != len(compact) or not compact:
        hint = " or 'off'" if allow_off else ""
        raise BadInput(f"bad {what} {text!r}: write e.g. 90s, 15m, 1h30m (a bare number means minutes){hint}")
    if total <= 0 and not allow_off:
        raise BadInput(f"{what} must be positive, got {text!r}")
    return total if total > 0 else None


def parse_money(text: str | float | int | None, *, what: str = "amount") -> float | None:
    if text is None:
        return None
    s = str(text).strip().lstrip("$").strip()
    if s.lower() in _OFF or s == "":
        return None
    try:
        value = float(s)
    except ValueError:
        raise BadInput(f"bad {what} {text!r}: write dollars, e.g. 5 or 2.50") from None
    if value <= 0:
        raise BadInput(f"{what} must be positive, got {text!r}")
    return value


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
