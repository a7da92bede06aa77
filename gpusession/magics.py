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
    In [8]: %gpu status      # latest GPU sample, cost, idle countdown
    In [9]: %gpu watch 60    # live for a minute (Ctrl-C ends it earlier)
    In [10]: %gpu keepalive 2h
    In [11]: %gpu stop
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any, Callable

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from .durations import format_duration, format_money, parse_duration
from .errors import CellLost, GpuSessionError, RemoteError
from .models import State
from .session import Session, SessionManager
from .statsview import WarningNotifier, status_lines, watch


@magic_arguments()
@argument("--type", "-t", dest="gpu_type", default=None, help="GPU type, optionally with a count: t4, a100:8 (see %%gpu types)")
@argument("--backend", "-b", default=None, help="local, docker or aws (default: docker when an engine answers, else local)")
@argument("--host", default=None, help="docker backend: a remote engine, ssh://user@host[:port]")
@argument("--image", default=None, help="container image (docker/aws); default: built from Dockerfile.cuda")
@argument("--idle", default="default", help="stop after this long idle: 90s, 15m, 1h, or off (default 30m)")
@argument("--gpu-only", dest="gpu_only_idle", action="store_true", default=None,
          help="count only GPU utilization as activity (stops a busy kernel whose GPU sits unused)")
@argument("--max-runtime", default=None, help="hard stop after this long, e.g. 8h")
@argument("--spot", action="store_true", default=None, help="aws: use spot capacity")
@argument("--region", default=None, help="aws: region, e.g. us-east-1")
@argument("--max-cost", default=None, help="stop when the session has cost this many dollars, e.g. 5")
@argument("--name", "-n", default=None, help="session name (default: TYPE-N)")
@argument("--gpus", default=None, help="docker: GPUs to request, 'all' (default) or a number")
@argument("--ssh-cidr", default=None, help="aws: addresses allowed to SSH in (default: your address /32)")
@argument("--fallback", default=None, choices=["off", "zone", "on-demand", "any"],
          help="aws: on a capacity error try another zone, on-demand, or both (default off)")
@argument("--max-price", default=None, help="aws spot: highest $/hour to pay (default: the on-demand price)")
@argument("--ami", default=None, help="aws: machine image id (default: a GPU image from SSM public parameters)")
def _start_args(line: str) -> None:
    """%gpu start [options]"""


@magic_arguments()
@argument("name", nargs="?", default=None, help="session name (default: the current session)")
@argument("--all", action="store_true", help="stop every active session")
def _stop_args(line: str) -> None:
    """%gpu stop [NAME | --all]"""


@magic_arguments()
@argument("names", nargs="+", help="variable names")
def _vars_args(line: str) -> None:
    """%gpu push|pull NAME..."""


@magic_arguments()
@argument("name", help="session name")
def _use_args(line: str) -> None:
    """%gpu use NAME"""


@magic_arguments()
@argument("duration", nargs="?", default=None, help="stop watching after this long: 60 (seconds), 5m (default: until interrupted)")
@argument("--interval", type=float, default=1.0, help="seconds between updates (default 1)")
def _watch_args(line: str) -> None:
    """%gpu watch [SECONDS]"""


@magic_arguments()
@argument("duration", nargs="?", default="1h", help="postpone the idle stop by this long: 30m, 1h, 2h (default 1h; at most 4h)")
def _keepalive_args(line: str) -> None:
    """%gpu keepalive [DURATION]"""


HELP = """%gpu SUBCOMMAND ...
  start [--type T4] [--backend local|docker|aws] [--idle 15m] [--max-cost 5] [--name N] ...
  stop [NAME | --all]     status     list     types
  on | off                run every following cell in the session (or stop doing so)
  push NAME...            send local variables to the session;  pull NAME...: fetch them back
  use NAME                work with another running session (e.g. one started from the panel)
  watch [SECONDS]         live GPU, CPU, cost and idle countdown (Ctrl-C or the stop button ends it)
  keepalive [1h]          postpone the idle stop (at most 4h ahead)
  panel [NAME | --all]    the session card with live gauges, start/stop buttons (ipywidgets)
  %%gpu                   (cell magic) run this cell in the session
`%gpu start?` style help: `%gpu help start`."""


