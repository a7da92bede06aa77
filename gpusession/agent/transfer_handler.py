"""In the session kernel: bulk bytes between the notebook and the session as ZMQ binary frames on
the kernel's own shell channel (no new port, no base64, no JSON of the payload).

The client (`gpusession.transport.kernel.transfer_client`) sends TRANSFER_REQUEST messages; each
gets one TRANSFER_REPLY, in order, so the client keeps a few requests in flight (its window):

- {"op": "open", "id", "kind": "push"|"upload", ...}, then {"op": "data", "id", "last"} with the
  bytes in the message's `buffers`; the reply to the last one says what was done;
- {"op": "open", "id", "kind": "pull"|"download", ...}, then {"op": "read", "id"} answered with
  the next bytes in the reply's `buffers` and "eof" once all were sent;
- {"op": "abort", "id"} drops a transfer a client gave up on.

A download's open may say `raw`: a kernel on unix sockets then sends the bytes on a socket of
their own (`gpusession.agent.transfer_raw`), and {"op": "end", "id", "size"} asks whether the
client holds the whole stream (its size and CRC-32) or should connect again (`more`).

push/pull: variables, pickled one by one (names with their sizes, so each failure names its
variable). upload/download: a tar stream of files, paths relative to the kernel's working
directory and never outside it. Every request counts as kernel activity for the idle watchdog.
Installed by the kernel extension (`gpusession.agent.activity`). Standard library only; Python
3.9 syntax.
"""

from __future__ import annotations

import collections
import os
import time
from typing import Any, Callable

from ..core.kernelwire import TRANSFER_REPLY, TRANSFER_REQUEST
from .transfer_kinds import Push, TransferError, Upload, open_download, open_pull
from .transfer_raw import RAW_PART, RawStream, raw_listener

MAX_OPEN = 8  # transfers open at once; older ones are dropped
KEEP_FINISHED = 16  # the last answers of finished transfers, for requests sent again after a cut
STALE_S = 600.0  # an open transfer untouched this long was left by a client that went away
RESUME = 1  # said in the open reply: requests sent again (by their seq) are answered again


