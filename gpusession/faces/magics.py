"""`%gpu` and `%%gpu`: the notebook face.

One small function per subcommand behind a dict; user mistakes become `UsageError` (a message,
not a traceback); exceptions raised by remote code show the remote traceback.

Examples
--------
::

    In [1]: %load_ext gpusession
    In [2]: %gpu start --type t4 --idle 15m
    In [3]: %%gpu
       ...: import torch; print(torch.cuda.get_device_name())
    In [4]: %gpu on          # every following cell runs in the session
    In [5]: %gpu off
    In [6]: %gpu push df model
    In [7]: %gpu pull result
    In [7]: %gpu upload data/ utils.py   # files into the session's working directory
    In [7]: %gpu download results/       # and back
    In [8]: %gpu status      # latest GPU sample, cost, idle countdown
    In [9]: %gpu watch 1m    # live for a minute (Ctrl-C ends it earlier)
    In [10]: %gpu keepalive 2h
    In [11]: %gpu stop
"""

from __future__ import annotations

import shlex
import sys
import threading
import time
from typing import Any, Callable

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class

from ..configuration import options
from ..configuration.config import GpuSessionConfig
from ..configuration.registry import price_lists
from ..configuration.settings import backend_sections
from ..core.durations import WATCH, format_duration, format_money
from ..core.errors import (
    BadInput,
    CellLost,
    GpuSessionError,
    LinkLost,
    RemoteError,
    RemoteInterrupt,
    SessionEnded,
)
from ..core.models import State
from ..session import SessionManager
from ..session.discovery import chosen_place, discover, free_now, make_default
from ..session.handle import Session
from ..session.recovery import wants_recovery
from ..session.store import owner_id
from ..widgets import register_panel
from ..words.common import free_now_lines, price_list_lines
from ..words.setup import LOOKING, chosen_line, places_table, setup_summary
from ..words.spend import advice_line, advice_lines, live_price_lines, report_lines, start_notes
from ..words.status import (
    connected_line,
    placement_line,
    rate_text,
    session_table,
    status_heading,
    status_lines,
    still_billing_line,
    waiting_connected_line,
)
from ..words.stops import (
    after_end,
    ended_message,
    error_text,
    idle_setting,
    interrupt_line,
    keepalive_line,
    no_session_after_end,
    no_session_text,
    renumber_cells,
    summary_line,
    usage_error,
)
from ..words.switches import (
    cell_cut_line,
    followed_line,
    recovered_line,
    recovering_line,
    recovery_failed_line,
    switch_line,
)
from ..words.workspaces import print_checkpoint, print_restored
from . import transfer_commands
from .magicargs import (
    HELP,
    PARSERS,
    _advice_args,
    _keepalive_args,
    _report_args,
    _setup_args,
    _start_args,
    _stop_args,
    _switch_args,
    _types_args,
    _use_args,
    _watch_args,
)
from .notify import CellNotices, WarningNotifier, watch


