"""`gpusession`: the command-line face. Errors are one line on stderr and a non-zero exit."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Callable

from ..configuration import options
from ..configuration.cost import add_report_arguments
from ..configuration.options import add_arguments as add_start_options
from ..core.errors import GpuSessionError
from . import transfer_commands


def _manager():
    """The CLI is no Jupyter app: its settings are the GPUSESSION_* env vars (a bad one is a
    one-line error), not ipython_config.py or jupyter_server_config.py, which may disagree."""
    # lazy: docs/architecture.md#imports-kept-inside-functions
    from ..configuration.settings import EnvConfig
    from ..session import SessionManager

    return SessionManager(EnvConfig())


def cmd_list(args: argparse.Namespace) -> int:
    # lazy: docs/architecture.md#imports-kept-inside-functions
    from ..words.status import session_table

    m = _manager()
    records = m.list(
        active_only=not args.all, check=True
    )  # a session gone is shown ended, not running
    if not args.all:  # and what an interruption ended with its state saved: resumable
        # lazy: docs/architecture.md#imports-kept-inside-functions
        from ..session.views import interrupted_to_resume

        records += interrupted_to_resume(m.list())
    if not records:
        print("no active sessions" if not args.all else "no sessions recorded")
        return 0
    print(session_table([m.view(r) for r in records]))
    return 0


def cmd_types(args: argparse.Namespace) -> int:
    # lazy: docs/architecture.md#imports-kept-inside-functions
    from ..configuration.catalog import load_catalog

    if args.live:
        # lazy: docs/architecture.md#imports-kept-inside-functions
        from ..words.spend import live_price_lines

        m = _manager()
        print("\n".join(live_price_lines(m.spend.live_prices(), m.catalog.prices_line)))
        return 0
    from ..configuration.registry import price_lists
    from ..session.discovery import free_now
    from ..words.common import free_now_lines, price_list_lines

    print("\n".join([load_catalog().table(), *price_list_lines(price_lists())]))
    free = free_now_lines(free_now(_manager().backend))
    if free:
        print("\n".join(free))
    return 0


def cmd_catalog(args: argparse.Namespace) -> int:
    # lazy: docs/architecture.md#imports-kept-inside-functions
    from ..words.spend import catalog_refresh_line

    if args.action != "refresh":
        raise GpuSessionError("say what to do: `gpusession catalog refresh`")
    print(catalog_refresh_line(_manager().spend.refresh_catalog()))
    return 0


def cmd_stop(args: argparse.Namespace) -> int:
    # lazy: docs/architecture.md#imports-kept-inside-functions
    from ..words.spend import advice_line
    from ..words.stops import summary_line
    from ..words.workspaces import print_checkpoint

    m = _manager()
    if args.all:
        stopped = m.stop_all(by="gpusession stop --all")
        print(f"stopped {len(stopped)} session(s)")
        for r in stopped:
            print(f"  {r.name}: {summary_line(r)}")
        return 0
    if not args.name:
        raise GpuSessionError("name a session to stop (`gpusession list`), or pass --all")
    r = m.stop(args.name, by="gpusession stop", save=args.save)
    print(f"stopped {r.name}: {summary_line(r)}")
    advice = advice_line(m.spend.advice(r.id, live=False))
    if advice:
        print(advice)
    print_checkpoint(r, print)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    # lazy: docs/architecture.md#imports-kept-inside-functions
    from ..words.spend import report_lines

    m = _manager()
    try:
        doc = m.spend.report(args.since, args.by)
    finally:
        m.close()
    print("\n".join(report_lines(doc)))
    return 0


def cmd_advice(args: argparse.Namespace) -> int:
    # lazy: docs/architecture.md#imports-kept-inside-functions
    from ..words.spend import advice_lines

    m = _manager()
    try:
        doc = m.spend.advice(args.name)
    finally:
        m.close()
    print("\n".join(advice_lines(doc["name"], doc)))
    return 0


def cmd_start(args: argparse.Namespace) -> int:
    # lazy: docs/architecture.md#imports-kept-inside-functions
    from ..words.spend import start_notes
    from ..words.stops import idle_setting
    from ..words.workspaces import print_restored

    m = _manager()
    spec = m.spec_from(options.given_values(args), options.FLAGS)
    record = m.create(spec)
    for note in start_notes(record):  # a policy's bounds, a budget near its end
        print(note, flush=True)
    session = m.launch(record, report=lambda line: print(line, flush=True))
    print_restored(session.record, print)
    print(
        f"{session.name} is running ({idle_setting(spec.idle)}); "
        f"`gpusession stop {session.name}` stops it"
    )
    session.kernel.close()
    session.link.close()
    return 0


def cmd_switch(args: argparse.Namespace) -> int:
    # lazy: docs/architecture.md#imports-kept-inside-functions
    from ..words.switches import switch_line

    m = _manager()
    given = options.given_values(args)
    if args.on_demand:
        given["on_demand"] = True
    spec = m.switch_spec(args.session, given, options.FLAGS)
    session, report = m.switch(
        args.session, spec, report=lambda line: print(line, flush=True), by="gpusession switch"
    )
    print(switch_line(report.to_dict()))
    session.close_connections()
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    # lazy: docs/architecture.md#imports-kept-inside-functions
    from ..words.status import (
        placement_line,
        rate_text,
        start_log_lines,
        status_heading,
        timeline,
        unverified_text,
    )
    from ..words.stops import ended_message

    m = _manager()
    r = m.liveness.check([m.get(args.name)])[0]
    v = m.view(r)
    print(status_heading(v))
    print(f"  id {r.id}, owner {r.owner}, {rate_text(v)}, cost so far ${v['cost_so_far']:.4f}")
    if placement_line(v):
        print(f"  {placement_line(v)}")
    if not v["verified"]:
        print(f"  {unverified_text(v)}; `gpusession stats {v['name']}` asks the session")
    if r.error:
        print(f"  error: {r.error}")
    if not r.state.active:
        print(f"  {ended_message(r)}")
    if r.resource.get("start_log"):
        print(start_log_lines(r.resource["start_log"]))
    print("  timeline:")
    print(timeline(r))
    return 0


def cmd_stats(args: argparse.Namespace) -> int:
    # lazy: docs/architecture.md#imports-kept-inside-functions
    from ..words.status import status_lines

    m = _manager()
    try:
        stats = m.stats.fetch(args.name, limit=60)
        print("\n".join(status_lines(stats, history=True)))
    finally:
        m.close()
    return 0


def cmd_keepalive(args: argparse.Namespace) -> int:
    # lazy: docs/architecture.md#imports-kept-inside-functions
    from ..words.stops import keepalive_line

    m = _manager()
    try:
        granted = m.stats.keepalive(args.name, args.duration)
    finally:
        m.close()
    print(keepalive_line(granted["name"], granted, granted["asked_s"]))
    return 0


def cmd_gc(args: argparse.Namespace) -> int:
    # lazy: docs/architecture.md#imports-kept-inside-functions
    from ..words.stops import gc_line

    m = _manager()
    skipped: list[str] = []
    actions = m.gc(
        dry_run=args.dry_run, orphans=args.orphans, skipped=skipped, volumes=args.volumes
    )
    for action in actions:
        print(gc_line(action))
    if not actions:
        print("nothing to clean up")
    for line in skipped:
        print(line)
    _report_orphaned_workspaces(m)
    return 0


def _report_orphaned_workspaces(m) -> None:
    """gc keeps every workspace: it says which no session uses any more."""
    # lazy: docs/architecture.md#imports-kept-inside-functions
    from ..session.workspace_ops import list_all
    from ..words.workspaces import orphaned_line

    for view in list_all(m.store, m.backend):
        if view.orphaned:
            print(orphaned_line(view))


def cmd_workspaces(args: argparse.Namespace) -> int:
    """List the workspaces, or delete one (only with --yes)."""
    # lazy: docs/architecture.md#imports-kept-inside-functions
    from ..session.workspace_ops import list_all, remove
    from ..words.common import size_text
    from ..words.workspaces import host_failed_line, workspace_table

    m = _manager()
    if args.action == "rm":
        if not args.yes:
            raise GpuSessionError(
                f"deleting workspace {args.name} deletes its files and saved variables; "
                f"add --yes to do it: `gpusession workspaces rm {args.name} --yes`"
            )
        ws = remove(m.store, m.backend, args.name, args.backend)
        print(f"deleted workspace {ws.name} ({ws.where}, {size_text(ws.size_bytes)})")
        return 0
    skipped: list[str] = []
    failed: list[dict] = []  # hosts that did not answer this time: said once, then remembered
    views = list_all(m.store, m.backend, skipped, failed=failed, retry_hosts=args.retry_hosts)
    print(workspace_table(views))
    for line in skipped:
        print(f"skipped {line}")
    for item in failed:
        print(host_failed_line(item))
    return 0


def cmd_upload(args: argparse.Namespace) -> int:
    return transfer_commands.cmd_upload(args, _manager())


def cmd_download(args: argparse.Namespace) -> int:
    return transfer_commands.cmd_download(args, _manager())


def cmd_kernelspec(args: argparse.Namespace) -> int:
    """GPU kernelspecs for JupyterLab's launcher (gpusession/provisioner, docs/kernels.md)."""
    # lazy: docs/architecture.md#imports-kept-inside-functions
    from ..provisioner import kernelspecs

    if args.action == "install":
        values = options.given_values(args)
        if "type" not in values:
            # lazy: docs/architecture.md#imports-kept-inside-functions
            from ..configuration.config import GpuSessionConfig

            values["type"] = GpuSessionConfig().default_type
        prefix = args.prefix or (sys.prefix if args.sys_prefix else None)
        try:
            spec = kernelspecs.install(values, name=args.kernel_name, prefix=prefix)
        except OSError as exc:  # a folder we may not write
            raise GpuSessionError(f"cannot install the kernelspec: {exc}") from None
        print(f"installed kernelspec {spec.name} ({spec.display_name}) in {spec.resource_dir}")
        return 0
    if args.action == "remove":
        try:
            spec = kernelspecs.remove(args.kernel_name)
        except OSError as exc:
            raise GpuSessionError(f"cannot remove the kernelspec: {exc}") from None
        print(f"removed kernelspec {spec.name} ({spec.display_name})")
        return 0
    specs = kernelspecs.installed()
    if not specs:
        print(
            "no gpusession kernelspecs installed (`gpusession kernelspec install --type t4` adds one)"
        )
    for spec in specs:
        given = " ".join(
            f"--{k.replace('_', '-')}" + ("" if v is True else f" {v}")
            for k, v in spec.options.items()
        )
        print(f"{spec.name}  {spec.display_name}  [{given}]  {spec.resource_dir}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    # lazy: docs/architecture.md#imports-kept-inside-functions
    from .demo import run_demo

    return run_demo(notebook=args.notebook, backend=args.backend, out=args.out)


def cmd_setup(args: argparse.Namespace) -> int:
    """Look for where GPUs are, say it in one table, and write the chosen place as the default."""
    # lazy: docs/architecture.md#imports-kept-inside-functions
    from ..session.discovery import chosen_place, discover, make_default
    from ..words.setup import LOOKING, chosen_line, places_table, setup_summary

    print(LOOKING)
    places = discover()
    print(places_table(places))
    if args.choose is None:
        print(setup_summary(places))
        return 0
    place = chosen_place(places, args.choose)
    if not args.yes:
        answer = input(f"make {place.backend} ({place.where}) your default? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            print("nothing written")
            return 1
    print(chosen_line(place, str(make_default(place))))
    return 0


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "setup": cmd_setup,
    "list": cmd_list,
    "types": cmd_types,
    "stop": cmd_stop,
    "start": cmd_start,
    "switch": cmd_switch,
    "status": cmd_status,
    "gc": cmd_gc,
    "workspaces": cmd_workspaces,
    "stats": cmd_stats,
    "keepalive": cmd_keepalive,
    "catalog": cmd_catalog,
    "advice": cmd_advice,
    "report": cmd_report,
    "demo": cmd_demo,
    "kernelspec": cmd_kernelspec,
    "upload": cmd_upload,
    "download": cmd_download,
}


class _Parser(argparse.ArgumentParser):
    """A command line it cannot read is one line too ('gpusession start: argument --idle: ...'),
    exit 2 as for any argparse usage error, without the usage block."""

    def error(self, message: str):  # type: ignore[override]
        # lazy: docs/architecture.md#imports-kept-inside-functions
        from ..words.stops import usage_error

        self.exit(2, f"{self.prog}: {usage_error(message)}\n")

    def add_start_options(self, skip: tuple[str, ...] = (), lazy: bool = False) -> None:
        """Every start option, from the one table (gpusession/configuration/options.py); `lazy`: added when this
        command is parsed or its help shown: the table gathers every backend's options, which
        imports every backend, and `gpusession list` must not pay for that."""
        self._later = (
            *getattr(self, "_later", ()),
            (skip, len(self._actions), len(self._optionals._group_actions)),
        )
        if not lazy:
            self._add_later()

    def _add_later(self) -> None:
        for skip, at, at_in_group in getattr(self, "_later", ()):
            before, in_group = len(self._actions), len(self._optionals._group_actions)
            add_start_options(self, skip=skip)
            # where they were asked for, so --help lists them as if added then
            for actions, start, end in (
                (self._actions, at, before),
                (self._optionals._group_actions, at_in_group, in_group),
            ):
                added = actions[end:]
                del actions[end:]
                actions[start:start] = added
        self._later = ()

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]
        self._add_later()
        return super().parse_known_args(args, namespace)

    def format_help(self) -> str:
        self._add_later()
        return super().format_help()

    def format_usage(self) -> str:
        self._add_later()
        return super().format_usage()


