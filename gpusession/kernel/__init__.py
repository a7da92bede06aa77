"""Talking to the session kernel with jupyter_client: execute with live output, interrupt, move
variables, shut down.

Output is re-published into the notebook as it arrives (stream text is written and flushed piece
by piece, display data goes through IPython's display publisher), so a loop's prints show before
the loop ends; through a tunnel that drops, every output still arrives exactly once and in order,
or one line names exactly which did not (`cellwait`).
"""

from .client import KernelClient
from .sink import NullSink, OutputSink

__all__ = ["KernelClient", "OutputSink", "NullSink"]
