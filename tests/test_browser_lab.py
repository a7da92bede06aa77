"""The JupyterLab face beyond the start form, in a real JupyterLab and Debian's headless Chromium
(through Playwright), against real local sessions:

- the history: a failed start and a watchdog stop stay in the sidebar with why and what they
  cost, and start again with the same options
- recorded GPU values (the agent's --nvml-replay, shown "recorded") draw the sidebar's charts
  and the main-area charts, which update; light and dark themes are readable (contrast measured)
- the idle warning (no `%gpu keepalive` hint next to the button), Keep alive, and a countdown
  that keeps counting when a reply has no fresh countdown
- the status-bar item of the notebook's session, the command-palette commands, and the
  notebook's next `%%gpu` after a Stop in the sidebar
- the form's defaults come from the Jupyter config (`--GpuSessionConfig.*`)
- a clean interrupt of a `%%gpu` cell (the remote traceback and one line, no frame of ours)
- Switch GPU… on a card: the dialog, a refusal's notification, the stages, the new card's line

Screenshots go to test-artifacts/: sidebar-light.png, sidebar-dark.png, charts-light.png,
charts-dark.png, history-light.png, idle-warning-dark.png, status-bar.png, interrupt-light.png,
interrupt-dark.png, switch-dialog-{light,dark}.png, switch-refused-dark.png,
switch-done-{light,dark}.png (and failed-<name>.png
when a test fails); the server log to browser-lab-jupyterlab.log.
"""

from __future__ import annotations

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
    answer_stop,
    broken_words,
    low_contrast,
    open_lab,
    open_sidebar,
    palette_labels,
    put_notebook,
    run_all_cells,
    run_command,
    running_lab,
    screenshot_on_failure,
    set_theme,
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

from gpusession.core.errors import GpuSessionError  # noqa: E402
from gpusession.core.models import State  # noqa: E402

CHARTS = "#gpusession-charts"
# records into window.__stagesSeen each stage line ("switch: ...") a switching card shows
STAGES_SEEN_JS = """() => {
  window.__stagesSeen = [];
  const look = () => document
    .querySelectorAll('.gpusession-card[data-switching="true"] .gpusession-progress')
    .forEach(n => {
      if (!n.hidden && /: /.test(n.textContent)) window.__stagesSeen.push(n.textContent);
    });
  new MutationObserver(look).observe(document.body, {
    subtree: true, childList: true, characterData: true, attributes: true
  });
}"""
# the scale labels of the large charts matching a selector that overlap their plot
OVER_PLOT_JS = """(selector) => [...document.querySelectorAll(selector)].filter(chart => {
    const top = chart.querySelector('.gpusession-bigchart-top').getBoundingClientRect();
    const plot = chart.querySelector('svg').getBoundingClientRect();
    return top.right > plot.left && top.left < plot.right && top.bottom > plot.top;
  }).map(chart => chart.dataset.metric)"""
# the texts of the elements matching a selector that do not show whole (cut, or past their box)
CLIPPED_JS = """(selector) => [...document.querySelectorAll(selector)]
  .filter(n => n.offsetParent !== null && (n.scrollWidth > n.clientWidth + 1 ||
    n.getBoundingClientRect().right > n.parentElement.getBoundingClientRect().right + 1))
  .map(n => n.textContent)"""
# Boxes that say something (notes, warnings, errors, badges): body text contrast, WCAG AA.
BOXES = (
    ".gpusession-idle-warning, .gpusession-api-error, .gpusession-error, .gpusession-action-error, "
    ".gpusession-stats-error, .gpusession-progress, .gpusession-recorded, .gpusession-history-reason, "
    ".gpusession-state, .gpusession-form-error, .gpusession-history-error, .gpusession-charts-note, "
    ".gpusession-switched"
)
# Everything else that is text, muted captions included: at least 3:1.
TEXT = (
    "span, label, summary, h2, h3, button, .gpusession-kind, .gpusession-no-gpu, .gpusession-catalog-note, "
    ".gpusession-field-help, .gpusession-field-note, .gpusession-price-note, "
    ".gpusession-type-price, .gpusession-empty"
)


