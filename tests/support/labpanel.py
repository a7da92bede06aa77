"""What the browser tests of the JupyterLab face share: a JupyterLab (tests/support/lab.py) that
serves this checkout's build of the extension, and the page steps (open the sidebar, run the
command palette, switch the theme, measure contrast).

The extension served is `gpusession/labextension/` of the repository (what `jlpm build` writes
and `pip install .` installs), put first on JUPYTER_PATH: a test sees the front end as built
now, not the copy an earlier `pip install -e .` left in the environment.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
import urllib.request
from pathlib import Path
from typing import Iterator, NamedTuple

from gpusession.configuration.config import GpuSessionConfig
from gpusession.session import SessionManager

from .lab import lab_url, start_lab, stop_lab

ROOT = Path(__file__).resolve().parent.parent.parent
ARTIFACTS = ROOT / "test-artifacts"
DATA = ROOT / "tests" / "data"
BUILT = ROOT / "gpusession" / "labextension"
PANEL = "#gpusession-panel"
TIMEOUT_MS = 30_000


class Lab(NamedTuple):
    url: str
    token: str
    root: Path
    manager: SessionManager  # the same store as the server's (GPUSESSION_HOME)
    log: Path | None = None  # the server's log (test-artifacts/)


def fresh_extension_env(folder: Path) -> dict[str, str]:
    """JUPYTER_PATH with this checkout's built extension first (nothing when it is not built)."""
    if not (BUILT / "package.json").exists():
        return {}
    labextensions = folder / "jupyter" / "labextensions"
    labextensions.mkdir(parents=True, exist_ok=True)
    link = labextensions / "gpusession-labextension"
    if not link.exists():
        link.symlink_to(BUILT, target_is_directory=True)
    paths = [str(folder / "jupyter")] + [
        p for p in os.environ.get("JUPYTER_PATH", "").split(os.pathsep) if p
    ]
    return {"JUPYTER_PATH": os.pathsep.join(paths)}


@contextlib.contextmanager
def running_lab(
    tmp_factory,
    log_name: str,
    *,
    env: dict[str, str] | None = None,
    extra_args: tuple[str, ...] = (),
) -> Iterator[Lab]:
    """A JupyterLab with its own session store, the gpusession server extension and the built
    front end; every session still active at the end is stopped."""
    home = tmp_factory.mktemp("gshome")
    root = tmp_factory.mktemp("notebooks")
    ARTIFACTS.mkdir(exist_ok=True)
    # a module's tests spread over the xdist workers, each with a lab of its own: one log each
    # (one file for all had the servers overwrite each other's lines)
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker:
        log_name = log_name.replace(".log", f"-{worker}.log")
    url, token, process = start_lab(
        root,
        env={
            "GPUSESSION_HOME": str(home),
            **fresh_extension_env(tmp_factory.mktemp("jupyter")),
            **(env or {}),
        },
        extra_args=extra_args,
        log_path=ARTIFACTS / log_name,
    )
    manager = SessionManager(GpuSessionConfig(data_dir=str(home)))
    try:
        yield Lab(url, token, root, manager, ARTIFACTS / log_name)
    finally:
        for record in manager.list(active_only=True):
            with contextlib.suppress(Exception):
                manager.stop(record.id)
        stop_lab(process)


@contextlib.contextmanager
def screenshot_on_failure(page, name: str, lab: Lab | None = None):
    """On a failure: a screenshot (test-artifacts/failed-NAME.png) and, in the test's output
    (all a CI log keeps), the sidebar's text as the user saw it and, from this lab's own log,
    its last requests to the extension (failed or slow), warnings and errors."""
    try:
        yield
    except BaseException:
        with contextlib.suppress(Exception):
            page.screenshot(path=str(ARTIFACTS / f"failed-{name}.png"))
        with contextlib.suppress(Exception):
            print(
                f"--- the sidebar's text at the failure ---\n{page.locator(PANEL).inner_text(timeout=2000)}"
            )
        if lab is not None and lab.log is not None:
            with contextlib.suppress(Exception):
                lines = lab.log.read_text(errors="replace").splitlines()
                asked = [
                    line
                    for line in lines
                    if "/gpusession/" in line
                    or "Traceback" in line
                    or line[:2] in ("[W", "[E", "[C")
                ]
                print(
                    f"--- {lab.log.name}: the last requests to the extension, warnings, errors ---",
                    *asked[-30:],
                    sep="\n",
                )
        raise


