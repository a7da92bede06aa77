"""The Spend view in a real JupyterLab and Debian's headless Chromium (Playwright), against a
session store seeded with sessions of several states (stopped, failed, interrupted by the cloud,
never ran, a Slurm job), GPU types, backends, days and workspaces, and a monthly budget: opened
from the command palette and from the sidebar, it agrees to the cent with `gpusession report`
run on the same store (each workspace row, the totals, each day's bar and each GPU type's part
of the bars, the price sources and the budget line), readable in light and dark themes. Then a
real session runs while the month's spend passes 80% of the budget: its card says so,
JupyterLab notifies once, and the session keeps running.

Screenshots: test-artifacts/spend-light.png, spend-dark.png, spend-budget-warning.png
(failed-spend.png when it fails);
the server log: browser-spend-jupyterlab.log.
"""

from __future__ import annotations

import os
import time
from typing import Iterator

import pytest

from support.lab import playwright_or_skip
from support.labpanel import (
    ARTIFACTS,
    CONTRAST_JS,
    PANEL,
    TIMEOUT_MS,
    Lab,
    open_lab,
    open_sidebar,
    run_command,
    running_lab,
    screenshot_on_failure,
    set_theme,
)

pytestmark = pytest.mark.browser

# the browser fixtures, for this module only (see tests/test_browser_panel.py)
from support import browser_fixtures as _shared  # noqa: E402

browser, page = _shared.browser, _shared.page
jp_asyncio_loop, jp_server_cleanup = _shared.jp_asyncio_loop, _shared.jp_server_cleanup
sync_api = playwright_or_skip()

from test_cli import cli  # noqa: E402
from test_spend import SPOT_STOP, _session, idle_a100_summary  # noqa: E402

from gpusession.configuration.cost import BILLED_FROM  # noqa: E402
from gpusession.core.durations import format_money  # noqa: E402
from gpusession.core.models import State  # noqa: E402

H, D = 3600.0, 86400.0
BUDGET = "60"
VIEW = "#gpusession-spend"
# the text whose contrast is measured: one of each kind (each costs the browser round trips)
READ = (
    "th, tr[data-key='ws-a'] td, .gpusession-spend-total-row td, .gpusession-spend-total span, "
    ".gpusession-spend-prices, .gpusession-spend-budget, .gpusession-spend-span, "
    ".gpusession-spend-legend-item, .gpusession-spend-day:not(:empty)"
)


@pytest.fixture(scope="module")
def lab(tmp_path_factory) -> Iterator[Lab]:
    env = {"GPUSESSION_BACKEND": "local", "GPUSESSION_MONTHLY_BUDGET": BUDGET}
    with running_lab(tmp_path_factory, "browser-spend-jupyterlab.log", env=env) as found:
        yield found


def seed(store, at: float) -> None:
    """Ended sessions only, so the figures stand still between the view and the CLI."""
    idle_a100, spot = idle_a100_summary(), SPOT_STOP
    _session(
        store,
        "t4-done",
        "t4",
        at,
        price=0.526,
        billed=(5 * H, 4 * H),
        workspace="ws-a",
        agent_summary={"mean_gpu_utilization": 40.0, "idle_minutes": 30.0},
    )
    _session(
        store,
        "a100-idle",
        "a100",
        at - 2 * D,
        backend="docker",
        price=2.745,
        billed=(2 * H, 0.0),
        agent_summary=idle_a100,
        workspace="ws-b",
    )
    _session(
        store,
        "t4-failed",
        "t4",
        at,
        backend="docker",
        price=0.526,
        billed=(3 * H, 3 * H - 120),
        end=State.FAILED,
        workspace="ws-b",
    )
    _session(
        store,
        "t4-spot",
        "t4",
        at - D,
        backend="aws",
        price=0.1579,
        billed=(10 * H, 9 * H),
        spot=True,
        market="spot",
        zone="us-east-1a",
        stop_reason=spot,
    )
    never = _session(store, "never", "t4", at, price=0.526, billed=None)
    store.transition(never.id, State.FAILED, "failed", error="image not found", at=at - H)
    _session(
        store,
        "slurm-ran",
        "t4",
        at,
        backend="slurm",
        price=1.0,
        billed=(3 * H, H),
        workspace="ws-a",
        **{BILLED_FROM: at - 2 * H},
    )
    _session(
        store,
        "l4-week",
        "l4",
        at - 5 * D,
        price=0.8048,
        billed=(3 * H, 0.0),
        workspace="ws-a",
        agent_summary={"mean_gpu_utilization": 85.0, "idle_minutes": 0},
    )
    _session(store, "v100-week", "v100", at - 5 * D, backend="docker", price=3.06, billed=(H, 0.0))
    _session(
        store, "a100-days", "a100", at - 12 * D, price=2.745, billed=(4 * H, H), workspace="ws-c"
    )
    _session(store, "t4-old", "t4", at - 40 * D, price=0.526, billed=(2 * H, H))  # fmt: skip