def assert_readable(page, scope: str) -> None:
    boxes = low_contrast(page, scope, BOXES, 4.5)
    assert not boxes, boxes
    text = low_contrast(page, scope, TEXT, 3.0)
    assert not text, text


@pytest.fixture(scope="module")
def lab(tmp_path_factory) -> Iterator[Lab]:
    """One JupyterLab whose defaults come from its Jupyter config, not the environment."""
    with running_lab(
        tmp_path_factory,
        "browser-lab-jupyterlab.log",
        env={"GPUSESSION_BACKEND": ""},
        extra_args=(
            "--GpuSessionConfig.default_backend=local",
            "--GpuSessionConfig.default_idle=45m",
        ),
    ) as found:
        yield found


def seconds(text: str) -> int:
    """'1h05m', '3m09s', '42s' -> seconds (the panel's countdown)."""
    match = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?", text)
    assert match and text, text
    h, m, s = (int(g or 0) for g in match.groups())
    return h * 3600 + m * 60 + s


# -- history -----------------------------------------------------------------------------------


def test_history_keeps_failed_starts_and_watchdog_stops(lab, page):
    manager = lab.manager
    # a start that fails for real: the agent cannot read the NVML recording it is given
    broken = manager.create(
        manager.make_spec(
            "t4",
            backend="local",
            idle="10m",
            name="broken-start",
            # a long path in its stage line: at 250 px it wraps after a '/', never mid-word
            nvml_replay=str(
                lab.root
                / "recordings"
                / "gpu-node-17.cluster.example.org"
                / "no-such-recording.json"
            ),
        )
    )
    with pytest.raises(GpuSessionError):
        manager.launch(broken)
    assert manager.get(broken.id).state == State.FAILED
    # a session its own watchdog stops after 5 s idle
    idle = manager.start(manager.make_spec("t4", backend="local", idle="5s", name="idle-5s"))
    with screenshot_on_failure(page, "history", lab):
        open_lab(page, lab, "history")
        open_sidebar(page)
        panel = page.locator(PANEL)
        # the form's defaults are the Jupyter config's (no GPUSESSION_BACKEND in this server's env)
        sync_api.expect(panel.locator(".gpusession-backend-select")).to_have_value("local")
        sync_api.expect(panel.locator(".gpusession-idle-input")).to_have_value("45m")

        history = panel.locator(".gpusession-history")
        failed = history.locator('.gpusession-history-item[data-session-name="broken-start"]')
        sync_api.expect(failed).to_have_attribute("data-state", "failed")
        reason = failed.locator(".gpusession-history-reason")
        sync_api.expect(reason).to_contain_text(
            "failed: connect: kernel process exited during start"
        )
        sync_api.expect(reason).to_contain_text("cannot read the NVML recording")
        assert re.fullmatch(r"\$0\.\d{4}", failed.locator(".gpusession-history-cost").inner_text())

        stopped = history.locator('.gpusession-history-item[data-session-name="idle-5s"]')
        sync_api.expect(stopped).to_have_attribute("data-state", "stopped", timeout=TIMEOUT_MS)
        sync_api.expect(stopped.locator(".gpusession-history-reason")).to_have_text(
            "stopped by its idle watchdog after 5s idle"
        )
        assert re.fullmatch(r"\$0\.\d{4}", stopped.locator(".gpusession-history-cost").inner_text())
        assert manager.get(idle.id).state == State.STOPPED
        assert not panel.locator('.gpusession-list [data-session-name="idle-5s"]').count()
        # what the words quote as code shows as code, without its backticks
        saved = stopped.locator(".gpusession-history-saved")
        sync_api.expect(saved.locator("code")).to_have_text("%gpu start --resume idle-5s")
        assert "`" not in saved.inner_text(), saved.inner_text()
        # at the sidebar's 250 px, lines wrap between words (the failed start's stages too)
        assert not broken_words(page, PANEL, ".gpusession-history-item *"), broken_words(
            page, PANEL, ".gpusession-history-item *"
        )
        panel.screenshot(path=str(ARTIFACTS / "history-light.png"))

        # collapsible
        summary = history.locator(".gpusession-history-summary")
        sync_api.expect(summary).to_have_text(re.compile(r"^Ended sessions \(\d+\)$"))
        summary.click()
        sync_api.expect(failed).to_be_hidden()
        summary.click()
        sync_api.expect(failed).to_be_visible()

        # start again: the same kind of session (type, backend, idle) on the same workspace,
        # named after it (broken-start stays with the failed record: a name, one record)
        failed.locator(".gpusession-restart").click()
        again = panel.locator(".gpusession-list .gpusession-card")
        sync_api.expect(again).to_have_count(1)
        sync_api.expect(again).to_have_attribute("data-state", "running", timeout=TIMEOUT_MS)
        name = again.get_attribute("data-session-name")
        record = manager.get(name)
        assert (
            name == "broken-start-2"
            and record.spec.extra.get("workspace") == "broken-start"
            and record.spec.gpu_type == "t4"
            and record.spec.backend == "local"
        ), record.spec
        assert record.spec.idle == 600 and "nvml_replay" not in record.spec.extra
        stop_card(page, again)
        sync_api.expect(again).to_have_count(0, timeout=TIMEOUT_MS)
        assert not page.errors, page.errors


