"""The link to a session kernel in a pod: its ports, on the pod's loopback only, forwarded to this
machine's 127.0.0.1 through the API server's port-forward (`pods/portforward`), so no sshd,
Service, NodePort or Ingress is needed, and the cluster's RBAC decides who may connect.

Each local connection (ZMQ opens one per kernel port, and again after a drop) gets a websocket
of its own, pumped by a thread. A stream that drops (the API server restarted, a proxy timed out)
closes its local connection; ZMQ connects again by itself, which opens a new stream. `reconnects`
counts the kernel streams that dropped, so the session resubscribes before its next cell and
nothing is lost or doubled; `healthy()` turns False when no stream could be opened for
GPUSESSION_RECONNECT_TIMEOUT, and `failure()` says why."""

from __future__ import annotations

import functools
import importlib
import logging
import selectors
import socket
import threading
import time
from typing import Callable

from ...configuration.settings import reconnect_give_up
from ...core.durations import format_duration
from ...core.models import KernelEndpoint
from ...core.protocol import KERNEL_PORT_NAMES
from ..base import Link
from .apiserver import Cluster, api_words, sdk

log = logging.getLogger(__name__)

BUFFER = 256 * 1024


class PortForwardLink(Link):
    """Local loopback ports for the kernel's five and the agent's, each forwarded to the pod."""

    def __init__(
        self,
        cluster: Cluster,
        pod: str,
        kernel_info: dict,
        agent_port: int | None,
        on_event: Callable[[str], None] = lambda text: None,
    ):
        self.cluster, self.pod, self.on_event = cluster, pod, on_event
        self.give_up_after = reconnect_give_up()
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._listeners: list[socket.socket] = []
        self._open: set[socket.socket] = set()
        self.streams: set = set()  # the open port-forward streams (a test cuts them)
        self._kernel_ports = {int(kernel_info[name]) for name in KERNEL_PORT_NAMES}
        self._reconnects = 0
        self._down_since: float | None = None
        self._last_error = ""
        info = dict(kernel_info, ip="127.0.0.1", transport="tcp")
        for name in KERNEL_PORT_NAMES:
            info[name] = self._forward(int(kernel_info[name]))
        agent_url = f"http://127.0.0.1:{self._forward(int(agent_port))}" if agent_port else None
        self.endpoint = KernelEndpoint(connection_info=info, agent_url=agent_url)

    # -- the Link --------------------------------------------------------------------------

    def close(self) -> None:
        self._closed.set()
        with self._lock:
            for sock in [*self._listeners, *self._open]:
                _close(sock)
            self._listeners.clear()
            self._open.clear()

    def healthy(self) -> bool:
        down = self._down_since
        return (
            down is None
            or self.give_up_after is None
            or time.monotonic() - down < self.give_up_after
        )

    def failure(self) -> str | None:
        if self.healthy():
            return None
        return (
            f"cannot reach pod {self.pod} through the API server at {self.cluster.server}: "
            f"down for over {format_duration(self.give_up_after)} ({self._last_error})"
        )

    @property
    def reconnects(self) -> int:
        return self._reconnects

    # -- forwarding ------------------------------------------------------------------------

    def _forward(self, remote_port: int) -> int:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        self._listeners.append(listener)
        threading.Thread(
            target=self._accept,
            args=(listener, remote_port),
            name=f"gpusession-k8s-forward-{remote_port}",
            daemon=True,
        ).start()
        return listener.getsockname()[1]

    def _accept(self, listener: socket.socket, remote_port: int) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return  # closed
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(
                target=self._serve,
                args=(conn, remote_port),
                name=f"gpusession-k8s-stream-{remote_port}",
                daemon=True,
            ).start()

    def _serve(self, conn: socket.socket, remote_port: int) -> None:
        """One local connection: a stream of its own to the pod's port, pumped until either
        side ends; a stream the remote side ended is a drop (ZMQ connects again)."""
        with self._lock:
            self._open.add(conn)
        stream, api = None, None
        try:
            stream, api = self._open_stream(remote_port)
            if stream is None:
                return
            remote = stream.socket(remote_port)
            remote.setblocking(True)
            self.streams.add(stream)
            ended = _pump(conn, remote, self._closed)
            if (
                ended == "remote"
                and remote_port in self._kernel_ports
                and not self._closed.is_set()
            ):
                self._reconnects += 1
                self.on_event(
                    f"port-forward: the stream to port {remote_port} dropped; reconnecting"
                )
        finally:
            with self._lock:
                self._open.discard(conn)
            _close(conn)
            if stream is not None:
                self.streams.discard(stream)
                stream.close()
            if api is not None:
                api.api_client.close()

    def _open_stream(self, remote_port: int):
        api = self.cluster.stream_api()
        try:
            # the module, which its package's `stream` function hides
            opener = importlib.import_module("kubernetes.stream.stream")._websocket_request
            stream = opener(
                _quiet_portforward_call,
                {"_preload_content": False},
                api.connect_get_namespaced_pod_portforward,
                self.pod,
                self.cluster.namespace,
                ports=str(remote_port),
            )
        except Exception as exc:  # noqa: BLE001 - any failure to open is the link being down
            api.api_client.close()
            self._went_down(api_words(exc))
            return None, None
        self._came_up()
        return stream, api

    def _went_down(self, why: str) -> None:
        self._last_error = why
        if self._down_since is None:
            self._down_since = time.monotonic()
            self.on_event(f"port-forward: cannot open a stream to pod {self.pod}: {why}")

    def _came_up(self) -> None:
        if self._down_since is not None:
            self._down_since = None
            self.on_event("port-forward: streams open again")


