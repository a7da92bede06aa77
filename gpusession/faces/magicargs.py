"""The argument parsers of the `%gpu` subcommands (the start options come from the one table,
gpusession/configuration/options.py) and `%gpu help`'s text."""

from __future__ import annotations

from IPython.core.magic_arguments import argument, magic_arguments

from ..configuration import options
from ..configuration.cost import add_report_arguments


@magic_arguments()
def _start_args(line: str) -> None:
    """%gpu start [options]"""


options.add_arguments(_start_args.parser)  # every start option, from the one table
_start_args.__doc__ = _start_args.parser.format_help()


@magic_arguments()
@argument("--on-demand", action="store_true", default=None, help=options.ON_DEMAND_HELP)
def _switch_args(line: str) -> None:
    """%gpu switch [options]: the current session's options with these over them"""


options.add_arguments(
    _switch_args.parser, skip=options.SWITCH_SKIP
)  # the new session's own name: --name
_switch_args.__doc__ = _switch_args.parser.format_help()


@magic_arguments()
@argument("name", nargs="?", default=None, help="session name (default: the current session)")
@argument("--all", action="store_true", help="stop every active session")
@argument(
    "--save",
    action="store_true",
    help="save the kernel's variables into the session's workspace first "
    "(within its save time bound); `%%gpu start --resume WORKSPACE` brings them back",
)
def _stop_args(line: str) -> None:
    """%gpu stop [NAME | --all] [--save]"""


def _seconds(text: str, low: float, high: float) -> float:
    """A number of seconds from `low` to `high` (argparse type): never nan or inf."""
    import argparse
    import math

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a number of seconds, got {text[:40]!r}"
        ) from None
    if not (math.isfinite(value) and low <= value <= high):
        raise argparse.ArgumentTypeError(f"expected {low:g} to {high:g} seconds, got {text[:40]!r}")
    return value


@magic_arguments()
@argument("name", help="session name")
def _use_args(line: str) -> None:
    """%gpu use NAME"""


@magic_arguments()
@argument(
    "duration",
    nargs="?",
    default=None,
    help="stop watching after this long: 90s, 5m, 1h; a bare number "
    "means minutes (default: until interrupted)",
)
@argument(
    "--interval",
    type=lambda text: _seconds(text, 0.2, 3600),
    default=1.0,
    help="seconds between updates, 0.2 to 3600 (default 1)",
)
def _watch_args(line: str) -> None:
    """%gpu watch [DURATION]"""


@magic_arguments()
@argument(
    "duration",
    nargs="?",
    default="1h",
    help="postpone the idle stop by this long: 30m, 1h, 2h (default 1h; at most 4h)",
)
def _keepalive_args(line: str) -> None:
    """%gpu keepalive [DURATION]"""


@magic_arguments()
@argument("name", nargs="?", default=None, help="session name (default: the current session)")
def _advice_args(line: str) -> None:
    """%gpu advice [NAME]: the GPU type this session's memory and utilization called for"""


@magic_arguments()
@argument(
    "--live",
    action="store_true",
    help="the current spot price per zone from the cloud (cached 5 minutes), beside the catalog's",
)
def _types_args(line: str) -> None:
    """%gpu types [--live]: GPU types and prices"""


@magic_arguments()
@argument("--choose", type=int, metavar="N", help="make place N of the table your default")
def _setup_args(line: str) -> None:
    """%gpu setup [--choose N]: find where GPUs are and make one the default"""


@magic_arguments()
def _report_args(line: str) -> None:
    """%gpu report [--since 30d] [--by type|backend|day|workspace]: spend from the session store"""


add_report_arguments(_report_args.parser)  # the same options as `gpusession report`


PARSERS = {
    "start": _start_args,
    "switch": _switch_args,
    "stop": _stop_args,
    "use": _use_args,
    "watch": _watch_args,
    "keepalive": _keepalive_args,
    "advice": _advice_args,
    "report": _report_args,
    "types": _types_args,
    "setup": _setup_args,
}
for (
    _sub,
    _func,
) in PARSERS.items():  # usage reads `%gpu start ...` (IPython adds the %), not the function's name
    _func.parser.prog = f"gpu {_sub}"


HELP = """%gpu SUBCOMMAND ...
  start [--type T4] [--backend local|docker|aws] [--idle 15m] [--max-cost 5] [--name N] ...
  setup [--choose N]      find where GPUs are (this machine, engines, SSH hosts, clouds) and pick the default
  stop [NAME | --all]     status     list     types [--live]
  switch [--type A100] [--backend B] [--host H] [--image I] [--spot | --on-demand] ...
                          move to other capacity keeping variables and files (saved, restored)
  on | off                run every following cell in the session (or stop doing so)
  push NAME...            send local variables to the session;  pull NAME...: fetch them back
  upload PATH... [--to DIR]    files or folders into the session's working directory
  download PATH... [--to DIR]  files or folders from the session's working directory to here
  use NAME                work with another running session (e.g. one started from the panel)
  watch [DURATION]        live GPU, CPU, cost and idle countdown (Ctrl-C or the stop button ends it)
  keepalive [1h]          postpone the idle stop (at most 4h ahead)
  advice [NAME]           right-sizing: peak memory, utilization, the type that would have fitted
  report [--since 30d] [--by type|backend|day|workspace]   spend, GPU-hours, idle cost, budget
  panel [NAME | --all]    the session card with live gauges, start/stop buttons (ipywidgets)
  %%gpu                   (cell magic) run this cell in the session
  debug [on | off]        errors show gpusession's own frames too (off: the remote traceback only)
`%gpu start?` style help: `%gpu help start`."""
