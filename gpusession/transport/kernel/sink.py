"""Where a remote cell's output goes: the notebook's display system by default."""

from __future__ import annotations

import sys
from typing import Any


class OutputSink:
    """Where remote output goes. The default writes into the current IPython display system."""

    def stream(self, name: str, text: str) -> None:
        target = sys.stderr if name == "stderr" else sys.stdout
        target.write(text)
        target.flush()

    def display(
        self, data: dict, metadata: dict, transient: dict | None = None, update: bool = False
    ) -> None:
        from IPython.display import publish_display_data

        kwargs: dict[str, Any] = {"data": data, "metadata": metadata}
        if transient:
            kwargs["transient"] = transient
        if update:
            kwargs["update"] = True
        publish_display_data(**kwargs)

    def clear(self, wait: bool) -> None:
        from IPython.display import clear_output

        clear_output(wait=wait)


class NullSink(OutputSink):
    def stream(self, name: str, text: str) -> None:
        pass

    def display(self, data, metadata, transient=None, update=False) -> None:
        pass

    def clear(self, wait: bool) -> None:
        pass


def show(sink: OutputSink, kind: str, content: dict) -> None:
    """One output message (not `error`: that becomes the cell's RemoteError) into `sink`."""
    if kind == "stream":
        sink.stream(content["name"], content["text"])
    elif kind in ("display_data", "execute_result"):
        sink.display(content["data"], content.get("metadata", {}), content.get("transient"))
    elif kind == "update_display_data":
        sink.display(
            content["data"], content.get("metadata", {}), content.get("transient"), update=True
        )
    elif kind == "clear_output":
        sink.clear(content.get("wait", False))
