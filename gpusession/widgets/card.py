"""The widgets of one session card: they show what they are given (a SessionView, a stats
document) and call back on clicks; fetching and threads are panel.py's.

CSS classes: `gpusession-widget-` + card (plus `gpusession-widget-state-<state>`), name, state,
kind, uptime, price, cost, idle, idle-warning, error, advice, action-message, stop, keepalive, stats,
stats-note, recorded, gpu, gauge, gauge-<key of a gpusession.configuration.metrics row: util, memory, temp, power, cpu, ram>, gauge-value.
"""

from __future__ import annotations

import html
from typing import Callable

import ipywidgets as widgets

from ..configuration.metrics import Metric, metrics, nvml_error_text
from ..core.durations import format_duration
from ..core.models import State
from ..words.common import NEVER_RAN
from ..words.spend import advice_line
from ..words.status import (
    RECORDED_WORDS,
    cost_text,
    gpu_metric_text,
    placement_line,
    rate_text,
    recorded_words,
)
from ..words.stops import warning_texts

KEEPALIVE = "1h"  # what the keep-alive button asks for (the sidebar's button does the same)
FINAL_STATES = {State.STOPPED.value, State.FAILED.value}
_STATE_COLORS = {
    "running": "#2e7d32",
    "failed": "#c62828",
    "stopped": "#757575",
    "stopping": "#ef6c00",
}
WARN_STYLE = "color: #b45309; font-weight: bold"


# the sidebar's "recorded" badge (labextension .gpusession-recorded): replayed GPU values
def recorded_badge(words: str = RECORDED_WORDS, label: str = "recorded") -> str:
    """The badge, its title the words of where the values come from."""
    return (
        f'<span title="{html.escape(words)}" style="padding: 0 6px; border: 1px dashed '
        "var(--jp-warn-color1, #b45309); border-radius: 8px; font-size: 11px; text-transform: "
        f'uppercase; color: var(--jp-ui-font-color1, #333)">{html.escape(label)}</span>'
    )


RECORDED_BADGE = recorded_badge()

# rows of text at 20 px instead of ipywidgets' 28 px input height: a card about as tall as the sidebar's;
# the form's labels wide enough for "Max cost ($)" (ipywidgets cuts a label at 80 px)
STYLE = """<style>
.gpusession-widget-card .widget-label, .gpusession-widget-card .widget-html,
.gpusession-widget-card .widget-html-content, .gpusession-widget-stats .widget-label
{ min-height: 20px; height: auto; line-height: 20px; }
.gpusession-widget-stats .widget-hprogress { height: 20px; }
.gpusession-widget-start-form .widget-inline-hbox .widget-label { width: 110px; }
</style>"""


def classed(widget: widgets.DOMWidget, *names: str) -> widgets.DOMWidget:
    for name in names:
        widget.add_class(f"gpusession-widget-{name}")
    return widget


def show(widget: widgets.DOMWidget, visible: bool) -> None:
    widget.layout.display = None if visible else "none"


def html_text(widget: widgets.HTML, text: str | None, style: str = "") -> None:
    """Put `text` (escaped) in an HTML widget; hide it when there is none."""
    widget.value = f'<span style="{style}">{html.escape(text)}</span>' if text else ""
    show(widget, bool(text))


class Gauge:
    """A labelled `FloatProgress` with its value in words next to it."""

    def __init__(self, kind: str, label: str):
        self.bar = classed(
            widgets.FloatProgress(
                value=0.0,
                min=0.0,
                max=100.0,
                description=label,
                style={"description_width": "72px"},
                layout=widgets.Layout(width="260px"),
            ),
            "gauge",
            f"gauge-{kind}",
        )
        self.text = classed(widgets.Label(value="-"), "gauge-value")
        self.widget = widgets.HBox([self.bar, self.text])

    def set(self, value: float | None, maximum: float | None, text: str) -> None:
        top = maximum if maximum and maximum > 0 else 100.0
        self.bar.max = max(top, value or 0.0)
        self.bar.value = max(0.0, value or 0.0)
        self.bar.bar_style = "warning" if value is not None and value >= 0.9 * top else ""
        self.text.value = text


def _scaled(metric: Metric, item: dict, field: str | None) -> float | None:
    value = item.get(field) if field else None
    return None if value is None else value / metric.scale


class MetricGauges:
    """A gauge per drawn metric of one scope (gpusession.configuration.metrics), in the table's order."""

    def __init__(self, scope: str):
        self.rows = [m for m in metrics(scope) if m.charted]
        self.gauges = {m.key: Gauge(m.key, m.short) for m in self.rows}

    def show(self, item: dict) -> None:
        """Show the values of a GPU dict or a sample dict of the stats document."""
        for m in self.rows:
            top = _scaled(m, item, m.limit) if m.limit else m.top
            self.gauges[m.key].set(_scaled(m, item, m.name), top, gpu_metric_text(m, item))


