"""A real notebook kernel driven like a notebook front end drives it, recording when each
output arrives (to prove streaming) and offering the stop button (SIGINT)."""

from __future__ import annotations

import dataclasses
import os
import queue
import shutil
import tempfile
import time
from typing import Callable

from jupyter_client.manager import KernelManager


@dataclasses.dataclass
class CellRun:
    reply: dict
    outputs: list[tuple[float, str, dict]]  # (seconds since send, msg_type, content)
    sent_at: float
    replied_at: float

    @property
    def status(self) -> str:
        return self.reply["status"]

    @property
    def text(self) -> str:
        parts = []
        for _, kind, content in self.outputs:
            if kind == "stream":
                parts.append(content["text"])
            elif kind in ("display_data", "execute_result"):
                parts.append(content["data"].get("text/plain", ""))
            elif kind == "error":
                parts.append(
                    f"{content['ename']}: {content['evalue']}\n" + "\n".join(content["traceback"])
                )
        return "".join(parts)

    @property
    def error(self) -> dict | None:
        """The error a person sees: an error output, or (UsageError, shown as one stderr line)
        the reply's ename/evalue."""
        found = next((c for _, k, c in self.outputs if k == "error"), None)
        if found is None and self.reply.get("status") == "error":
            found = {k: self.reply.get(k) for k in ("ename", "evalue", "traceback")}
            shown = "".join(
                c["text"] for _, k, c in self.outputs if k == "stream" and c["name"] == "stderr"
            )
            assert found["evalue"] in shown, "the message must be shown in the notebook"
        return found

    def stream_times(self, needle: str) -> list[float]:
        return [t for t, k, c in self.outputs if k == "stream" and needle in c["text"]]


class NotebookKernel:
    def __init__(self, env: dict[str, str], cwd: str | None = None, python: str | None = None):
        """`python`: the kernel's interpreter (another environment's); default: this one's.

        The kernel listens on unix sockets in a folder of its own, not on TCP ports: jupyter_client
        picks free ports, closes them and writes them down, and on a loaded run another worker's
        process took one before the kernel bound it, twice: the kernel died ("Address already in
        use"), and once another kernel's socket answered on the port, so the client's first
        message blocked (a ZMQ handshake refused leaves the shell socket with no peer) and the
        test hung for its whole timeout. How a notebook reaches its own kernel is not what a
        test here tests; the product's kernels are started by the product."""
        self._sockets = tempfile.mkdtemp(prefix="gsnk-")  # 0700; short: a unix socket's path
        self.km = KernelManager(
            kernel_name="python3", transport="ipc", ip=os.path.join(self._sockets, "k")
        )
        if python is not None:
            from jupyter_client.kernelspec import KernelSpec

            self.km._kernel_spec = KernelSpec(
                argv=[python, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                display_name="python3",
                language="python",
            )
        self.km.start_kernel(env=env, cwd=cwd or os.getcwd())
        self.kc = self.km.client()
        self.kc.start_channels()
        try:
            self.kc.wait_for_ready(timeout=60)
        except RuntimeError:
            self.kc.stop_channels()
            self.km.shutdown_kernel(now=True)
            shutil.rmtree(self._sockets, ignore_errors=True)
            raise
        self.elsewhere: list[tuple[str | None, dict]] = []  # (its cell's msg_id, content)

    @property
    def pid(self) -> int:
        """The kernel's process (SIGSTOP freezes the notebook as a sleeping laptop does)."""
        return self.km.provisioner.pid  # type: ignore[union-attr]

    def run(
        self,
        code: str,
        timeout: float = 120,
        interrupt_after: float | None = None,
        interrupt_when: Callable[[], bool] | None = None,
    ) -> CellRun:
        """Run a cell; interrupt it (as the stop button does) `interrupt_after` seconds after it
        was sent, or as soon as `interrupt_when()` says so (asked every 0.1 s while it runs)."""
        return self.wait(self.send(code), timeout, interrupt_after, interrupt_when)

    def send(self, code: str) -> tuple[str, float]:
        """Send a cell (a frozen kernel finds it queued when it wakes); `wait` for its end."""
        return self.kc.execute(code), time.monotonic()

    def wait(
        self,
        sent_cell: tuple[str, float],
        timeout: float = 120,
        interrupt_after: float | None = None,
        interrupt_when: Callable[[], bool] | None = None,
    ) -> CellRun:
        """The outputs and reply of a cell `send` sent. Outputs of other cells (a notice printed
        under an older cell) are kept in `elsewhere`."""
        msg_id, sent = sent_cell
        outputs: list[tuple[float, str, dict]] = []
        interrupted = False
        deadline = sent + timeout
        while True:
            due = (interrupt_after is not None and time.monotonic() - sent > interrupt_after) or (
                interrupt_when is not None and interrupt_when()
            )
            if due and not interrupted:
                self.km.interrupt_kernel()  # what the notebook's stop button does
                interrupted = True
            try:
                msg = self.kc.get_iopub_msg(timeout=0.1)
            except queue.Empty:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"cell did not finish within {timeout}s: {msg_id}")
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                if msg["msg_type"] in ("stream", "display_data", "error"):
                    self.elsewhere.append((msg["parent_header"].get("msg_id"), msg["content"]))
                continue
            kind = msg["msg_type"]
            if kind == "execute_input":
                continue
            if kind == "status":
                if msg["content"]["execution_state"] == "idle":
                    break
                continue
            outputs.append((time.monotonic() - sent, kind, msg["content"]))
        reply = self.kc.get_shell_msg(timeout=10)
        while reply["parent_header"].get("msg_id") != msg_id:
            reply = self.kc.get_shell_msg(timeout=10)
        return CellRun(
            reply=reply["content"], outputs=outputs, sent_at=sent, replied_at=time.monotonic()
        )

    def close(self) -> None:
        try:
            self.run("%gpu stop --all", timeout=60)
        except Exception:  # noqa: BLE001 - best effort before shutting the kernel
            pass
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)
        shutil.rmtree(self._sockets, ignore_errors=True)