# -- recorded GPU values: charts, themes --------------------------------------------------------


def test_recorded_gpu_charts_draw_update_and_read_in_both_themes(lab, page):
    manager = lab.manager
    replay = manager.start(
        manager.make_spec(
            "t4:2",  # the recording's two T4s replay as this session's own (issue 32 §5)
            backend="local",
            idle="off",
            name="recorded-t4",
            nvml_replay=str(DATA / "nvml_two_t4.json"),
        )
    )
    plain = manager.start(manager.make_spec("t4", backend="local", idle="off", name="no-gpu"))
    elsewhere = manager.start(  # an a100 session replaying the T4s: one GPU, said as elsewhere
        manager.make_spec(
            "a100",
            backend="local",
            idle="off",
            name="recorded-a100",
            nvml_replay=str(DATA / "nvml_two_t4.json"),
        )
    )
    try:
        with screenshot_on_failure(page, "recorded", lab):
            page.set_viewport_size(
                {"width": 1400, "height": 1900}
            )  # the whole sidebar in its screenshots
            open_lab(page, lab, "recorded")
            open_sidebar(page)
            panel = page.locator(PANEL)
            card = panel.locator('.gpusession-card[data-session-name="recorded-t4"]')
            sync_api.expect(card).to_have_attribute("data-state", "running")
            badge = card.locator(".gpusession-recorded")
            sync_api.expect(badge).to_be_visible()
            assert badge.text_content() == "recorded" and "--nvml-replay" in badge.get_attribute(
                "title"
            )
            gpus = card.locator(".gpusession-gpu")
            sync_api.expect(gpus).to_have_count(2)
            assert gpus.first.locator(".gpusession-gpu-title").inner_text() == "GPU 0 · Tesla T4"
            # the charts draw, and move: the replay loops over the recording's frames
            util = gpus.first.locator(".gpusession-gpu-util")
            seen = set()
            deadline = time.monotonic() + 15
            while len(seen) < 2 and time.monotonic() < deadline:
                seen.add(util.get_attribute("data-value"))
                time.sleep(0.5)
            assert len(seen) >= 2, seen
            line = util.locator("polyline")
            first, later = wait_for_change(lambda: line.get_attribute("points"))
            assert len(later.split()) > 1
            # the other card: no GPU, said quietly; the recorded badge is only on the replay
            other = panel.locator('.gpusession-card[data-session-name="no-gpu"]')
            sync_api.expect(other.locator(".gpusession-no-gpu")).to_have_text(
                "no NVIDIA GPU visible"
            )
            assert not other.locator(".gpusession-recorded").is_visible()
            a100 = panel.locator('.gpusession-card[data-session-name="recorded-a100"]')
            sync_api.expect(a100.locator(".gpusession-gpu")).to_have_count(1)
            sync_api.expect(a100.locator(".gpusession-recorded")).to_have_text("recorded elsewhere")
            assert "recorded on another machine (2 x Tesla T4)" in a100.locator(
                ".gpusession-recorded"
            ).get_attribute("title")

            # at the sidebar's 250 px no caption is clipped ("RAM 79 MiB/23.5 GiB" whole)
            clipped = page.evaluate(CLIPPED_JS, f"{PANEL} .gpusession-chart-caption > span")
            assert not clipped, clipped
            assert_readable(page, PANEL)
            panel.screenshot(path=str(ARTIFACTS / "sidebar-light.png"))
            set_theme(page, dark=True)
            assert_readable(page, PANEL)
            panel.screenshot(path=str(ARTIFACTS / "sidebar-dark.png"))

            # the main-area charts of the same session: large, per GPU, and the session's CPU and memory
            page.set_viewport_size({"width": 1400, "height": 1250})
            card.locator(".gpusession-open-charts").click()
            charts = page.locator(CHARTS)
            charts.wait_for(state="visible")
            sync_api.expect(charts.locator(".gpusession-charts-session")).to_have_value(replay.id)
            sync_api.expect(charts.locator(".gpusession-charts-gpu")).to_have_count(2)
            sync_api.expect(charts.locator(".gpusession-recorded")).to_be_visible()
            for metric in ("util", "memory", "temp", "power"):
                sync_api.expect(
                    charts.locator(
                        f'.gpusession-charts-gpu[data-gpu-index="0"] '
                        f'.gpusession-bigchart[data-metric="{metric}"]'
                    )
                ).to_be_visible()
            for metric in ("cpu", "ram"):
                sync_api.expect(
                    charts.locator(
                        f'.gpusession-charts-host .gpusession-bigchart[data-metric="{metric}"]'
                    )
                ).to_be_visible()
            big = charts.locator('.gpusession-charts-gpu[data-gpu-index="0"] [data-metric="util"]')
            before, after = wait_for_change(lambda: big.get_attribute("data-points"))
            assert int(after) > int(before) >= 1
            # the chosen window, data or not: a session seconds old still draws its 15 minutes
            start = big.locator(".gpusession-bigchart-start")
            sync_api.expect(start).to_have_text("-15m")
            charts.locator(".gpusession-charts-window").select_option("300")
            sync_api.expect(start).to_have_text("-5m")
            # every scale label ("100%", "70 W", "15.0 GiB") beside its plot, never over the data
            over = page.evaluate(OVER_PLOT_JS, f"{CHARTS} .gpusession-bigchart")
            assert not over, over
            assert_readable(page, CHARTS)
            charts.screenshot(path=str(ARTIFACTS / "charts-dark.png"))
            set_theme(page, dark=False)
            assert_readable(page, CHARTS)
            charts.screenshot(path=str(ARTIFACTS / "charts-light.png"))

            # the session ends: the charts say so and keep what they drew
            manager.stop(replay.id)
            sync_api.expect(charts.locator(".gpusession-charts-note")).to_contain_text(
                "Session recorded-t4 is stopped", timeout=TIMEOUT_MS
            )
            assert int(big.get_attribute("data-points")) > 0
            assert not page.errors, page.errors
    finally:
        for session in (replay, plain, elsewhere):
            manager.stop(session.id)


