"""Talking to the session kernel with jupyter_client: execute with live output, interrupt, move
variables, shut down.

Output is re-published into the notebook as it arrives (stream text is written and flushed piece
by piece, display data goes through IPython's display publisher), so a loop's prints show before
the loop ends; through a tunnel that drops, every output still arrives exactly once and in order,
or one line names exactly which did not (`cellwait`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .sink import NullSink, OutputSink

if TYPE_CHECKING:
    from .client import KernelClient

__all__ = ["KernelClient", "OutputSink", "NullSink"]


def __getattr__(name: str):
    """KernelClient (jupyter_client, zmq) loads on first use: `files`, say, needs neither."""
    if name == "KernelClient":
        # lazy: docs/architecture.md#imports-kept-inside-functions
        from .client import KernelClient

        return KernelClient
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
