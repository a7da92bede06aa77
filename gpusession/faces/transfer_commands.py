"""Data between here and a session, on the notebook and command-line faces: `%gpu push|pull NAME...`,
`%gpu upload|download PATH... [--to DIR]`, `gpusession upload|download NAME PATH... [--to DIR]`,
each with a progress bar (bytes, rate, ETA) once a transfer is over a megabyte. The bytes move as
binary frames on the session kernel's own connection
(gpusession/transport/kernel/transfer_client.py)."""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time
from typing import IO, Any

from ..core.errors import BadInput

BAR_FROM = 1_000_000  # bytes: smaller transfers print only their result


class Bar:
    """progress(done, total) for a transfer: the bar redrawn in place (`\\r`; Jupyter and a
    terminal both draw it so), or, to a file or pipe, a line a second."""

    def __init__(self, verb: str, stream: IO[str] | None = None, *, overwrite: bool | None = None):
        self.verb = verb
        self.stream = stream or sys.stdout
        self.overwrite = overwrite if overwrite is not None else _inline(self.stream)
        self.started = time.monotonic()
        self.shown_at = 0.0
        self.shown = False
        self.last: tuple[int, int | None] = (0, None)

    def __call__(self, done: int, total: int | None) -> None:
        self.last = (done, total)
        if total is not None and total < BAR_FROM:
            return
        now = time.monotonic()
        if now - self.shown_at < (0.1 if self.overwrite else 1.0) and done != total:
            return
        self.shown_at = now
        self._show(done, total)

    def _show(self, done: int, total: int | None) -> None:
        # lazy: docs/architecture.md#imports-kept-inside-functions
        from ..words.workspaces import transfer_line

        line = transfer_line(self.verb, done, total, time.monotonic() - self.started)
        self.stream.write(("\r" + line) if self.overwrite else line + "\n")
        self.stream.flush()
        self.shown = True

    def close(self) -> None:
        done, total = self.last
        if self.shown and (total is None or done < total):
            self._show(done, total)  # the final state, once
        if self.shown and self.overwrite:
            self.stream.write("\n")
            self.stream.flush()


def _inline(stream: IO[str]) -> bool:
    isatty = getattr(stream, "isatty", None)
    return "ipykernel" in type(stream).__module__ or bool(isatty and isatty())


# -- %gpu ---------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def _parsers() -> dict:
    """The subcommands' parsers (IPython's magic_arguments, made on first use: the CLI never
    imports IPython)."""
    from IPython.core.magic_arguments import argument, magic_arguments

    @magic_arguments()
    @argument("names", nargs="+", help="variable names")
    def _vars_args(line: str) -> None:
        """%gpu push|pull NAME..."""

    @magic_arguments()
    @argument(
        "paths",
        nargs="+",
        help="files or folders here (a folder goes without .git and what its .gitignore ignores)",
    )
    @argument(
        "--to",
        default=".",
        help="folder in the session, relative to its working directory (default: that directory)",
    )
    @argument("--all", action="store_true", help="send a folder whole: .git and ignored files too")
    def _upload_args(line: str) -> None:
        """%gpu upload PATH... [--to DIR]"""

    @magic_arguments()
    @argument(
        "paths",
        nargs="+",
        help="files or folders in the session, relative to its working directory",
    )
    @argument("--to", default=".", help="folder here (default: this notebook's folder)")
    def _download_args(line: str) -> None:
        """%gpu download PATH... [--to DIR]"""

    for func, name in (
        (_vars_args, "push|pull"),
        (_upload_args, "upload"),
        (_download_args, "download"),
    ):
        func.parser.prog = f"gpu {name}"  # `%gpu help upload` reads `%gpu upload [--to TO] ...`
    return {
        "push": _vars_args,
        "pull": _vars_args,
        "upload": _upload_args,
        "download": _download_args,
    }


