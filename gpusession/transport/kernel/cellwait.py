"""Waiting for one cell: its output shown exactly once and in order, and an end in every case.

Through a tunnel, a cut can lose any ZMQ message in flight: the execute request, outputs on IOPub,
the final idle status, the execute_reply, a probe. The session kernel numbers every output of a
cell and keeps it a while, and answers on the control channel, even while a cell runs, what it
knows of a cell (`gpusession.agent.cellog`). So the wait:

- shows outputs in their numbered order: one that comes ahead of a missing one waits for it
  (REORDER_S), then the missing ones are asked of the kernel and shown in their place; output the
  kernel no longer keeps is named exactly, in one line ("outputs 12-14 of this cell were lost");
- after QUIET_S with nothing heard (and after every reconnect), asks the kernel about the cell:
  a cell it never saw, once a kernel_info sent after it on shell came back, was lost on the way
  (CellLost: it did not run); a finished cell whose reply was lost ends with the reply it kept;
- ends when the reply is in and every numbered output is shown.

A kernel without the log (an image with an older runtime) gets the older best effort: a shell
probe after quiet or a reconnect, and a warning that output may be missing after a cut.
"""

from __future__ import annotations

import queue
import signal
import sys
import threading
import time

from ...core.errors import CellLost, KernelDied, LinkLost, RemoteError, RemoteInterrupt
from ...core.protocol import (
    CELL_LOG_REPLY,
    CELL_LOG_REQUEST,
    META_OUTPUTS,
    META_SEQ,
    OUTPUT_MSG_TYPES,
)
from .connection import Connection
from .sink import OutputSink, show

QUIET_S = 3.0  # nothing heard this long: ask the kernel about the cell (then 2x, up to QUIET_MAX_S)
QUIET_MAX_S = 12.0
REORDER_S = 0.5  # an output ahead of a missing one waits this long before the kernel is asked
ASK_AGAIN_S = 5.0  # a question to the kernel unanswered this long is asked again
FILL_GIVE_UP_S = 20.0  # missing output the kernel could not be asked for: named as lost after this
POLL_S = 0.05  # while output flows, shell and control are looked at this often
IDLE_GRACE_S = 1.0  # after the reply, wait this long for the idle status (late output before it)
NO_REPLY_S = (
    10.0  # idle seen, the link up, and no reply (nor an answer from the log): the kernel died
)

LOST_REQUEST = (
    "the connection dropped as this cell was sent, so it did not run; the session "
    "and its variables are intact: run the cell again"
)


class Outputs:
    """A cell's outputs into the sink: numbered ones exactly once and in the kernel's order."""

    def __init__(self, sink: OutputSink):
        self.sink = sink
        self.next = 1  # the number of the next output to show
        self.held: dict[int, tuple[str, dict]] = {}  # arrived ahead of a missing one
        self.gap_since: float | None = None
        self.error: dict | None = None  # the cell's `error` output: raised as RemoteError
        self.lost = 0  # outputs named as lost
        self.recovered = 0  # outputs lost in transit, shown from what the kernel sent again

    def take(self, seq: int | None, kind: str, content: dict, again: bool = False) -> None:
        if seq is None:  # a kernel without the log: as it comes
            self._show(kind, content)
            return
        if seq < self.next or seq in self.held:
            return  # had it already (the kernel sent it again)
        self.recovered += again
        self.held[seq] = (kind, content)
        self._drain()

    def fill(self, outputs: list[dict], first_kept: int) -> None:
        """What the kernel sent again: shown in place; what it no longer keeps is named as lost."""
        if self.next < first_kept:
            self.skip_to(first_kept - 1, "the session kernel no longer kept them")
        for out in outputs:
            self.take(out["seq"], out["msg_type"], out["content"], again=True)

    def skip_to(self, last: int, why: str) -> None:
        """Give up waiting for outputs up to `last`: name those never seen, show the rest."""
        missing: list[int] = []
        while self.next <= last:
            item = self.held.pop(self.next, None)
            if item is None:
                missing.append(self.next)
            else:
                self._say_lost(missing, why)
                missing = []
                self._show(*item)
            self.next += 1
        self._say_lost(missing, why)
        self._drain()

    def complete(self, total: int) -> bool:
        return self.next > total

    def missing_below(self) -> int | None:
        """The number of the newest output known to be missing, or None."""
        return min(self.held) - 1 if self.held else None

    def _drain(self) -> None:
        while self.next in self.held:
            kind, content = self.held.pop(self.next)
            self.next += 1
            self._show(kind, content)
        if not self.held:
            self.gap_since = None
        elif self.gap_since is None:
            self.gap_since = time.monotonic()

    def _show(self, kind: str, content: dict) -> None:
        if kind == "error":
            self.error = content
        else:
            show(self.sink, kind, content)

    def _say_lost(self, seqs: list[int], why: str) -> None:
        if not seqs:
            return
        self.lost += len(seqs)
        which = f"output {seqs[0]}" if len(seqs) == 1 else f"outputs {seqs[0]}-{seqs[-1]}"
        self.sink.stream(
            "stderr",
            f"[gpusession] {which} of this cell (in the order the session sent "
            f"them) were lost in a tunnel cut: {why}\n",
        )


