"""A real JupyterLab server for browser tests, and the Chromium settings that work here.

    from support.lab import start_lab, stop_lab, lab_url, chromium_launch_kwargs

    url, token, proc = start_lab(tmp_path, env={"GPUSESSION_HOME": str(home)})
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(**chromium_launch_kwargs())
            page = browser.new_page()
            page.goto(lab_url(url, token))
            ...
    finally:
        stop_lab(proc)

The server runs `python -m jupyterlab` of the running interpreter, so it sees the same
installed packages (and labextensions) as the tests. Its output goes to a log file whose
tail is put into the error when it fails to come up.
"""

from __future__ import annotations

import http.client
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import NamedTuple

from . import browser_net
from .ports import free_port

#: Where Debian's chromium lives; GPUSESSION_CHROMIUM overrides it.
DEFAULT_CHROMIUM = "/usr/bin/chromium"

#: Flags Chromium needs here: root, no GPU, no /dev/shm to speak of, no network.
CHROMIUM_ARGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
)


class LabServer(NamedTuple):
    """A started server; unpacks as ``url, token, process``."""

    url: str  #: base URL with a trailing slash, e.g. "http://127.0.0.1:8123/"
    token: str  #: the auth token (also accepted as ``?token=`` in URLs)
    process: subprocess.Popen  #: the server process; stop it with stop_lab()


def start_lab(
    root_dir: str | os.PathLike[str],
    *,
    port: int | None = None,
    token: str | None = None,
    env: Mapping[str, str] | None = None,
    extra_args: Iterable[str] = (),
    timeout: float = 60.0,
    log_path: str | os.PathLike[str] | None = None,
) -> LabServer:
    """Start ``jupyter lab`` serving ``root_dir`` and wait until its API answers.

    root_dir: the notebook directory (``--ServerApp.root_dir``); created if missing.
    port: the port to listen on (127.0.0.1); default: a free one.
    token: the auth token; default: a random one.
    env: variables set on top of this process's environment (which passes through).
    extra_args: more command line arguments, e.g. ``["--ServerApp.jpserver_extensions=my_ext=True"]``.
    timeout: seconds to wait for ``/api/status`` to answer 200 before giving up.
    log_path: where the server's stdout and stderr go; default: a temporary file, named in
        errors and kept (as ``process.log_path``) for a test to read.

    Raises RuntimeError, with the end of the server log, when the server exits or does
    not answer in time (the process is stopped first).

    A free port is free only until someone binds it: another worker's kernel took the one
    free_port() gave before the server (seconds of imports later) could (a loaded CI run: the
    wait read a ZMQ greeting). Such a start is made again on another free port, twice at most;
    a port the caller chose is not changed.
    """
    for attempt in range(3):
        try:
            return _start_lab_on(
                root_dir, port or free_port(), token, env, extra_args, timeout, log_path
            )
        except _PortTaken:
            if port is not None or attempt == 2:
                raise
    raise AssertionError("unreachable")


class _PortTaken(RuntimeError):
    """The server's port was bound by another process before the server could bind it."""


def _start_lab_on(root_dir, port, token, env, extra_args, timeout, log_path) -> LabServer:
    root = Path(root_dir)
    root.mkdir(parents=True, exist_ok=True)
    token = token or secrets.token_hex(16)
    if log_path is None:
        fd, log_name = tempfile.mkstemp(prefix="jupyterlab-", suffix=".log")
        os.close(fd)
        log_path = log_name
    log_path = Path(log_path)
    state_dir = Path(tempfile.mkdtemp(prefix="jupyterlab-state-"))
    settings_dir = state_dir / "user-settings"
    _write_quiet_settings(settings_dir)

    args = [
        sys.executable,
        "-m",
        "jupyterlab",
        "--no-browser",
        "--allow-root",
        "--ServerApp.ip=127.0.0.1",
        f"--ServerApp.port={port}",
        "--ServerApp.port_retries=0",
        f"--ServerApp.root_dir={root}",
        f"--IdentityProvider.token={token}",
        # Fresh layout and settings per server, no news toast, no calls to the internet.
        f"--LabApp.workspaces_dir={state_dir / 'workspaces'}",
        f"--LabApp.user_settings_dir={settings_dir}",
        "--LabApp.news_url=None",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        *extra_args,
    ]
    full_env = {**os.environ, **(env or {})}
    with log_path.open("wb") as log:
        process = subprocess.Popen(  # noqa: S603 - our own interpreter, our own arguments
            args,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=full_env,
            cwd=str(root),
            start_new_session=True,
        )
    process.log_path = log_path  # type: ignore[attr-defined]
    process.state_dir = state_dir  # type: ignore[attr-defined]
    url = f"http://127.0.0.1:{port}/"
    process.port = port  # type: ignore[attr-defined]
    try:
        _wait_until_up(process, url, token, timeout)
        browser_net.relay(port)  # the browser's own network reaches it (support/browser_net.py)
    except BaseException:
        stop_lab(process)
        raise
    return LabServer(url, token, process)


