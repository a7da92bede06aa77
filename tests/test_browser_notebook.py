"""A session belongs to a notebook (issue 32 §1), in a real JupyterLab and Debian's headless
Chromium (through Playwright), against a real local session:

- a start from the sidebar while a notebook is open offers to connect that notebook, naming it
  (a notification with "Connect NAME.ipynb"); connecting it makes its next `%%gpu` cell run in
  that session, with no magic typed (not even `%load_ext`)
- the session's card says which notebooks use it; the notebook's toolbar shows its session
  (name, type, $/h, state), and a click on it offers the live sessions to connect
- "Run this Notebook on a GPU…" (the palette; the badge's dialog too): the start form's fields
  in a dialog, and the notebook's kernel becomes a GPU kernel with those options

Screenshots go to test-artifacts/: notebook-connect-offer.png, notebook-badge.png,
notebook-connect-dialog.png, notebook-gpu-kernel-form.png, notebook-gpu-kernel.png (and failed-<name>.png when a test fails); the server log to
browser-notebook-jupyterlab.log.
"""

from __future__ import annotations

import re
from typing import Iterator

import pytest

from support.lab import playwright_or_skip
from support.labpanel import (
    ARTIFACTS,
    PANEL,
    TIMEOUT_MS,
    Lab,
    open_lab,
    open_more,
    open_sidebar,
    put_notebook,
    run_all_cells,
    run_command,
    running_lab,
    screenshot_on_failure,
    wait_kernel_idle,
)

pytestmark = pytest.mark.browser

# the browser fixtures, for this module only (see test_browser_panel.py)
from support import browser_fixtures as _shared  # noqa: E402

browser, page = _shared.browser, _shared.page
jp_asyncio_loop, jp_server_cleanup = _shared.jp_asyncio_loop, _shared.jp_server_cleanup
sync_api = playwright_or_skip()

BADGE = ".jp-NotebookPanel-toolbar .gpusession-notebook-badge"


@pytest.fixture(scope="module")
def lab(tmp_path_factory) -> Iterator[Lab]:
    data = tmp_path_factory.mktemp("jupyter-data")  # the GPU kernelspecs it installs
    with running_lab(
        tmp_path_factory,
        "browser-notebook-jupyterlab.log",
        env={"GPUSESSION_BACKEND": "local", "JUPYTER_DATA_DIR": str(data)},
    ) as found:
        yield found


def test_a_sidebar_start_connects_the_open_notebook_and_its_next_cell_runs_there(lab, page):
    put_notebook(lab, "owner.ipynb", ["%%gpu\nprint('ran in', where)"])
    with screenshot_on_failure(page, "notebook-connect", lab):
        open_lab(page, lab, "connect", "tree/owner.ipynb")
        wait_kernel_idle(page)
        badge = page.locator(BADGE)
        sync_api.expect(badge).to_have_text("GPUConnect GPU")

        open_sidebar(page)
        panel = page.locator(PANEL)
        panel.locator(".gpusession-type-select option[value='t4']").wait_for(state="attached")
        panel.locator(".gpusession-backend-select").select_option("local")
        open_more(panel)  # idle and name fold under "More"
        panel.locator(".gpusession-idle-input").fill("off")
        panel.locator(".gpusession-name-input").fill("nb-linked")
        panel.locator(".gpusession-start-button").click()

        # the offer names the open notebook
        offer = page.locator(".Toastify__toast").filter(
            has_text="GPU session nb-linked is starting"
        )
        sync_api.expect(offer).to_contain_text("Run owner.ipynb's %%gpu cells there?")
        offer.screenshot(path=str(ARTIFACTS / "notebook-connect-offer.png"))
        offer.get_by_role("button", name="Connect owner.ipynb").click()

        card = panel.locator('.gpusession-card[data-session-name="nb-linked"]')
        sync_api.expect(card).to_have_attribute("data-state", "running", timeout=TIMEOUT_MS)
        sync_api.expect(card.locator(".gpusession-used-by")).to_have_text("Used by owner.ipynb")
        sync_api.expect(badge).to_have_text(
            re.compile(r"^GPUnb-linked · t4 × 1 · \$0\.5260/h · running$"), timeout=TIMEOUT_MS
        )
        page.locator(".jp-NotebookPanel-toolbar").screenshot(
            path=str(ARTIFACTS / "notebook-badge.png")
        )

        # something only that session's kernel holds, then the notebook's cell: no magic typed
        assert lab.manager.attach("nb-linked").run("where = 'nb-linked'")["status"] == "ok"
        page.locator(".jp-Notebook .jp-Cell").first.click()
        run_all_cells(page)
        output = page.locator(".jp-Notebook .jp-Cell").first.locator(".jp-OutputArea-output")
        sync_api.expect(output.filter(has_text="ran in nb-linked")).to_be_visible(
            timeout=TIMEOUT_MS
        )
        text = output.all_inner_texts()
        assert any("this notebook now uses nb-linked" in t for t in text), text

        # one click on the badge: the live sessions, this one chosen
        badge.click()
        dialog = page.locator(".jp-Dialog", has_text="GPU session of owner.ipynb")
        sync_api.expect(dialog.locator(".gpusession-connect-pick")).to_have_value("nb-linked")
        dialog.screenshot(path=str(ARTIFACTS / "notebook-connect-dialog.png"))
        dialog.get_by_role("button", name="Cancel").click()
        dialog.wait_for(state="detached")


