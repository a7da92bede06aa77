"""KernelClient.wait_ready's end: the kernel's first answer, then iopub read up to that request's
idle status (iopub is connected then), not a wait for iopub to go quiet (which cost every start
and restart 50 ms). The client's channels are a stand-in here; every start in the suite runs the
real thing."""

from __future__ import annotations

import queue

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
