"""`%gpu panel`: the sidebar's session card as ipywidgets, inside the notebook.

One card per session - type x count and backend, state, uptime, $/hour, cost so far, idle
countdown and warning, live gauges (each GPU's utilization, memory, temperature and power, or
"no NVIDIA GPU visible"; the session's CPU and memory) - with stop and keep-alive buttons, and
a start form (GPU type from the catalog with its price, backend, idle timeout).

A background thread refreshes the cards every `REFRESH_S` seconds (ipywidgets may be updated
from any thread of the kernel); it ends when nothing on the panel is active any more, or when
the panel is closed. Everything goes through `SessionManager`; no backend is imported here.

Browser tests find the parts by CSS class: `gpusession-widget-panel`, `-card` (plus
`gpusession-widget-state-<state>`), `-name`, `-state`, `-kind`, `-uptime`, `-price`, `-cost`,
`-idle`, `-idle-warning`, `-error`, `-action-message`, `-stop`, `-keepalive`, `-stats`,
`-stats-note`, `-gpu`, `-gauge-<util|memory|temp|power|cpu|ram>`, `-start-form`,
`-type-select`, `-backend-select`, `-idle-input`, `-start-button`, `-form-message`, `-empty`.
"""

from __future__ import annotations

import html
import threading
from typing import Any, Callable, Iterable

import ipywidgets as widgets
from IPython.core.magic_arguments import argument, magic_arguments

from .durations import format_duration, format_money
from .errors import GpuSessionError, NoSession
from .models import State
from .session import Session, SessionManager, default_backend_name

REFRESH_S = 1.5  # seconds between two refreshes of the cards
KEEPALIVE = "1h"  # what the keep-alive button asks for (the sidebar's button does the same)
GIB = 1024**3
_FINAL = {State.STOPPED.value, State.FAILED.value}
_STATE_COLORS = {"running": "#2e7d32", "failed": "#c62828", "stopped": "#757575", "stopping": "#ef6c00"}
_WARN = "color: #b45309; font-weight: bold"

# rows of text at 20 px instead of ipywidgets' 28 px input height: a card about as tall as the sidebar's
_STYLE = """<style>
.gpusession-widget-card .widget-label, .gpusession-widget-card .widget-html,
.gpusession-widget-card .widget-html-content, .gpusession-widget-stats .widget-label
{ min-height: 20px; height: auto; line-height: 20px; }
.gpusession-widget-stats .widget-hprogress { height: 20px; }
</style>"""


def _classed(widget: widgets.DOMWidget, *names: str) -> widgets.DOMWidget:
    for name in names:
        widget.add_class(f"gpusession-widget-{name}")
    return widget


def _show(widget: widgets.DOMWidget, visible: bool) -> None:
    widget.layout.display = None if visible else "none"


def _html_text(widget: widgets.HTML, text: str | None, style: str = "") -> None:
    """Put `text` (escaped) in an HTML widget; hide it when there is none."""
    widget.value = f'<span style="{style}">{html.escape(text)}</span>' if text else ""
    _show(widget, bool(text))


class Gauge:
    """A labelled `FloatProgress` with its value in words next to it."""

    def __init__(self, kind: str, label: str):
        self.bar = _classed(widgets.FloatProgress(value=0.0, min=0.0, max=100.0, description=label,
                                                  style={"description_width": "72px"},
                                                  layout=widgets.Layout(width="260px")), "gauge", f"gauge-{kind}")
        self.text = _classed(widgets.Label(value="-"), "gauge-value")
        self.widget = widgets.HBox([self.bar, self.text])

    def set(self, value: float | None, maximum: float | None, text: str) -> None:
        top = maximum if maximum and maximum > 0 else 100.0
        self.bar.max = max(top, value or 0.0)
        self.bar.value = max(0.0, value or 0.0)
        self.bar.bar_style = "warning" if value is not None and value >= 0.9 * top else ""
        self.text.value = text


def _num(v: float | None, fmt: str, unit: str) -> str:
    return "n/a" if v is None else f"{v:{fmt}}{unit}"