def _quiet_portforward_call(configuration, _method, url, **kwargs):
    """The client's `portforward_call` for one port, with a proxy thread of our own (relay.py:
    buffers that a send does not copy, and one that ends quietly when the API server drops the
    stream, where the client's prints an SSLEOFError's traceback into the notebook): the same
    websocket, opened the same way, through the same auth headers."""
    ws_client = sdk().stream.ws_client
    port = int(dict(kwargs.get("query_params") or [])["ports"])
    url = ws_client.get_websocket_url(url, kwargs.get("query_params"))
    try:
        websocket = ws_client.create_websocket(configuration, url, kwargs.get("headers"))
    except Exception as exc:  # noqa: BLE001 - as the client says it: an ApiException without status
        raise sdk().client.ApiException(status=0, reason=str(exc)) from None
    return _quiet_class()(websocket, [port])


@functools.lru_cache(maxsize=1)
def _quiet_class():
    base = sdk().stream.ws_client.PortForward

    class QuietPortForward(base):
        def _proxy(self) -> None:
            # lazy: docs/architecture.md#imports-kept-inside-functions
            from .relay import relay

            try:
                relay(self.websocket, list(self.local_ports.values()))
            except Exception as exc:  # noqa: BLE001 - a dropped stream: its local side closes
                log.debug("port-forward stream ended: %s: %s", type(exc).__name__, exc)
                for port in self.local_ports.values():
                    _close(port.python)
                try:
                    self.websocket.close()
                except Exception:  # noqa: BLE001, S110 - it is gone already
                    pass

    return QuietPortForward


def _pump(local: socket.socket, remote, closed: threading.Event) -> str:
    """Copy bytes both ways until one side ends: 'local' or 'remote' (who ended first)."""
    selector = selectors.DefaultSelector()
    selector.register(local, selectors.EVENT_READ, remote)
    selector.register(remote, selectors.EVENT_READ, local)
    try:
        while not closed.is_set():
            for key, _ in selector.select(timeout=1.0):
                try:
                    data = key.fileobj.recv(BUFFER)
                except OSError:
                    data = b""
                if not data:
                    return "local" if key.fileobj is local else "remote"
                try:
                    key.data.sendall(data)
                except OSError:
                    return "remote" if key.fileobj is local else "local"
        return "local"
    finally:
        selector.close()


def _close(sock) -> None:
    try:
        sock.close()
    except OSError:
        pass