class GpuGauges(MetricGauges):
    """One GPU: utilization, memory, temperature and power."""

    def __init__(self, index: int):
        super().__init__("gpu")
        self.title = widgets.Label(value=f"GPU {index}")
        self.util, self.memory = self.gauges["util"], self.gauges["memory"]
        self.temp, self.power = self.gauges["temp"], self.gauges["power"]
        self.widget = classed(
            widgets.VBox([self.title, *(g.widget for g in self.gauges.values())]), "gpu"
        )

    def show(self, gpu: dict) -> None:
        self.title.value = f"GPU {gpu['index']} · {gpu.get('name') or '?'}" + (
            f" · {nvml_error_text(gpu['error'])}" if gpu.get("error") else ""
        )
        super().show(gpu)


class StatsView:
    """The live part of a card: the no-GPU note or one GpuGauges per GPU, then the session's CPU
    and memory (there even without a GPU)."""

    def __init__(self):
        self.note = classed(widgets.HTML(), "stats-note")
        self.recorded = classed(widgets.HTML(RECORDED_BADGE), "recorded")
        show(self.recorded, False)
        self.gpus: list[GpuGauges] = []
        self.gpu_box = widgets.VBox([])
        self.host = MetricGauges("host")
        self.cpu, self.ram = self.host.gauges["cpu"], self.host.gauges["ram"]
        self.widget = classed(
            widgets.VBox(
                [
                    self.recorded,
                    self.note,
                    self.gpu_box,
                    *(g.widget for g in self.host.gauges.values()),
                ]
            ),
            "stats",
        )

    def show(self, doc: dict) -> None:
        samples = doc.get("samples") or []
        latest = samples[-1] if samples else None
        show(self.recorded, doc.get("source") == "recorded")
        elsewhere = (doc.get("recording") or {}).get("of_this_type") is False  # another's GPUs
        badge = (
            recorded_badge(recorded_words(doc) or "", "recorded elsewhere") if elsewhere else None
        )
        self.recorded.value = badge or RECORDED_BADGE
        if not doc.get("gpus_visible"):
            html_text(
                self.note,
                doc.get("message") or "no NVIDIA GPU visible",
                "color: var(--jp-ui-font-color2)",
            )
        else:
            html_text(self.note, None if latest else "waiting for the first sample")
        gpus = (latest or {}).get("gpus") or []
        if len(gpus) != len(self.gpus):
            self.gpus = [GpuGauges(g["index"]) for g in gpus]
            self.gpu_box.children = [g.widget for g in self.gpus]
        for view, gpu in zip(self.gpus, gpus):
            view.show(gpu)
        if latest is not None:
            self.host.show(latest)

    def problem(self, text: str) -> None:
        html_text(self.note, text, WARN_STYLE)