def open_lab(page, lab: Lab, workspace: str, path: str = "") -> None:
    """JupyterLab in a workspace of its own: a fresh layout (sidebar closed), not the last test's."""
    page.goto(lab_url(lab.url, lab.token, f"lab/workspaces/{workspace}/{path}".rstrip("/")))
    page.locator('.jp-SideBar [data-id="gpusession-panel"]').wait_for()


def open_sidebar(page) -> None:
    page.locator('.jp-SideBar [data-id="gpusession-panel"]').click()
    page.locator(PANEL).wait_for(state="visible")


def stop_card(page, card, choice: str = "Stop") -> None:
    """A card's Stop, then `choice` in the dialog it opens for a session with a workspace
    ("Stop", "Save and stop", "Cancel")."""
    card.locator(".gpusession-stop").click()
    answer_stop(page, choice)


def answer_stop(page, choice: str = "Stop") -> None:
    """Press `choice` in the open "Stop a GPU session" dialog and wait until it closes."""
    dialog = page.locator(".jp-Dialog", has_text="Stop a GPU session")
    dialog.locator("button", has_text=re.compile(f"^{re.escape(choice)}$")).click()
    dialog.wait_for(state="detached")


def wait_for_change(read, timeout: float = 10.0) -> tuple[str, str]:
    """(first, later) values of `read()` once it changed."""
    first = read()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        time.sleep(0.25)
        later = read()
        if later != first:
            return first, later
    raise AssertionError(f"value stayed {first!r} for {timeout:.0f} s")


def run_command(page, label: str, attempts: int = 3) -> None:
    """Run a command by its label from the command palette (Ctrl+Shift+C), as a user does.
    A JupyterLab page that has just loaded moves the focus to its launcher once it settles,
    which closes a palette opened before (its input hides, its items detach): opened again."""
    palette_input = page.locator(".lm-CommandPalette-input")
    item = page.locator(
        ".lm-CommandPalette-item",
        has=page.locator(
            ".lm-CommandPalette-itemLabel", has_text=re.compile(f"^{re.escape(label)}$")
        ),
    )
    for attempt in range(attempts):
        last = attempt == attempts - 1
        wait = TIMEOUT_MS if last else 5000
        try:
            if not palette_input.is_visible():
                page.keyboard.press("Control+Shift+C")
            palette_input.wait_for(state="visible", timeout=wait)
            palette_input.fill(label, timeout=wait)
            item.first.click(timeout=wait)
            return
        except Exception as exc:  # noqa: BLE001 - playwright's TimeoutError: the palette closed
            if last or type(exc).__name__ != "TimeoutError":
                raise


def palette_labels(page, text: str) -> list[str]:
    """The labels the command palette lists for a search."""
    page.keyboard.press("Control+Shift+C")
    palette_input = page.locator(".lm-CommandPalette-input")
    palette_input.wait_for(state="visible")
    palette_input.fill(text)
    page.locator(".lm-CommandPalette-item").first.wait_for()
    labels = page.locator(".lm-CommandPalette-itemLabel").all_inner_texts()
    page.keyboard.press("Escape")
    return labels