class CtrlC:
    """While a cell is waited for in the main thread under Python's own Ctrl-C handler: that
    handler, counting each Ctrl-C before it raises KeyboardInterrupt. Python drops a
    KeyboardInterrupt raised while a `__del__` or a weakref callback runs (a garbage collection
    at that moment: it prints "Exception ignored" and goes on), so a Ctrl-C could end nowhere and
    the cell run on; `missed()` tells the wait that one came and did not reach it. Python's
    "Exception ignored ... KeyboardInterrupt" report of it (our frames, in the cell's output) is
    left out meanwhile: the wait takes that Ctrl-C at its next turn. Another handler (an
    application's own) is left alone, and so is a wait in another thread."""

    def __init__(self) -> None:
        self.seen = self.taken = 0
        self._installed = None  # the handler set (a bound method is a new object each time)
        self._hooked = None  # sys.unraisablehook as it was, while ours is set

    def __enter__(self) -> "CtrlC":
        if threading.current_thread() is threading.main_thread():
            try:
                if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
                    self._installed = self._handler
                    signal.signal(signal.SIGINT, self._installed)
                    self._hooked, sys.unraisablehook = sys.unraisablehook, self._unraisable
            except (ValueError, OSError):  # not the main interpreter
                pass
        return self

    def __exit__(self, *exc) -> None:
        if self._installed is not None and signal.getsignal(signal.SIGINT) is self._installed:
            signal.signal(signal.SIGINT, signal.default_int_handler)
        self._installed = None
        if self._hooked is not None:
            if sys.unraisablehook == self._unraisable:
                sys.unraisablehook = self._hooked
            self._hooked = None

    def _unraisable(self, unraisable) -> None:
        """A KeyboardInterrupt Python could not raise, counted by our handler: not reported."""
        if isinstance(unraisable.exc_value, KeyboardInterrupt) and self.seen > self.taken:
            return
        (self._hooked or sys.__unraisablehook__)(unraisable)

    def _handler(self, signum, frame) -> None:
        self.seen += 1
        signal.default_int_handler(signum, frame)

    def missed(self) -> bool:
        """A Ctrl-C came that no `except KeyboardInterrupt` of the wait took (then it counts as
        taken)."""
        if self.seen > self.taken:
            self.taken = self.seen
            return True
        return False


