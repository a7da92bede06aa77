"""The browser tests' Chromium is deaf to this machine's address changes (support/browser_net.py).

Chromium fails the requests it is connecting or queueing when an IPv4 address of the machine
comes or goes (net::ERR_NETWORK_CHANGED): a JupyterLab page that was loading showed "Failed to
fetch", a stylesheet that failed to load or the "Server Connection Error" dialog when the suite
made a namespace host or the Kubernetes cluster's bridges beside it (three CI failures). Here a
page keeps 30 fetches in flight to a server on this machine while an address comes and goes on a
veth pair, once with Chromium on this machine's network (requests fail: the test can see the
fault) and once in its own namespace, relayed as the browser tests' Chromium is (none fails)."""

from __future__ import annotations

import http.server
import os
import socketserver
import subprocess
import threading
import time

import pytest

from support import browser_net
from support.lab import chromium_executable, chromium_launch_kwargs, playwright_or_skip

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.timeout(180)]

sync_api = playwright_or_skip()

FETCHES = """async (ms) => {
  let ok = 0, failed = 0;
  const end = Date.now() + ms;
  const one = async () => {
    while (Date.now() < end) {
      try { const r = await fetch('/x?' + Math.random()); await r.text(); ok++; }
      catch (e) { failed++; }
    }
  };
  await Promise.all(Array.from({length: 30}, one));
  return {ok, failed};
}"""


class _Slow(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's name
        time.sleep(0.02)  # as an API answer takes: requests queue for Chromium's six sockets
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args):
        pass


class _Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True


def _churn(stop: threading.Event, worker: str) -> tuple[threading.Thread, list[int]]:
    """An address that comes and goes on a veth pair of this test's own, until stopped (the
    thread deletes the pair before it ends); the thread, and how many times it came and went."""
    n = int("".join(c for c in worker if c.isdigit()) or 0) % 200
    here, there = f"gbn{n}a", f"gbn{n}b"
    count = [0]

    def run() -> None:
        while not stop.is_set():
            for command in (
                f"ip link add {here} type veth peer name {there}",
                f"ip addr add 10.250.{n}.1/24 dev {here}",
                f"ip link set {here} up",
            ):
                subprocess.run(command.split(), capture_output=True, timeout=30)
            time.sleep(0.3)
            subprocess.run(["ip", "link", "del", here], capture_output=True, timeout=30)
            count[0] += 1
            time.sleep(0.3)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, count


def _fetch_through(executable: str, port: int) -> dict[str, int]:
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            **{**chromium_launch_kwargs(), "executable_path": executable}
        )
        try:
            page = browser.new_page()
            page.goto(f"http://127.0.0.1:{port}/")
            return page.evaluate(FETCHES, 6000)
        finally:
            browser.close()


@pytest.fixture
def server():
    server = _Server(("127.0.0.1", 0), _Slow)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    browser_net.relay(port)
    yield port
    browser_net.unrelay(port)
    server.shutdown()
    server.server_close()


def test_a_page_loses_no_request_while_the_machines_addresses_change(server):
    if browser_net.namespace() is None:
        pytest.skip("the browser's own network namespace needs root, ip and nsenter")
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    isolated = browser_net.wrapper(chromium_executable())
    assert isolated != chromium_executable()  # the suite's Chromium runs through the wrapper

    stop = threading.Event()
    churn, changes = _churn(stop, worker)
    try:
        exposed = _fetch_through(chromium_executable(), server)
        seen_exposed = changes[0]
        shielded = _fetch_through(isolated, server)
    finally:
        stop.set()
        churn.join(timeout=60)
    assert seen_exposed >= 3, "the address came and went too few times to test anything"
    assert exposed["failed"] > 0, f"on this machine's network no request failed: {exposed}"
    assert shielded["ok"] > 200 and shielded["failed"] == 0, (
        f"{shielded['failed']} of {shielded['ok'] + shielded['failed']} requests failed in the"
        f" browser's own namespace while the machine's addresses changed"
    )
