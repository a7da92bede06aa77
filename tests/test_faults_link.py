"""Faults between the notebook and its session kernel, reproduced small and fast: a real session
kernel (the agent runtime, with its cell log), a real sshd on 127.0.0.1 and our tunnel.

- messages lost in flight (the execute request, outputs, the idle status, the reply), dropped on
  purpose at the client: the cell must end, with every output exactly once and in order;
- Ctrl-C says whether the remote cell started;
- a tunnel that cannot come back (changed host key, refused login, unreachable): a waiting cell
  ends within the give-up time with one line saying why;
- a cell printing at 10 Hz across real tunnel cuts: every line arrives, in order, once.
"""

from __future__ import annotations

import _thread
import os
import signal
import sys
import threading
import time
import types

import pytest
from test_ctrl_c import Dropped
from test_tunnel import PORTS, SSHD, Sshd, _through

from gpusession.backends.base import Link
from gpusession.core.errors import CellLost, LinkLost
from gpusession.core.models import KernelEndpoint
from gpusession.session.handle import Session
from gpusession.transport.kernel.client import KernelClient
from gpusession.transport.kernel.sink import OutputSink
from gpusession.transport.sshlogin import make_session_key
from gpusession.transport.tunnel import Tunnel
from support.procs import start_runtime

needs_sshd = pytest.mark.skipif(not os.path.exists(SSHD), reason="needs OpenSSH's sshd")


class Recorder(OutputSink):
    """What the notebook would show: stream text per stream, other outputs by kind."""

    def __init__(self):
        self.parts: list[tuple[str, str]] = []

    def stream(self, name, text):
        self.parts.append((name, text))

    def display(self, data, metadata, transient=None, update=False):
        self.parts.append(("display", data.get("text/plain", "")))

    def clear(self, wait):
        self.parts.append(("clear", ""))

    def text(self, name: str = "stdout") -> str:
        return "".join(t for n, t in self.parts if n == name)


@pytest.fixture
def runtime(tmp_path):
    """A real session kernel (python -m gpusession.agent run) on 127.0.0.1 with its cell log."""
    info, proc = start_runtime(tmp_path / "state", "faults", "--agent-port", "-1")
    yield info, proc
    proc.terminate()
    proc.wait(15)


@pytest.fixture
def kernel(runtime):
    info, _ = runtime
    kc = KernelClient(info)
    kc.wait_ready(30)
    yield kc
    kc.close()


def _drop(kc: KernelClient, channel: str, should_drop) -> list[dict]:
    """Lose the messages `should_drop(msg)` picks on their way in (as a tunnel cut would)."""
    dropped: list[dict] = []
    getter = getattr(kc.client, f"get_{channel}_msg")

    def get(timeout=None):
        while True:
            msg = getter(timeout=timeout)
            if not should_drop(msg):
                return msg
            dropped.append(msg)

    setattr(kc.client, f"get_{channel}_msg", get)
    return dropped


def _drop_next_request(kc: KernelClient, msg_type: str = "execute_request") -> None:
    """Lose the next request of this type on its way out."""
    channel = kc.client.shell_channel
    send = channel.send

    def lossy(msg):
        if msg["header"]["msg_type"] == msg_type and not getattr(lossy, "done", False):
            lossy.done = True
            return
        send(msg)

    channel.send = lossy