def register(magics) -> None:
    """Add push, pull, upload and download to a GpuMagics."""
    from IPython.core.error import UsageError

    # lazy: docs/architecture.md#imports-kept-inside-functions
    from ..words.workspaces import transfer_done

    def push(rest: str) -> None:
        args = magics._parse(_parsers()["push"], rest)
        session = magics._session()
        ns = magics.shell.user_ns
        missing = [n for n in args.names if n not in ns]
        if missing:
            raise UsageError(f"not defined here: {', '.join(missing)}")
        _with_bar("push", lambda bar: session.push({n: ns[n] for n in args.names}, bar))
        print(f"pushed {', '.join(args.names)} to {session.name}")

    def pull(rest: str) -> None:
        args = magics._parse(_parsers()["push"], rest)
        session = magics._session()
        values = _with_bar("pull", lambda bar: session.pull(args.names, bar))
        magics.shell.user_ns.update(values)
        print(f"pulled {', '.join(args.names)} from {session.name}")

    def upload(rest: str) -> None:
        args = magics._parse(_parsers()["upload"], rest)
        session = magics._session()
        done = _with_bar(
            "upload", lambda bar: session.upload(args.paths, args.to, bar, everything=args.all)
        )
        print(
            transfer_done(
                "uploaded", ", ".join(args.paths), done, f"to {done['dest']} in {session.name}"
            )
        )

    def download(rest: str) -> None:
        args = magics._parse(_parsers()["download"], rest)
        session = magics._session()
        done = _with_bar("download", lambda bar: session.download(args.paths, args.to, bar))
        print(
            transfer_done(
                "downloaded", ", ".join(args.paths), done, f"from {session.name} to {done['dest']}"
            )
        )

    for name, handler in (
        ("push", push),
        ("pull", pull),
        ("upload", upload),
        ("download", download),
    ):
        magics.add_subcommand(name, handler)


def help_parser(sub: str):
    """The parser behind `%gpu help SUB` for the subcommands of this module, or None."""
    return _parsers().get(sub)


def _with_bar(verb: str, run, stream: IO[str] | None = None) -> Any:
    bar = Bar(verb, stream)
    try:
        return run(bar)
    finally:
        bar.close()


# -- gpusession upload|download ---------------------------------------------------------------


def add_commands(sub) -> None:
    s = sub.add_parser(
        "upload", help="copy files or folders from here into a session's working directory"
    )
    s.add_argument("name", help="the session")
    s.add_argument(
        "paths",
        nargs="+",
        metavar="PATH",
        help="files or folders here (a folder goes without .git and what its .gitignore ignores)",
    )
    s.add_argument(
        "--to", default=".", help="folder in the session, relative to its working directory"
    )
    s.add_argument(
        "--all", action="store_true", help="send a folder whole: .git and ignored files too"
    )
    s = sub.add_parser(
        "download", help="copy files or folders from a session's working directory to here"
    )
    s.add_argument("name", help="the session")
    s.add_argument(
        "paths",
        nargs="+",
        metavar="PATH",
        help="files or folders in the session, relative to its working directory",
    )
    s.add_argument("--to", default=".", help="folder here (default: the current directory)")


def cmd_upload(args: argparse.Namespace, manager) -> int:
    # lazy: docs/architecture.md#imports-kept-inside-functions
    from ..words.workspaces import transfer_done

    missing = [p for p in args.paths if not os.path.exists(p)]
    if missing:  # said before connecting to the session
        raise BadInput(f"no such file or folder here: {', '.join(repr(p) for p in missing)}")
    session = manager.attach(args.name)
    try:
        done = _with_bar(
            "upload",
            lambda bar: session.upload(args.paths, args.to, bar, everything=args.all),
            sys.stderr,
        )
    finally:
        session.close_connections()
    print(
        transfer_done(
            "uploaded", ", ".join(args.paths), done, f"to {done['dest']} in {session.name}"
        )
    )
    return 0


def cmd_download(args: argparse.Namespace, manager) -> int:
    # lazy: docs/architecture.md#imports-kept-inside-functions
    from ..words.workspaces import transfer_done

    if os.path.isfile(args.to):
        raise BadInput(f"--to {args.to!r} is a file here, not a folder")
    session = manager.attach(args.name)
    try:
        done = _with_bar(
            "download", lambda bar: session.download(args.paths, args.to, bar), sys.stderr
        )
    finally:
        session.close_connections()
    print(
        transfer_done(
            "downloaded", ", ".join(args.paths), done, f"from {session.name} to {done['dest']}"
        )
    )
    return 0
