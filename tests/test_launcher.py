"""A GPU kernel from JupyterLab's launcher, in a real JupyterLab and Debian's headless Chromium
(Playwright): `gpusession kernelspec install --type t4` adds "Python 3 (GPU · T4)"; clicking it
starts a session (docker when this machine's engine runs, with the product image; else local),
and the notebook's cells run there. JupyterLab's own interrupt, restart and shut down work:
restart keeps the session, shut down stops it and removes its container.

The server's log, the notebook after the restart and a screenshot of a failure go to
test-artifacts/ (launcher-jupyterlab.log, launcher-notebook.png, failed-launcher.png); the
timings to test-artifacts/launcher-timings.json.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support.hosts import docker_available, product_image
from support.lab import chromium_launch_kwargs, lab_url, playwright_or_skip, start_lab, stop_lab
from support.labpanel import fresh_extension_env, set_theme

pytestmark = [pytest.mark.browser, pytest.mark.timeout(180)]

sync_api = playwright_or_skip()

from gpusession.configuration.config import GpuSessionConfig  # noqa: E402
from gpusession.core.models import State  # noqa: E402
from gpusession.session import SessionManager  # noqa: E402

ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"
CARD = "Python 3 (GPU · T4 · $0.5260/h · cloud rate, own hardware)"  # type, price as cards say it
TIMEOUT_MS = 30_000


@pytest.fixture
def jp_asyncio_loop():
    """pytest-jupyter's autouse loop fixture would close Playwright's loop; no server runs in
    this process (as in test_browser_panel.py)."""
    yield None


@pytest.fixture
def jp_server_cleanup():
    yield


def _backend() -> str:
    if not docker_available():
        return "local"
    import docker

    client = docker.from_env()
    try:
        client.images.get(product_image())
        return "docker"
    except docker.errors.ImageNotFound:
        return "local"
    finally:
        client.close()


def _kernel_status(page, text: str, timeout_ms: int = TIMEOUT_MS) -> None:
    """The status bar's 'Python 3 (GPU · T4) | Idle'."""
    page.locator(
        ".jp-StatusBar-TextItem", has_text=re.compile(re.escape(CARD) + r"\s*\|\s*" + text)
    ).wait_for(timeout=timeout_ms)


def _run_cell(page, code: str) -> None:
    """Type `code` into the last cell and run it (Shift+Enter adds a new cell below)."""
    editor = page.locator(".jp-Notebook .jp-Cell .cm-content").last
    editor.click()
    page.keyboard.type(code)
    page.keyboard.press("Shift+Enter")


def _output(page, index: int) -> str:
    """The text output of code cell `index` (0-based), once it has some."""
    out = page.locator(".jp-Notebook .jp-CodeCell").nth(index).locator(".jp-OutputArea-output")
    out.first.wait_for(timeout=TIMEOUT_MS)
    return out.first.inner_text()


def _click_dialog(page, label: str) -> None:
    page.locator(".jp-Dialog .jp-Dialog-button", has_text=label).click()


def test_a_gpu_kernel_from_the_launcher(tmp_path):
    backend = _backend()
    home, root, prefix = tmp_path / "gshome", tmp_path / "notebooks", tmp_path / "prefix"
    env_server = {
        "GPUSESSION_HOME": str(home),
        "GPUSESSION_BACKEND": backend,
        "GPUSESSION_IMAGE": product_image(),
        "GPUSESSION_PRICE_PER_HOUR": "0",
        # this checkout's built sidebar and status bar first, then the installed kernelspec
        "JUPYTER_PATH": os.pathsep.join(
            p
            for p in (
                fresh_extension_env(tmp_path).get("JUPYTER_PATH"),
                str(prefix / "share" / "jupyter"),
            )
            if p
        ),
    }
    installed = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpusession",
            "kernelspec",
            "install",
            "--type",
            "t4",
            "--idle",
            "10m",
            "--prefix",
            str(prefix),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        # the server's backend: a default nobody chose that cannot give a T4 is refused at install
        env=dict(os.environ, GPUSESSION_BACKEND=backend),
    )
    assert installed.returncode == 0, installed.stderr
    assert f"({CARD})" in installed.stdout
    ARTIFACTS.mkdir(exist_ok=True)
    timings: dict[str, float | str] = {"backend": backend}
    t0 = time.monotonic()
    url, token, process = start_lab(
        root, env=env_server, log_path=ARTIFACTS / "launcher-jupyterlab.log"
    )
    timings["lab_up_s"] = round(time.monotonic() - t0, 2)
    manager = SessionManager(GpuSessionConfig(data_dir=str(home)))
    try:
        with sync_api.sync_playwright() as playwright:
            browser = playwright.chromium.launch(**chromium_launch_kwargs())
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.set_default_timeout(TIMEOUT_MS)
            errors: list[str] = []
            page.on("pageerror", lambda error: errors.append(str(error)))
            try:
                _drive(page, url, token, manager, backend, timings)
            except BaseException:
                with contextlib.suppress(Exception):
                    page.screenshot(path=str(ARTIFACTS / "failed-launcher.png"))
                raise
            finally:
                browser.close()
            assert not errors, errors
    finally:
        for record in manager.list(active_only=True):
            with contextlib.suppress(Exception):
                manager.stop(record.id)
        stop_lab(process)
        (ARTIFACTS / "launcher-timings.json").write_text(json.dumps(timings, indent=1) + "\n")


