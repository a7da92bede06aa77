"""In the session kernel: number every output of a cell and keep it a while, so that a client that
lost part of it in a tunnel cut gets exactly that part again (`gpusession.transport.kernel.cellwait`).

Installed by the kernel extension (`gpusession.agent.activity`). It wraps the kernel's
`Session.send`, which every message the kernel sends passes through (stdout and stderr from the
IOPub thread; display data, results, errors and status from the shell thread):

- each output (`protocol.OUTPUT_MSG_TYPES`) of an execute request gets `META_SEQ` = 1, 2, ... in
  its message metadata, in the order the program made them;
- the request's execute_reply and final idle status carry `META_OUTPUTS` (how many there were),
  and kernel_info_reply carries `META_CELL_LOG`, so a client knows this kernel keeps the log;
- a control request `CELL_LOG_REQUEST` {"msg_id", "since"} is answered at once, even while a cell
  runs (control has its own thread): the cell's state (unknown: the request never arrived;
  started; done), its output count, the outputs numbered `since` and later that are still kept,
  and its reply once done.

Memory is bounded: the newest MAX_CELLS cells, at most MAX_BYTES of output in all (the oldest
outputs go first; a client asking for one is told exactly which were not kept), and a reply is
kept only when it is small (a `%gpu pull` reply is not).
"""

from __future__ import annotations

import collections
import threading
from typing import Any

from ..core.kernelwire import (
    CELL_LOG_REPLY,
    CELL_LOG_REQUEST,
    META_CELL_LOG,
    META_OUTPUTS,
    META_SEQ,
    OUTPUT_MSG_TYPES,
)

MAX_BYTES = 32 * 1024 * 1024
MAX_CELLS = 16
MAX_REPLY_BYTES = 1024 * 1024
MAX_ANSWER_BYTES = 4 * 1024 * 1024  # per control reply: a client asks again for the rest
VERSION = 1


def _weight(obj: Any, depth: int = 0) -> int:
    """About how many bytes `obj` takes as JSON, without serializing it."""
    if isinstance(obj, str):
        return len(obj)
    if depth > 4:
        return 64
    if isinstance(obj, dict):
        return sum(len(str(k)) + _weight(v, depth + 1) for k, v in obj.items()) + 2
    if isinstance(obj, (list, tuple)):
        return sum(_weight(v, depth + 1) for v in obj) + 2
    return 16


class _Cell:
    __slots__ = ("state", "count", "outputs", "reply")

    def __init__(self) -> None:
        self.state = "started"
        self.count = 0  # outputs numbered so far
        self.outputs: collections.deque = collections.deque()  # (seq, msg_type, content, weight)
        self.reply: dict | None = None


class CellLog:
    """Thread-safe: `note` runs in the shell and IOPub threads, `answer` in the control thread."""

    def __init__(self, max_bytes: int = MAX_BYTES, max_cells: int = MAX_CELLS):
        self.max_bytes = max_bytes
        self.max_cells = max_cells
        self._cells: collections.OrderedDict[str, _Cell] = collections.OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def note(self, msg: dict) -> None:
        """Called for every message the kernel sends, before it is serialized: numbers outputs
        (adds to its metadata) and remembers them."""
        kind = msg.get("msg_type") or msg.get("header", {}).get("msg_type")
        if kind == "kernel_info_reply":
            msg.setdefault("metadata", {})[META_CELL_LOG] = VERSION
            return
        parent = msg.get("parent_header") or {}
        if parent.get("msg_type") != "execute_request" or not parent.get("msg_id"):
            return
        if kind not in OUTPUT_MSG_TYPES and kind not in ("status", "execute_reply"):
            return
        msg_id = parent["msg_id"]
        metadata = msg.setdefault("metadata", {})
        with self._lock:
            cell = self._cells.get(msg_id)
            if cell is None:
                cell = self._cells[msg_id] = _Cell()
                self._forget_old_cells()
            if kind in OUTPUT_MSG_TYPES:
                cell.count += 1
                metadata[META_SEQ] = cell.count
                weight = _weight(msg["content"])
                cell.outputs.append((cell.count, kind, msg["content"], weight))
                self._bytes += weight
                self._trim()
            elif kind == "execute_reply":
                content = msg["content"]
                if _weight(content) <= MAX_REPLY_BYTES:
                    cell.reply = content
                else:
                    cell.reply = {
                        "status": content.get("status"),
                        "gpusession_reply_not_kept": True,
                    }
                cell.state = "done"
                metadata[META_OUTPUTS] = cell.count
            elif msg["content"].get("execution_state") == "idle":
                metadata[META_OUTPUTS] = cell.count

    def answer(self, msg_id: str, since: int = 1) -> dict:
        """What the client asks for by CELL_LOG_REQUEST."""
        with self._lock:
            cell = self._cells.get(msg_id)
            if cell is None:
                return {
                    "state": "unknown",
                    "outputs_total": 0,
                    "first_kept": 1,
                    "outputs": [],
                    "reply": None,
                }
            first_kept = cell.outputs[0][0] if cell.outputs else cell.count + 1
            outputs, size = [], 0
            for seq, kind, content, weight in cell.outputs:
                if seq < since:
                    continue
                if outputs and size + weight > MAX_ANSWER_BYTES:
                    break
                outputs.append({"seq": seq, "msg_type": kind, "content": content})
                size += weight
            return {
                "state": cell.state,
                "outputs_total": cell.count,
                "first_kept": first_kept,
                "outputs": outputs,
                "reply": cell.reply,
            }

    def _trim(self) -> None:
        """Drop the oldest outputs (oldest cell first) until the log fits."""
        for cell in self._cells.values():
            while self._bytes > self.max_bytes and cell.outputs:
                self._bytes -= cell.outputs.popleft()[3]
            if self._bytes <= self.max_bytes:
                return

    def _forget_old_cells(self) -> None:
        while len(self._cells) > self.max_cells:
            _, cell = self._cells.popitem(last=False)
            self._bytes -= sum(o[3] for o in cell.outputs)


def install(kernel, log: CellLog | None = None) -> CellLog:
    """Wrap `kernel.session.send` and answer CELL_LOG_REQUEST on the control channel."""
    log = log or CellLog()
    session = kernel.session
    original = session.send

    def send(
        stream,
        msg_or_type,
        content=None,
        parent=None,
        ident=None,
        buffers=None,
        track=False,
        header=None,
        metadata=None,
    ):
        if isinstance(msg_or_type, str):
            msg_or_type = session.msg(
                msg_or_type, content=content, parent=parent, header=header, metadata=metadata
            )
        try:
            log.note(msg_or_type)
        except Exception:  # noqa: BLE001 - the log must never keep a message from going out
            pass
        return original(stream, msg_or_type, ident=ident, buffers=buffers, track=track)

    def on_request(stream, ident, parent):
        request = parent.get("content") or {}
        try:
            since = max(1, int(request.get("since", 1)))
        except (TypeError, ValueError):
            since = 1
        answer = log.answer(str(request.get("msg_id", "")), since)
        original(stream, session.msg(CELL_LOG_REPLY, answer, parent), ident=ident)

    session.send = send
    kernel.control_handlers[CELL_LOG_REQUEST] = on_request
    kernel.gpusession_cell_log = log  # for a look from inside the kernel (tests)
    return log