# -- idle: warning, keep alive, countdown ------------------------------------------------------


def test_idle_warning_readable_and_keep_alive(lab, page):
    """A session 40 s from its idle stop warns (8 s ahead) in words without the notebook's
    `%gpu keepalive` hint, readable in the dark theme, next to the Keep alive button, which
    takes the warning away."""
    session = lab.manager.start(
        lab.manager.make_spec("t4", backend="local", idle="40s", name="idle-40s")
    )
    try:
        with screenshot_on_failure(page, "idle-warning", lab):
            open_lab(page, lab, "idle")
            open_sidebar(page)
            set_theme(page, dark=True)
            scope = f'{PANEL} .gpusession-card[data-session-name="idle-40s"]'
            card = page.locator(scope)
            warning = card.locator(".gpusession-idle-warning")
            sync_api.expect(warning).to_contain_text("the session stops in", timeout=45_000)
            text = warning.text_content()
            measured = low_contrast(page, scope, ".gpusession-idle-warning", 4.5)
            card.screenshot(path=str(ARTIFACTS / "idle-warning-dark.png"))
            card.locator(".gpusession-keepalive").click()
            assert text.startswith("idle for ") and "keepalive" not in text, text
            assert not measured, measured
            sync_api.expect(warning).to_be_hidden()
            sync_api.expect(card.locator(".gpusession-idle")).to_have_text(
                re.compile(r"^(59m\d\ds|1h00m)$")
            )
            assert lab.manager.get(session.id).state == State.RUNNING
            assert not page.errors, page.errors
    finally:
        lab.manager.stop(session.id)


