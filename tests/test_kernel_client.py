"""KernelClient.wait_ready's end: the kernel's first answer, then iopub read up to that request's
idle status (iopub is connected then), not a wait for iopub to go quiet (which cost every start
and restart 50 ms). The client's channels are a stand-in there; every start in the suite runs the
real thing. And close()'s bounded wait for its ZMQ context's end, with a real context."""

from __future__ import annotations

import queue
import time

from gpusession.transport.kernel import client as kc


class _Channels:
    def __init__(self, iopub: list[dict]):
        self.iopub, self.waits = iopub, []

    def kernel_info(self) -> str:
        return "m1"

    def get_shell_msg(self, timeout: float) -> dict:
        return {"parent_header": {"msg_id": "m1"}, "content": {"status": "ok"}, "metadata": {}}

    def get_iopub_msg(self, timeout: float) -> dict:
        self.waits.append(timeout)
        if not self.iopub:
            raise queue.Empty
        return self.iopub.pop(0)


def _status(parent: str, state: str) -> dict:
    return {
        "parent_header": {"msg_id": parent},
        "msg_type": "status",
        "content": {"execution_state": state},
    }


def _client(channels: _Channels) -> kc.KernelClient:
    client = kc.KernelClient.__new__(kc.KernelClient)
    client.client, client.healthy = channels, lambda: True
    return client


def test_the_first_answer_reads_iopub_up_to_its_idle_status_and_no_further_wait():
    welcome = {"parent_header": {}, "msg_type": "iopub_welcome", "content": {}}
    channels = _Channels([welcome, _status("m1", "busy"), _status("m1", "idle"), welcome])
    assert _client(channels).wait_ready(5) == {"status": "ok"}
    assert channels.iopub == [], "what had come is read: later reads start clean"
    before_idle, after_idle = channels.waits[:3], channels.waits[3:]
    assert all(0 < w <= kc.DRAIN_S for w in before_idle)
    assert after_idle == [0.0, 0.0], "no wait once the request's idle came"


def test_without_its_idle_status_iopub_is_read_for_drain_s_at_most():
    channels = _Channels([_status("other", "idle")])
    _client(channels).wait_ready(5)
    assert channels.iopub == [] and all(0 <= w <= kc.DRAIN_S for w in channels.waits)
    assert channels.waits[0] > 0, "it waited for the idle status that did not come"


def _unconnected() -> kc.KernelClient:
    """A real client whose ports nothing listens on (ZMQ connects lazily: nothing fails)."""
    ports = dict(shell_port=1, iopub_port=2, stdin_port=3, control_port=4, hb_port=5)
    return kc.KernelClient(dict(ports, ip="127.0.0.1", transport="tcp", key=""))


def test_close_waits_for_its_zmq_context_to_end_at_most_end_wait_s(monkeypatch):
    """A context whose term does not return (a socket nobody closes holds it here; once in CI,
    libzmq itself on the kubernetes link) costs close() END_WAIT_S, not the stop that called it:
    the context ends in the background when it can."""
    import threading

    import zmq

    monkeypatch.setattr(kc, "END_WAIT_S", 0.3)
    client = _unconnected()
    context = client._context
    held = zmq.Socket(context, zmq.DEALER)  # not the context's to close: its term waits for it
    before = set(threading.enumerate())  # another test's end, still going, is not this one
    began = time.monotonic()
    client.close()
    assert 0.3 <= time.monotonic() - began < 3, "close waited END_WAIT_S, and no longer"
    ending = [t for t in set(threading.enumerate()) - before if t.name == "gpusession-zmq-end"]
    assert len(ending) == 1 and not context.closed, "its end goes on in the background"
    held.close()
    ending[0].join(5)
    assert context.closed and not ending[0].is_alive(), "and ends once it can"


def test_a_context_that_ends_at_once_is_not_waited_for():
    client = _unconnected()
    began = time.monotonic()
    client.close()
    assert time.monotonic() - began < 1 and client._context.closed