@magics_class
class GpuMagics(Magics):
    def __init__(self, shell, manager: SessionManager | None = None):
        super().__init__(shell)
        self._manager = manager
        self.current: Session | None = None
        self.auto = False
        self._notifier: WarningNotifier | None = None
        # held while a magic or cell uses the session; the notifier only looks when it is free,
        # so it never tears down connections a running cell is reading from
        self._in_use = threading.RLock()
        self._subcommands: dict[str, Callable[[str], Any]] = {
            "start": self._start,
            "stop": self._stop,
            "status": self._status,
            "list": self._list,
            "types": self._types,
            "on": self._on,
            "off": self._off,
            "push": self._push,
            "pull": self._pull,
            "use": self._use,
            "watch": self._watch,
            "keepalive": self._keepalive,
            "help": self._help,
        }

    @property
    def manager(self) -> SessionManager:
        if self._manager is None:
            self._manager = SessionManager()
        return self._manager

    def add_subcommand(self, name: str, handler: Callable[[str], Any]) -> None:
        """Later layers (stats, panel) register their subcommands here."""
        self._subcommands[name] = handler

    # -- entry points ------------------------------------------------------------------

    @line_magic
    def gpu(self, line: str = "") -> Any:
        """Run a GPU session subcommand; `%gpu help` lists them."""
        sub, _, rest = line.strip().partition(" ")
        handler = self._subcommands.get(sub or "status")
        if handler is None:
            raise UsageError(f"unknown subcommand {sub!r}; valid: {', '.join(sorted(self._subcommands))}")
        try:
            with self._in_use:
                return handler(rest.strip())
        except GpuSessionError as exc:
            if isinstance(exc, RemoteError):
                raise
            raise UsageError(str(exc)) from None

    @cell_magic("gpu")
    def gpu_cell(self, line: str, cell: str) -> None:
        """%%gpu [NAME]: run the cell in the session kernel, output streamed back live."""
        session = self._session(line.strip() or None)
        try:
            with self._in_use:
                session.run(cell)
        except RemoteError:
            raise
        except CellLost as exc:
            raise UsageError(str(exc)) from None
        except GpuSessionError as exc:
            if session is self.current and not session.record.state.active:
                self._forget(session.id)
            raise UsageError(f"{exc}. Session {session.name} is no longer usable; `%gpu start` a new one.") from None

    # -- helpers -----------------------------------------------------------------------

    def _session(self, name: str | None = None) -> Session:
        if name:
            session = self.manager.connected(name)
            return session or self.manager.attach(name, report=_print)
        if self.current is None:
            raise UsageError("no GPU session: run `%gpu start --type t4` first (or `%gpu use NAME`)")
        return self.current

    def _parse(self, spec_func, rest: str):
        try:
            return parse_argstring(spec_func, rest)
        except UsageError:
            raise
        except SystemExit:  # argparse exits on --help
            raise UsageError(spec_func.__doc__ or "bad arguments") from None

    # -- subcommands -------------------------------------------------------------------

    def _start(self, rest: str) -> Session:
        args = self._parse(_start_args, rest)
        spec = self.manager.make_spec(
            args.gpu_type,
            backend=args.backend,
            idle=args.idle,
            name=args.name,
            image=args.image,
            host=args.host,
            spot=args.spot,
            region=args.region,
            gpu_only_idle=args.gpu_only_idle,
            max_cost=args.max_cost,
            max_runtime=args.max_runtime,
            gpus=args.gpus,
            ssh_cidr=args.ssh_cidr,
            fallback=args.fallback,
            max_price=args.max_price,
            ami=args.ami,
        )
        session = self.manager.start(spec, report=_print)
        self.current = session
        self._notify(session)
        return None

    def _notify(self, session: Session) -> None:
        """Warnings (idle stop soon, cost cap near) and the session's end reach this notebook
        even while no cell runs."""
        if self._notifier is not None:
            self._notifier.stop()
        sid = session.id

        def ended(text: str) -> None:
            _print(f"[gpusession] {text}")
            self._forget(sid)

        self._notifier = WarningNotifier.for_session(self.manager, sid, self._in_use, _print, ended).start()

    def _stop(self, rest: str) -> None:
        args = self._parse(_stop_args, rest)
        if args.all:
            stopped = self.manager.stop_all()
            if self.current is not None:
                self._forget(self.current.id)
            print(f"stopped {len(stopped)} session(s)" + "".join(f"\n  {r.name}: {self.manager.summary_line(r)}" for r in stopped))
            return
        if args.name:
            record = self.manager.get(args.name)
        elif self.current is not None:
            record = self.current.record
        else:
            raise UsageError("no current session to stop; name one (`%gpu list`) or use --all")
        record = self.manager.stop(record.id)
        if self.current is not None and self.current.id == record.id:
            was_auto = self.auto
            self._forget(record.id)
            if was_auto:
                print("cells run locally again")
        print(f"stopped {record.name}: {self.manager.summary_line(record)}")

    def _status(self, rest: str) -> None:
        name = rest.strip() or None
        if name is None and self.current is None:
            print("no current GPU session. `%gpu start --type t4` starts one; `%gpu list` shows all.")
            return
        key = name or self.current.id  # type: ignore[union-attr]
        was_running = self.manager.get(key).state == State.RUNNING
        record = self.manager.refresh_state(key)  # finds a session its watchdog stopped
        if not record.state.active:  # how it ended: its watchdog, a stop, a failure
            if was_running:
                self._forget(record.id)
            print(self.manager.ended_message(record))
            return
        if self.current is not None and self.current.id == record.id:
            self.current.record = record
        live, problem = None, None
        if record.state == State.RUNNING:
            try:
                live = self.manager.stats(record.id, limit=1)
            except GpuSessionError as exc:
                problem = f"  live stats unavailable: {exc}"
        v = self.manager.view(record)
        lines = [f"{v['name']}: {v['gpu_count']} x {v['gpu_type']} on {v['backend']} - {v['state']}",
                 f"  up {format_duration(v['uptime_s'])}, {format_money(v['price_per_hour'])}/h"
                 + ("" if live else f", cost so far {format_money(v['cost_so_far'])}")]
        if problem:
            lines.append(problem)
        if live is not None:
            lines += status_lines(live)
        else:
            lines.append(f"  idle timeout {format_duration(v['idle']['timeout_s'])}" + (f", max cost ${v['max_cost']:.2f}" if v["max_cost"] else ""))
        if record.error:
            lines.append(f"  error: {record.error}")
        if self.auto and self.current is not None and self.current.id == record.id:
            lines.append("  %gpu on: every cell runs in this session")
        print("\n".join(lines))

    def _forget(self, session_id: str) -> None:
        """The session ended (stopped here, or by its watchdog): it is no longer the current one."""
        if self.current is not None and self.current.id == session_id:
            self.current = None
            self._off("quiet")
            if self._notifier is not None:
                self._notifier.stop()
                self._notifier = None

    def _watch(self, rest: str) -> None:
        args = self._parse(_watch_args, rest)
        session = self._session()
        text = (args.duration or "").strip()
        try:  # a bare number means seconds here
            duration = float(text) if text else None
        except ValueError:
            duration = parse_duration(text, what="watch duration", allow_off=False)
        manager, sid = self.manager, session.id

        def header() -> str:
            return f"{session.name} ({session.record.spec.gpu_count} x {session.record.spec.gpu_type}) {time.strftime('%H:%M:%S')}"

        watch(lambda: manager.stats(sid, limit=60), header, duration=duration, interval=max(0.2, args.interval))
        if manager.get(sid).state != State.RUNNING:
            self._forget(sid)

    def _keepalive(self, rest: str) -> None:
        args = self._parse(_keepalive_args, rest)
        session = self._session()
        self.manager.keepalive(session.id, args.duration, report=_print)

    def _list(self, rest: str) -> None:
        records = self.manager.list()
        if not records:
            print("no sessions yet. `%gpu start --type t4` starts one.")
            return
        print(render_session_table(self.manager, records, current=self.current.id if self.current else None))

    def _types(self, rest: str) -> None:
        print(self.manager.catalog.table())

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
        first = next((l.strip() for l in lines if l.strip()), "")
        if first.startswith(("%gpu", "%%gpu", "%load_ext", "%reload_ext", "%unload_ext")):
            return lines
        return ["%%gpu\n", *lines]

    def _push(self, rest: str) -> None:
        args = self._parse(_vars_args, rest)
        session = self._session()
        ns = self.shell.user_ns
        missing = [n for n in args.names if n not in ns]
        if missing:
            raise UsageError(f"not defined here: {', '.join(missing)}")
        session.push({n: ns[n] for n in args.names})
        print(f"pushed {', '.join(args.names)} to {session.name}")

    def _pull(self, rest: str) -> None:
        args = self._parse(_vars_args, rest)
        session = self._session()
        values = session.pull(args.names)
        self.shell.user_ns.update(values)
        print(f"pulled {', '.join(args.names)} from {session.name}")

    def _use(self, rest: str) -> None:
        args = self._parse(_use_args, rest)
        self.current = self.manager.connected(args.name) or self.manager.attach(args.name, report=_print)
        self._notify(self.current)
        print(f"using {self.current.name}")

    def _help(self, rest: str) -> None:
        sub = rest.strip()
        funcs = {"start": _start_args, "stop": _stop_args, "push": _vars_args, "pull": _vars_args, "use": _use_args,
                 "watch": _watch_args, "keepalive": _keepalive_args}
        if sub in funcs:
            print(funcs[sub].parser.format_help().replace("usage: ", "usage: %gpu " + sub + " ", 1))
        else:
            print(HELP)


def render_session_table(manager: SessionManager, records, current: str | None = None) -> str:
    rows = [("", "NAME", "TYPE", "BACKEND", "STATE", "UPTIME", "$/H", "COST")]
    for r in records:
        v = manager.view(r)
        rows.append(
            (
                "*" if r.id == current else "",
                r.name,
                f"{v['gpu_count']}x{v['gpu_type']}",
                v["backend"],
                v["state"],
                format_duration(v["uptime_s"]),
                f"{v['price_per_hour']:.3f}",
                format_money(v["cost_so_far"]),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows)


def _print(line: str) -> None:
    print(line, flush=True)
    sys.stdout.flush()


def load_ipython_extension(ip) -> None:
    magics = GpuMagics(ip)
    ip.register_magics(magics)
    ip._gpusession_magics = magics  # for later layers (widgets) and unload
    from .widgets import register_panel  # the ipywidgets face adds `%gpu panel`

    register_panel(magics)


def unload_ipython_extension(ip) -> None:
    magics = getattr(ip, "_gpusession_magics", None)
    if magics is not None:
        magics._off("quiet")
        if magics._notifier is not None:
            magics._notifier.stop()