def test_idle_countdown_keeps_counting_without_a_fresh_value(lab, page):
    """Every other list reply, and every stats reply, without the agent's countdown (what a
    server with stale stats answers): the card counts on from the last deadline it saw, never
    showing a dash or the whole timeout again."""
    session = lab.manager.start(
        lab.manager.make_spec("t4", backend="local", idle="30m", name="countdown")
    )
    replies = {"list": 0}

    def without_countdown(route):
        response = route.fetch()
        body = response.json()
        if "sessions" in body:
            replies["list"] += 1
            if replies["list"] % 2 == 0:
                for view in body["sessions"]:
                    view["idle"]["remaining_s"] = None
        else:
            body.pop("idle", None)
        route.fulfill(response=response, body=json.dumps(body))

    try:
        with screenshot_on_failure(page, "countdown", lab):
            page.route(
                re.compile(r".*/gpusession/api/sessions(\?.*|/[^/]+/stats\?.*)$"), without_countdown
            )
            open_lab(page, lab, "countdown")
            open_sidebar(page)
            idle = page.locator(
                f'{PANEL} .gpusession-card[data-session-name="countdown"] .gpusession-idle'
            )
            sync_api.expect(idle).to_have_text(re.compile(r"^29m\d\ds$"))
            shown = []
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                shown.append(idle.inner_text())
                time.sleep(0.2)
            assert replies["list"] >= 4, replies
            values = [seconds(text) for text in shown]  # '-' would fail here
            assert all(v < 1800 for v in values), shown  # never the whole timeout again
            assert all(b <= a for a, b in zip(values, values[1:])), shown  # only down
            assert values[0] - values[-1] >= 5, shown  # and it moves
    finally:
        # a reply the handler still holds would fail on the next test's page (disposed)
        page.unroute_all(behavior="ignoreErrors")
        lab.manager.stop(session.id)


# -- the notebook: status bar, commands, %%gpu after a sidebar stop --------------------------------


