"""An output sink for tests: a cell's streams and displays, collected as text."""

from __future__ import annotations

from gpusession.transport.kernel.sink import OutputSink


class Collect(OutputSink):
    def __init__(self):
        self.text = ""

    def stream(self, name, text):
        self.text += text

    def display(self, data, metadata, transient=None, update=False):
        self.text += data.get("text/plain", "")
