"""One connection to a session kernel with jupyter_client: wait for it, execute (the wait itself
is `cellwait.CellWait`), interrupt, move variables, shut down."""

from __future__ import annotations

import atexit
import logging
import queue
import threading
import time
import weakref
from typing import Any, Callable

import zmq
from jupyter_client.blocking.client import BlockingKernelClient

from ...core.errors import KernelDied, RemoteError
from ...core.protocol import META_CELL_LOG
from . import transfer_client
from .cellwait import CellWait
from .connection import went_idle
from .sink import NullSink, OutputSink

_OPEN_CLIENTS: "weakref.WeakSet[KernelClient]" = weakref.WeakSet()
DRAIN_S = 0.05  # wait_ready's read of iopub after the kernel's first answer, at most
END_WAIT_S = 5.0  # close()'s wait for its ZMQ context to end, at most (_end_context)
log = logging.getLogger(__name__)


@atexit.register
def _close_open_clients() -> None:
    """A ZMQ socket left open makes interpreter exit hang on context termination."""
    for client in list(_OPEN_CLIENTS):
        client.close()


def _release(client: BlockingKernelClient, context: zmq.Context) -> None:
    """Close the channels' sockets, then the context (in this order, or term() blocks)."""
    try:
        client.stop_channels()
    finally:
        _end_context(context)


def _end_context(context: zmq.Context) -> None:
    """The context's end (`destroy(linger=0)`: what is still open closes without waiting on
    anything unsent, then libzmq's term), waited for END_WAIT_S at most, in a thread of its own.
    Once, in CI, term did not return although every socket of ours had closed (the kubernetes
    link, its kernel shut down a moment before; not seen again, cause not found): the stop
    waited there until pytest's timeout. Past the wait the context ends in the background (its
    I/O thread kept, at worst, until the process exits) and the caller goes on."""
    ending = threading.Thread(
        target=context.destroy, kwargs={"linger": 0}, name="gpusession-zmq-end", daemon=True
    )
    try:
        ending.start()
    except RuntimeError:  # the interpreter is shutting down: no new thread, end it here
        context.destroy(linger=0)
        return
    ending.join(END_WAIT_S)
    if ending.is_alive():
        log.debug(
            "a kernel connection's ZMQ context did not end in %.1f s: left to end", END_WAIT_S
        )