def _within(seconds: float, fn, *args, **kwargs):
    """fn's result, or its exception; fails (instead of hanging the suite) after `seconds`."""
    box: dict = {}

    def run():
        try:
            box["value"] = fn(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            box["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t0 = time.monotonic()
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"still waiting after {seconds:.0f}s: the cell hangs"
    return box, time.monotonic() - t0


LINES = "import time\nfor i in range({n}):\n    print(f'line {{i}}', flush=True)\n    time.sleep({dt})\n"


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line]


# -- the kernel's cell log -----------------------------------------------------------------------


@pytest.mark.integration
def test_kernel_numbers_outputs_and_answers_for_a_cell_on_control(kernel):
    raw: list[dict] = []
    original = kernel.client.get_iopub_msg

    def spy(timeout=None):
        msg = original(timeout=timeout)
        raw.append(msg)
        return msg

    kernel.client.get_iopub_msg = spy
    sink = Recorder()
    reply = kernel.execute("print('a', flush=True)\ndisplay('b')\nprint('c')\n'd'", sink=sink)
    assert kernel.cell_log
    outputs = [m for m in raw if "gpusession_seq" in m["metadata"]]
    assert [m["metadata"]["gpusession_seq"] for m in outputs] == [1, 2, 3, 4]
    assert [m["msg_type"] for m in outputs] == [
        "stream",
        "display_data",
        "stream",
        "execute_result",
    ]
    idle = [
        m
        for m in raw
        if m["msg_type"] == "status"
        and m["content"]["execution_state"] == "idle"
        and "gpusession_outputs" in m["metadata"]
    ]
    assert idle and idle[-1]["metadata"]["gpusession_outputs"] == 4
    assert reply["status"] == "ok"
    assert sink.parts == [
        ("stdout", "a\n"),
        ("display", "'b'"),
        ("stdout", "c\n"),
        ("display", "'d'"),
    ]


# -- lost messages: item 3 (hangs) and item 4 (silent loss) ----------------------------------------


@pytest.mark.integration
def test_lost_request_without_any_reconnect_ends_saying_it_did_not_run(kernel):
    _drop_next_request(kernel)
    box, took = _within(20, kernel.execute, "lost_cell_ran = True", sink=Recorder())
    assert isinstance(box.get("error"), CellLost), box
    assert "so it did not run" in str(box["error"]) and "run the cell again" in str(box["error"])
    assert took < 10
    assert kernel.evaluate("'lost_cell_ran' in globals()") == "False"


@pytest.mark.integration
def test_lost_reply_and_idle_end_with_the_reply_the_kernel_kept(kernel):
    dropped_shell = _drop(kernel, "shell", lambda m: m["msg_type"] == "execute_reply")
    dropped_iopub = _drop(kernel, "iopub", lambda m: m["msg_type"] == "status")
    sink = Recorder()
    box, took = _within(20, kernel.execute, "print('ran')\n6 * 7", sink=sink)
    assert "error" not in box, box
    assert box["value"]["status"] == "ok" and box["value"]["execution_count"] >= 1
    assert sink.parts == [("stdout", "ran\n"), ("display", "42")]
    assert dropped_shell and dropped_iopub
    assert took < 10


@pytest.mark.integration
def test_lost_error_reply_still_raises_the_remote_error(kernel):
    from gpusession.core.errors import RemoteError

    _drop(kernel, "shell", lambda m: m["msg_type"] == "execute_reply")
    _drop(kernel, "iopub", lambda m: m["msg_type"] in ("status", "error"))
    box, _ = _within(20, kernel.execute, "1/0", sink=Recorder())
    assert isinstance(box.get("error"), RemoteError) and box["error"].ename == "ZeroDivisionError"


@pytest.mark.integration
def test_outputs_lost_mid_cell_are_fetched_and_shown_in_order_exactly_once(kernel):
    lost = {3, 4, 5, 9}
    _drop(kernel, "iopub", lambda m: m["metadata"].get("gpusession_seq") in lost)
    sink = Recorder()
    kernel.execute(LINES.format(n=12, dt=0.02), sink=sink)
    assert _lines(sink.text()) == [f"line {i}" for i in range(12)]
    assert sink.text("stderr") == ""


@pytest.mark.integration
def test_outputs_lost_at_the_end_are_fetched(kernel):
    _drop(kernel, "iopub", lambda m: m["metadata"].get("gpusession_seq") in (5, 6))
    sink = Recorder()
    kernel.execute("for i in range(6):\n    print(i, flush=True)", sink=sink)
    assert _lines(sink.text()) == [str(i) for i in range(6)]


@pytest.mark.integration
def test_outputs_arriving_out_of_order_are_shown_in_order(kernel):
    held: list[dict] = []
    getter = kernel.client.get_iopub_msg

    def swap(timeout=None):  # hold output 2 back until output 3 went by
        msg = getter(timeout=timeout)
        seq = msg["metadata"].get("gpusession_seq")
        if seq == 2:
            held.append(msg)
            return swap(timeout)
        if seq == 3 and held:
            kernel.client.get_iopub_msg = lambda timeout=None: (
                held.pop() if held else getter(timeout=timeout)
            )
        return msg

    kernel.client.get_iopub_msg = swap
    sink = Recorder()
    kernel.execute("for i in range(4):\n    print(i, flush=True)", sink=sink)
    assert _lines(sink.text()) == ["0", "1", "2", "3"]


@pytest.mark.integration
def test_output_the_kernel_no_longer_keeps_is_named_exactly(kernel):
    kernel.execute(
        "get_ipython().kernel.gpusession_cell_log.max_bytes = 40", silent=True
    )  # ~1 output
    _drop(kernel, "iopub", lambda m: m["metadata"].get("gpusession_seq") in (2, 3))
    sink = Recorder()
    kernel.execute(
        "import time\nfor i in range(8):\n    print('x' * 9, i, flush=True)\n    time.sleep(0.01)",
        sink=sink,
    )
    assert sink.text("stderr") == (
        "[gpusession] outputs 2-3 of this cell (in the order the session sent them) were "
        "lost in a tunnel cut: the session kernel no longer kept them\n"
    )
    assert _lines(sink.text()) == [f"xxxxxxxxx {i}" for i in (0, 3, 4, 5, 6, 7)]


# -- Ctrl-C: say whether the remote cell started --------------------------------------------------


def _interrupt_main_after(seconds: float) -> None:
    threading.Timer(seconds, _thread.interrupt_main).start()


@pytest.mark.integration
def test_interrupting_a_lost_cell_says_it_never_started(kernel):
    _drop_next_request(kernel)
    _interrupt_main_after(0.5)
    with pytest.raises(KeyboardInterrupt) as err:
        kernel.execute("never = 1", sink=Recorder(), interrupt_grace=5)
    assert "never started in the session kernel" in str(err.value) and "nothing ran" in str(
        err.value
    )
    assert "may still be running" not in str(err.value)


@pytest.mark.integration
def test_interrupting_a_running_cell_stops_it(kernel):
    _interrupt_main_after(1.0)
    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt, match="interrupted the remote cell"):
        kernel.execute("import time\nprint('go', flush=True)\ntime.sleep(30)", sink=Recorder())
    assert time.monotonic() - t0 < 25  # not the 30 s the cell would sleep
    assert kernel.evaluate("1 + 1") == "2"