class CellWait:
    """One execute request, from sent to its reply. `KernelClient.execute` makes one per cell."""

    def __init__(
        self,
        kc: Connection,
        msg_id: str,
        sink: OutputSink,
        *,
        interrupt_grace: float,
        health_every: float,
    ):
        self.kc, self.client, self.msg_id = kc, kc.client, msg_id
        self.out = Outputs(sink)
        self.interrupt_grace, self.health_every = interrupt_grace, health_every
        now = time.monotonic()
        self.cell_log = kc.cell_log  # the kernel numbers outputs and answers CELL_LOG_REQUEST
        self.started = (
            False  # the kernel said it took the request (busy, execute_input, outputs, log)
        )
        self.reply: dict | None = None
        self.reply_at = self.idle_at = self.interrupted_at = None
        self.total: int | None = None  # how many numbered outputs the cell made (reply or idle)
        self.heard_at = self.checked_at = self.polled_at = now
        self.quiet_s = QUIET_S
        self.reconnects = kc.reconnects()
        self.query: tuple[str, float, bool] | None = None  # (msg_id, sent at, probe was back then)
        self.probe: tuple[str, float] | None = None  # kernel_info on shell, sent after the cell
        self.probe_back = False
        self.lost = False  # confirmed: the request never reached the kernel
        self.cut_seen = False  # a reconnect happened while this cell ran
        self.ctrl_c = CtrlC()  # Ctrl-Cs counted while wait() runs

    # -- the loop ---------------------------------------------------------------------------

    def wait(self) -> dict:
        try:
            with self.ctrl_c:
                return self._wait()
        finally:
            counts = self.kc.counts
            counts["outputs_recovered"] += self.out.recovered
            counts["outputs_named_lost"] += self.out.lost
            counts["requests_lost"] += self.lost

    def _wait(self) -> dict:
        while True:
            try:
                if self.ctrl_c.missed():
                    raise KeyboardInterrupt  # one that Python dropped on its way here (CtrlC)
                if self._step():
                    return self._result()
            except KeyboardInterrupt:
                self.ctrl_c.taken = self.ctrl_c.seen
                if self.interrupted_at is not None:
                    raise  # a second Ctrl-C: stop waiting at once
                self.kc.interrupt()
                self.interrupted_at = time.monotonic()
                self._ask(force=True)  # did it start? the answer decides what to say

    def _step(self) -> bool:
        # block on the channel the next message is due on; look at the others when it is quiet
        # or every POLL_S (not per output: a cell printing 50 MB sends thousands)
        if self.reply is None and self.idle_at is not None:
            self._on_shell(self._get(self.client.get_shell_msg, 0.1))
            self._on_iopub(self._get(self.client.get_iopub_msg, 0))
            got = None
        else:
            got = self._get(self.client.get_iopub_msg, 0.1)
            self._on_iopub(got)
        now = time.monotonic()
        if got is None or now - self.polled_at > POLL_S:
            self.polled_at = now
            self._on_shell(self._get(self.client.get_shell_msg, 0))
            self._on_control(self._get(self.client.get_control_msg, 0))
        if now - self.checked_at >= self.health_every:
            self.checked_at = now
            self._check_link()
        return self._decide(now)

    @staticmethod
    def _get(getter, timeout: float) -> dict | None:
        try:
            return getter(timeout=timeout)
        except queue.Empty:
            return None

    # -- what arrives -----------------------------------------------------------------------

    def _on_iopub(self, msg: dict | None) -> None:
        if msg is None or msg["parent_header"].get("msg_id") != self.msg_id:
            return
        self.heard_at, self.quiet_s = time.monotonic(), QUIET_S
        kind, content, meta = msg["msg_type"], msg["content"], msg.get("metadata") or {}
        self.started = True  # busy, execute_input, output or idle: the kernel has the request
        if kind == "status" and content.get("execution_state") == "idle":
            self.idle_at = time.monotonic()
            self._count(meta)
        elif kind in OUTPUT_MSG_TYPES:
            seq = meta.get(META_SEQ)
            self.cell_log = self.cell_log or seq is not None
            self.out.take(seq, kind, content)

    def _on_shell(self, msg: dict | None) -> None:
        while msg is not None:
            parent = msg["parent_header"].get("msg_id")
            if parent == self.msg_id and msg["msg_type"] == "execute_reply" and self.reply is None:
                self.reply, self.reply_at, self.started = msg["content"], time.monotonic(), True
                self._count(msg.get("metadata") or {})
            elif self.probe is not None and parent == self.probe[0]:
                self.probe_back = True
                self._ask(force=True)  # now an "unknown" from the kernel is final
            msg = self._get(self.client.get_shell_msg, 0)

    def _on_control(self, msg: dict | None) -> None:
        while msg is not None:
            if (
                self.query is not None
                and msg["msg_type"] == CELL_LOG_REPLY
                and msg["parent_header"].get("msg_id") == self.query[0]
            ):
                after_probe = self.query[2]
                self.query = None
                self._on_answer(msg["content"], after_probe)
            msg = self._get(self.client.get_control_msg, 0)

    def _on_answer(self, answer: dict, after_probe: bool) -> None:
        if answer["state"] == "unknown":
            if after_probe:
                self.lost = True  # shell answered a later request, and this one never came
            elif self.probe is None:
                self._send_probe()
            return
        self.started, self.heard_at = True, time.monotonic()
        self.out.fill(answer["outputs"], answer["first_kept"])
        if answer["state"] == "done":
            self.total = answer["outputs_total"]
            if self.reply is None and answer.get("reply") is not None:
                self.reply, self.reply_at = answer["reply"], time.monotonic()
                self.kc.counts["replies_recovered"] += 1
        if self.out.next <= answer["outputs_total"] and answer["outputs"]:
            self._ask(force=True)  # the answer had a size limit: the rest next

    def _count(self, meta: dict) -> None:
        if META_OUTPUTS in meta:
            self.total, self.cell_log = int(meta[META_OUTPUTS]), True

    # -- asking -----------------------------------------------------------------------------

    def _ask(self, force: bool = False) -> None:
        """Ask the kernel's cell log about this cell (one question at a time)."""
        if not self.cell_log:
            if force and self.probe is None:
                self._send_probe()  # the older best effort
            return
        now = time.monotonic()
        if self.query is not None and not force and now - self.query[1] < ASK_AGAIN_S:
            return
        msg = self.client.session.msg(
            CELL_LOG_REQUEST, {"msg_id": self.msg_id, "since": self.out.next}
        )
        self.client.control_channel.send(msg)
        self.query = (msg["header"]["msg_id"], now, self.probe_back)

    def _send_probe(self) -> None:
        self.probe, self.probe_back = (self.client.kernel_info(), time.monotonic()), False

    def _check_link(self) -> None:
        try:
            alive = self.kc.healthy()
        except LinkLost as exc:
            raise LinkLost(f"{exc}; {self._cell_words()}") from None
        if not alive:
            raise KernelDied("the session kernel died while running this cell")
        reconnects = self.kc.reconnects()
        if reconnects != self.reconnects:  # what was in flight may be lost: ask again
            self.reconnects, self.cut_seen = reconnects, True
            now = time.monotonic()  # time spent down does not count against the kernel
            self.idle_at = self.idle_at and now
            self.out.gap_since = self.out.gap_since and now
            if self.probe is not None and not self.probe_back:
                self._send_probe()
            self._ask(force=True)

    # -- the end ----------------------------------------------------------------------------

    def _decide(self, now: float) -> bool:
        if self.lost:
            if self.interrupted_at is not None:
                raise RemoteInterrupt(
                    "interrupted: this cell never started in the session kernel "
                    "(its request was lost in a tunnel cut), so nothing ran"
                )
            raise CellLost(LOST_REQUEST)
        if self.reply is not None and self._reply_complete(now):
            return True
        if self.reply is None and self.idle_at is not None and now - self.idle_at > 2 * REORDER_S:
            if now - self.idle_at > NO_REPLY_S:
                raise KernelDied("the session kernel went idle but sent no reply")
            self._ask()  # the reply was lost: the kernel kept it
        gap = self.out.gap_since
        if gap is not None and now - gap > REORDER_S:
            if now - gap > FILL_GIVE_UP_S:
                self.out.skip_to(self.out.missing_below() or 0, "the session kernel did not answer")
            else:
                self._ask()
        if now - self.heard_at > self.quiet_s:
            self.heard_at, self.quiet_s = now, min(self.quiet_s * 2, QUIET_MAX_S)
            self._ask(force=self.query is None or now - self.query[1] > ASK_AGAIN_S)
        if not self.cell_log and self.probe_back and self.reply is None and not self.started:
            raise CellLost(LOST_REQUEST)  # no log: shell answered the later probe first
        if self.interrupted_at is not None and now - self.interrupted_at > self.interrupt_grace:
            raise RemoteInterrupt(self._interrupt_words())
        return False

    def _reply_complete(self, now: float) -> bool:
        """The reply is in: is every output shown (or named as lost)?"""
        if self.total is None:  # a kernel without the log
            if self.idle_at is not None:
                return True
            if now - self.reply_at > 2 * self.health_every:
                if self.cut_seen or self.probe is not None:
                    self.out.sink.stream(
                        "stderr",
                        "[gpusession] the connection dropped during this cell: "
                        "some of its output may be missing\n",
                    )
                return True
            return False
        if not self.out.complete(self.total):
            since = max(self.reply_at, self.out.gap_since or 0.0)
            if now - since > FILL_GIVE_UP_S:
                self.out.skip_to(self.total, "the session kernel did not answer")
                return True
            if now - self.reply_at > REORDER_S:
                self._ask()  # still missing after the reply: ask for them
            return False
        return self.idle_at is not None or now - self.reply_at > IDLE_GRACE_S

    def _result(self) -> dict:
        reply = self.reply or {}
        count = reply.get("execution_count")
        if self.interrupted_at is not None:  # where the remote cell was when it stopped
            err = self.out.error or (reply if reply.get("status") == "error" else {})
            raise RemoteInterrupt(
                "interrupted the remote cell", err.get("traceback"), count, stopped=True
            )
        if reply.get("gpusession_reply_not_kept"):
            raise CellLost(
                f"this cell ran (status: {reply.get('status')}) but its reply was lost in a tunnel "
                "cut and was too big to keep; run it again"
            )
        if reply.get("status") == "error" or self.out.error:
            err = self.out.error or reply
            raise RemoteError(
                err.get("ename", "Error"), err.get("evalue", ""), err.get("traceback", []), count
            )
        return reply

    def _cell_words(self) -> str:
        if self.reply is not None:
            return "this cell had finished"
        if self.started:
            return "this cell had started and may still be running in the session"
        return "this cell had not started in the session (or its start was not seen before the cut)"

    def _interrupt_words(self) -> str:
        grace = f"{self.interrupt_grace:.0f}s"
        if self.started:
            return (
                f"the remote cell did not stop within {grace} of the interrupt; it is still running "
                "in the session kernel"
            )
        return (
            f"the remote cell had not started {grace} after the interrupt (the kernel may be busy "
            "with an earlier cell, or the connection is down); it may still run"
        )
