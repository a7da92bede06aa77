"""A kubernetes session from the JupyterLab sidebar, in a real browser, on the test cluster
(scripts/ci-kubernetes.sh): the form offers the backend and an image, the card runs, says what it
is and what it costs, and its Stop deletes the pod. The cluster's other faces: tests/test_kubernetes.py."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
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
    running_lab,
    screenshot_on_failure,
    stop_card,
)

pytestmark = [pytest.mark.integration, pytest.mark.kubernetes, pytest.mark.browser]

from support import browser_fixtures as _shared  # noqa: E402

browser, page = _shared.browser, _shared.page
jp_asyncio_loop, jp_server_cleanup = _shared.jp_asyncio_loop, _shared.jp_server_cleanup
sync_api = playwright_or_skip()

from test_kubernetes import LABEL  # noqa: E402

from gpusession.core.models import State  # noqa: E402
from support.kube import IMAGE, KUBECTL, LANE_2  # noqa: E402


@pytest.fixture(scope="module")
def kube_lab(kube, kube_config, tmp_path_factory) -> Iterator[Lab]:
    """A lab whose sessions go to this worker's namespace (its kubeconfig's: support.kube)."""
    before = os.environ.get("KUBECONFIG")
    os.environ["KUBECONFIG"] = str(kube_config)  # the lab's manager here stops what is left
    try:
        with running_lab(
            tmp_path_factory, "browser-kubernetes.log", env={"KUBECONFIG": str(kube_config)}
        ) as found:
            yield found
            store = (
                found.manager.store.store_id
            )  # its sessions' claims, kept by design: the test's go
            subprocess.run(
                [str(KUBECTL), "--kubeconfig", str(kube_config), "delete", "pvc",
                 "-l", f"gpusession.session.store={store}", "--wait=false"],
                capture_output=True, timeout=60, check=False,
            )  # fmt: skip
    finally:
        if before is None:
            os.environ.pop("KUBECONFIG", None)
        else:
            os.environ["KUBECONFIG"] = before


def _pods(kubeconfig: Path, session_id: str) -> list[str]:
    out = subprocess.run(
        [str(KUBECTL), "--kubeconfig", str(kubeconfig), "get", "pods",
         "-l", f"{LABEL}={session_id}", "-o", "name"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    return out.stdout.split()


@LANE_2
def test_a_kubernetes_session_from_the_sidebar(kube_lab, kube_config, page):
    with screenshot_on_failure(page, "sidebar-kubernetes", kube_lab):
        open_lab(page, kube_lab, "kube")
        open_sidebar(page)
        panel = page.locator(PANEL)
        panel.locator(".gpusession-type-select option[value='t4']").wait_for(state="attached")
        open_more(panel)
        panel.locator(".gpusession-backend-select").select_option("kubernetes")
        # the image field is offered for it (a backend that takes an image); the cluster is the
        # kubeconfig's current context and namespace, as kubectl's
        panel.locator(".gpusession-image-input").wait_for(state="visible")
        panel.locator(".gpusession-type-select").select_option("t4")
        panel.locator(".gpusession-image-input").fill(IMAGE)
        panel.locator(".gpusession-idle-input").fill("off")
        panel.locator(".gpusession-name-input").fill("kube-sidebar")
        panel.locator(".gpusession-start-button").click()

        card = panel.locator('.gpusession-card[data-session-name="kube-sidebar"]')
        card.wait_for()
        sync_api.expect(card).to_have_attribute("data-state", "running", timeout=TIMEOUT_MS * 3)
        kind = card.locator(".gpusession-kind").inner_text()
        assert kind == f"t4 × 1 · kubernetes · {IMAGE}", kind
        assert re.fullmatch(r"\$\d+\.\d{4}/h", card.locator(".gpusession-price").inner_text())
        record = kube_lab.manager.get("kube-sidebar")
        assert record.resource["node"] == "n1" and _pods(kube_config, record.id), record.resource
        page.screenshot(path=str(ARTIFACTS / "sidebar-kubernetes.png"))

        stop_card(page, card)
        sync_api.expect(
            panel.locator('.gpusession-list .gpusession-card[data-session-name="kube-sidebar"]')
        ).to_have_count(0, timeout=TIMEOUT_MS)
        assert kube_lab.manager.get(record.id).state == State.STOPPED
        assert not _pods(kube_config, record.id), "the stop deleted the pod"