@pytest.mark.integration
def test_a_ctrl_c_that_python_dropped_in_a_finalizer_still_stops_the_cell(kernel, monkeypatch):
    """Python drops a KeyboardInterrupt raised while a `__del__` runs (a garbage collection at
    that moment): once, under load, a Ctrl-C in the test above did nothing and the cell ran its
    30 s. The wait counts the Ctrl-C itself (cellwait.CtrlC) and stops the cell anyway."""

    class Sink(Recorder):
        def stream(self, name, text):
            super().stream(name, text)
            if "go" in text:
                Dropped()  # made and dropped at once, in the wait's own thread

    reported = []  # what Python reports as dropped ("Exception ignored in ...")
    monkeypatch.setattr(sys, "unraisablehook", lambda u: reported.append(u.exc_type))
    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt, match="interrupted the remote cell"):
        kernel.execute("import time\nprint('go', flush=True)\ntime.sleep(30)", sink=Sink())
    assert time.monotonic() - t0 < 25  # not the 30 s the cell would sleep
    assert reported == []  # dropped in the finalizer, taken by the wait, not in the output
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # given back
    assert kernel.evaluate("1 + 1") == "2"


@pytest.mark.integration
def test_a_cell_that_ignores_the_interrupt_is_said_to_be_still_running(kernel):
    _interrupt_main_after(1.0)
    stubborn = (
        "import time\nprint('go', flush=True)\nend = time.time() + 6\nwhile time.time() < end:\n"
        "    try:\n        time.sleep(0.1)\n    except KeyboardInterrupt:\n        pass\n"
    )
    with pytest.raises(KeyboardInterrupt) as err:
        kernel.execute(stubborn, sink=Recorder(), interrupt_grace=2)
    assert (
        "did not stop within 2s of the interrupt; it is still running in the session kernel"
        in str(err.value)
    )


# -- a tunnel that cannot come back: item 2 ------------------------------------------------------------


class _TunnelLink(Link):
    def __init__(self, tunnel: Tunnel, info: dict):
        self.tunnel = tunnel
        self.endpoint = KernelEndpoint(connection_info=_through(tunnel, info), agent_url=None)

    def close(self):
        self.tunnel.close()

    def healthy(self):
        return self.tunnel.healthy()

    def failure(self):
        return str(self.tunnel.failure) if self.tunnel.failure else None

    @property
    def reconnects(self):
        return self.tunnel.reconnects


def _session(tunnel: Tunnel, info: dict) -> Session:
    """The session layer over our tunnel, with a remote side that stays alive."""
    record = types.SimpleNamespace(id="faults", name="faulty")
    backend = types.SimpleNamespace(is_alive=lambda record: True)
    session = Session(None, record, backend, _TunnelLink(tunnel, info))
    session.kernel.wait_ready(30)
    return session


@pytest.fixture
def own_sshd(tmp_path):
    server = Sshd(tmp_path / "sshd")
    yield server
    if server.proc.poll() is None:
        server.close()


def _new_host_key(sshd: Sshd) -> None:
    """The server's host key changes (a new container answering on the same port, or worse)."""
    sshd.host_key_path.unlink()
    sshd.host_key_path.with_suffix(".pub").unlink(missing_ok=True)
    make_session_key(sshd.folder, "host")
    sshd.proc.send_signal(signal.SIGHUP)  # sshd re-executes itself and reads its keys again
    time.sleep(0.5)