def test_status_bar_commands_and_the_next_cell_after_a_sidebar_stop(lab, page):
    put_notebook(
        lab,
        "status.ipynb",
        [
            "%load_ext gpusession",
            "%gpu start --backend local --idle 30m --name nb-session",
            "%%gpu\nprint('ran', 6 * 7)",
            "%%gpu\nimport time\n\ndef train():\n    for step in range(600):\n"
            "        time.sleep(0.1)\n\ntrain()",
        ],
    )
    with screenshot_on_failure(page, "status", lab):
        open_lab(page, lab, "status", "tree/status.ipynb")
        wait_kernel_idle(page)
        run_all_cells(page)
        sync_api.expect(page.locator(".jp-OutputArea-output", has_text="ran 42")).to_be_visible(
            timeout=60_000
        )

        # the stop button on a running %%gpu cell: the remote traceback (the user's own lines,
        # numbered as this notebook numbers them) and one line; no frame of gpusession's
        training = page.locator(".jp-Notebook .jp-Cell").nth(3)
        sync_api.expect(training.locator(".jp-InputPrompt")).to_have_text("[*]:")
        time.sleep(1.0)
        page.locator('.jp-NotebookPanel-toolbar [data-command="notebook:interrupt-kernel"]').click()
        error = training.locator(".jp-OutputArea-output")
        sync_api.expect(error).to_contain_text("KeyboardInterrupt", timeout=TIMEOUT_MS)
        text = error.inner_text()
        assert "Cell In[4], line 7" in text and "train()" in text, text
        assert "time.sleep(0.1)" in text, text
        assert text.rstrip().splitlines()[-1] == (
            "[gpusession] interrupted the cell in session nb-session; its variables are kept"
        ), text
        for ours in ("gpusession", "magics.py", "handle.py", "client.py", "cellwait.py"):
            assert ours not in text.replace("[gpusession]", ""), text
        sync_api.expect(training.locator(".jp-InputPrompt")).to_have_text("[4]:")
        training.screenshot(path=str(ARTIFACTS / "interrupt-light.png"))
        set_theme(page, dark=True)
        training.screenshot(path=str(ARTIFACTS / "interrupt-dark.png"))
        set_theme(page, dark=False)

        # the status bar: this notebook's session, its cost and idle countdown, live
        status = page.locator(".gpusession-status")
        status_text = status.locator(".gpusession-status-text")
        sync_api.expect(status_text).to_have_text(
            re.compile(r"^nb-session: t4 × 1 · \$0\.\d{4} · stops in 29m\d\ds$")
        )
        wait_for_change(status_text.inner_text, timeout=5)  # the countdown moves
        page.locator(".jp-StatusBar-Widget").screenshot(path=str(ARTIFACTS / "status-bar.png"))
        status.click()
        page.locator(PANEL).wait_for(state="visible")

        # the commands, in the palette
        labels = palette_labels(page, "GPU")
        for label in (
            "Show GPU Sessions",
            "Start a GPU Session…",
            "Stop a GPU Session…",
            "Open GPU Charts",
        ):
            assert label in labels, labels
        run_command(page, "Open GPU Charts")  # of the current notebook's session
        charts = page.locator(CHARTS)
        charts.wait_for(state="visible")
        nb_id = lab.manager.get("nb-session").id
        sync_api.expect(charts.locator(".gpusession-charts-session")).to_have_value(nb_id)
        sync_api.expect(charts.locator(".gpusession-charts-gpu-note")).to_contain_text(
            "no NVIDIA GPU visible"
        )
        sync_api.expect(
            charts.locator('.gpusession-charts-host [data-metric="cpu"]')
        ).to_be_visible()
        run_command(page, "Start a GPU Session…")
        page.wait_for_function("() => !!document.activeElement?.closest('.gpusession-start-form')")

        # the palette's Stop names this notebook's session first, though another is newer; its
        # Stop is the danger button
        other = lab.manager.start(
            lab.manager.make_spec("t4", backend="local", idle="off", name="other-one")
        )
        page.locator(f'{PANEL} .gpusession-card[data-session-name="other-one"]').wait_for()
        run_command(page, "Stop a GPU Session…")
        dialog = page.locator(".jp-Dialog", has_text="Stop a GPU session")
        pick = dialog.locator("select.gpusession-stop-pick")
        sync_api.expect(pick.locator("option")).to_have_count(2)
        assert pick.locator("option").first.inner_text().startswith("nb-session ")
        sync_api.expect(dialog.locator(".gpusession-stop-question")).to_contain_text(
            "Stop nb-session "
        )
        stop_button = dialog.locator(".jp-Dialog-button", has_text=re.compile("^Stop$"))
        assert "jp-mod-warn" in (stop_button.get_attribute("class") or "")
        dialog.locator(".jp-Dialog-content").screenshot(path=str(ARTIFACTS / "stop-palette.png"))
        dialog.locator(".jp-Dialog-button", has_text="Cancel").click()
        sync_api.expect(dialog).to_have_count(0)

        # Stop in the sidebar; the notebook's next %%gpu says who stopped it (no "kernel died")
        card = page.locator(f'{PANEL} .gpusession-card[data-session-name="nb-session"]')
        stop_card(page, card)
        sync_api.expect(card).to_have_count(0, timeout=TIMEOUT_MS)
        sync_api.expect(status).to_be_hidden()
        page.locator(
            ".lm-DockPanel-tabBar .lm-TabBar-tab", has_text="status.ipynb"
        ).click()  # back from the charts
        again = page.locator(".jp-Notebook .jp-Cell").nth(2)
        again.locator(".jp-InputArea-editor").click()
        page.keyboard.press("Shift+Enter")
        # one output when the cell finds the end itself; two when the notebook's notifier found it
        # first (it looks every 20 s): its line, then the cell's "it ended (said above)"; either
        # way the cell names the session still running and how to use it
        outputs = again.locator(".jp-OutputArea")
        sync_api.expect(outputs).to_contain_text(
            "active now: other-one (running): `%gpu use NAME`", timeout=60_000
        )
        text = outputs.inner_text()
        assert "session nb-session was stopped by the JupyterLab sidebar" in text, text
        assert "died" not in text, text
        record = lab.manager.get("nb-session")
        assert record.state == State.STOPPED and record.stop_reason.by == "the JupyterLab sidebar"

        # the stop command, with no notebook session: it names the one that is live
        run_command(page, "Stop a GPU Session…")
        sync_api.expect(dialog.locator(".gpusession-stop-question")).to_contain_text(
            "Stop other-one "
        )
        answer_stop(page, "Stop")
        sync_api.expect(
            page.locator(f'{PANEL} .gpusession-list [data-session-name="other-one"]')
        ).to_have_count(0, timeout=TIMEOUT_MS)
        assert lab.manager.get(other.id).state == State.STOPPED
        assert not page.errors, page.errors