@magics_class
class GpuMagics(Magics):
    def __init__(
        self,
        shell,
        manager: SessionManager | None = None,
        gpu_config: GpuSessionConfig | None = None,
    ):
        super().__init__(shell)
        # The live settings: `%config GpuSessionConfig...` changes this object, and the manager
        # reads it at each start. (Not `self.config`: that is the Magics' own traitlets config.)
        self.gpu_config = gpu_config or (
            manager.config if manager else GpuSessionConfig(parent=shell)
        )
        self._manager = manager
        self._current: Session | None = None
        # when this notebook last took up a session (started, used, followed): a connection
        # made from the sidebar after it wins (GpuMagics._follow_connection)
        self._taken_at = 0.0
        self.auto = False
        self._notifier: WarningNotifier | None = None
        self._ended_note: str | None = None  # how the current session ended, seen by the notifier
        self.debug = False  # `%gpu debug on`: errors show our own frames too
        self._cell_numbers: dict[str, dict[int, int]] = {}  # per session: its cell no. -> ours
        # held while a magic or cell uses the session; the notifier only looks when it is free,
        # so it never tears down connections a running cell is reading from
        self._in_use = threading.RLock()
        # what a background thread says goes to the running cell, or waits for the next one
        self._notices = CellNotices(shell, _print)
        self._subcommands: dict[str, Callable[[str], Any]] = {
            "start": self._start,
            "stop": self._stop,
            "switch": self._switch,
            "status": self._status,
            "list": self._list,
            "types": self._types,
            "setup": self._setup,
            "on": self._on,
            "off": self._off,
            "use": self._use,
            "watch": self._watch,
            "keepalive": self._keepalive,
            "advice": self._advice,
            "report": self._report,
            "help": self._help,
            "debug": self._debug,
        }

    @property
    def manager(self) -> SessionManager:
        """Made at the first %gpu command, so data_dir set by then (files, command line,
        `%config` right after `%load_ext`) picks the store; other settings apply at each start."""
        if self._manager is None:
            self._manager = SessionManager(self.gpu_config)
        return self._manager

    @property
    def current(self) -> Session | None:
        """The session this notebook's `%%gpu` cells run in."""
        return self._current

    @current.setter
    def current(self, session: Session | None) -> None:
        if session is not None:
            self._taken_at = time.time()
        self._current = session

    def add_subcommand(self, name: str, handler: Callable[[str], Any]) -> None:
        """Later layers (stats, panel) register their subcommands here."""
        self._subcommands[name] = handler

    # -- entry points ------------------------------------------------------------------

    @line_magic
    def gpu(self, line: str = "") -> Any:
        """Run a GPU session subcommand; `%gpu help` lists them."""
        sub, _, rest = _without_comment(line).strip().partition(" ")
        handler = self._subcommands.get(sub or "status")
        if handler is None:
            raise UsageError(
                f"unknown subcommand {sub!r}; valid: {', '.join(sorted(self._subcommands))}"
            )
        try:
            with self._in_use:
                return handler(rest.strip())
        except GpuSessionError as exc:
            if isinstance(exc, RemoteError):
                raise
            raise UsageError(error_text(exc)) from None

    @cell_magic("gpu")
    def gpu_cell(self, line: str, cell: str) -> None:
        """%%gpu [NAME]: run the cell in the session kernel, output streamed back live."""
        # the session is picked, used and, when it ended, forgotten under the lock: the notifier
        # never lets go of its connections between the pick and the send (a laptop waking finds
        # both the cell and the notifier's look due at once)
        with self._in_use:
            self._run_cell(_without_comment(line).strip() or None, cell)

    def _run_cell(self, name: str | None, cell: str) -> None:
        try:
            session = self._session(name)
        except GpuSessionError as exc:  # no such session, it ended, its store cannot be opened
            raise UsageError(error_text(exc)) from None
        # this notebook's number of the cell (IPython counts it up before the cell runs)
        here = self.shell.execution_count - 1
        try:
            reply = session.run(cell)
            self._number(session, reply.get("execution_count"), here)
        except RemoteError as exc:  # its traceback is the remote one, cells numbered as here
            self._number(session, exc.execution_count, here)
            exc.traceback = renumber_cells(exc.traceback, self._numbers(session), session.name)
            raise
        except (
            KeyboardInterrupt
        ) as exc:  # where the remote code was, and one line: no frame of ours
            if self.debug:
                raise
            raise self._interrupted(session, exc, here) from None
        except (CellLost, LinkLost) as exc:  # the session is fine (or still runs): one line, why
            raise UsageError(str(exc)) from None
        except GpuSessionError as exc:
            if session is self.current and not session.record.state.active:
                self._forget(session.id)
            if isinstance(exc, SessionEnded) and _interrupted(exc.record):
                # its capacity went away mid-cell: the cell is said to be cut, never re-run;
                # with --recover a replacement takes over before the next cell
                _print(error_text(exc))
                back = self._recover(exc.record)
                raise UsageError(
                    cell_cut_line(exc.record) + (f"\n{back}" if back else "")
                ) from None
            if isinstance(exc, SessionEnded):  # stopped (by whom and why), not broken
                raise UsageError(after_end(error_text(exc), self._active())) from None
            raise UsageError(
                f"{error_text(exc)}. Session {session.name} is no longer usable; `%gpu start` a new one."
            ) from None
        except Exception as exc:  # a fault of ours or of the machine: one line unless debugging
            if self.debug:
                raise
            raise UsageError(
                f"the cell could not run in session {session.name}: {type(exc).__name__}: {exc} "
                "(`%gpu debug on` shows where)"
            ) from None

    def _numbers(self, session: Session) -> dict[int, int]:
        """The session kernel's cell numbers -> this notebook's, for the cells sent from here."""
        return self._cell_numbers.setdefault(session.id, {})

    def _number(self, session: Session, remote: int | None, here: int) -> None:
        if remote is not None:
            self._numbers(session)[remote] = here

    def _interrupted(
        self, session: Session, exc: KeyboardInterrupt, here: int
    ) -> KeyboardInterrupt:
        """A KeyboardInterrupt that renders as the remote traceback and one line (IPython shows
        `_render_traceback_` instead of the local frames, as for RemoteError)."""
        remote = (
            exc
            if isinstance(exc, RemoteInterrupt)
            else RemoteInterrupt(
                "interrupted while waiting for the session; the remote cell may still run"
            )
        )
        self._number(session, remote.execution_count, here)
        lines = renumber_cells(remote.traceback, self._numbers(session), session.name)
        lines.append(interrupt_line(session.name, remote.stopped, str(remote)))
        clean = KeyboardInterrupt(lines[-1])
        clean._render_traceback_ = lambda: lines  # type: ignore[attr-defined]
        return clean

    # -- helpers -----------------------------------------------------------------------

    def _session(self, name: str | None = None) -> Session:
        if name:
            session = self.manager.connected(name)
            return session or self.manager.attach(name, report=_print)
        self._follow_connection()
        if self.current is None and self._ended_note:  # it ended while no cell ran: say how
            said = self._notices.said_in_this_cell(f"[gpusession] {self._ended_note}")
            raise UsageError(
                no_session_after_end(self._ended_note, said_above=said, active=self._active())
            )
        if self.current is None:
            raise UsageError(self._no_session("no GPU session in this notebook"))
        self._follow_switch()
        return self.current

    def _follow_connection(self) -> None:
        """The sidebar connected this notebook (its kernel: this process) to a session after
        the notebook last took one up (REST `PUT kernels/ID/session`, recorded as a use of the
        session by this process): its cells run there from now on, with one line. A session
        still starting is waited for."""
        try:
            taken = self.manager.store.taken_by(owner_id())
        except GpuSessionError:
            return
        if taken is None or taken[1] <= self._taken_at:
            return
        record = taken[0]
        if self.current is not None and self.current.id == record.id:
            self._taken_at = taken[1]
            return
        if record.state != State.RUNNING:
            _print(waiting_connected_line(record))
            record = self._wait_running(record.id)
        session = self.manager.connected(record.id) or self.manager.attach(record.id, report=_print)
        self.current, self._ended_note = session, None
        self._notify(session)
        _print(connected_line(session.record))

    def _wait_running(self, session_id: str, timeout: float = 900.0):
        """The record of a session once it left its start (running, or how it ended)."""
        deadline = time.monotonic() + timeout
        record = self.manager.get(session_id)
        while record.state.active and record.state != State.RUNNING:
            if time.monotonic() > deadline:
                raise UsageError(waiting_connected_line(record) + ": still not running")
            time.sleep(0.5)
            record = self.manager.get(session_id)
        return record

    def _no_session(self, head: str) -> str:
        """`head`, the sessions that exist and `%gpu use NAME` (or how to start one)."""
        return no_session_text(head, self._active())

    def _active(self) -> list[tuple[str, str]]:
        """(name, state) of the active sessions, newest first."""
        return [(r.name, r.state.value) for r in self.manager.list(active_only=True)]

    def _follow_switch(self) -> None:
        """A switch made elsewhere (the sidebar, the CLI, REST, another notebook) moved the
        current session: follow it to its successor, with one line (`%gpu on` stays on). Asked
        before each use, so the next cell runs there even before the notifier saw the stop; a
        successor that does not run any more is left to the words of the old one's end."""
        for _ in range(8):  # switched again and again while this notebook looked away
            if self.current is None:
                return
            try:
                old = self.manager.get(self.current.id)
                new_id = old.resource.get("switched_to")
                if not new_id:
                    return
                session = self.manager.connected(new_id) or self.manager.attach(new_id)
            except GpuSessionError:  # forgotten, or its successor ended: the cell says how
                return
            self.current, self._ended_note = session, None
            self.manager.store.note_user(session.id, owner_id(), time.time())  # the status bar
            self._notify(session)
            self._notices.say(followed_line(old, session.record))

    def _parse(self, spec_func, rest: str):
        """Shell quoting, as a user expects: `--name "my run"` is `my run`, without quotes."""
        try:
            words = shlex.split(rest)
        except ValueError as exc:  # an unclosed quote
            raise UsageError(f"cannot read the arguments ({exc}): close the quote") from None
        try:
            return spec_func.parser.parse_args(words)
        except UsageError as exc:
            raise UsageError(usage_error(str(exc))) from None
        except SystemExit:  # argparse exits on --help
            raise UsageError(spec_func.__doc__ or "bad arguments") from None

    # -- subcommands -------------------------------------------------------------------

    def _start(self, rest: str) -> Session:
        spec = self.manager.spec_from(
            options.given_values(self._parse(_start_args, rest)), options.FLAGS
        )
        record = self.manager.create(spec)
        self._say_still_billing()
        for note in start_notes(record):  # a policy's bounds, a budget near its end
            _print(note)
        try:
            session = self.manager.launch(record, report=_print)
        except KeyboardInterrupt:  # one line, not IPython's traceback: launch already cleaned up
            ended = self.manager.get(record.id)
            raise UsageError(
                f"start of {ended.name} interrupted ({ended.error}); nothing is left running "
                f"(`%gpu list` shows it as {ended.state.value})"
            ) from None
        self.current = session
        _print(idle_setting(spec.idle))  # `--idle 0` means off: say so
        print_restored(session.record, _print)  # --resume: what came back, what did not
        self._notify(session)
        return None

    def _say_still_billing(self) -> None:
        """A second start in this notebook leaves the first session billing: say so, with its
        rate and how to stop it."""
        if self.current is None:
            return
        try:
            record = self.manager.get(self.current.id)
        except GpuSessionError:
            return
        if record.state.active:
            _print(still_billing_line(self.manager.view(record)))

    def _switch(self, rest: str) -> None:
        """Move the current session to other capacity; it stays current, under its new name."""
        args = self._parse(_switch_args, rest)
        old = self._session()
        given = options.given_values(args)
        if args.on_demand:
            given["on_demand"] = True
        spec = self.manager.switch_spec(old.id, given, options.FLAGS)
        try:
            session, report = self.manager.switch(old, spec, report=_print, by="%gpu switch")
        except KeyboardInterrupt:  # switch_session says so as a StageError; this is a second one
            raise UsageError(f"switch interrupted; session {old.name} keeps running") from None
        self.current = session
        self._notify(session)
        _print(switch_line(report.to_dict()))

    def _recover(self, record) -> str | None:
        """A replacement for a session whose capacity went away after a save, when it asks
        for one (--recover): made current, restored. The line to say; None when not wanted."""
        if not wants_recovery(record):
            return None
        self._notices.say(recovering_line(record))
        try:
            session = self.manager.recover(record.id, report=self._notices.say)
        except (GpuSessionError, OSError) as exc:
            return recovery_failed_line(record, str(exc), record.resource.get("workspace"))
        if session is None:
            return None
        self.current, self._ended_note = session, None
        print_restored(session.record, self._notices.say)
        self._notify(session)
        return recovered_line(record, session.record)

    def _notify(self, session: Session) -> None:
        """Warnings (idle stop soon, cost cap near) and the session's end reach this notebook
        even while no cell runs."""
        if self._notifier is not None:
            self._notifier.stop()
        sid = session.id

        def ended(text: str) -> None:
            # the notifier's look holds `_in_use` around this: said and forgotten at once
            with self._in_use:  # switched elsewhere: follow it, one line instead of its end
                if self.current is not None and self.current.id == sid:
                    self._follow_switch()
                    if self.current.id != sid:
                        return
                self._notices.say(f"[gpusession] {text}")
                self._forget(sid)
                self._ended_note = text  # for the next %%gpu, which has no session now
                record = self.manager.get(sid)
                if _interrupted(record):  # --recover: a replacement before the next cell
                    back = self._recover(record)
                    if back:
                        self._notices.say(f"[gpusession] {back}")

        self._notifier = WarningNotifier.for_session(
            self.manager, sid, self._in_use, self._notices.say, ended
        ).start()

    def _stop(self, rest: str) -> None:
        args = self._parse(_stop_args, rest)
        if args.all:
            stopped = self.manager.stop_all(by="%gpu stop --all")
            if self.current is not None:
                self._forget(self.current.id)
            print(
                f"stopped {len(stopped)} session(s)"
                + "".join(f"\n  {r.name}: {summary_line(r)}" for r in stopped)
            )
            return
        if not args.name:
            self._follow_connection()
        if args.name:
            record = self.manager.get(args.name)
        elif self.current is not None:
            record = self.current.record
        else:
            raise UsageError(self._no_session("no session in this notebook to stop"))
        record = self.manager.stop(record.id, by="%gpu stop", save=args.save)
        if self.current is not None and self.current.id == record.id:
            was_auto = self.auto
            self._forget(record.id)
            if was_auto:
                print("cells run locally again")
        print(f"stopped {record.name}: {summary_line(record)}")
        advice = advice_line(self.manager.spend.advice(record.id, live=False))
        if advice:
            print(advice)
        print_checkpoint(record, _print)

    def _report(self, rest: str) -> None:
        args = self._parse(_report_args, rest)
        print("\n".join(report_lines(self.manager.spend.report(args.since, args.by))))

    def _advice(self, rest: str) -> None:
        args = self._parse(_advice_args, rest)
        if args.name is None and self.current is None:
            raise UsageError(self._no_session("no session in this notebook to advise on"))
        doc = self.manager.spend.advice(args.name or self.current.id)  # type: ignore[union-attr]
        print("\n".join(advice_lines(doc["name"], doc)))

    def _status(self, rest: str) -> None:
        name = rest.strip() or None
        if name is None:
            self._follow_connection()
        if name is None and self.current is None:
            print(self._no_session("no GPU session in this notebook"))
            return
        key = name or self.current.id  # type: ignore[union-attr]
        was_running = self.manager.get(key).state == State.RUNNING
        record = self.manager.refresh_state(key)  # finds a session its watchdog stopped
        if not record.state.active:  # how it ended: its watchdog, a stop, a failure
            if was_running:
                self._forget(record.id)
            print(ended_message(record))
            return
        if self.current is not None and self.current.id == record.id:
            self.current.record = record
        live, problem = None, None
        if record.state == State.RUNNING:
            try:
                live = self.manager.stats.fetch(record.id, limit=1)
            except GpuSessionError as exc:
                problem = f"  live stats unavailable: {exc}"
        v = self.manager.view(record)
        lines = [
            status_heading(v),
            f"  up {format_duration(v['uptime_s'])}, {rate_text(v)}"
            + ("" if live else f", cost so far {format_money(v['cost_so_far'])}"),
        ]
        if placement_line(v):
            lines.append(f"  {placement_line(v)}")
        if problem:
            lines.append(problem)
        if live is not None:
            lines += status_lines(live)
        else:
            lines.append(
                f"  idle timeout {format_duration(v['idle']['timeout_s'])}"
                + (f", max cost ${v['max_cost']:.2f}" if v["max_cost"] else "")
            )
        if record.error:
            lines.append(f"  error: {record.error}")
        if self.auto and self.current is not None and self.current.id == record.id:
            lines.append("  %gpu on: every cell runs in this session")
        print("\n".join(lines))

    def _forget(self, session_id: str) -> None:
        """The session ended (stopped here, or by its watchdog): it is no longer the current one."""
        self._ended_note = None
        if self.current is not None and self.current.id == session_id:
            self.current = None
            self._off("quiet")
            if self._notifier is not None:
                self._notifier.stop()
                self._notifier = None

    def _watch(self, rest: str) -> None:
        args = self._parse(_watch_args, rest)
        session = self._session()
        duration = WATCH.parse(args.duration) if (args.duration or "").strip() else None
        manager, sid = self.manager, session.id

        def header() -> str:
            return f"{session.name} ({session.record.spec.gpu_count} x {session.record.spec.gpu_type}) {time.strftime('%H:%M:%S')}"

        watch(
            lambda: manager.stats.fetch(sid, limit=60),
            header,
            duration=duration,
            interval=max(0.2, args.interval),
        )
        if manager.get(sid).state != State.RUNNING:
            self._forget(sid)

    def _keepalive(self, rest: str) -> None:
        args = self._parse(_keepalive_args, rest)
        session = self._session()
        granted = self.manager.stats.keepalive(session.id, args.duration)
        _print(keepalive_line(session.name, granted, granted["asked_s"]))

    def _list(self, rest: str) -> None:
        records = self.manager.list(check=True)  # a session gone is shown ended, not running
        if not records:
            print("no sessions yet. `%gpu start --type t4` starts one.")
            return
        views = [self.manager.view(r) for r in records]
        print(
            session_table(views, current=self.current.id if self.current else None, command="%gpu")
        )

    def _types(self, rest: str) -> None:
        args = self._parse(_types_args, rest)
        if args.live:
            rows = self.manager.spend.live_prices()
            print("\n".join(live_price_lines(rows, self.manager.catalog.prices_line)))
            return
        print("\n".join([self.manager.catalog.table(), *price_list_lines(price_lists())]))
        free = free_now_lines(free_now(self.manager.backend))
        if free:
            print("\n".join(free))

    def _setup(self, rest: str) -> None:
        """`%gpu setup [--choose N]`: gpusession setup in the notebook; the choice is the line
        itself (no question asked)."""
        args = self._parse(_setup_args, rest)
        print(LOOKING)
        places = discover()
        print(places_table(places))
        if args.choose is None:
            print(setup_summary(places, command="%gpu setup --choose N"))
            return
        try:
            place = chosen_place(places, args.choose)
        except BadInput as exc:
            raise UsageError(str(exc)) from None
        print(chosen_line(place, str(make_default(place))))

    def _on(self, rest: str) -> None:
        self._session()  # must have one
        self.auto = True
        transformers = self.shell.input_transformers_cleanup
        if self._auto_transform not in transformers:
            transformers.append(self._auto_transform)
        print(f"every cell now runs in {self.current.name} (`%gpu off` to stop)")  # type: ignore[union-attr]

    def _off(self, rest: str) -> None:
        was = self.auto
        self.auto = False
        transformers = self.shell.input_transformers_cleanup
        if self._auto_transform in transformers:
            transformers.remove(self._auto_transform)
        if was and rest != "quiet":
            print("cells run locally again")

    def _auto_transform(self, lines: list[str]) -> list[str]:
        """With `%gpu on`, make every cell a %%gpu cell, except %gpu lines themselves."""
        if not self.auto or not lines:
            return lines
        first = next((line.strip() for line in lines if line.strip()), "")
        if first.startswith(("%gpu", "%%gpu", "%load_ext", "%reload_ext", "%unload_ext")):
            return lines
        return ["%%gpu\n", *lines]

    def _use(self, rest: str) -> None:
        args = self._parse(_use_args, rest)
        self.current = self.manager.connected(args.name) or self.manager.attach(
            args.name, report=_print
        )
        self.manager.store.note_user(
            self.current.id, owner_id(), time.time()
        )  # the status bar follows
        self._notify(self.current)
        print(f"using {self.current.name}")

    def _debug(self, rest: str) -> None:
        word = rest.strip().lower()
        if word not in ("", "on", "off"):
            raise UsageError(f"`%gpu debug` takes on or off, not {rest.strip()!r}")
        self.debug = word == "on" if word else not self.debug
        print(
            "debug on: errors show gpusession's own frames"
            if self.debug
            else "debug off: errors show the remote traceback and one line"
        )

    def _help(self, rest: str) -> None:
        sub = rest.strip()
        func = PARSERS.get(sub) or transfer_commands.help_parser(sub)
        print(func.parser.format_help() if func is not None else HELP)