def run_cell(page, n: int) -> None:
    """Run cell `n` alone (its own Shift+Enter), as a user does."""
    page.locator(".jp-Notebook .jp-Cell").nth(n).locator(".jp-InputArea-editor").click()
    page.keyboard.press("Shift+Enter")


def test_run_this_notebook_on_a_gpu_turns_its_kernel_into_a_gpu_kernel(lab, page):
    """The notebook's kernel becomes a GPU kernel, and what its first kernel computed moves over
    (values, arrays, imports; a generator cannot and is named)."""
    put_notebook(
        lab,
        "whole.ipynb",
        [
            "import numpy as np\nanswer = 6 * 7\ntable = np.arange(12.0)\ngen = (i for i in 'ab')",
            "print('answer', answer, table.sum(), np.__name__)",
        ],
    )
    with screenshot_on_failure(page, "notebook-gpu-kernel", lab):
        open_lab(page, lab, "gpu-kernel", "tree/whole.ipynb")
        wait_kernel_idle(page)
        run_cell(page, 0)  # computed on this machine's kernel first
        page.locator(".jp-Notebook .jp-Cell").first.locator(
            ".jp-InputPrompt", has_text="[1]"
        ).wait_for()
        before = {r.id for r in lab.manager.list(active_only=True)}
        run_command(page, "Run this Notebook on a GPU…")
        dialog = page.locator(".jp-Dialog", has_text="Run whole.ipynb on a GPU")
        form = dialog.locator(".gpusession-start-form")
        form.locator(".gpusession-type-select option[value='t4']").wait_for(state="attached")
        form.locator(".gpusession-backend-select").select_option("local")
        open_more(form)
        form.locator(".gpusession-idle-input").fill("off")
        dialog.screenshot(path=str(ARTIFACTS / "notebook-gpu-kernel-form.png"))
        form.locator(".gpusession-start-button").click()
        dialog.wait_for(state="detached", timeout=TIMEOUT_MS)
        # the notebook's kernel is the GPU kernelspec of those options, a session of its own
        page.locator(
            ".jp-StatusBar-TextItem", has_text=re.compile(r"GPU · T4.*\|\s*Idle")
        ).wait_for(timeout=TIMEOUT_MS)
        (started,) = [r for r in lab.manager.list(active_only=True) if r.id not in before]
        assert (started.backend, started.spec.gpu_type, started.spec.idle) == ("local", "t4", None)
        badge = page.locator(BADGE)
        sync_api.expect(badge).to_have_text(
            re.compile(rf"^GPU{re.escape(started.name)} · t4 × 1 · .* · running$"),
            timeout=TIMEOUT_MS,
        )
        moved = page.locator(".Toastify__toast", has_text="Variables moved into")
        sync_api.expect(moved).to_contain_text(
            f"Variables moved into {started.name}: answer, table (imports: np); not moved: gen "
            "(generator).",
            timeout=TIMEOUT_MS,
        )
        run_cell(page, 1)  # only the second cell: what the first computed came over
        output = page.locator(".jp-Notebook .jp-Cell").nth(1).locator(".jp-OutputArea-output")
        sync_api.expect(output).to_have_text("answer 42 66.0 numpy", timeout=TIMEOUT_MS)
        page.screenshot(path=str(ARTIFACTS / "notebook-gpu-kernel.png"))
