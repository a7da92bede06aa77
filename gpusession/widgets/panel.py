"""The panel: session cards, the start form, the thread that refreshes them, and `%gpu panel`."""

from __future__ import annotations

import html
import threading
from typing import Any, Callable, Iterable

import ipywidgets as widgets
from IPython.core.magic_arguments import argument, magic_arguments

from ..configuration import options
from ..configuration.registry import backend_names, backend_places, price_lists
from ..core.durations import format_money
from ..core.errors import GpuSessionError, NoSession
from ..core.models import State
from ..session import SessionManager, default_backend_name
from ..session.handle import Session
from ..words.spend import live_spot_line
from ..words.status import image_text
from ..words.stops import ended_message, error_text, keepalive_line, summary_line
from .card import FINAL_STATES, KEEPALIVE, STYLE, WARN_STYLE, SessionCard, classed, html_text, show

REFRESH_S = 1.5  # seconds between two refreshes of the cards


class StartForm:
    """The start options marked for forms in the one table (gpusession/configuration/options.py), each as its
    kind asks: the catalog's GPU types with prices, the installed backends, a checkbox for a
    switch, text for the rest. A backend's own options show only while it is selected.
    `on_start(values)` gets what was filled in, by option name (blank fields left out)."""

    def __init__(self, manager: SessionManager, on_start: Callable[[dict[str, Any]], None]):
        catalog = manager.catalog
        self.manager = manager
        self.fields: dict[str, widgets.Widget] = {}
        self.rows: dict[str, widgets.Widget] = {}  # each field with its help under it
        self.image_note = classed(widgets.HTML(), "image-note")  # on the engine, or pulled
        self.spot_note = classed(widgets.HTML(), "spot-note")  # a spot start: the price now
        # the chosen backend's own price of the chosen type, where it prices GPUs itself
        self.own_price_note = classed(widgets.HTML(), "own-price-note")
        self._spot_type: str | None = None  # the type whose current spot price was asked
        self._places = backend_places(manager.config)  # per backend, what --host offers
        self._make_rows(manager)
        self.type_select = self.fields["type"]
        self.backend_select = self.fields["backend"]
        self.idle_input = self.fields["idle"]
        self.image_input = self.fields.get(IMAGE)
        self._images: tuple[str, Any] | None = None  # (backend and host, their images' reply)
        self._images_key: str | None = None  # the backend and host last asked
        self.start_button = classed(
            widgets.Button(description="Start", button_style="primary", icon="play"), "start-button"
        )
        self.message = classed(widgets.HTML(), "form-message")
        show(self.message, False)
        self.prices_note = note = widgets.HTML(
            f"<small>Prices per GPU-hour ({html.escape(catalog.region)}): "
            f"{html.escape(catalog.prices_line)}</small>"
        )
        self.start_button.on_click(lambda _: on_start(self.values()))
        self._watch_fields()
        self._show_backend_options()
        by_name = options.table().by_name
        # what a first start does not need folds under "More", as in the sidebar's form
        self.more = classed(
            widgets.Accordion(
                children=[widgets.VBox([r for n, r in self.rows.items() if not by_name[n].first])],
                titles=("More",),
                selected_index=None,
            ),
            "more",
        )
        self.widget = classed(
            widgets.VBox(
                [
                    widgets.HTML("<b>Start a GPU session</b>"),
                    *(r for n, r in self.rows.items() if by_name[n].first),
                    self.more,
                    self.start_button,
                    self.message,
                    note,
                ]
            ),
            "start-form",
        )

    def _make_rows(self, manager: SessionManager) -> None:
        """A field for each option the forms show (the option table's `form` rows), with its help
        under it and the notes that belong to it (the image's, the type's prices)."""
        defaults = options.form_defaults(manager.config, default_backend_name(manager.config))
        for option in options.table().options:
            if option.form:
                widget, role = self._input(option, manager, defaults)
                self.fields[option.name] = classed(
                    widget, f"{option.name.replace('_', '-')}-{role}"
                )
                help_line = classed(
                    widgets.HTML(f"<small>{html.escape(options.form_help(option))}</small>"),
                    "field-help",
                )
                notes = [self.image_note] if option.name == IMAGE else []
                if option.kind == "gpu_type":
                    notes = [self.own_price_note, self.spot_note]
                self.rows[option.name] = widgets.VBox([widget, help_line, *notes])

    def _watch_fields(self) -> None:
        """What changes when a field does: the backend's own rows, the image note, the prices."""
        self.backend_select.observe(lambda _: self._show_backend_options(), names="value")
        if self.image_input is not None:
            self.image_input.observe(lambda _: self._show_image_note(), names="value")
        if HOST in self.fields:
            self.fields[HOST].observe(lambda _: self._show_backend_options(), names="value")
        for name in ("type", "spot", "cheapest"):
            if name in self.fields:
                self.fields[name].observe(lambda _: self._show_spot_price(), names="value")
        self.type_select.observe(lambda _: self._show_own_price(), names="value")

    @staticmethod
    def _input(
        option: options.StartOption, manager: SessionManager, defaults: dict[str, Any]
    ) -> tuple[widgets.Widget, str]:
        """The widget for one option, and its role in the CSS class (type-select, idle-input)."""
        common = {"description": option.label, "tooltip": option.help}
        placeholder = options.placeholder(option, defaults.get(option.name, option.default))
        if option.name == IMAGE:  # offers the engine's images (_show_backend_options); any text
            return widgets.Combobox(
                options=[], ensure_option=False, placeholder=placeholder, **common
            ), "input"
        if option.name == HOST:  # offers the backend's pools (_show_backend_options); any host
            return widgets.Combobox(
                options=[],
                ensure_option=False,
                placeholder=placeholder,
                continuous_update=False,  # its images are asked of it when it is whole
                **common,
            ), "input"
        if option.kind == "gpu_type":
            catalog = manager.catalog
            choices = [
                (f"{t.name} · {t.memory_gb} GB · {format_money(t.rate)}/h", t.name)
                for t in catalog.types
            ]
            return widgets.Dropdown(
                options=choices, value=catalog.parse(manager.config.default_type)[0].name, **common
            ), "select"
        if option.kind == "backend":
            return widgets.Dropdown(
                options=backend_names(), value=default_backend_name(manager.config), **common
            ), "select"
        if option.kind == "choice":
            return widgets.Dropdown(
                options=list(option.choices or ()), value=option.default, **common
            ), "select"
        if option.kind == "bool":
            return widgets.Checkbox(value=bool(option.default), indent=True, **common), "input"
        value = getattr(manager.config, option.config_default) if option.config_default else ""
        return widgets.Text(
            value=value,
            placeholder=placeholder,
            **common,
        ), "input"

    def _show_backend_options(self) -> None:
        backend = self.backend_select.value
        for name, row in self.rows.items():
            applies = options.table().by_name[name].backends
            show(row, applies is None or backend in applies)
        if HOST in self.fields:  # a docker pool: pool:lab
            self.fields[HOST].options = tuple(self._places.get(backend, []))
        self._load_images()
        self._show_spot_price()
        self._show_own_price()

    def _show_own_price(self) -> None:
        """The backend's own price of the type (its `price_list`), as the sidebar's form says it."""
        listed = next((r for r in price_lists() if r["backend"] == self.backend_select.value), None)
        own = (listed or {}).get("prices", {}).get(self.type_select.value)
        self.own_price_note.value = (
            ""
            if own is None
            else f"<small>{html.escape(format_money(own))}/h per GPU "
            f"({html.escape(listed['source'])})</small>"
        )

    def _show_spot_price(self) -> None:
        """Under the GPU type, for a spot start (or --cheapest) where a cloud prices it now:
        the current spot price in the cheapest zone (words.spend.live_spot_line, as the sidebar's
        form says it), asked on a thread (AWS answers from a 5-minute cache)."""
        spot = "spot" in self.rows and self.rows["spot"].layout.display != "none"
        ticked = any(
            bool(self.fields[name].value) for name in ("spot", "cheapest") if name in self.fields
        )
        gpu_type = self.type_select.value if spot and ticked else None
        if gpu_type == self._spot_type:
            return
        self._spot_type = gpu_type
        self.spot_note.value = ""
        if gpu_type is None:
            return

        def ask() -> None:
            try:
                rows = self.manager.spend.live_prices([gpu_type])
            except GpuSessionError:
                return  # no cloud answers (no credentials): the catalog's price stays alone
            if rows and self._spot_type == gpu_type:
                self.spot_note.value = (
                    f"<small>{html.escape(live_spot_line(rows, gpu_type))}</small>"
                )

        threading.Thread(target=ask, name="gpusession-spot-price", daemon=True).start()

    def _load_images(self) -> None:
        """The images the chosen backend has (on the typed host), offered by the image field."""
        if self.image_input is None:
            return
        backend = self.backend_select.value
        applies = options.table().by_name[IMAGE].backends
        if applies is not None and backend not in applies:
            return
        host = ""
        if HOST in self.fields and self.rows[HOST].layout.display != "none":
            host = self.fields[HOST].value.strip()
        key = f"{backend}\n{host}"
        if self._images_key == key:
            return
        self._images_key = key

        def listing() -> None:
            try:
                chosen = self.manager.backend(backend)
                if host:
                    options.parse_values({HOST: host}, catalog=self.manager.catalog)  # BadOptions
                reply = (chosen.default_image(), chosen.local_images(host or None), None)
            except GpuSessionError as exc:
                reply = (None, [], f"could not list the images there: {exc}")
            if self._images_key == key:  # not superseded meanwhile
                self._images = (key, reply)
                self.image_input.options = [image.reference for image in reply[1]]
                self._show_image_note()

        if host:  # a login away (SSH): not on the kernel's thread
            threading.Thread(target=listing, name="gpusession-images", daemon=True).start()
        else:  # this machine's engine answers at once
            listing()

    def _show_image_note(self) -> None:
        """Under the image field: what the engine has of the typed image, or that it is pulled."""
        if self._images is None or self.image_input is None:
            return
        default, images, problem = self._images[1]
        typed = self.image_input.value.strip()
        reference = typed or default
        found = next((i for i in images if i.reference == reference), None)
        if problem:
            text = problem
        elif not reference:
            text = ""
        elif found is not None:
            text = ("" if typed else "default: ") + image_text(found)
        else:
            text = (
                f"{reference if typed else 'default ' + reference}: not on the engine yet; "
                "the start pulls it first (that can take minutes)"
            )
        html_text(self.image_note, text or None, "font-size: small")

    def values(self) -> dict[str, Any]:
        """What the form says, by option name: blank text and options of other backends left out."""
        backend = self.backend_select.value
        out: dict[str, Any] = {}
        for name, widget in self.fields.items():
            applies = options.table().by_name[name].backends
            value = widget.value.strip() if isinstance(widget.value, str) else widget.value
            if value != "" and (applies is None or backend in applies):
                out[name] = value
        return out

    def say(self, text: str | None, warn: bool = False) -> None:
        html_text(self.message, text, "color: #c62828" if warn else "")

    def show_problems(self, problems: dict[str, str]) -> None:
        """Open "More" when a field the start found wrong is folded there (the message says
        which field and what was wrong)."""
        by_name = options.table().by_name
        if any(name in self.rows and not by_name[name].first for name in problems):
            self.more.selected_index = 0