def _drive(
    page, url: str, token: str, manager: SessionManager, backend: str, timings: dict
) -> None:
    page.goto(lab_url(url, token, "lab/workspaces/launcher"))
    card = page.locator('.jp-LauncherCard[data-category="Notebook"]', has_text=CARD)
    card.wait_for()
    # its own icon (a GPU chip), not Python's
    assert "logo-svg" in (card.locator("img").first.get_attribute("src") or "")
    card.screenshot(path=str(ARTIFACTS / "launcher-card.png"))
    t = time.monotonic()
    card.click()
    _kernel_status(
        page, "Idle", timeout_ms=120_000
    )  # the session is provisioned while it says Starting
    timings["card_click_to_idle_s"] = round(time.monotonic() - t, 2)
    [record] = manager.list()
    assert (record.state, record.backend, record.spec.gpu_type, record.spec.idle) == (
        State.RUNNING,
        backend,
        "t4",
        600.0,
    )

    # a cell runs in the session: its hostname is the container's
    _run_cell(page, "import socket; print(socket.gethostname())")
    hostname = _output(page, 0).strip()
    if backend == "docker":
        import docker

        client = docker.from_env()
        try:
            container = client.containers.get(record.resource["container_id"])
            assert hostname == container.attrs["Config"]["Hostname"]
        finally:
            client.close()

    # the status bar shows the notebook's session (it has no kernel_id: the provisioner knows it)
    status = page.locator('[data-testid="gpusession-status"]')
    sync_api.expect(status).to_have_text(
        re.compile(
            rf"^GPU\s*{re.escape(record.name)}: t4 × 1 · \$0\.\d{{4}} · stops in \d+m\d\ds$"
        ),
        timeout=TIMEOUT_MS,
    )
    for dark in (False, True):
        set_theme(page, dark=dark)
        page.locator(".jp-StatusBar-Widget").screenshot(
            path=str(ARTIFACTS / f"statusbar-gpu-kernel-{'dark' if dark else 'light'}.png")
        )
    set_theme(page, dark=False)

    # interrupt a sleeping cell with the toolbar's stop button
    _run_cell(page, "import time; time.sleep(60)")
    _kernel_status(page, "Busy")
    time.sleep(0.5)
    t = time.monotonic()
    page.locator(".jp-NotebookPanel-toolbar [data-command='notebook:interrupt-kernel']").click()
    assert "KeyboardInterrupt" in _output(page, 1)
    _kernel_status(page, "Idle")
    timings["interrupt_s"] = round(time.monotonic() - t, 2)

    # restart: a fresh kernel (the import is gone) in the same session
    t = time.monotonic()
    page.locator(".jp-NotebookPanel-toolbar [data-command='notebook:restart-kernel']").click()
    _click_dialog(page, "Restart")
    _kernel_status(page, "Idle", timeout_ms=60_000)
    _run_cell(page, "print('socket' in dir())")
    assert _output(page, 2).strip() == "False"
    timings["restart_s"] = round(time.monotonic() - t, 2)
    [after] = manager.list()
    assert (after.id, after.state) == (record.id, State.RUNNING)
    page.screenshot(path=str(ARTIFACTS / "launcher-notebook.png"))

    # shut down: the session stops, its container goes
    t = time.monotonic()
    page.locator("#jp-MainMenu .lm-MenuBar-itemLabel", has_text=re.compile(r"^Kernel$")).click()
    page.get_by_role("menuitem", name=re.compile(r"^Shut Down Kernel")).click()
    deadline = time.monotonic() + 30
    while manager.get(record.id).state != State.STOPPED and time.monotonic() < deadline:
        dialog = page.locator(".jp-Dialog .jp-Dialog-button", has_text="Shut Down")
        if dialog.count():  # JupyterLab versions that ask first
            dialog.click()
        time.sleep(0.2)
    ended = manager.get(record.id)
    timings["shutdown_s"] = round(time.monotonic() - t, 2)
    assert ended.state == State.STOPPED
    assert ended.resource["stop_reason"]["by"] == "JupyterLab kernel shutdown"
    if backend == "docker":
        import docker

        client = docker.from_env()
        try:
            assert (
                client.containers.list(
                    all=True, filters={"label": f"gpusession.session={record.id}"}
                )
                == []
            )
        finally:
            client.close()
    else:  # the local backend: its process is gone
        assert not manager.backend("local").is_alive(ended)