@pytest.mark.integration
@needs_sshd
@pytest.mark.parametrize("fault", ["host key changed", "login refused"])
def test_cell_ends_with_one_line_when_the_tunnel_is_refused_after_a_cut(
    own_sshd, runtime, fault, tmp_path
):
    (own_sshd.folder).mkdir(exist_ok=True)
    info, proc = runtime
    events: list[str] = []
    tunnel = Tunnel(
        own_sshd.target(), [info[p] for p in PORTS], on_event=events.append, give_up_after=300
    ).start()
    session = _session(tunnel, info)
    try:

        def fault_then_cut():
            time.sleep(1.0)
            if fault == "host key changed":
                _new_host_key(own_sshd)
            else:
                (own_sshd.folder / "authorized_keys").write_text("")
            own_sshd.cut_connections()

        threading.Thread(target=fault_then_cut, daemon=True).start()
        box, took = _within(
            30, session.run, "import time\nprint('start', flush=True)\ntime.sleep(8)", Recorder()
        )
        err = box.get("error")
        assert isinstance(err, LinkLost), box
        text = str(err)
        assert "\n" not in text
        assert text.startswith("lost the connection to session faulty: ")
        if fault == "host key changed":
            assert f"host key for [127.0.0.1]:{own_sshd.port} changed: refusing to connect" in text
        else:
            assert "authentication failed" in text and "refused every key" in text
        assert text.endswith("this cell had started and may still be running in the session")
        assert took < 8, "a refusal is final: no waiting for the give-up time"
        assert not tunnel.healthy()
        assert any("reconnect refused, giving up" in e for e in events), events
        # the next cell says the same at once, and sends nothing
        box, took = _within(10, session.run, "print('again')", Recorder())
        assert isinstance(box.get("error"), LinkLost) and str(box["error"]).endswith(
            "this cell was not sent"
        )
        assert took < 3
        assert proc.poll() is None, "the session kernel keeps running"
    finally:
        session.close_connections()


@pytest.mark.integration
@needs_sshd
def test_cell_ends_within_the_give_up_time_when_the_host_is_unreachable(
    own_sshd, runtime, monkeypatch
):
    info, _ = runtime
    monkeypatch.setenv("GPUSESSION_RECONNECT_TIMEOUT", "3s")
    tunnel = Tunnel(own_sshd.target(), [info[p] for p in PORTS]).start()
    assert tunnel.give_up_after == 3.0
    session = _session(tunnel, info)
    try:

        def vanish():
            time.sleep(1.0)
            own_sshd.close()  # sshd gone, connections cut: nothing answers on its port
            own_sshd.cut_connections()

        threading.Thread(target=vanish, daemon=True).start()
        box, took = _within(30, session.run, "import time\ntime.sleep(10)", Recorder())
        err = box.get("error")
        assert isinstance(err, LinkLost), box
        assert (
            f"cannot reach {own_sshd.target().label}: down for over 3s, the reconnect give-up time "
            "(GPUSESSION_RECONNECT_TIMEOUT) (last error: ConnectionRefusedError: "
        ) in str(err)
        assert "still trying in the background; this cell had started" in str(err)
        assert 3.5 < took < 8
    finally:
        session.close_connections()


def test_reconnect_timeout_setting_is_checked(monkeypatch):
    from gpusession.configuration.settings import ConfigError, reconnect_give_up

    monkeypatch.setenv("GPUSESSION_RECONNECT_TIMEOUT", "2m")
    assert reconnect_give_up() == 120.0
    monkeypatch.setenv("GPUSESSION_RECONNECT_TIMEOUT", "off")
    assert reconnect_give_up() is None
    monkeypatch.setenv("GPUSESSION_RECONNECT_TIMEOUT", "abc")
    with pytest.raises(
        ConfigError, match="GPUSESSION_RECONNECT_TIMEOUT='abc': bad reconnect timeout"
    ):
        reconnect_give_up()


# -- real tunnel cuts: item 4 at 10 Hz ---------------------------------------------------------------


@pytest.mark.integration
@needs_sshd
def test_a_cell_printing_at_10hz_across_tunnel_cuts_loses_no_line(own_sshd, runtime):
    info, _ = runtime
    tunnel = Tunnel(own_sshd.target(), [info[p] for p in PORTS]).start()
    session = _session(tunnel, info)
    try:
        for run in range(3):

            def cut():
                time.sleep(0.7 + 0.3 * run)
                own_sshd.cut_connections()

            threading.Thread(target=cut, daemon=True).start()
            sink = Recorder()
            box, _ = _within(60, session.run, LINES.format(n=30, dt=0.1), sink)
            assert "error" not in box, box
            assert _lines(sink.text()) == [f"line {i}" for i in range(30)], sink.parts
            assert sink.text("stderr") == ""
        assert tunnel.reconnects >= 3
    finally:
        session.close_connections()
