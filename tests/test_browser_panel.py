"""The panels in a real browser: JupyterLab (started here, with the gpusession server extension
and the local backend) in Debian's headless Chromium through Playwright.

- the sidebar: start a session from its form, see the card run with live values, stop it from
  the button, see the card go (and the store say stopped)
- the sidebar with 20 real running sessions: time to open it, time for a click to take effect,
  long tasks on the page while it polls
- the ipywidgets panel (`%gpu panel`) in a notebook: it renders, updates live, its stop button
  works

Screenshots and timings are kept in test-artifacts/ at the repository root (gitignored):
sidebar-panel.png, sidebar-20-sessions.png, widget-panel.png (and -page.png, the whole
notebook), widget-gpu-gauges.png, browser-timings.json, and the server's log
browser-jupyterlab.log. A failing test leaves failed-<name>.png there too.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from typing import Iterator

import pytest

from support.lab import playwright_or_skip
from support.labpanel import (
    ARTIFACTS,
    DATA,
    PANEL,
    TIMEOUT_MS,
    Lab,
    open_lab,
    open_more,
    open_sidebar,
    put_notebook,
    run_all_cells,
    running_lab,
    screenshot_on_failure,
    stop_card,
    wait_for_change,
    wait_kernel_idle,
)

pytestmark = pytest.mark.browser

# the browser fixtures, for this module only (a pytest_plugins entry would turn pytest-jupyter's loop off for every
# later test of the run, and jp_fetch with it)
from support import browser_fixtures as _shared  # noqa: E402

browser, page = _shared.browser, _shared.page
jp_asyncio_loop, jp_server_cleanup = _shared.jp_asyncio_loop, _shared.jp_server_cleanup
sync_api = playwright_or_skip()

from gpusession.core.models import State  # noqa: E402
from support.hosts import docker_available, product_image  # noqa: E402
from support.labpanel import set_theme  # noqa: E402

MISSING_IMAGE = "gpusession/no-such-image:never"


@pytest.fixture(scope="module")
def lab(tmp_path_factory) -> Iterator[Lab]:
    """One JupyterLab for the module, its own session store, the local backend by default."""
    with running_lab(
        tmp_path_factory, "browser-jupyterlab.log", env={"GPUSESSION_BACKEND": "local"}
    ) as found:
        yield found


@pytest.fixture(scope="module")
def timings() -> Iterator[dict]:
    """Measured seconds, written to test-artifacts/browser-timings.json at the end."""
    found: dict = {}
    yield found
    (ARTIFACTS / "browser-timings.json").write_text(json.dumps(found, indent=1) + "\n")


# -- the sidebar -----------------------------------------------------------------------------


# What a card shows while it changes: its state, whether Keep alive is offered, its stage line.
WATCH_CARDS_JS = """() => {
    window.__cardSnapshots = [];
    const take = () => {
        for (const card of document.querySelectorAll('#gpusession-panel .gpusession-list .gpusession-card')) {
            const keep = card.querySelector('.gpusession-keepalive');
            const progress = card.querySelector('.gpusession-progress');
            window.__cardSnapshots.push({
                state: card.dataset.state,
                keepalive: !!keep && !keep.hidden && keep.offsetParent !== null,
                progress: progress && !progress.hidden ? progress.textContent : null,
            });
        }
    };
    new MutationObserver(take).observe(document.getElementById('gpusession-panel'),
        {subtree: true, childList: true, attributes: true, characterData: true});
}"""


def clipped(locator) -> bool:
    """Whether an element's text is cut off (wider than its box, or past its card's edge)."""
    return locator.evaluate("""el => {
        const card = el.closest('.gpusession-card') || el.parentElement;
        const box = el.getBoundingClientRect(), edge = card.getBoundingClientRect();
        return el.scrollWidth > el.clientWidth + 1 || box.right > edge.right + 0.5 || box.left < edge.left - 0.5;
    }""")


def test_sidebar_start_live_values_and_stop(lab, page):
    """The form starts from the served defaults; the card follows the start's stages (no Keep
    alive before it runs), then runs with live values that fit the default sidebar width; Stop
    moves it to the history, saying who stopped it."""
    with screenshot_on_failure(page, "sidebar", lab):
        open_lab(page, lab, "sidebar")
        open_sidebar(page)
        panel = page.locator(PANEL)
        empty = panel.locator(".gpusession-empty")
        empty.wait_for(state="visible")
        # while there is none, two lines say what a session is, and point to setup
        assert empty.locator("p").count() == 2
        sync_api.expect(empty).to_contain_text("A session is a Python kernel on a GPU machine")
        sync_api.expect(empty).to_contain_text("`gpusession setup`")
        # the form is built from GET options: the server's defaults (GPUSESSION_BACKEND=local)
        panel.locator(".gpusession-type-select option[value='t4']").wait_for(state="attached")
        sync_api.expect(panel.locator(".gpusession-backend-select")).to_have_value("local")
        idle = panel.locator(".gpusession-idle-input")
        sync_api.expect(idle).to_have_value("30m")
        # a first start's fields at once, the rest under "More"
        assert not idle.is_visible()
        open_more(panel)
        sync_api.expect(idle).to_be_visible()
        assert not panel.locator(".gpusession-host-input").is_visible()  # docker only
        panel.locator(".gpusession-backend-select").select_option("docker")
        panel.locator(".gpusession-host-input").wait_for(state="visible")
        # each field says what it takes: its help under it, the served placeholder in it
        host = panel.locator(".gpusession-host-input")
        assert host.get_attribute("placeholder") == "default this machine"
        assert not clipped(host), "its placeholder fits the sidebar"
        sync_api.expect(
            panel.locator('.gpusession-field[data-option="host"] .gpusession-field-help')
        ).to_contain_text("docker: a remote engine, ssh://user@host[:port]")
        assert idle.get_attribute("placeholder") == "default 30m"
        sync_api.expect(
            panel.locator('.gpusession-field[data-option="type"] .gpusession-field-help')
        ).not_to_contain_text("GpuSessionConfig")
        if docker_available():
            check_image_field_and_a_failed_start(page, panel)
        panel.locator(".gpusession-type-select").select_option("t4")
        panel.locator(".gpusession-backend-select").select_option("local")
        # the server checks values as they are typed, by the same rules as %gpu start
        idle.fill("soon")
        idle_error = panel.locator('.gpusession-field-error[data-option="idle"]')
        sync_api.expect(idle_error).to_contain_text("bad idle timeout 'soon'")
        # Start with that field folded away under "More": the field is shown and focused
        panel.locator(".gpusession-more-summary").click()
        sync_api.expect(idle).to_be_hidden()
        panel.locator(".gpusession-start-button").click()
        sync_api.expect(idle).to_be_visible()
        sync_api.expect(idle).to_be_focused()
        idle.fill("off")  # the notebook's "never"
        sync_api.expect(idle_error).to_be_hidden()
        idle.fill("1h")  # a countdown as wide as it gets ("59m55s"), and Keep alive applies
        sync_api.expect(idle_error).to_be_hidden()
        panel.locator(".gpusession-name-input").fill("from-sidebar")
        page.evaluate(WATCH_CARDS_JS)
        panel.locator(".gpusession-start-button").click()

        card = panel.locator('.gpusession-card[data-session-name="from-sidebar"]')
        card.wait_for()
        sync_api.expect(card).to_have_attribute("data-state", "running", timeout=TIMEOUT_MS)
        snapshots = page.evaluate("() => window.__cardSnapshots")
        before = [s for s in snapshots if s["state"] != "running"]
        assert before, snapshots  # the card was there before it ran
        assert not [s for s in before if s["keepalive"]], before  # nothing to keep alive yet
        stages = [s["progress"] for s in before if s["progress"]]
        assert stages and all(re.search(r"\(\d+\.\ds\)$", text) for text in stages), before
        assert any(
            re.match(r"(session from-sidebar|provision|connect|kernel)", text) for text in stages
        ), stages
        assert not card.locator(".gpusession-progress").is_visible()  # gone once it runs

        assert card.locator(".gpusession-kind").inner_text() == "t4 × 1 · local"
        assert (
            card.locator(".gpusession-price").inner_text() == "$0.5260/h"
        )  # as the notebook prints it
        # the catalog's cloud rate, applied to this machine: the card says so
        assert card.locator(".gpusession-price-note").inner_text() == "cloud rate, own hardware"
        assert re.fullmatch(r"\$0\.\d{4}", card.locator(".gpusession-cost").inner_text())
        # its first minute is billed in full: the card says so while it applies
        cost_note = card.locator(".gpusession-cost-note")
        sync_api.expect(cost_note).to_have_text(
            "the first minute is billed in full (60-second minimum)"
        )
        assert not clipped(cost_note)
        idle_value = card.locator(".gpusession-idle")
        sync_api.expect(idle_value).to_have_text(re.compile(r"^(59m\d\ds|1h00m)$"))
        sync_api.expect(card.locator(".gpusession-keepalive")).to_be_visible()
        # with no GPU, one quiet line per card: not a warning box repeating the NVML error
        no_gpu = card.locator(".gpusession-no-gpu")
        no_gpu.wait_for(state="visible")
        assert no_gpu.inner_text() == "no NVIDIA GPU visible"
        assert no_gpu.get_attribute("title")  # the driver's detail, on hover
        style = no_gpu.evaluate(
            "el => { const s = getComputedStyle(el); return [s.borderLeftWidth, s.backgroundColor]; }"
        )
        assert style == ["0px", "rgba(0, 0, 0, 0)"], style
        card.locator(
            ".gpusession-cpu .gpusession-chart-value"
        ).wait_for()  # the session's own CPU and memory

        uptime = card.locator(".gpusession-uptime")
        before_uptime, after = wait_for_change(uptime.inner_text)
        assert re.fullmatch(r"\d+s|\d+m\d\ds", after), after
        # nothing of the card's facts is cut off at the default sidebar width
        for fact in (
            idle_value,
            uptime,
            card.locator(".gpusession-price"),
            card.locator(".gpusession-cost"),
        ):
            assert not clipped(fact), fact.inner_text()

        record = lab.manager.get("from-sidebar")
        assert record.state == State.RUNNING and record.spec.idle == 3600
        panel.screenshot(path=str(ARTIFACTS / "sidebar-panel.png"))

        stop_card(page, card)
        sync_api.expect(card).to_have_count(0, timeout=TIMEOUT_MS)
        assert lab.manager.get(record.id).state == State.STOPPED
        panel.locator(".gpusession-empty").wait_for(state="visible")
        ended = panel.locator('.gpusession-history-item[data-session-name="from-sidebar"]')
        sync_api.expect(ended.locator(".gpusession-history-reason")).to_have_text(
            "stopped by the JupyterLab sidebar"
        )
        assert not page.errors, page.errors


def check_image_field_and_a_failed_start(page, panel) -> None:
    """The image field (docker chosen) offers the engine's images with their size, takes any
    reference and says a pull will happen; a start whose image cannot be had raises a
    notification whose "Show all" gives the whole message, and its history row says it never
    ran and cost $0. Screenshots in light and dark."""
    image = panel.locator(".gpusession-image-input")
    image.wait_for(state="visible")
    assert image.get_attribute("placeholder").startswith("default ")
    offered = panel.locator(f'#gpusession-images-list option[value="{product_image()}"]')
    offered.wait_for(state="attached")
    assert offered.get_attribute("label").startswith(f"{product_image()} · ")
    note = panel.locator('.gpusession-field-note[data-option="image"]')
    image.fill(product_image())
    sync_api.expect(note).to_have_text(
        re.compile(re.escape(product_image()) + r" · [\d.]+ [MG]B · ")
    )
    image.fill(MISSING_IMAGE)
    sync_api.expect(note).to_have_text(
        f"{MISSING_IMAGE}: not on the engine yet; the start pulls it first (that can take minutes)"
    )
    panel.locator(".gpusession-name-input").fill("no-image")
    panel.screenshot(path=str(ARTIFACTS / "start-form-image-light.png"))
    panel.locator(".gpusession-start-button").click()
    toast = page.locator(".Toastify__toast--error").filter(has_text="no-image did not start")
    sync_api.expect(toast).to_be_visible(timeout=TIMEOUT_MS)
    failed = panel.locator('.gpusession-history-item[data-session-name="no-image"]')
    sync_api.expect(failed.locator(".gpusession-kind")).to_have_text(  # after its date and time
        re.compile(
            rf"^\d{{4}}-\d\d-\d\d \d\d:\d\d · t4 × 1 · docker · {re.escape(MISSING_IMAGE)} · never ran"
        )
    )
    sync_api.expect(failed.locator(".gpusession-history-cost")).to_have_text("$0.0000")
    page.screenshot(path=str(ARTIFACTS / "failed-start-notification-light.png"))
    set_theme(page, True)  # (the palette is behind a dialog once one is open)
    toast.get_by_role("button", name="Show all").click()
    dialog = page.locator(".jp-Dialog")
    sync_api.expect(dialog).to_contain_text(
        f"pull or build it there (`docker pull {MISSING_IMAGE}`)"
    )
    sync_api.expect(dialog).to_contain_text("or pass another --image")
    page.screenshot(path=str(ARTIFACTS / "failed-start-notification-dark.png"))
    dialog.get_by_role("button").last.click()  # (the action dismissed the notification)
    sync_api.expect(dialog).to_have_count(0)
    panel.screenshot(path=str(ARTIFACTS / "start-form-image-dark.png"))
    set_theme(page, False)
    image.fill("")


def test_sidebar_with_twenty_sessions_stays_responsive(lab, page, timings):
    """20 real running sessions (a local kernel process each, ~27 MB): the list, the cards and
    the on-screen cards' stats polls are what a user with 20 sessions would have."""
    manager = lab.manager
    started = time.monotonic()
    sessions = [
        manager.start(manager.make_spec("t4", backend="local", idle="off", name=f"many-{i:02d}"))
        for i in range(20)
    ]
    timings["start_20_local_sessions_s"] = round(time.monotonic() - started, 2)
    try:
        with screenshot_on_failure(page, "twenty", lab):
            open_lab(page, lab, "twenty")
            page.evaluate("""() => {
                window.__longTasks = [];
                new PerformanceObserver(list => window.__longTasks.push(
                    ...list.getEntries().map(e => e.duration))).observe({type: 'longtask'});
            }""")
            clicked = time.monotonic()
            open_sidebar(page)
            cards = page.locator(f"{PANEL} .gpusession-card[data-state='running']")
            sync_api.expect(cards).to_have_count(20, timeout=TIMEOUT_MS)
            timings["open_sidebar_to_20_cards_s"] = round(time.monotonic() - clicked, 2)
            assert page.locator(f"{PANEL} .gpusession-count").inner_text().startswith("20")
            page.locator(f"{PANEL} .gpusession-card").first.locator(".gpusession-no-gpu").wait_for(
                state="visible"
            )

            # the last card: scrolled to, its stats arrive (only on-screen cards poll them)
            last = page.locator(f'{PANEL} .gpusession-card[data-session-name="many-00"]')
            last.scroll_into_view_if_needed()
            shown = time.monotonic()
            last.locator(".gpusession-no-gpu").wait_for(state="visible")
            timings["scrolled_card_stats_s"] = round(time.monotonic() - shown, 2)

            page.evaluate("() => { window.__longTasks = []; }")
            time.sleep(6)  # steady state: the list poll and the visible cards' stats polls
            long_tasks = page.evaluate("() => window.__longTasks")
            timings["long_tasks_in_6s_of_polling_ms"] = [round(t) for t in long_tasks]
            # the observer does see long tasks here (an empty list must mean there were none)
            page.evaluate(
                "() => new Promise(done => setTimeout(() => {"
                " const end = performance.now() + 150; while (performance.now() < end) {} ;"
                " setTimeout(done, 100); }, 0))"
            )
            assert any(t >= 150 for t in page.evaluate("() => window.__longTasks")), (
                "long-task observer blind"
            )

            # a click takes effect quickly: stop one session from its card
            clicked = time.monotonic()
            stop_card(page, last)
            sync_api.expect(last).to_have_count(0, timeout=TIMEOUT_MS)
            timings["stop_click_to_card_gone_s"] = round(time.monotonic() - clicked, 2)
            assert manager.get("many-00").state == State.STOPPED
            sync_api.expect(cards).to_have_count(19)
            page.locator(f"{PANEL} .gpusession-card").first.scroll_into_view_if_needed()
            page.locator(PANEL).screenshot(path=str(ARTIFACTS / "sidebar-20-sessions.png"))

            assert timings["open_sidebar_to_20_cards_s"] < 5, timings
            assert timings["stop_click_to_card_gone_s"] < 5, timings
            assert max(long_tasks, default=0) < 500, f"the page froze for {max(long_tasks):.0f} ms"
            assert not page.errors, page.errors
    finally:
        for session in sessions:
            with contextlib.suppress(Exception):
                manager.stop(session.id)


