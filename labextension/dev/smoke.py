"""Open JupyterLab in headless Chromium and check that the GPU sessions panel renders.

    python labextension/dev/smoke.py --api fake --screenshot /tmp/panel.png
    python labextension/dev/smoke.py --api none   # no server extension: an error, not a blank

--api fake   serve the made-up API of fake_api.py (FAKE_GPUSESSION_* variables apply)
--api none   serve no API at all: the panel must say the server extension is missing
--api real   whatever gpusession server extension is installed

The extension must be installed where this interpreter's JupyterLab finds it (pip install,
or JUPYTER_PATH pointing at a folder with labextensions/gpusession-labextension).
Exits non-zero with a message when a check fails.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent / "tests"))

from playwright.sync_api import sync_playwright  # noqa: E402
from support.lab import chromium_launch_kwargs, lab_url, start_lab, stop_lab  # noqa: E402

PANEL = "#gpusession-panel"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--api", choices=["fake", "none", "real"], default="fake")
    parser.add_argument("--screenshot", default=None, help="PNG of the panel to write")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds per wait")
    options = parser.parse_args()

    env: dict[str, str] = {}
    extra: list[str] = []
    if options.api == "fake":
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))
        extra.append("--ServerApp.jpserver_extensions=fake_api=True")
    elif options.api == "none":
        extra.append("--ServerApp.jpserver_extensions=gpusession=False")

    root = Path(tempfile.mkdtemp(prefix="gpusession-smoke-"))
    url, token, process = start_lab(root, env=env, extra_args=extra)
    timeout_ms = options.timeout * 1000
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(**chromium_launch_kwargs())
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            errors: list[str] = []
            page.on("pageerror", lambda error: errors.append(str(error)))
            started = time.monotonic()
            page.goto(lab_url(url, token))
            tab = page.locator('.jp-SideBar [data-id="gpusession-panel"]')
            tab.wait_for(timeout=timeout_ms)
            print(f"sidebar tab: title={tab.get_attribute('title')!r} ({time.monotonic() - started:.1f} s)")
            tab.click()
            page.locator(PANEL).wait_for(state="visible", timeout=timeout_ms)

            if options.api == "none":
                error = page.locator(f"{PANEL} .gpusession-api-error")
                error.wait_for(state="visible", timeout=timeout_ms)
                print("api error:", error.inner_text())
            else:
                outcome = page.locator(
                    f"{PANEL} .gpusession-card:visible, {PANEL} .gpusession-empty:visible,"
                    f" {PANEL} .gpusession-api-error:visible"
                ).first
                outcome.wait_for(timeout=timeout_ms)
                api_error = page.locator(f"{PANEL} .gpusession-api-error")
                if api_error.is_visible():
                    print("api error:", api_error.inner_text())
                    return 1
                cards = page.locator(f"{PANEL} .gpusession-card")
                print(f"cards: {cards.count()}")
                for i in range(min(cards.count(), 5)):
                    card = cards.nth(i)
                    print(
                        " ",
                        card.get_attribute("data-session-name"),
                        card.locator(".gpusession-state").inner_text(),
                        card.locator(".gpusession-cost").inner_text(),
                    )
                if options.api == "fake" and cards.count():
                    util = page.locator(f"{PANEL} .gpusession-gpu-util").first
                    util.wait_for(state="visible", timeout=timeout_ms)
                    print("first GPU utilization:", util.get_attribute("data-value"))
                    page.locator(f"{PANEL} .gpusession-type-select option").first.wait_for(
                        state="attached", timeout=timeout_ms
                    )
                    time.sleep(2.5)  # let the charts gather a few samples
            if options.screenshot:
                page.locator(PANEL).screenshot(path=options.screenshot)
                page.screenshot(path=str(Path(options.screenshot).with_suffix(".page.png")))
                print("screenshot:", options.screenshot)
            browser.close()
            if errors:
                print("page errors:", *errors, sep="\n  ")
                return 1
    finally:
        stop_lab(process)
    return 0


if __name__ == "__main__":
    sys.exit(main())