class KernelClient:
    """One connection to one session kernel. Owns its ZMQ context, so closing it never
    waits on another connection's sockets."""

    def __init__(
        self,
        connection_info: dict,
        *,
        healthy: Callable[[], bool] | None = None,
        reconnects: Callable[[], int] | None = None,
        open_stream: Callable[[str], Any] | None = None,
    ):
        self._context = zmq.Context()
        # never block on unsent messages when closing (or when the GC or interpreter exit
        # terminates the context): a dead peer would otherwise hang us forever
        self._context.setsockopt(zmq.LINGER, 0)
        self.client = BlockingKernelClient(context=self._context)
        self.client.load_connection_info(connection_info)
        self.client.start_channels(hb=False)
        self.healthy: Callable[[], bool] = healthy or (
            lambda: True
        )  # may raise (the session's LinkLost)
        self.reconnects: Callable[[], int] = reconnects or (
            lambda: 0
        )  # how often the link reconnected
        # a socket beside the kernel's (its link's open_stream): downloads come on it
        self.open_stream = open_stream
        self.cell_log = (
            False  # the kernel keeps a cell log (gpusession.agent.cellog): known at wait_ready
        )
        # what the cell waits met on this connection (for the fault suite's figures)
        self.counts = {
            "outputs_recovered": 0,
            "outputs_named_lost": 0,
            "replies_recovered": 0,
            "requests_lost": 0,
        }
        self._closed = False
        _OPEN_CLIENTS.add(self)
        # Dropped without close() (its session stopped by another process, say), this client is
        # collected with its Session in a reference cycle; the GC clears the context's weak list
        # of sockets first, and Context.__del__'s term() then waits forever for sockets nobody
        # closes. The finalizer holds client and context and closes them in order instead.
        self._release = weakref.finalize(self, _release, self.client, self._context)

    # -- life -----------------------------------------------------------------------------

    def wait_ready(self, timeout: float = 60.0) -> dict:
        """Until the kernel answers kernel_info (ZMQ reconnects by itself while ports come up)."""
        deadline = time.monotonic() + timeout
        while True:
            msg_id = self.client.kernel_info()
            try:
                reply = self._reply(
                    self.client.get_shell_msg,
                    msg_id,
                    timeout=min(2.0, max(0.1, deadline - time.monotonic())),
                )
                self.cell_log = META_CELL_LOG in (reply.get("metadata") or {})
                self._drain_iopub(msg_id)
                return reply["content"]
            except queue.Empty:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"kernel did not answer within {timeout:.0f}s") from None
                if not self.healthy():
                    raise KernelDied("the session kernel exited while starting") from None

    def _drain_iopub(self, msg_id: str) -> None:
        """Read iopub up to the kernel_info request's idle status, which comes right after its
        reply (then iopub is connected, and later reads start clean), DRAIN_S at most where it
        does not come; then what is there already. Waiting out DRAIN_S of quiet cost every
        start and restart that long."""
        deadline = time.monotonic() + DRAIN_S
        while True:
            try:
                msg = self.client.get_iopub_msg(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                return
            if went_idle(msg, (msg_id,)):
                deadline = 0.0  # the rest without waiting

    def _reply(self, getter, msg_id: str, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            msg = getter(timeout=max(0.0, deadline - time.monotonic()))
            if msg["parent_header"].get("msg_id") == msg_id:
                return msg

    @property
    def closed(self) -> bool:
        """close() was called: its channels are gone, nothing can be sent on them."""
        return self._closed

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        _OPEN_CLIENTS.discard(self)
        self._release()

    def shutdown(self, timeout: float = 5.0) -> bool:
        """Ask the kernel to exit and wait for its reply (so it does not keep running)."""
        msg = self.client.session.msg("shutdown_request", {"restart": False})
        self.client.control_channel.send(msg)
        try:
            self._reply(self.client.get_control_msg, msg["header"]["msg_id"], timeout)
            return True
        except queue.Empty:
            return False

    def interrupt(self) -> None:
        """interrupt_request on the control channel: the kernel SIGINTs its own process group.
        Works the same through a tunnel, where no signal could reach the process."""
        msg = self.client.session.msg("interrupt_request", {})
        self.client.control_channel.send(msg)

    # -- execution ------------------------------------------------------------------------

    def execute(
        self,
        code: str,
        *,
        sink: OutputSink | None = None,
        silent: bool = False,
        user_expressions: dict | None = None,
        store_history: bool = True,
        interrupt_grace: float = 10.0,
        health_every: float = 1.0,
    ) -> dict:
        """Run `code`, forwarding output as it comes. Returns the execute_reply content.

        Raises RemoteError for an exception in the remote code (its traceback renders in the
        notebook), KeyboardInterrupt after forwarding a local interrupt, CellLost when the request
        never reached the kernel, KernelDied when the kernel stops answering, and whatever the
        `healthy` callable raises (the session's LinkLost: the link gave up).
        """
        msg_id = self.client.execute(
            code,
            silent=silent,
            store_history=store_history and not silent,
            user_expressions=user_expressions or {},
            allow_stdin=False,
        )
        return CellWait(
            self,
            msg_id,
            sink or OutputSink(),
            interrupt_grace=interrupt_grace,
            health_every=health_every,
        ).wait()

    def evaluate(self, expression: str, setup: str = "") -> str:
        """Run `setup` silently and return repr-text of `expression` (user_expressions)."""
        reply = self.execute(
            setup or "pass", silent=True, user_expressions={"v": expression}, sink=NullSink()
        )
        value = reply["user_expressions"]["v"]
        if value.get("status") != "ok":
            raise RemoteError(
                value.get("ename", "Error"), value.get("evalue", ""), value.get("traceback", [])
            )
        return value["data"]["text/plain"]

    # -- variables ------------------------------------------------------------------------

    def push(self, namespace: dict[str, Any], progress=None) -> None:
        """Send local variables (pickled) into the session kernel's namespace, as binary frames
        (gpusession.transport.kernel.transfer_client)."""
        transfer_client.push(self, namespace, progress)

    def pull(self, names: list[str], progress=None) -> dict[str, Any]:
        """Fetch variables (pickled) from the session kernel's namespace."""
        return transfer_client.pull(self, names, progress)