IMAGE, HOST = "image", "host"  # the field offering images, and the machine it asks


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
        self.widget = self._lay_out(manager)
        ids = (
            [r.id for r in manager.list(active_only=True)]
            if session_ids is None
            else [manager.get(k).id for k in session_ids]
        )
        for sid in ids:
            self._card(manager.view(manager.get(sid)))
        self.refresh()

    def _lay_out(self, manager: SessionManager) -> widgets.VBox:
        """The panel's parts, top to bottom: title, status line, the empty note, the cards, the
        start form."""
        self.empty = classed(widgets.HTML("<i>No GPU sessions</i>"), "empty")
        self.status = classed(widgets.HTML(), "panel-status")
        show(self.status, False)
        self.card_box = widgets.VBox([])
        self.form = StartForm(manager, self._start)
        return classed(
            widgets.VBox(
                [
                    widgets.HTML(STYLE + "<h3 style='margin: 4px 0'>GPU sessions</h3>"),
                    self.status,
                    self.empty,
                    self.card_box,
                    self.form.widget,
                ]
            ),
            "panel",
        )

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
            html_text(self.status, why, "color: var(--jp-ui-font-color2)")

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
                    html_text(
                        self.status, f"panel update failed: {type(exc).__name__}: {exc}", WARN_STYLE
                    )
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
            final = view["state"] in FINAL_STATES
            with self._lock:
                if final and not card.final:  # how it ended (its watchdog, a stop elsewhere, a
                    # failure), said before the card shows the end; a card its own Stop ended
                    # says that button's result (_stop), not this over it
                    card.say(ended_message(self.manager.get(card.id)))
                card.show(view, stats)
                if problem:
                    card.stats.problem(problem)
            if final:
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
                return self.manager.stats.fetch(sid, limit=1)
            finally:
                self._in_use.release()
        return self.manager.stats.fetch(
            sid, limit=1, check_alive=False
        )  # a cell runs: only ask the agent

    def _card(self, view: dict) -> SessionCard:
        with self._lock:
            card = self.cards.get(view["id"])
            if card is None:
                card = SessionCard(view, self._stop, self._keepalive, self._resume)
                self.cards[view["id"]] = card
                self.card_box.children = [card.widget, *self.card_box.children]  # newest first
                show(self.empty, False)
            show(self.empty, not self.cards)
            return card

    # -- buttons -------------------------------------------------------------------------------

    def _stop(self, card: SessionCard) -> None:
        card.stop_button.description = "Stopping…"
        card.stop_button.disabled = card.keepalive_button.disabled = True
        stopped = False
        try:
            with self._in_use:
                record = self.manager.stop(card.id, by="the session panel")
            stopped = True
        except GpuSessionError as exc:
            said = (f"stop failed: {error_text(exc)}", True)
            record = self.manager.get(card.id)
        else:
            said = (f"stopped: {summary_line(record)}", False)
        finally:
            card.stop_button.description = "Stop"
            card.keepalive_button.disabled = False
        with self._lock:  # said with the end shown, at once: a refresh that saw the end meanwhile
            card.say(*said)  # says nothing more over it (it speaks only to a card not yet final)
            card.show(self.manager.view(record))
        if stopped:
            self._on_stopped(card.id)

    def _keepalive(self, card: SessionCard) -> None:
        card.keepalive_button.disabled = True
        try:
            with self._in_use:
                granted = self.manager.stats.keepalive(card.id, KEEPALIVE)
            card.say(keepalive_line(granted["name"], granted, granted["asked_s"]))
        except GpuSessionError as exc:
            card.say(f"keep-alive failed: {error_text(exc)}", warn=True)
        finally:
            card.keepalive_button.disabled = False

    def _resume(self, card: SessionCard) -> None:
        """A new session on the workspace the ended one saved into, restoring its variables."""
        if card.view.get("resume"):
            self._start(dict(card.view["resume"]))

    def _start(self, values: dict[str, Any]) -> None:
        """Record the session now (bad input is said in the form), start it in a thread: a cloud
        start takes minutes, and the notebook stays usable meanwhile."""
        try:
            spec = self.manager.spec_from(values, options.FORM)
            record = self.manager.create(spec)
        except GpuSessionError as exc:
            self.form.say(str(exc), warn=True)
            self.form.show_problems(getattr(exc, "problems", {}))
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
        panel = SessionPanel(
            self.magics.manager,
            ids,
            in_use=self.magics._in_use,
            on_started=self._started,
            on_stopped=self._stopped,
        )
        if self.panel is not None:
            self.panel.stop_polling("not updated any more: a newer %gpu panel is below")
        self.panel = panel
        display(panel.widget)
        panel.start_polling()

    def _started(self, session: Session) -> None:
        """A session started from the panel becomes the notebook's current one, as `%gpu start` does."""
        if self.magics.current is None or not self.magics.current.record.state.active:
            self.magics.current = session
            self.magics._notify(session)

    def _stopped(self, session_id: str) -> None:
        self.magics._forget(session_id)


@magic_arguments()
@argument(
    "name",
    nargs="?",
    default=None,
    help="session name (default: the current session, else every active one)",
)
@argument(
    "--all",
    action="store_true",
    help="every active session, and those started elsewhere while it updates",
)
def _panel_args(line: str) -> None:
    """%gpu panel [NAME | --all]"""


def register_panel(magics: Any) -> None:
    """Add `%gpu panel` to a GpuMagics (gpusession.faces.magics.load_ipython_extension calls this)."""
    magics.add_subcommand("panel", PanelCommand(magics))