class GpuGauges:
    """One GPU: utilization, memory, temperature and power."""

    def __init__(self, index: int):
        self.title = widgets.Label(value=f"GPU {index}")
        self.util, self.memory = Gauge("util", "util"), Gauge("memory", "memory")
        self.temp, self.power = Gauge("temp", "temp"), Gauge("power", "power")
        gauges = [self.util, self.memory, self.temp, self.power]
        self.widget = _classed(widgets.VBox([self.title, *(g.widget for g in gauges)]), "gpu")

    def show(self, gpu: dict) -> None:
        self.title.value = f"GPU {gpu['index']} · {gpu.get('name') or '?'}" + (f" · {gpu['error']}" if gpu.get("error") else "")
        used, total = gpu.get("memory_used"), gpu.get("memory_total")
        power, limit = gpu.get("power_draw"), gpu.get("power_limit")
        self.util.set(gpu.get("utilization"), 100.0, _num(gpu.get("utilization"), ".0f", "%"))
        self.memory.set(None if used is None else used / GIB, None if total is None else total / GIB,
                        f"{_num(None if used is None else used / GIB, '.1f', '')}/{_num(None if total is None else total / GIB, '.1f', ' GiB')}")
        self.temp.set(gpu.get("temperature"), 100.0, _num(gpu.get("temperature"), ".0f", " °C"))
        self.power.set(power, limit, f"{_num(power, '.0f', '')}/{_num(limit, '.0f', ' W')}")


class StatsView:
    """The live part of a card: the no-GPU note or one GpuGauges per GPU, then the session's CPU
    and memory (there even without a GPU)."""

    def __init__(self):
        self.note = _classed(widgets.HTML(), "stats-note")
        self.gpus: list[GpuGauges] = []
        self.gpu_box = widgets.VBox([])
        self.cpu, self.ram = Gauge("cpu", "CPU"), Gauge("ram", "RAM")
        self.widget = _classed(widgets.VBox([self.note, self.gpu_box, self.cpu.widget, self.ram.widget]), "stats")

    def show(self, doc: dict) -> None:
        samples = doc.get("samples") or []
        latest = samples[-1] if samples else None
        if not doc.get("gpus_visible"):
            _html_text(self.note, doc.get("message") or "no NVIDIA GPU visible", "color: var(--jp-ui-font-color2)")
        else:
            _html_text(self.note, None if latest else "waiting for the first sample")
        gpus = (latest or {}).get("gpus") or []
        if len(gpus) != len(self.gpus):
            self.gpus = [GpuGauges(g["index"]) for g in gpus]
            self.gpu_box.children = [g.widget for g in self.gpus]
        for view, gpu in zip(self.gpus, gpus):
            view.show(gpu)
        if latest is not None:
            cpu = latest.get("cpu_percent")
            self.cpu.set(cpu, 100.0, _num(cpu, ".0f", "% of a core"))
            used, total = latest.get("memory_used"), latest.get("memory_total")
            self.ram.set(used, total, f"{_num(None if used is None else used / GIB, '.2f', '')} of "
                                      f"{_num(None if total is None else total / GIB, '.1f', ' GiB')}")

    def problem(self, text: str) -> None:
        _html_text(self.note, text, _WARN)


