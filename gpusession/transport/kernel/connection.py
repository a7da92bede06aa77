"""What a cell's wait (`cellwait`) and a transfer (`channel`, `transfer`) use of one connection
to a session kernel: `KernelClient` is one; they take this narrow shape, not the client module,
so the client imports them and nothing imports it back."""

from __future__ import annotations

from typing import Any, Callable, Collection, Optional, Protocol


def went_idle(msg: dict, requests: Collection[str]) -> bool:
    """An iopub message saying the kernel is done with one of `requests` (their message ids)."""
    return (
        msg["msg_type"] == "status"
        and msg["parent_header"].get("msg_id") in requests
        and msg["content"].get("execution_state") == "idle"
    )


class Connection(Protocol):
    client: Any  # jupyter_client's BlockingKernelClient: its channels and message getters
    cell_log: bool  # the kernel keeps a cell log (gpusession.agent.cellog)
    counts: dict[str, int]  # what the waits met on this connection (the fault suite's figures)
    # a connection to a socket beside the kernel's (None: none; downloads as ZMQ frames)
    open_stream: Optional[Callable[[str], Any]]

    def healthy(self) -> bool:
        """The session still runs (may raise the session's LinkLost)."""

    def reconnects(self) -> int:
        """How often the link reconnected so far."""

    def interrupt(self) -> None:
        """interrupt_request on the control channel."""