def build_parser(lazy: bool = False) -> argparse.ArgumentParser:
    """`lazy`: add the start options to `start` and `kernelspec install` only when one of them is
    parsed (what `main` does: the table imports every backend); else at once."""
    p = _Parser(prog="gpusession", description="GPU sessions for notebooks")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser(
        "setup",
        help="find where GPUs are (this machine, Docker engines, SSH hosts, AWS, Slurm, "
        "kubeconfig) and make one the default",
    )
    s.add_argument("--choose", type=int, metavar="N", help="make place N of the table the default")
    s.add_argument("--yes", action="store_true", help="do not ask before writing the choice")
    _add_listings(sub)
    _add_lifecycle(sub, lazy)
    _add_session_views(sub)
    _add_cleanup(sub)
    _add_kernelspec(sub, lazy)
    transfer_commands.add_commands(sub)  # upload, download (gpusession/faces/transfer_commands.py)
    s = sub.add_parser("demo", help="run notebooks/quickstart.ipynb headless and show what it did")
    s.add_argument("--notebook", default=None, help="another notebook to run")
    s.add_argument("--backend", default="local", help="backend for the demo (default: local)")
    s.add_argument("--out", default=None, help="save the executed notebook here")
    return p


def _add_listings(sub) -> None:
    """list, types, catalog: what sessions there are, and the GPU types with their prices."""
    s = sub.add_parser("list", help="list active sessions")
    s.add_argument(
        "--all",
        action="store_true",
        help="include every stopped and failed session (without it: the active ones, and the interrupted ones whose state was saved)",
    )
    s = sub.add_parser("types", help="GPU types and prices")
    s.add_argument(
        "--live",
        action="store_true",
        help="the current spot price per zone from the cloud (cached 5 minutes), beside the catalog's",
    )
    s = sub.add_parser("catalog", help="the GPU catalog's prices: refresh them from the cloud")
    s.add_subparsers(dest="action").add_parser(
        "refresh",
        help="on-demand prices from the AWS Price List API (needs AWS credentials), written as "
        "your dated snapshot (catalog.json in the data folder) that every face then uses",
    )