class Transfers:
    """The open transfers of one kernel, by id. Every request but `open` carries its number in
    the transfer (`seq`): a request sent again after a tunnel cut lost it (or its reply) gets the
    same answer, and one that arrives before an earlier, lost one is answered `ahead` (the client
    sends from the first unanswered one again)."""

    def __init__(self, kernel, touch: Callable[[], None]) -> None:
        self.kernel = kernel
        self.touch = touch
        self.open: dict = {}
        self.finished: "collections.OrderedDict[str, Any]" = (
            collections.OrderedDict()
        )  # their last answers

    def ns(self) -> dict:
        return self.kernel.shell.user_ns

    def handle(self, stream, ident, parent) -> None:
        request = parent.get("content") or {}
        buffers = parent.get("buffers") or []
        self.touch()
        tid = str(request.get("id", ""))
        try:
            content, out = self._answer(tid, request, buffers)
        except TransferError as exc:
            content, out = self._fail(tid, str(exc)), []
        except Exception as exc:  # noqa: BLE001 - the client must get an answer, never a hang
            content, out = self._fail(tid, f"{type(exc).__name__}: {exc}"), []
        content["seq"] = request.get("seq")
        self.kernel.session.send(stream, TRANSFER_REPLY, content, parent, ident=ident, buffers=out)

    def _fail(self, tid: str, message: str) -> dict:
        """The transfer ends; asked again (its reply lost in a cut), it says the same."""
        content = {"status": "error", "message": message}
        self._drop(tid)
        self._finish(tid, content)
        return dict(content)

    def _finish(self, tid: str, final: dict) -> None:
        self.open.pop(tid, None)
        self.finished[tid] = final
        while len(self.finished) > KEEP_FINISHED:
            self.finished.popitem(last=False)

    def _drop(self, tid: str) -> None:
        transfer = self.open.pop(tid, None)
        if transfer is not None:
            transfer.close()

    def _answer(self, tid: str, request: dict, buffers: list) -> tuple[dict, list]:
        op = request.get("op")
        chunk = int(request.get("chunk") or (4 << 20))
        if op == "abort":
            self._drop(tid)
            return {"status": "ok"}, []
        final = self.finished.get(tid)
        if final is not None and (final.get("status") == "error" or op != "open"):
            return dict(final), []  # asked again: the end it had
        if op == "open":
            return self._open(tid, request, chunk), []
        transfer = self.open.get(tid)
        if transfer is None:
            raise TransferError("this transfer is not open in the session (the kernel restarted?)")
        transfer.touched = time.monotonic()
        seq = request.get("seq")
        seq = transfer.next_seq if seq is None else int(seq)
        if op == "data":
            if seq < transfer.next_seq:
                return {"status": "ok", "again": True}, []  # it arrived before; its reply was lost
            if seq > transfer.next_seq:
                return {"status": "ok", "ahead": True, "expected": transfer.next_seq}, []
            transfer.next_seq += 1
            last = bool(request.get("last"))
            result = transfer.feed(
                buffers[0] if buffers else b"", last, request.get("crc"), request.get("size")
            )
            if result is not None and "error" in result:
                raise TransferError(result["error"])
            if last:
                self._finish(tid, dict(result or {}, status="ok"))
            return dict(result or {}, status="ok"), []
        if op == "end":
            return self._end(tid, transfer, int(request.get("size") or 0)), []
        if op == "read":
            part, eof = transfer.part(seq, int(request.get("acked") or 0))
            content = {"status": "ok", "eof": eof}
            if eof:
                content.update(crc=transfer.check.crc, size=transfer.check.size)
            return content, [part] if len(part) else []
        raise TransferError(f"unknown transfer request {op!r}")

    def _end(self, tid: str, transfer: Any, size: int) -> dict:
        raw = getattr(transfer, "raw", None)
        if raw is None:
            raise TransferError("this transfer has no raw stream")
        content = raw.end(size)
        if "error" in content:
            raise TransferError(content["error"])
        content["status"] = "ok"
        if content.get("eof"):  # the client holds it all: the transfer ends here
            self._drop(tid)
            self._finish(tid, content)
        return dict(content)

    def _open(self, tid: str, request: dict, chunk: int) -> dict:
        if tid in self.open:  # sent again: its reply was lost
            return dict(self.open[tid].info)
        now = time.monotonic()
        for stale in [t for t, tr in self.open.items() if now - tr.touched > STALE_S]:
            self._drop(stale)  # left by clients that went away (a cut that never came back)
        for stale in list(self.open)[: -MAX_OPEN + 1] if len(self.open) >= MAX_OPEN else []:
            self._drop(stale)  # the oldest
        kind = request.get("kind")
        cwd = os.getcwd()
        info: dict = {}
        if kind == "push":
            transfer: Any = Push(self.ns(), list(request["names"]), list(request["sizes"]))
        elif kind == "upload":
            transfer = Upload(cwd, str(request.get("to") or "."))
            info = {"dest": transfer.dest}
        elif kind == "pull":
            transfer, info = open_pull(self.ns(), list(request["names"]), chunk)
        elif kind == "download":
            raw = raw_listener() if request.get("raw") else None
            # on a socket of its own, each part the tar thread writes goes as it is (no join)
            transfer, info = open_download(
                cwd, list(request["paths"]), chunk if raw is None else RAW_PART
            )
            if raw is not None:  # the bytes on a socket of their own, beside the kernel's
                transfer.raw = RawStream(transfer, raw, self.touch)
                info.update(transfer.raw.info())
        else:
            raise TransferError(f"unknown transfer kind {kind!r}")
        first = request.get("seq")  # the transfer's requests are numbered on from its open's
        transfer.touched, transfer.next_seq = now, 0 if first is None else int(first) + 1
        transfer.info = dict(info, status="ok", cwd=cwd, resume=RESUME)
        self.open[tid] = transfer
        return dict(transfer.info)


def install(kernel, touch: Callable[[], None]) -> Transfers:
    transfers = Transfers(kernel, touch)
    kernel.shell_handlers[TRANSFER_REQUEST] = transfers.handle
    return transfers