def lab_url(url: str, token: str, path: str = "lab") -> str:
    """The browser address of ``path`` on the server, logged in by token."""
    return f"{url}{path.lstrip('/')}?token={token}"


def stop_lab(process: subprocess.Popen, timeout: float = 10.0) -> None:
    """Stop the server (SIGTERM to its process group, SIGKILL if it lingers) and remove
    its workspace and settings folder. The log stays."""
    port = getattr(process, "port", None)
    if port is not None:
        browser_net.unrelay(port)
    try:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout)
    except ProcessLookupError:
        pass
    state_dir = getattr(process, "state_dir", None)
    if state_dir is not None:
        shutil.rmtree(state_dir, ignore_errors=True)


def log_tail(process: subprocess.Popen, chars: int = 4000) -> str:
    """The end of the server's log, for failure messages."""
    path = getattr(process, "log_path", None)
    if path is None or not Path(path).exists():
        return ""
    return Path(path).read_text(errors="replace")[-chars:]


def chromium_launch_kwargs(headless: bool = True) -> dict:
    """Keyword arguments for playwright's ``chromium.launch()`` with Debian's chromium.

    Never run ``playwright install`` here: it downloads browsers and fails offline.
    """
    args = [a for a in CHROMIUM_ARGS if headless or a != "--headless"]
    # in a network namespace of its own where this process can make one: this machine's
    # address changes fail the requests a page is making (support/browser_net.py)
    executable = browser_net.wrapper(chromium_executable())
    return {"executable_path": executable, "headless": headless, "args": args}


def chromium_executable() -> str:
    """Debian's chromium (GPUSESSION_CHROMIUM, else /usr/bin/chromium, else on PATH)."""
    executable = os.environ.get("GPUSESSION_CHROMIUM") or DEFAULT_CHROMIUM
    if not Path(executable).exists():
        executable = shutil.which("chromium") or shutil.which("chromium-browser") or executable
    return executable


def _write_quiet_settings(settings_dir: Path) -> None:
    """User settings that keep the "get Jupyter news?" toast from covering the page."""
    path = settings_dir / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('{"fetchNews": "false", "checkForUpdates": false}\n')


def _wait_until_up(process: subprocess.Popen, url: str, token: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    status_url = f"{url}api/status"
    request = urllib.request.Request(status_url, headers={"Authorization": f"token {token}"})
    last_error = "no answer yet"
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = log_tail(process)
            error = _PortTaken if "is not available" in tail else RuntimeError
            raise error(
                f"jupyter lab exited with code {process.returncode} before answering "
                f"at {url}; log {getattr(process, 'log_path', '?')}:\n{tail}"
            )
        try:
            with urllib.request.urlopen(request, timeout=2) as reply:  # noqa: S310 - http on localhost
                if reply.status == 200:
                    return
                last_error = f"HTTP {reply.status}"
        except urllib.error.HTTPError as error:
            last_error = f"HTTP {error.code}"
        except OSError as error:  # refused while starting, or a timeout
            last_error = str(error)
        except http.client.HTTPException as error:  # not HTTP: another process's socket
            raise _PortTaken(f"{url} answers, but not as HTTP ({error!r})") from None
        time.sleep(0.2)
    raise RuntimeError(
        f"jupyter lab did not answer at {status_url} within {timeout:.0f} s ({last_error}); "
        f"log {getattr(process, 'log_path', '?')}:\n{log_tail(process)}"
    )


def playwright_or_skip():
    """playwright.sync_api, or skip the calling module saying what is missing."""
    import pytest

    chromium = chromium_executable()
    if not Path(chromium).exists():
        pytest.skip(
            f"no Chromium at {chromium} (apt-get install chromium; or set GPUSESSION_CHROMIUM)",
            allow_module_level=True,
        )
    return pytest.importorskip(
        "playwright.sync_api", reason="playwright is not installed (pip install -e '.[test]')"
    )
