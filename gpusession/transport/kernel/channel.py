"""One transfer's requests and replies on a session kernel's shell channel, numbered so that
those a tunnel cut lost are sent again (the kernel side: `gpusession.agent.transfer_handler`)."""

from __future__ import annotations

import collections
import queue
import time
import uuid
from typing import Callable

from ...core.errors import BadInput, KernelDied, TransferStopped
from ...core.protocol import TRANSFER_REPLY, TRANSFER_REQUEST
from .connection import Connection, went_idle

CHUNK = 4 << 20
WINDOW = (
    8  # 32 MiB in flight: at 4 a single big download sometimes stalled to ~250 MB/s (bench_data.py)
)
RESEND_AFTER_CUT_S = 1.0  # after the link came back, unanswered requests go again this much later
SILENT_S = (
    15.0  # no reply this long on a live link: the request goes again (a loss no reconnect showed)
)
STALL_S = 120.0  # no answer at all this long: the transfer ends, said
ABORT_WAIT_S = 2.0  # on the way out, how long the kernel's word on an abort is waited for
Progress = Callable[[int, "int | None"], None]


def _none(done: int, total: int | None) -> None:
    pass


class Channel:
    """One transfer's requests and their in-order replies on the kernel's shell channel. Each
    request carries its number (`seq`); a tunnel cut can lose requests or replies, and those
    not answered are sent again once the link is back (the kernel answers a request sent again
    the same way, and holds back none: gpusession.agent.transfer_handler). The wait ends with the
    reply, with one line why (the link gave up, the kernel died, no answer for STALL_S), never
    in a hang."""

    def __init__(self, kc: Connection, progress: Progress | None, verb: str = "transfer"):
        self.kc = kc
        self.id = uuid.uuid4().hex
        self.verb = verb
        self.report = progress or _none
        self.at: tuple[int, int | None] = (
            0,
            None,
        )  # the bytes moved, of how many (for the words on a stop)
        self.seq = 0
        self.waiting: collections.OrderedDict[int, tuple[dict, list]] = (
            collections.OrderedDict()
        )  # unanswered
        self.ids: dict[str, tuple[int, float]] = {}  # msg_id -> (seq, sent at)
        self.last_sent: dict[int, float] = {}  # seq -> when it was last sent
        self.resume = False  # the kernel answers requests sent again (said in its open reply)
        self.unsupported = False
        self.early: dict[int, dict] = {}  # answers that came before an older request's
        self.reconnects = kc.reconnects()
        self.heard = time.monotonic()  # the last answer (or the last time the link came back)
        self.cut_at: float | None = (
            None  # when the link was seen back after a cut, until requests go again
        )
        self.idle_at: float | None = (
            None  # when iopub said the kernel was done with the open request
        )

    def progress(self, done: int, total: int | None) -> None:
        self.at = (done, total)
        self.report(done, total)

    def send(self, content: dict, buffers: list | None = None) -> int:
        seq, self.seq = self.seq, self.seq + 1
        self.waiting[seq] = (dict(content, id=self.id, chunk=CHUNK, seq=seq), buffers or [])
        self._send(seq)
        return seq

    def _send(self, seq: int) -> None:
        client = self.kc.client
        content, buffers = self.waiting[seq]
        msg = client.session.send(
            client.shell_channel.socket, TRANSFER_REQUEST, content, buffers=buffers or None
        )
        now = time.monotonic()
        self.ids[msg["header"]["msg_id"]] = (seq, now)
        self.last_sent[seq] = now

    def _again(self) -> None:
        """Every unanswered request once more, in order (after a cut lost some of them)."""
        if not self.resume and self.seq > 1:
            raise TransferStopped(
                f"the link to the session dropped during the {self.verb}, and this session's "
                "runtime cannot resume a transfer; run it again"
            )
        for seq in [s for s in self.waiting if s not in self.early]:
            self._send(seq)

    def reply(self) -> dict:
        """The reply to the oldest request in flight (others' replies are skipped)."""
        while True:
            want = next(iter(self.waiting))
            if want in self.early:
                del self.waiting[want]
                return self.early.pop(want)
            try:
                msg = self.kc.client.get_shell_msg(timeout=0.5)
            except queue.Empty:
                self._quiet(want)
                continue
            seq, sent_at = self.ids.pop(msg["parent_header"].get("msg_id"), (None, 0.0))
            if (
                seq is None
                or msg["msg_type"] != TRANSFER_REPLY
                or seq not in self.waiting
                or seq in self.early
            ):
                continue
            self.heard = time.monotonic()
            content = msg["content"]
            if content.get("ahead"):  # an earlier request was lost (in order, so before this one)
                if self.last_sent[want] < sent_at:
                    self._again()
                continue
            if content.get("status") != "ok":
                raise BadInput(content.get("message") or "the transfer failed in the session")
            if seq == 0:
                self.resume = bool(content.get("resume"))
            content["buffers"] = msg.get("buffers") or []
            self.early[seq] = content

    def _quiet(self, want: int) -> None:
        """No reply yet: is the link gone, was the request lost, does the kernel know transfers?"""
        if not self.kc.healthy():
            raise KernelDied("the session kernel stopped answering")
        now = time.monotonic()
        reconnects = self.kc.reconnects()
        if reconnects != self.reconnects:  # the link came back: what was in flight may be lost
            self.reconnects, self.heard, self.cut_at = reconnects, now, now
            return
        if self.cut_at is not None:
            if now - self.cut_at > RESEND_AFTER_CUT_S:
                self.cut_at = None
                self._again()
            return
        if want == 0 and self._handled(want):  # done, and no reply: it knows no transfers
            self.waiting.clear()  # nothing will come back: nothing to drain or abort
            self.unsupported = True
            raise BadInput(
                "the session kernel cannot move data this way (its gpusession runtime is older "
                "than this one); start a new session"
            ) from None
        if now - self.heard > STALL_S:
            raise TransferStopped(
                f"the session kernel did not answer for {STALL_S:.0f}s (is a cell still "
                "running there?)"
            )
        if now - self.last_sent[want] > SILENT_S and self.resume:
            self._again()  # a loss no reconnect showed

    def _handled(self, want: int) -> bool:
        """Did the kernel go idle after request `want` 2 s ago or more (iopub), i.e. handle it
        without a reply?"""
        ids = {m for m, (s, _) in self.ids.items() if s == want}
        while self.idle_at is None:
            try:
                msg = self.kc.client.get_iopub_msg(timeout=0)
            except queue.Empty:
                break
            if went_idle(msg, ids):
                self.idle_at = time.monotonic()
        return self.idle_at is not None and time.monotonic() - self.idle_at > 2.0

    def abort(self) -> None:
        """Best effort on the way out (bounded: the link may be down): the kernel drops the
        transfer and what it wrote of it."""
        if self.unsupported:
            return
        try:
            self.waiting.clear()
            self.early.clear()
            self.send({"op": "abort"})
            deadline = time.monotonic() + ABORT_WAIT_S
            while self.waiting and time.monotonic() < deadline:
                try:
                    msg = self.kc.client.get_shell_msg(timeout=0.2)
                except queue.Empty:
                    continue
                seq, _ = self.ids.pop(msg["parent_header"].get("msg_id"), (None, 0.0))
                self.waiting.pop(seq, None)
        except Exception:  # noqa: BLE001 - best effort on the way out
            pass