class SessionCard:
    """One session. `show(view, stats)` writes what changed; the buttons call back into the panel."""

    def __init__(
        self,
        view: dict,
        on_stop: Callable[["SessionCard"], None],
        on_keepalive: Callable[["SessionCard"], None],
        on_resume: Callable[["SessionCard"], None] | None = None,
    ):
        self.id = view["id"]
        self.view = view
        facts = self._make_fields()
        self._make_buttons(on_stop, on_keepalive, on_resume)
        self.stats = StatsView()
        self.widget = self._lay_out(facts)
        self._state_class = ""
        self.say(None)
        self.show(view)

    def _make_fields(self) -> list[tuple[str, widgets.Widget]]:
        """The card's texts (name, state, kind, the facts, warnings, messages); returns the
        facts with their captions."""
        self.name = classed(widgets.HTML(), "name")
        self.state = classed(widgets.HTML(), "state")
        self.kind = classed(widgets.Label(), "kind")
        self.uptime, self.price = (
            classed(widgets.Label(), "uptime"),
            classed(widgets.HTML(), "price"),  # HTML wraps: "$0.5260/h (cloud rate, own hardware)"
        )
        # HTML wraps: "$0.0088 (60-second minimum) of $5.00"
        self.cost, self.idle = classed(widgets.HTML(), "cost"), classed(widgets.Label(), "idle")
        facts = [
            ("Uptime", self.uptime),
            ("Rate", self.price),
            ("Cost", self.cost),
            ("Idle stop", self.idle),
        ]
        self.idle_warning = classed(widgets.HTML(), "idle-warning")
        self.error = classed(widgets.HTML(), "error")
        self.message = classed(widgets.HTML(), "action-message")
        self.advice = classed(widgets.HTML(), "advice")
        self.placement = classed(widgets.HTML(), "placement")  # a fallback's type, a pool's box
        return facts

    def _make_buttons(
        self,
        on_stop: Callable[["SessionCard"], None],
        on_keepalive: Callable[["SessionCard"], None],
        on_resume: Callable[["SessionCard"], None] | None,
    ) -> None:
        """Keep alive, Stop and Resume, each calling back into the panel with this card."""
        self.keepalive_button = classed(
            widgets.Button(
                description=f"Keep alive {KEEPALIVE}",
                icon="clock",
                tooltip=f"Postpone the idle stop by {KEEPALIVE}",
            ),
            "keepalive",
        )
        self.stop_button = classed(
            widgets.Button(
                description="Stop",
                button_style="danger",
                icon="stop",
                tooltip="Stop this session and its billing",
            ),
            "stop",
        )
        self.resume_button = classed(
            widgets.Button(
                description="Resume",
                icon="play",
                tooltip="Start a new session "
                "on this workspace and restore the variables its stop saved",
            ),
            "resume",
        )
        self.keepalive_button.on_click(lambda _: on_keepalive(self))
        self.resume_button.on_click(lambda _: on_resume(self) if on_resume else None)
        self.stop_button.on_click(lambda _: on_stop(self))

    def _lay_out(self, facts: list[tuple[str, widgets.Widget]]) -> widgets.VBox:
        """The card: name and state, kind, the facts in a grid, the texts, the buttons, the
        stats."""
        return classed(
            widgets.VBox(
                [
                    widgets.HBox(
                        [self.name, self.state],
                        layout=widgets.Layout(justify_content="space-between"),
                    ),
                    self.kind,
                    widgets.GridBox(
                        [w for label, value in facts for w in (widgets.Label(label), value)],
                        layout=widgets.Layout(
                            grid_template_columns="70px 110px 70px auto", grid_gap="0 8px"
                        ),
                    ),
                    self.placement,
                    self.idle_warning,
                    self.error,
                    self.advice,
                    self.message,
                    widgets.HBox([self.keepalive_button, self.stop_button, self.resume_button]),
                    self.stats.widget,
                ],
                layout=widgets.Layout(
                    border="1px solid var(--jp-border-color2, #ccc)",
                    padding="6px",
                    margin="4px 0",
                    width="440px",
                ),
            ),
            "card",
        )

    @property
    def final(self) -> bool:
        return self.view["state"] in FINAL_STATES

    def show(self, view: dict, stats: dict | None = None) -> None:
        """Show a SessionView (`SessionManager.view`), and the stats document when there is one."""
        self.view = view
        state = view["state"]
        if self._state_class != f"gpusession-widget-state-{state}":
            if self._state_class:
                self.widget.remove_class(self._state_class)
            self._state_class = f"gpusession-widget-state-{state}"
            self.widget.add_class(self._state_class)
        self.name.value = f"<b>{html.escape(view['name'])}</b>"
        color = _STATE_COLORS.get(state, "#1565c0")
        self.state.value = (
            f'<span style="color: {color}; font-weight: bold">{html.escape(state)}</span>'
        )
        kind = [f"{view['gpu_type']} × {view['gpu_count']}", view["backend"]]
        kind += ["spot"] * bool(view.get("spot")) + [view["host"]] * bool(view.get("host"))
        kind += [view["image"]] * bool(view.get("image"))
        self.kind.value = " · ".join(kind)
        self.uptime.value = (
            NEVER_RAN if view.get("never_ran") else format_duration(view["uptime_s"])
        )
        self.price.value = html.escape(rate_text(view))
        self.cost.value = html.escape(cost_text(view))
        idle = dict(view.get("idle") or {})
        warnings = view.get("warnings") or []
        if stats is not None:  # the agent's countdown is fresher than the view's
            idle.update(
                {
                    k: v
                    for k, v in (stats.get("idle") or {}).items()
                    if k in ("timeout_s", "remaining_s")
                }
            )
            warnings = stats.get("warnings") or []
        warning = (
            "; ".join(warning_texts(warnings, hint=False)) or None
        )  # the card has a Keep alive button
        final = state in FINAL_STATES
        if final or idle.get("timeout_s") is None:
            self.idle.value = "off" if not final else "-"
        else:
            remaining = idle.get("remaining_s")
            self.idle.value = (
                f"in {format_duration(remaining)}"
                if remaining is not None
                else format_duration(idle["timeout_s"])
            )
        html_text(self.idle_warning, None if final else warning, WARN_STYLE)
        html_text(self.error, view.get("error"), "color: #c62828")
        html_text(self.advice, advice_line(view["advice"]) if view.get("advice") else None)
        html_text(self.placement, placement_line(view))
        show(self.keepalive_button, not final and idle.get("timeout_s") is not None)
        show(self.stop_button, not final)
        show(self.resume_button, final and bool(view.get("resume")))  # its stop saved the variables
        self.stop_button.disabled = state == State.STOPPING.value
        show(self.stats.widget, state == State.RUNNING.value)
        if stats is not None:
            self.stats.show(stats)

    def say(self, text: str | None, warn: bool = False) -> None:
        html_text(self.message, text, WARN_STYLE if warn else "")