def _add_lifecycle(sub, lazy: bool) -> None:
    """stop, start, switch: a session's life."""
    s = sub.add_parser("stop", help="stop a session")
    s.add_argument("name", nargs="?")
    s.add_argument("--all", action="store_true", help="stop every active session")
    s.add_argument(
        "--save", action="store_true", help="save the kernel's variables into its workspace first"
    )
    s = sub.add_parser(
        "start", help="start a session (it keeps running after this command returns)"
    )
    s.add_start_options(
        lazy=lazy
    )  # every start option, from the one table (gpusession/configuration/options.py)
    s = sub.add_parser(
        "switch",
        help="move a running session to other capacity, keeping its variables and files",
    )
    s.add_argument("session", metavar="NAME", help="the running session to move")
    s.add_argument("--on-demand", action="store_true", help=options.ON_DEMAND_HELP)
    s.add_start_options(skip=options.SWITCH_SKIP, lazy=lazy)  # the new session's: --type, --host...


def _add_session_views(sub) -> None:
    """status, stats, advice, report, keepalive: what one session (or all of them) did and
    costs, and its idle stop postponed."""
    s = sub.add_parser("status", help="one session's state, cost and timeline")
    s.add_argument("name")
    s = sub.add_parser(
        "stats", help="a running session's latest GPU sample, idle countdown and cost"
    )
    s.add_argument("name")
    s = sub.add_parser(
        "advice", help="right-sizing: the GPU type a session's memory and utilization called for"
    )
    s.add_argument("name")
    s = sub.add_parser("report", help="spend from the session store: cost, GPU-hours, idle cost")
    add_report_arguments(s)  # the same options as `%gpu report`
    s = sub.add_parser("keepalive", help="postpone a session's idle stop")
    s.add_argument("name")
    s.add_argument(
        "duration",
        nargs="?",
        default="1h",
        help="e.g. 30m, 1h; a bare number means minutes (default 1h; at most 4h ahead)",
    )