def set_theme(page, dark: bool) -> None:
    """Switch JupyterLab's theme from the command palette and wait until it applies: its
    stylesheet loaded, not only asked for. The next switch removes a stylesheet still loading,
    and JupyterLab then says "Error Loading Theme" in a dialog over the page (a loaded run's
    browser test met it where a 300 ms pause had guessed the load was done). A command whose
    click did not take (the palette closing under it as a loaded page settles: once, beside
    `yes`, the theme stayed as it was for 30 s) is run again, as a user would: the same theme
    asked twice changes nothing."""
    applied = f"document.body.dataset.jpThemeLight === '{'false' if dark else 'true'}'"
    for attempt in range(3):
        run_command(page, "Use Theme: JupyterLab Dark" if dark else "Use Theme: JupyterLab Light")
        try:
            page.wait_for_function(applied, timeout=TIMEOUT_MS if attempt == 2 else 10_000)
            break
        except Exception as exc:  # noqa: BLE001 - playwright's TimeoutError: run it again
            if attempt == 2 or type(exc).__name__ != "TimeoutError":
                raise
    theme = "theme-dark-extension" if dark else "theme-light-extension"
    page.wait_for_function(
        "(theme) => { const links = [...document.querySelectorAll('link[rel=stylesheet]')]"
        ".filter(l => l.href.includes(theme)); return links.length > 0 && links.every(l => l.sheet); }",
        arg=theme,
    )