# -- "Switch GPU…" on a card -------------------------------------------------------------------


def test_switch_gpu_from_a_card_refused_while_busy_then_moves_the_variables(lab, page):
    """A running card's Switch GPU… opens the start form's served fields (with their help) set to
    what the session runs now; a switch refused (a cell runs) says why in a notification and on
    the card, the session keeps running; a switch to another type shows its stages on the card,
    then the new card says the one line (what moved, the new rate) and the variables are there."""
    import threading

    manager = lab.manager
    session = manager.start(manager.make_spec("t4", backend="local", idle="off", name="sw-ui"))
    assert session.run("z = 7")["status"] == "ok"
    new_name = None
    try:
        with screenshot_on_failure(page, "switch", lab):
            page.set_viewport_size({"width": 1400, "height": 1000})
            open_lab(page, lab, "switch")
            open_sidebar(page)
            panel = page.locator(PANEL)
            card = panel.locator('.gpusession-card[data-session-name="sw-ui"]')
            sync_api.expect(card).to_have_attribute("data-state", "running")

            def ask_switch(gpu_type: str):
                card.locator(".gpusession-switch").click()
                dialog = page.locator(".jp-Dialog", has_text="Switch sw-ui to another GPU")
                fields = dialog.locator(".gpusession-switch-dialog")
                sync_api.expect(fields.locator(".gpusession-type-select")).to_have_value("t4")
                sync_api.expect(fields.locator(".gpusession-backend-select")).to_have_value("local")
                confirm = dialog.locator(".jp-Dialog-button", has_text=re.compile("^Switch$"))
                sync_api.expect(confirm).to_be_disabled()  # nothing changed yet
                fields.locator(".gpusession-type-select").select_option(gpu_type)
                sync_api.expect(confirm).to_be_enabled()
                return dialog, fields, confirm

            # the dialog: the served help, only the local backend's fields (no image, host, spot)
            set_theme(page, dark=True)  # (the palette does not open over a dialog)
            dialog, fields, confirm = ask_switch("l4")
            shown = fields.locator(".gpusession-field:not([hidden])")
            assert [shown.nth(i).get_attribute("data-option") for i in range(shown.count())] == [
                "type",
                "backend",
            ]
            sync_api.expect(
                fields.locator('.gpusession-field[data-option="type"] .gpusession-field-help')
            ).to_contain_text("GPU type")
            fields.locator(".gpusession-backend-select").select_option("docker")
            sync_api.expect(fields.locator('.gpusession-field[data-option="host"]')).to_be_visible()
            sync_api.expect(
                fields.locator('.gpusession-field[data-option="image"]')
            ).to_be_visible()
            dialog.locator(".jp-Dialog-content").screenshot(
                path=str(ARTIFACTS / "switch-dialog-dark.png")
            )
            fields.locator(".gpusession-backend-select").select_option("local")

            # refused while a cell runs: a notification with the whole message; nothing changed
            busy = threading.Thread(target=session.run, args=("import time; time.sleep(6)",))
            busy.start()
            time.sleep(1.5)
            confirm.click()
            toast = page.locator(".Toastify__toast--error").filter(
                has_text="Switch of sw-ui failed"
            )
            sync_api.expect(toast).to_be_visible(timeout=TIMEOUT_MS)
            sync_api.expect(toast).to_contain_text("session sw-ui is running a cell")
            sync_api.expect(card.locator(".gpusession-action-error")).to_contain_text(
                "Switch failed: session sw-ui is running a cell; switch once it has finished, "
                "or interrupt it first: nothing was changed"
            )
            page.screenshot(path=str(ARTIFACTS / "switch-refused-dark.png"))
            busy.join()
            assert manager.get("sw-ui").state == State.RUNNING
            toast.locator("button").last.click()  # dismissed
            sync_api.expect(toast).to_have_count(0)
            panel.locator(".gpusession-title").click()  # the focus back on the page

            # the switch: its stages on the card while it runs, then the new card's one line
            set_theme(page, dark=False)
            dialog, fields, confirm = ask_switch("a100")
            dialog.locator(".jp-Dialog-content").screenshot(
                path=str(ARTIFACTS / "switch-dialog-light.png")
            )
            # every stage line a switching card shows, however briefly (a quick switch on an idle
            # machine may show one for less than a poll of this test)
            page.evaluate(STAGES_SEEN_JS)
            # the agent has sampled the kernel idle since the busy cell ended (a switch asked
            # while its latest sample still says busy waits a few samples for a newer one)
            sid = manager.get("sw-ui").id
            deadline = time.monotonic() + 30
            while (manager.stats.fetch(sid, limit=1).get("samples") or [{}])[-1].get("kernel_busy"):
                assert time.monotonic() < deadline, "the agent still samples sw-ui busy"
                time.sleep(0.25)
            confirm.click()
            sync_api.expect(card).to_have_attribute("data-switching", "true")
            try:
                page.wait_for_function("() => window.__stagesSeen.length > 0", timeout=TIMEOUT_MS)
            except sync_api.TimeoutError:
                raise AssertionError(
                    "no stage line on the switching card; the panel says "
                    f"{page.locator(PANEL).inner_text()!r}"
                ) from None
            # at once what was asked, then the server's stages as they come
            stages = page.evaluate("() => window.__stagesSeen")
            assert stages[0] == "switch: asking for a100 on local", stages
            new = panel.locator(".gpusession-card").filter(
                has=page.locator(".gpusession-switched:not([hidden])")
            )
            sync_api.expect(new).to_have_count(1, timeout=TIMEOUT_MS)
            new_name = new.get_attribute("data-session-name")
            line = new.locator(".gpusession-switched").inner_text()
            assert new_name == "sw-ui", "a switched session keeps its name"
            assert line.startswith("switched sw-ui in "), line
            took = float(re.search(r" in ([\d.]+)s", line).group(1))
            stages = page.evaluate("() => window.__stagesSeen")
            server = [t for t in stages if re.search(r"\(\d+(\.\d+)?s\)$", t)]
            if took >= 2:  # the list comes every 0.5 s while a switch runs
                assert server, (took, stages)
            for text in server:
                assert re.search(r"^(switch|save|provision|connect|kernel|stop|running)\b", text), (
                    stages
                )
            assert (
                "moved 2 name(s) (z, time)" in line
                and "now $" in line
                and "(was $0.5260/h)" in line
            )
            sync_api.expect(
                page.locator(".Toastify__toast--success").filter(has_text="switched sw-ui in ")
            ).to_be_visible()
            # the old card goes into the history: one card keeps the name, the new one's
            sync_api.expect(card).to_have_count(1, timeout=TIMEOUT_MS)
            sync_api.expect(card.locator(".gpusession-switched:not([hidden])")).to_have_count(1)
            sync_api.expect(
                panel.locator(
                    '.gpusession-history-item[data-session-name="sw-ui~1"] .gpusession-history-reason'
                )
            ).to_contain_text("switch to 1 x a100 on local")
            assert not broken_words(page, PANEL, ".gpusession-switched"), broken_words(
                page, PANEL, ".gpusession-switched"
            )
            assert_readable(page, PANEL)
            new.screenshot(path=str(ARTIFACTS / "switch-done-light.png"))
            set_theme(page, dark=True)
            assert_readable(page, PANEL)
            new.screenshot(path=str(ARTIFACTS / "switch-done-dark.png"))
            record = manager.get(new_name)
            assert record.spec.gpu_type == "a100" and record.state == State.RUNNING
            assert manager.attach(new_name).run("assert z == 7")["status"] == "ok"
            assert not page.errors, page.errors
    finally:
        for key in ("sw-ui", new_name):
            if key:
                manager.stop(key)