class SessionCard:
    """One session. `show(view, stats)` writes what changed; the buttons call back into the panel."""

    def __init__(self, view: dict, on_stop: Callable[["SessionCard"], None], on_keepalive: Callable[["SessionCard"], None]):
        self.id = view["id"]
        self.view = view
        self.name = _classed(widgets.HTML(), "name")
        self.state = _classed(widgets.HTML(), "state")
        self.kind = _classed(widgets.Label(), "kind")
        self.uptime, self.price = _classed(widgets.Label(), "uptime"), _classed(widgets.Label(), "price")
        self.cost, self.idle = _classed(widgets.Label(), "cost"), _classed(widgets.Label(), "idle")
        facts = [("Uptime", self.uptime), ("Rate", self.price), ("Cost", self.cost), ("Idle stop", self.idle)]
        self.idle_warning = _classed(widgets.HTML(), "idle-warning")
        self.error = _classed(widgets.HTML(), "error")
        self.message = _classed(widgets.HTML(), "action-message")
        self.keepalive_button = _classed(widgets.Button(description=f"Keep alive {KEEPALIVE}", icon="clock",
                                                        tooltip=f"Postpone the idle stop by {KEEPALIVE}"), "keepalive")
        self.stop_button = _classed(widgets.Button(description="Stop", button_style="danger", icon="stop",
                                                   tooltip="Stop this session and its billing"), "stop")
        self.keepalive_button.on_click(lambda _: on_keepalive(self))
        self.stop_button.on_click(lambda _: on_stop(self))
        self.stats = StatsView()
        self.widget = _classed(widgets.VBox([
            widgets.HBox([self.name, self.state], layout=widgets.Layout(justify_content="space-between")),
            self.kind,
            widgets.GridBox([w for label, value in facts for w in (widgets.Label(label), value)],
                            layout=widgets.Layout(grid_template_columns="70px 110px 70px auto", grid_gap="0 8px")),
            self.idle_warning, self.error, self.message,
            widgets.HBox([self.keepalive_button, self.stop_button]),
            self.stats.widget,
        ], layout=widgets.Layout(border="1px solid var(--jp-border-color2, #ccc)", padding="6px", margin="4px 0",
                                 width="440px")), "card")
        self._state_class = ""
        self.say(None)
        self.show(view)

    @property
    def final(self) -> bool:
        return self.view["state"] in _FINAL

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
        self.state.value = f'<span style="color: {color}; font-weight: bold">{html.escape(state)}</span>'
        kind = [f"{view['gpu_type'].upper()} × {view['gpu_count']}", view["backend"]]
        kind += ["spot"] * bool(view.get("spot")) + [view["host"]] * bool(view.get("host"))
        self.kind.value = " · ".join(kind)
        self.uptime.value = format_duration(view["uptime_s"])
        self.price.value = f"{format_money(view['price_per_hour'])}/h"
        cost = format_money(view["cost_so_far"])
        self.cost.value = cost if not view.get("max_cost") else f"{cost} of {format_money(view['max_cost'])}"
        idle = dict(view.get("idle") or {})
        warning = idle.get("warning")
        if stats is not None:  # the agent's countdown is fresher than the view's
            idle.update({k: v for k, v in (stats.get("idle") or {}).items() if k in ("timeout_s", "remaining_s")})
            warning = "; ".join(stats.get("warnings") or []) or None
        final = state in _FINAL
        if final or idle.get("timeout_s") is None:
            self.idle.value = "off" if not final else "-"
        else:
            remaining = idle.get("remaining_s")
            self.idle.value = f"in {format_duration(remaining)}" if remaining is not None else format_duration(idle["timeout_s"])
        _html_text(self.idle_warning, None if final else warning, _WARN)
        _html_text(self.error, view.get("error"), "color: #c62828")
        _show(self.keepalive_button, not final and idle.get("timeout_s") is not None)
        _show(self.stop_button, not final)
        self.stop_button.disabled = state == State.STOPPING.value
        _show(self.stats.widget, state == State.RUNNING.value)
        if stats is not None:
            self.stats.show(stats)

    def say(self, text: str | None, warn: bool = False) -> None:
        _html_text(self.message, text, _WARN if warn else "")


class StartForm:
    """GPU type (catalog, with price), backend and idle timeout; `on_start(spec options)`."""

    def __init__(self, manager: SessionManager, on_start: Callable[[str, str, str], None]):
        catalog = manager.catalog
        self.type_select = _classed(widgets.Dropdown(
            options=[(f"{t.name} · {t.memory_gb} GB · {format_money(t.per_gpu_on_demand)}/h", t.name) for t in catalog.types],
            value=manager.catalog.parse(manager.config.default_type)[0].name, description="GPU type"), "type-select")
        from .backends import backend_names

        self.backend_select = _classed(widgets.Dropdown(options=backend_names(), value=default_backend_name(manager.config),
                                                        description="Backend"), "backend-select")
        self.idle_input = _classed(widgets.Text(value=manager.config.default_idle, description="Idle stop",
                                                placeholder="15m, 2h, off"), "idle-input")
        self.start_button = _classed(widgets.Button(description="Start", button_style="primary", icon="play"), "start-button")
        self.message = _classed(widgets.HTML(), "form-message")
        _show(self.message, False)
        note = widgets.HTML(f'<small>Prices: {html.escape(catalog.region)}, snapshot of {html.escape(catalog.snapshot_date)}'
                            " (per GPU-hour, on demand)</small>")
        self.start_button.on_click(lambda _: on_start(self.type_select.value, self.backend_select.value, self.idle_input.value))
        self.widget = _classed(widgets.VBox([widgets.HTML("<b>Start a GPU session</b>"), self.type_select,
                                             self.backend_select, self.idle_input, self.start_button, self.message, note]),
                               "start-form")

    def say(self, text: str | None, warn: bool = False) -> None:
        _html_text(self.message, text, "color: #c62828" if warn else "")