# -- the ipywidgets panel --------------------------------------------------------------------


# No GPU here: the GPU gauges are shown once more with two T4s' values recorded from a driver
# (tests/data), replayed by the agent's own Sampler, to see them render in the browser.
RECORDED_GPUS_CELL = f"""\
import time, ipywidgets
from gpusession.agent.nvml import NvmlReader, RecordedNvml
from gpusession.agent.sampler import Sampler
from gpusession.widgets import StatsView
sampler = Sampler(NvmlReader(RecordedNvml.from_file({str(DATA / "nvml_two_t4.json")!r})))
for busy in (False, True):
    sampler.sample(time.time(), kernel_busy=busy)
recorded = StatsView()
recorded.show({{"gpus_visible": True, "message": None, "samples": sampler.samples(), "source": sampler.nvml.source}})
recorded.widget.add_class("recorded-gpus")
ipywidgets.VBox([ipywidgets.HTML("<b>2 x Tesla T4</b> (tests/data/nvml_two_t4.json)"), recorded.widget])"""


def test_widget_panel_in_a_notebook(lab, page, timings):
    put_notebook(
        lab,
        "panel.ipynb",
        [
            "%load_ext gpusession",
            "%gpu start --backend local --idle off --name from-notebook",
            "%gpu panel",
            RECORDED_GPUS_CELL,
        ],
    )
    with screenshot_on_failure(page, "widget", lab):
        opened = time.monotonic()
        open_lab(page, lab, "widget", "tree/panel.ipynb")
        wait_kernel_idle(page)
        timings["notebook_open_to_kernel_idle_s"] = round(time.monotonic() - opened, 2)
        run_all_cells(page)

        ran = time.monotonic()
        card = page.locator(".gpusession-widget-card")
        card.wait_for(state="visible", timeout=60_000)
        page.locator(".gpusession-widget-card .widget-hprogress").first.wait_for(state="visible")
        timings["run_all_to_widget_card_s"] = round(time.monotonic() - ran, 2)
        assert card.count() == 1
        assert card.locator(".gpusession-widget-state").inner_text() == "running"
        # the sidebar's words (its kindText): "t4 × 1 · local"
        assert card.locator(".gpusession-widget-kind").inner_text() == "t4 × 1 · local"
        # the catalog's rate on this machine: said so (issue 21 item 6)
        assert (
            card.locator(".gpusession-widget-price").inner_text()
            == "$0.5260/h (cloud rate, own hardware)"
        )
        assert card.locator(".gpusession-widget-idle").inner_text() == "off"
        note = card.locator(".gpusession-widget-stats-note")
        sync_api.expect(note).to_contain_text("no NVIDIA GPU visible")
        progress = card.locator(".widget-hprogress")
        assert progress.count() == 2  # the session's CPU and memory (no GPU here)
        # updated from the kernel's background thread, with no cell running
        wait_for_change(card.locator(".gpusession-widget-uptime").inner_text)
        ram = card.locator(".gpusession-widget-gauge-value").nth(1).inner_text()
        assert re.fullmatch(r"(\d+ MiB|\d+\.\d)/\d+\.\d GiB", ram), ram
        # no label cut short ("Max cost ..."), on the card or in the form
        clipped = page.evaluate(
            """() => [...document.querySelectorAll('.jp-OutputArea-output .widget-label')]
              .filter(n => n.offsetParent !== null && n.scrollWidth > n.clientWidth + 1)
              .map(n => n.textContent)"""
        )
        assert not clipped, clipped
        page.locator(".jp-OutputArea-output", has=card).screenshot(
            path=str(ARTIFACTS / "widget-panel.png")
        )
        page.screenshot(path=str(ARTIFACTS / "widget-panel-page.png"))

        recorded = page.locator(".recorded-gpus")
        recorded.wait_for(state="visible")
        assert recorded.locator(".gpusession-widget-gpu").count() == 2
        assert (
            recorded.locator(".widget-hprogress").count() == 2 * 4 + 2
        )  # per GPU 4, then CPU and RAM
        values = (
            recorded.locator(".gpusession-widget-gpu")
            .first.locator(".gpusession-widget-gauge-value")
            .all_inner_texts()
        )
        assert values == ["97%", "10.2/15.0 GiB", "70 °C", "67/70 W"], values
        # labelled as the sidebar labels replayed values
        sync_api.expect(recorded.locator(".gpusession-widget-recorded")).to_have_text("recorded")
        page.locator(".jp-OutputArea-output", has=recorded).screenshot(
            path=str(ARTIFACTS / "widget-gpu-gauges.png")
        )

        record = lab.manager.get("from-notebook")
        assert record.state == State.RUNNING
        card.locator(".gpusession-widget-stop").click()
        sync_api.expect(card.locator(".gpusession-widget-state")).to_have_text(
            "stopped", timeout=TIMEOUT_MS
        )
        sync_api.expect(card.locator(".gpusession-widget-action-message")).to_contain_text(
            "stopped: ran "
        )
        # hidden by a later message of the same update than the state's text: waited for
        sync_api.expect(card.locator(".gpusession-widget-stop")).to_be_hidden()
        assert lab.manager.get(record.id).state == State.STOPPED
        assert not page.errors, page.errors