def put_notebook(lab: Lab, name: str, cells: list[str]) -> None:
    """Create the notebook through the server's contents API (as a front end would)."""
    notebook = {
        "nbformat": 4,
        "nbformat_minor": 5,
        "metadata": {
            "kernelspec": {
                "name": "python3",
                "display_name": "Python 3 (ipykernel)",
                "language": "python",
            }
        },
        "cells": [
            {
                "cell_type": "code",
                "id": f"cell-{i}",
                "metadata": {},
                "source": src,
                "outputs": [],
                "execution_count": None,
            }
            for i, src in enumerate(cells)
        ],
    }
    body = json.dumps({"type": "notebook", "format": "json", "content": notebook}).encode()
    request = urllib.request.Request(
        f"{lab.url}api/contents/{name}",
        data=body,
        method="PUT",
        headers={"Authorization": f"token {lab.token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as reply:  # noqa: S310 - http on localhost
        assert reply.status in (200, 201)


def wait_kernel_idle(page) -> None:
    """A run asked for before the kernel is up is dropped: wait for "Idle" in the status bar."""
    page.locator(".jp-StatusBar-TextItem", has_text=re.compile(r"\|\s*Idle")).wait_for()


def run_all_cells(page) -> None:
    page.locator("#jp-MainMenu .lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
    page.get_by_role("menuitem", name="Run All Cells", exact=True).click()


# WCAG contrast of an element's text against what is behind it: its own background and its
# ancestors', composed (a tint of 16% over the panel is what the eye sees), in sRGB.
CONTRAST_JS = """
(el) => {
  const parse = text => {
    let m = /rgba?\\(([^)]+)\\)/.exec(text);
    if (m) {
      const p = m[1].split(/[ ,/]+/).filter(Boolean).map(Number);
      return [p[0], p[1], p[2], p.length > 3 ? p[3] : 1];
    }
    m = /color\\(srgb ([^)]+)\\)/.exec(text);
    if (m) {
      const p = m[1].split(/[ /]+/).filter(Boolean).map(Number);
      return [p[0] * 255, p[1] * 255, p[2] * 255, p.length > 3 ? p[3] : 1];
    }
    return [0, 0, 0, 0];
  };
  const over = (top, bottom) => {
    const a = top[3] + bottom[3] * (1 - top[3]);
    if (a === 0) return [0, 0, 0, 0];
    return [0, 1, 2].map(i => (top[i] * top[3] + bottom[i] * bottom[3] * (1 - top[3])) / a).concat([a]);
  };
  const layers = [];
  for (let node = el; node; node = node.parentElement) {
    const style = getComputedStyle(node);
    const bg = parse(style.backgroundColor);
    const opacity = Number(style.opacity);
    if (bg[3] > 0) layers.push(bg);
    if (bg[3] >= 1) break;
  }
  let back = [255, 255, 255, 1];
  for (const layer of layers.reverse()) back = over(layer, back);
  const fore = over(parse(getComputedStyle(el).color), back);
  const lum = c => {
    const [r, g, b] = c.slice(0, 3).map(v => {
      v /= 255;
      return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4);
    });
    return 0.2126 * r + 0.7152 * g + 0.0722 * b;
  };
  const [hi, lo] = [lum(fore), lum(back)].sort((a, b) => b - a);
  return {
    ratio: (hi + 0.05) / (lo + 0.05),
    color: getComputedStyle(el).color,
    background: back.map(v => Math.round(v)).join(','),
    text: (el.innerText || el.textContent || '').slice(0, 60),
    cls: el.className && el.className.baseVal === undefined ? el.className : ''
  };
}
"""


# The elements under a scope matching a selector list (each of its selectors under the scope),
# visible as Playwright says it (a box with an area, not visibility: hidden) and with text: their
# contrast measured in one call (three calls an element took 12 s a check on a quiet machine,
# 60 s on a busy one)
LOW_CONTRAST_JS = (
    """([scope, selector, minimum]) => {
  const measure = """
    + CONTRAST_JS.strip()
    + """;
  const shown = el => {
    const box = el.getBoundingClientRect();
    return box.width > 0 && box.height > 0 && getComputedStyle(el).visibility !== 'hidden';
  };
  return [...document.querySelectorAll(scope)]
    .flatMap(root => [...root.querySelectorAll(selector)])
    .filter(el => shown(el) && (el.innerText || '').trim())
    .map(measure)
    .filter(m => m.ratio < minimum);
}"""
)


def low_contrast(page, scope: str, selector: str, minimum: float) -> list[dict]:
    """The visible elements under `scope` matching `selector` (a list: each under `scope`) whose
    text has less contrast than `minimum`."""
    return page.evaluate(LOW_CONTRAST_JS, [scope, selector, minimum])


# The words of an element that the browser broke across lines although they fit on one: a word
# is a run without spaces (a line may end after a hyphen or a slash, except in code); one wider
# than the element may break (nothing else can hold it).
BROKEN_WORDS_JS = """
(node) => {
  const style = getComputedStyle(node);
  const width = node.getBoundingClientRect().width - parseFloat(style.paddingLeft) -
    parseFloat(style.paddingRight) - parseFloat(style.borderLeftWidth) - parseFloat(style.borderRightWidth);
  const broken = [];
  const walker = document.createTreeWalker(node, NodeFilter.SHOW_TEXT);
  for (let text = walker.nextNode(); text; text = walker.nextNode()) {
    const value = text.nodeValue;
    // a word: a run without spaces, hyphens or slashes (a line may end after those); in code
    // a run without spaces ("--resume" is one)
    const code = text.parentElement && text.parentElement.closest('code');
    for (const match of value.matchAll(code ? /\\S+/g : /[^\\s\\/-]+[\\/-]?/g)) {
      const range = document.createRange();
      range.setStart(text, match.index);
      range.setEnd(text, match.index + match[0].length);
      const rects = [...range.getClientRects()];
      const lines = new Set(rects.map(r => Math.round(r.top)));
      // its width on one line (a broken word's bounding box is as wide as the lines it spans)
      const whole = rects.reduce((sum, r) => sum + r.width, 0);
      if (lines.size > 1 && whole < width) {
        broken.push(match[0]);
      }
    }
  }
  return broken;
}
"""


def broken_words(page, scope: str, selector: str) -> list[str]:
    """Words the browser broke mid-word (across lines) in the visible elements matching."""
    found: list[str] = []
    for element in page.locator(f"{scope} {selector}").all():
        if element.is_visible():
            found += element.evaluate(BROKEN_WORDS_JS)
    return found


def open_more(panel) -> None:
    """Unfold the start form's "More" (the fields a first start does not need)."""
    more = panel.locator("details.gpusession-more")
    more.wait_for(state="attached")
    if more.get_attribute("open") is None:
        panel.locator(".gpusession-more-summary").click()
