"""Chromium in a network namespace of its own, reaching this machine's labs through a relay.

Chromium fails the requests it is connecting at the moment any IPv4 address of the machine
changes (net::ERR_NETWORK_CHANGED; the page sees "Failed to fetch", a stylesheet that failed to
load, or JupyterLab's "Server Connection Error" dialog). The suite changes the machine's
addresses while browser tests run: each namespace host made on a worker's first use
(scripts/lib/netns.sh), the Kubernetes cluster's bridges and its nodes' pod gateways
(scripts/ci-kubernetes.sh), all beside the browser tests. So, where this process is root:

- Chromium runs in the namespace `gpus-browser-<worker>` (loopback only: nothing in it ever
  changes), started by a wrapper script (`nsenter --net`) that `chromium_launch_kwargs` names;
- each lab's port (start_lab) is relayed: a listener on the same 127.0.0.1 port inside that
  namespace, each connection passed on to the lab on this machine's 127.0.0.1, so every URL,
  origin and cookie is what it would be without the namespace.

Not root, or no `ip`/`nsenter`: Chromium runs as before, on this machine's network.
tests/test_browser_network.py checks both halves: a page's fetches all answered while an
address comes and goes, and that without the namespace they are not."""

from __future__ import annotations

import ctypes
import os
import shutil
import socket
import subprocess
import threading
from pathlib import Path

CLONE_NEWNET = 0x40000000
_CHUNK = 1 << 16


def namespace_name() -> str:
    return f"gpus-browser-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}"


def _can_isolate() -> bool:
    if os.environ.get("GPUSESSION_BROWSER_NETNS", "1") == "0":
        return False
    return os.geteuid() == 0 and bool(shutil.which("ip")) and bool(shutil.which("nsenter"))


_lock = threading.Lock()
_namespace: Path | None = None
_checked = False


def namespace() -> Path | None:
    """The browser's namespace (made once per worker, its loopback up), or None where this
    process cannot make one."""
    global _namespace, _checked
    with _lock:
        if _checked:
            return _namespace
        _checked = True
        if not _can_isolate():
            return None
        name = namespace_name()
        path = Path("/run/netns") / name
        if not path.exists():
            made = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
            if made.returncode != 0 and not path.exists():
                return None
        up = subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], capture_output=True)
        if up.returncode != 0:
            return None
        _namespace = path
        return _namespace


def wrapper(chromium: str) -> str:
    """An executable that runs `chromium` in the browser's namespace (or `chromium` itself)."""
    path = namespace()
    if path is None:
        return chromium
    folder = Path(f"/run/gpusession-browser/{namespace_name()}")
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    script = folder / "chromium"
    text = f'#!/bin/sh\nexec nsenter --net={path} -- {chromium} "$@"\n'
    if not script.exists() or script.read_text() != text:
        partial = folder / f".chromium.{os.getpid()}"
        partial.write_text(text)
        partial.chmod(0o700)
        partial.replace(script)
    return str(script)


def _listen_inside(path: Path, port: int) -> socket.socket:
    """A listener on 127.0.0.1:port inside the namespace: made by a thread that entered it (a
    socket keeps the namespace it was made in; the thread ends there)."""
    made: dict[str, object] = {}

    def enter_and_listen() -> None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            fd = os.open(path, os.O_RDONLY)
            try:
                if libc.setns(fd, CLONE_NEWNET) != 0:
                    errno = ctypes.get_errno()
                    raise OSError(errno, f"setns {path}: {os.strerror(errno)}")
            finally:
                os.close(fd)
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(("127.0.0.1", port))
            listener.listen(64)
            made["listener"] = listener
        except BaseException as error:  # said in the caller's thread
            made["error"] = error

    thread = threading.Thread(target=enter_and_listen, name=f"netns-listen-{port}")
    thread.start()
    thread.join()
    if "error" in made:
        raise made["error"]  # type: ignore[misc]
    return made["listener"]  # type: ignore[return-value]


class _Relay:
    """Connections to 127.0.0.1:port inside the namespace, passed on to 127.0.0.1:port here."""

    def __init__(self, listener: socket.socket, port: int) -> None:
        self.listener = listener
        self.port = port
        self.sockets: set[socket.socket] = set()
        self.closed = False
        threading.Thread(target=self._accept, name=f"netns-relay-{port}", daemon=True).start()

    def _accept(self) -> None:
        while not self.closed:
            try:
                inner, _ = self.listener.accept()
            except OSError:
                return
            try:
                outer = socket.create_connection(("127.0.0.1", self.port), timeout=30)
                outer.settimeout(None)
            except OSError:
                inner.close()  # the lab is gone: the browser sees a refused connection
                continue
            with _lock:
                self.sockets |= {inner, outer}
            pumps = [2]  # the pump that ends last closes both sockets
            for source, sink in ((inner, outer), (outer, inner)):
                threading.Thread(target=self._pump, args=(source, sink, pumps), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, pumps: list[int]) -> None:
        try:
            while chunk := source.recv(_CHUNK):
                sink.sendall(chunk)
            sink.shutdown(socket.SHUT_WR)  # the other way may still be talking
        except OSError:  # reset or closed: the other way ends too
            for sock in (source, sink):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        with _lock:
            pumps[0] -= 1
            last = pumps[0] == 0
            if last:
                self.sockets -= {source, sink}
        if last:
            source.close()
            sink.close()

    def close(self) -> None:
        self.closed = True
        try:  # wakes the accept that waits (a close alone leaves it waiting, the port taken)
            self.listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.listener.close()
        with _lock:
            sockets, self.sockets = self.sockets, set()
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()


_relays: dict[int, _Relay] = {}


def relay(port: int) -> None:
    """Make 127.0.0.1:port inside the browser's namespace reach 127.0.0.1:port here (nothing to
    do where Chromium runs on this machine's network)."""
    path = namespace()
    if path is None:
        return
    with _lock:
        old = _relays.pop(port, None)
    if old is not None:
        old.close()
    listener = _listen_inside(path, port)
    with _lock:
        _relays[port] = _Relay(listener, port)


def unrelay(port: int) -> None:
    with _lock:
        old = _relays.pop(port, None)
    if old is not None:
        old.close()
