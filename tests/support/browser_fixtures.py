"""Fixtures the browser tests share (a browser test module binds them: `browser, page = _shared.browser, _shared.page` and the
loop fixtures alike, from `support import browser_fixtures as _shared`; not `pytest_plugins`, which would turn
pytest-jupyter's loop off for every later test of the run): Debian's
headless Chromium through Playwright, a fresh page per test that records the page's uncaught
errors, and pytest-jupyter's loop fixtures turned off (no in-process server here).

A browser test module starts with `sync_api = playwright_or_skip()` (support.lab): the module is skipped, with
what to install, when Chromium or Playwright is missing."""

from __future__ import annotations

import pytest

from .lab import chromium_launch_kwargs
from .labpanel import TIMEOUT_MS


@pytest.fixture
def jp_asyncio_loop():
    """pytest-jupyter's autouse loop fixture would pick up and close Playwright's running loop;
    these tests run no in-process server, so neither it nor jp_server_cleanup has work here."""
    yield None


@pytest.fixture
def jp_server_cleanup():
    yield


@pytest.fixture(scope="module")
def browser():
    from playwright import sync_api

    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(**chromium_launch_kwargs())
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser):
    """A fresh page (1400 x 1000) that records the page's uncaught errors in `page.errors`."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    # an assertion waits as long as an action: its own default (5 s) was too short for a listing
    # that asks every backend at load 16 (a loaded run's failure)
    from playwright import sync_api  # as in `browser`: present once a browser test runs

    sync_api.expect.set_options(timeout=TIMEOUT_MS)
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.errors = errors
    yield page
    context.close()