class SessionPanel:
    """Cards for `session_ids` (or, with `session_ids=None`, every active session, newest first,
    including those started later from elsewhere while the panel polls), and the start form.

    in_use: a lock held while a cell uses a session (GpuMagics._in_use); while it is taken the
    panel only asks the agents of sessions this process is connected to, and never lets a
    liveness check tear down connections a running cell reads from.
    on_started(session), on_stopped(session_id): tell the notebook (the magics' current session).
    """

    def __init__(
        self,
        manager: SessionManager,
        session_ids: Iterable[str] | None = None,
        *,
        interval: float = REFRESH_S,
        in_use: threading.RLock | None = None,
        on_started: Callable[[Session], None] | None = None,
        on_stopped: Callable[[str], None] | None = None,
    ):
        self.manager = manager
        self.interval = interval
        self.follow_all = session_ids is None
        self._in_use = in_use or threading.RLock()
        self._on_started = on_started or (lambda session: None)
        self._on_stopped = on_stopped or (lambda sid: None)
        self._lock = threading.RLock()  # the poller thread and button clicks both update cards
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None
        self.cards: dict[str, SessionCard] = {}
        self.empty = _classed(widgets.HTML("<i>No GPU sessions</i>"), "empty")
        self.status = _classed(widgets.HTML(), "panel-status")
        _show(self.status, False)
        self.card_box = widgets.VBox([])
        self.form = StartForm(manager, self._start)
        self.widget = _classed(widgets.VBox([widgets.HTML(_STYLE + "<h3 style='margin: 4px 0'>GPU sessions</h3>"), self.status,
                                             self.empty, self.card_box, self.form.widget]), "panel")
        ids = [r.id for r in manager.list(active_only=True)] if session_ids is None else [manager.get(k).id for k in session_ids]
        for sid in ids:
            self._card(manager.view(manager.get(sid)))
        self.refresh()

    # -- life cycle --------------------------------------------------------------------------

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget)

    def start_polling(self) -> "SessionPanel":
        """Refresh every `interval` seconds in a background thread while anything is active."""
        with self._lock:
            if self._closed.is_set() or self._thread is not None:
                return self
            self._thread = threading.Thread(target=self._poll, name="gpusession-panel", daemon=True)
            self._thread.start()
        return self

    @property
    def polling(self) -> bool:
        thread = self._thread
        return thread is not None and thread.is_alive()

    def stop_polling(self, why: str | None = None) -> None:
        """Stop refreshing (the widgets stay as they are, with `why` shown on top)."""
        self._closed.set()
        if why:
            _html_text(self.status, why, "color: var(--jp-ui-font-color2)")

    def close(self) -> None:
        """Stop refreshing and remove the widgets."""
        self._closed.set()
        self._close_tree(self.widget)

    @staticmethod
    def _close_tree(widget: widgets.Widget) -> None:
        for child in getattr(widget, "children", ()):
            SessionPanel._close_tree(child)
        widget.close()

    def _poll(self) -> None:
        while True:
            if not self._closed.wait(self.interval):
                try:
                    self.refresh()
                except Exception as exc:  # noqa: BLE001 - a bug must show, and must not end the updates silently
                    _html_text(self.status, f"panel update failed: {type(exc).__name__}: {exc}", _WARN)
            # decided under the lock: a start from the form meanwhile (a new card, _closed cleared)
            # either sees this thread still going or starts the next one
            with self._lock:
                if self._closed.is_set() or all(card.final for card in self.cards.values()):
                    self._thread = None
                    return

    # -- one refresh ---------------------------------------------------------------------------

    def refresh(self) -> bool:
        """Read every shown session (and, following all, the new ones) once and update the cards.
        Returns whether anything is still active, i.e. worth another refresh."""
        if self.follow_all:
            for record in reversed(self.manager.list(active_only=True)):
                if record.id not in self.cards:
                    self._card(self.manager.view(record))
        active = False
        for card in list(self.cards.values()):
            if card.final:
                continue
            view, stats, problem = self._read(card.id)
            with self._lock:
                card.show(view, stats)
                if problem:
                    card.stats.problem(problem)
            if view["state"] in _FINAL:  # how it ended: its watchdog, a stop elsewhere, a failure
                card.say(self.manager.ended_message(self.manager.get(card.id)))
                self._on_stopped(card.id)
            else:
                active = True
        return active

    def _read(self, sid: str) -> tuple[dict, dict | None, str | None]:
        """(view, stats document or None, why there are no stats) of one session."""
        record = self.manager.get(sid)
        if record.state != State.RUNNING:
            return self.manager.view(record), None, None
        stats, problem = None, None
        try:
            stats = self._stats(sid)
        except NoSession:  # its watchdog stopped it, or it died: the record says so now
            return self.manager.view(self.manager.get(sid)), None, None
        except GpuSessionError as exc:
            problem = f"live stats unavailable: {exc}"
        return self.manager.view(self.manager.get(sid)), stats, problem

    def _stats(self, sid: str) -> dict:
        if self._in_use.acquire(blocking=False):
            try:
                return self.manager.stats(sid, limit=1)
            finally:
                self._in_use.release()
        return self.manager.stats(sid, limit=1, check_alive=False)  # a cell runs: only ask the agent

    def _card(self, view: dict) -> SessionCard:
        with self._lock:
            card = self.cards.get(view["id"])
            if card is None:
                card = SessionCard(view, self._stop, self._keepalive)
                self.cards[view["id"]] = card
                self.card_box.children = [card.widget, *self.card_box.children]  # newest first
                _show(self.empty, False)
            _show(self.empty, not self.cards)
            return card

    # -- buttons -------------------------------------------------------------------------------

    def _stop(self, card: SessionCard) -> None:
        card.stop_button.description = "Stopping…"
        card.stop_button.disabled = card.keepalive_button.disabled = True
        try:
            with self._in_use:
                record = self.manager.stop(card.id)
        except GpuSessionError as exc:
            card.say(f"stop failed: {exc}", warn=True)
            record = self.manager.get(card.id)
        else:
            card.say(f"stopped: {self.manager.summary_line(record)}")
            self._on_stopped(card.id)
        finally:
            card.stop_button.description = "Stop"
            card.keepalive_button.disabled = False
        with self._lock:
            card.show(self.manager.view(record))

    def _keepalive(self, card: SessionCard) -> None:
        card.keepalive_button.disabled = True
        try:
            with self._in_use:
                self.manager.keepalive(card.id, KEEPALIVE, report=lambda line: card.say(line))
        except GpuSessionError as exc:
            card.say(f"keep-alive failed: {exc}", warn=True)
        finally:
            card.keepalive_button.disabled = False

    def _start(self, gpu_type: str, backend: str, idle: str) -> None:
        """Record the session now (bad input is said in the form), start it in a thread: a cloud
        start takes minutes, and the notebook stays usable meanwhile."""
        try:
            spec = self.manager.make_spec(gpu_type, backend=backend, idle=idle.strip() or "default")
            record = self.manager.create(spec)
        except GpuSessionError as exc:
            self.form.say(str(exc), warn=True)
            return
        self.form.say(f"starting {record.name}…")
        with self._lock:
            card = self._card(self.manager.view(record))
            self._closed.clear()  # a superseded panel comes alive again when used

        def launch() -> None:
            try:
                session = self.manager.launch(record, report=lambda line: card.say(line.strip()))
            except BaseException as exc:  # noqa: BLE001 - launch recorded the failure; the card shows it
                self.form.say(f"{record.name} failed to start: {exc}", warn=True)
            else:
                card.say(None)
                self.form.say(f"{record.name} is running")
                self._on_started(session)
            finally:
                self.refresh()

        threading.Thread(target=launch, name=f"gpusession-start-{record.name}", daemon=True).start()
        self.start_polling()


