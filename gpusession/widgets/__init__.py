"""`%gpu panel`: the sidebar's session card as ipywidgets, inside the notebook.

One card per session - type x count and backend, state, uptime, $/hour, cost so far, idle
countdown and warning, live gauges (each GPU's utilization, memory, temperature and power, or
"no NVIDIA GPU visible"; the session's CPU and memory) - with stop and keep-alive buttons, and
a start form (GPU type from the catalog with its price, backend, idle timeout).

    card.py   Gauge, GpuGauges, StatsView, SessionCard: widgets that show what they are given
    panel.py  SessionPanel (cards + start form + the refreshing thread), StartForm, `%gpu panel`

A background thread refreshes the cards every `REFRESH_S` seconds (ipywidgets may be updated
from any thread of the kernel); it ends when nothing on the panel is active any more, or when
the panel is closed. Everything goes through `SessionManager`; no backend is imported here.
docs/panel.md lists the CSS classes browser tests find the parts by.
"""

from __future__ import annotations

from .card import GpuGauges, SessionCard, StatsView
from .panel import REFRESH_S, PanelCommand, SessionPanel, StartForm, register_panel

__all__ = [
    "GpuGauges",
    "PanelCommand",
    "REFRESH_S",
    "SessionCard",
    "SessionPanel",
    "StartForm",
    "StatsView",
    "register_panel",
]