def _interrupted(record) -> bool:
    """Did the session end because its capacity went away (gpusession.core.protocol.StopKind)?"""
    return record.stop_reason is not None and record.stop_reason.kind.interruption


def _print(line: str) -> None:
    print(line, flush=True)
    sys.stdout.flush()


def load_ipython_extension(ip) -> None:
    from traitlets import TraitError

    try:  # reads c.GpuSessionConfig from ipython_config.py / the kernel's command line
        gpu_config = GpuSessionConfig(parent=ip)
    except TraitError as exc:
        raise UsageError(f"gpusession: {exc}") from None
    try:
        gpu_config.check()
    except GpuSessionError as exc:  # a bad env var: say so now; `%config` can still override it
        print(f"gpusession: {exc}", file=sys.stderr)
    magics = GpuMagics(ip, gpu_config=gpu_config)
    ip.register_magics(magics)
    # what makes `%config GpuSessionConfig.default_idle = "10m"` apply (jupysql's habit), and
    # `%config DockerBackend.image = "..."`: each backend's own section (its `settings`)
    sections = backend_sections(gpu_config)
    ip.configurables[:] = [
        c
        for c in ip.configurables
        if not isinstance(c, GpuSessionConfig)
        and type(c).__name__ not in {type(s).__name__ for s in sections}
    ] + [gpu_config, *sections]
    ip._gpusession_magics = magics  # for later layers (widgets) and unload
    transfer_commands.register(magics)  # push, pull, upload, download (with progress bars)
    register_panel(magics)  # the ipywidgets face adds `%gpu panel`


def unload_ipython_extension(ip) -> None:
    magics = getattr(ip, "_gpusession_magics", None)
    if magics is not None:
        if magics.gpu_config in ip.configurables:
            ip.configurables.remove(magics.gpu_config)
        magics._off("quiet")
        if magics._notifier is not None:
            magics._notifier.stop()
        magics._notices.close()


def _without_comment(line: str) -> str:
    """The magic's line without a trailing `# comment` (IPython hands line magics their whole
    line): `%gpu start --type t4  # on the GPU box` reads as `%gpu start --type t4`. A # inside
    quotes, or glued to a word (`--name run#2`), is kept."""
    import shlex

    lexer = shlex.shlex(line, posix=True, punctuation_chars=False)
    lexer.whitespace_split, lexer.commenters = True, "#"
    try:
        words = list(lexer)
    except ValueError:  # an unclosed quote: the option parser says what is wrong
        return line
    return line if len(words) == len(shlex.split(line, comments=False)) else shlex.join(words)