def _add_cleanup(sub) -> None:
    """workspaces, gc: what outlives sessions, and what crashed processes left."""
    s = sub.add_parser(
        "workspaces", help="the workspaces that outlive sessions: list them, or delete one"
    )
    s.add_argument(
        "--retry-hosts",
        action="store_true",
        help="ask again the hosts a listing could not reach before (they are remembered and "
        "skipped, so that no listing waits on them twice)",
    )
    ws = s.add_subparsers(dest="action")
    k = ws.add_parser("rm", help="delete a workspace, its files and its saved variables")
    k.add_argument("name")
    k.add_argument(
        "--yes", action="store_true", help="yes, delete it (nothing is deleted without it)"
    )
    k.add_argument(
        "--backend",
        default=None,
        help="the backend whose workspace it is, when several have one of that name",
    )
    s = sub.add_parser("gc", help="find and stop what crashed processes left behind")
    s.add_argument("--dry-run", action="store_true", help="only say what would be done")
    s.add_argument(
        "--orphans",
        action="store_true",
        help="also stop running sessions whose notebook process is gone",
    )
    s.add_argument(
        "--volumes",
        action="store_true",
        help="also remove the runtime volumes of other gpusession builds "
        "that no container uses (Docker engines)",
    )


def _add_kernelspec(sub, lazy: bool) -> None:
    """kernelspec install|remove|list: GPU kernels for JupyterLab's launcher."""
    s = sub.add_parser(
        "kernelspec", help="install, list or remove GPU kernels for JupyterLab's launcher"
    )
    ks = s.add_subparsers(dest="action", required=True)
    k = ks.add_parser(
        "install", help="a kernelspec whose kernels are sessions, e.g. 'Python 3 (GPU · T4)'"
    )
    k.add_start_options(
        skip=("name",), lazy=lazy
    )  # the start options the session gets (the one table)
    k.add_argument(
        "--name",
        dest="kernel_name",
        default=None,
        help="the kernelspec's name (default: from type, backend and image, e.g. gpusession-t4)",
    )
    where = k.add_mutually_exclusive_group()
    where.add_argument("--user", action="store_true", help="for this user (the default)")
    where.add_argument(
        "--sys-prefix", action="store_true", help="in this Python environment (sys.prefix)"
    )
    where.add_argument(
        "--prefix", default=None, help="under this prefix (PREFIX/share/jupyter/kernels)"
    )
    k = ks.add_parser("remove", help="remove a GPU kernelspec")
    k.add_argument("kernel_name", metavar="NAME")
    ks.add_parser("list", help="the GPU kernelspecs Jupyter finds")


def main(argv: list[str] | None = None) -> int:
    args = build_parser(lazy=True).parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except GpuSessionError as exc:
        # lazy: docs/architecture.md#imports-kept-inside-functions
        from ..words.stops import error_text

        print(f"gpusession {args.command}: {error_text(exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"gpusession {args.command}: interrupted", file=sys.stderr)
        return 130
    except (
        BrokenPipeError
    ):  # `gpusession list | head`: the reader left; no traceback (Python docs recipe)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