def low_contrast_text(page, minimum: float = 4.5) -> list[dict]:
    """The view's text (READ) with less contrast than `minimum`, measured in one call into the
    page, all of it counted (support.labpanel.low_contrast returns only the low ones)."""
    deadline = time.monotonic() + TIMEOUT_MS / 1000
    while True:  # a theme change redraws the view: measured once it is whole again
        measured = (
            page.locator(VIEW)
            .locator(READ)
            .evaluate_all(
                "els => els.filter(e => e.offsetParent !== null && (e.innerText || '').trim())"
                f".map({CONTRAST_JS.strip()})"
            )
        )
        if len(measured) > 30 or time.monotonic() > deadline:
            break
        page.wait_for_timeout(100)
    assert len(measured) > 30  # every kind of text was measured
    return [m for m in measured if m["ratio"] < minimum]


def printed(env, by: str, since: str = "30d") -> tuple[dict[str, list[str]], list[str]]:
    """`gpusession report --by BY --since SINCE`: its rows (key -> the other cells, the total's
    key "total") and all its lines."""
    r = cli(env, "report", "--by", by, "--since", since)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    rows = {}
    for line in lines[2:]:
        cells = line.split()
        if len(cells) == 7 and not set(line.strip()) <= {"-"}:
            rows[cells[0]] = cells[1:]
    return rows, lines