# -- %gpu panel ------------------------------------------------------------------------------


class PanelCommand:
    """`%gpu panel [NAME] [--all]`: the current session's card (or NAME's, or every active
    session's) with live gauges and buttons. One panel per notebook updates at a time: a new
    one freezes the one before."""

    def __init__(self, magics):
        self.magics = magics
        self.panel: SessionPanel | None = None

    def __call__(self, rest: str) -> None:
        from IPython.display import display

        args = self.magics._parse(_panel_args, rest)
        current = self.magics.current
        if args.all or (not args.name and current is None):
            ids = None
        else:
            ids = [args.name or current.id]  # type: ignore[union-attr]
        if self.panel is not None:
            self.panel.stop_polling("not updated any more: a newer %gpu panel is below")
        self.panel = SessionPanel(self.magics.manager, ids, in_use=self.magics._in_use,
                                  on_started=self._started, on_stopped=self._stopped)
        display(self.panel.widget)
        self.panel.start_polling()

    def _started(self, session: Session) -> None:
        """A session started from the panel becomes the notebook's current one, as `%gpu start` does."""
        if self.magics.current is None or not self.magics.current.record.state.active:
            self.magics.current = session
            self.magics._notify(session)

    def _stopped(self, session_id: str) -> None:
        self.magics._forget(session_id)


@magic_arguments()
@argument("name", nargs="?", default=None, help="session name (default: the current session, else every active one)")
@argument("--all", action="store_true", help="every active session, and those started elsewhere while it updates")
def _panel_args(line: str) -> None:
    """%gpu panel [NAME | --all]"""


def register_panel(magics: Any) -> None:
    """Add `%gpu panel` to a GpuMagics (gpusession.magics.load_ipython_extension calls this)."""
    magics.add_subcommand("panel", PanelCommand(magics))


__all__ = ["SessionPanel", "SessionCard", "StartForm", "PanelCommand", "register_panel", "REFRESH_S"]