def test_spend_view_agrees_with_the_report_to_the_cent(lab, page):
    """Then a running session past 80% of the budget (one page: JupyterLab loads once)."""
    seed(lab.manager.store, time.time())
    env = dict(
        os.environ,
        GPUSESSION_HOME=str(lab.manager.config.data_path),
        GPUSESSION_BACKEND="local",
        GPUSESSION_MONTHLY_BUDGET=BUDGET,
    )
    by_workspace, lines = printed(env, "workspace")
    by_day, _ = printed(env, "day")
    by_type, _ = printed(env, "type")
    assert set(by_workspace) == {"ws-a", "ws-b", "ws-c", "-", "total"}, lines
    assert len(by_day) >= 4 and set(by_type) == {"t4", "a100", "l4", "v100", "total"}
    prices = next(line.strip() for line in lines if line.strip().startswith("prices: "))
    budget = next(line.strip() for line in lines if line.strip().startswith("this month: "))
    this_month, _ = printed(env, "workspace", "month")

    with screenshot_on_failure(page, "spend", lab):
        page.set_viewport_size({"width": 1400, "height": 1100})
        open_lab(page, lab, "spend")
        # the sidebar: the month's spend against the budget, as the CLI says it
        open_sidebar(page)
        panel = page.locator(PANEL)
        sync_api.expect(panel.locator(".gpusession-budget-line")).to_have_text(budget)
        # from the command palette (its shortcut needs the focus in the page's main area)
        page.locator(".jp-Launcher-content h2").first.click()
        run_command(page, "Open GPU Spend")
        view = page.locator(VIEW)
        table = view.locator(".gpusession-spend-table")
        # it opens on this calendar month, the budget's period: the header's figure, the CLI's
        sync_api.expect(view.locator(".gpusession-spend-period")).to_have_value("month")
        sync_api.expect(
            view.locator('[data-total="cost"] .gpusession-spend-total-value')
        ).to_have_text(this_month["total"][2], timeout=TIMEOUT_MS)
        assert f"{this_month['total'][2]} of the" in budget, (budget, this_month["total"])
        # the last 30 days, to compare every row with the CLI's default report
        view.locator(".gpusession-spend-period").select_option("30d")
        sync_api.expect(view.locator('tr[data-key="ws-c"]')).to_have_count(1, timeout=TIMEOUT_MS)
        sync_api.expect(table.locator("tr.gpusession-spend-total-row")).to_have_count(
            1, timeout=TIMEOUT_MS
        )
        # each workspace row and the total: the same cells as the CLI's, to the cent
        shown = {}
        for row in table.locator("tr[data-key]").all():
            cells = row.locator("td").all_inner_texts()
            shown["total" if "total-row" in row.get_attribute("class") else cells[0]] = cells[1:7]
        assert shown == by_workspace
        assert table.locator('tr[data-key="ws-a"] td').last.inner_text() == (
            "2 catalog rate, 1 configured price"
        )
        # the totals, the price sources and the budget, in the same words
        total = by_workspace["total"]
        totals = {
            key: view.locator(f'[data-total="{key}"] .gpusession-spend-total-value').inner_text()
            for key in ("cost", "gpu-hours", "idle-cost", "could-save", "sessions")
        }
        assert totals == {
            "cost": total[2],
            "gpu-hours": total[1],
            "idle-cost": total[4],
            "could-save": total[5],
            "sessions": total[0],
        }
        sync_api.expect(view.locator(".gpusession-spend-prices")).to_have_text(prices)
        sync_api.expect(view.locator(".gpusession-spend-budget")).to_have_text(budget)
        # a bar per day of the period, each day's cost as the CLI's by-day row ...
        bars = view.locator(".gpusession-spend-bar")
        assert bars.count() in (30, 31)
        costs = {day: float(bar["cost"]) for bar in bars.evaluate_all(
            "bars => bars.map(b => ({day: b.dataset.day, cost: b.dataset.cost}))"
        ) for day in [bar["day"]] if float(bar["cost"]) > 0}  # fmt: skip
        assert {day: format_money(c) for day, c in costs.items()} == {
            day: row[2] for day, row in by_day.items() if day != "total"
        }
        # ... stacked by GPU type: each type's parts add up to the CLI's by-type row
        parts = view.locator(".gpusession-spend-segment").evaluate_all(
            "s => s.map(e => [e.dataset.type, Number(e.dataset.cost), e.offsetHeight])"
        )
        per_type: dict[str, float] = {}
        for gpu, cost, height in parts:
            per_type[gpu] = per_type.get(gpu, 0.0) + cost
            assert height > 0 or cost < 0.01
        assert {k: format_money(v) for k, v in per_type.items()} == {
            k: row[2] for k, row in by_type.items() if k != "total"
        }
        legend = view.locator(".gpusession-spend-legend-item").all_inner_texts()
        assert sorted(legend) == sorted(k for k in by_type if k != "total")

        assert not low_contrast_text(page), "light"
        view.screenshot(path=str(ARTIFACTS / "spend-light.png"))
        set_theme(page, dark=True)
        assert not low_contrast_text(page), "dark"
        view.screenshot(path=str(ARTIFACTS / "spend-dark.png"))
        set_theme(page, dark=False)

        # from the sidebar's Spend button
        page.locator('.lm-TabBar-tab[data-id="gpusession-spend"] .lm-TabBar-tabCloseIcon').click()
        sync_api.expect(view).to_have_count(0)
        panel.locator(".gpusession-open-spend").click()
        sync_api.expect(
            view.locator('[data-total="cost"] .gpusession-spend-total-value')
        ).to_have_text(total[2], timeout=TIMEOUT_MS)  # the period the user chose is kept
        # another period: the view asks again (7 days: the 12-day-old session drops out)
        view.locator(".gpusession-spend-period").select_option("7d")
        sync_api.expect(view.locator('tr[data-key="ws-c"]')).to_have_count(0)
        assert view.locator(".gpusession-spend-bar").count() in (7, 8)

        # the month's spend passes 80% of the budget while a session runs: its card says so
        # and JupyterLab notifies once; the session keeps running
        manager = lab.manager
        manager.config.monthly_budget = float(BUDGET)  # as the server reads it from its env
        session = manager.start(manager.make_spec("t4", backend="local", idle="10m", name="b-live"))
        spent = manager.spend.budget()["spent"]
        at = time.time()  # other spend of this month: a minute at 60x its price brings it to 90%
        _session(manager.store, "b-other", "a100", at, price=(0.9 * 60 - spent) * 60,
                 billed=(70.0, 10.0))  # fmt: skip
        card = panel.locator('.gpusession-card[data-session-name="b-live"]')
        warning = card.locator(".gpusession-idle-warning")
        sync_api.expect(warning).to_contain_text(
            "of the $60.00 monthly budget: this session keeps running; at 100% new starts are "
            "refused",
            timeout=TIMEOUT_MS,
        )
        toast = page.locator(".Toastify__toast", has_text="GPU session b-live: this month's GPU")
        sync_api.expect(toast).to_have_count(1)
        page.wait_for_timeout(4000)  # more polls (every 2 s): still one notification
        sync_api.expect(toast).to_have_count(1)
        assert manager.refresh_state(session.id).state == State.RUNNING
        panel.screenshot(path=str(ARTIFACTS / "spend-budget-warning.png"))
        assert not page.errors, page.errors
    manager.stop(session.id)
