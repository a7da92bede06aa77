"""Cuts inside transfers (issue 19 item 3): push, pull, upload and download across real tunnel
cuts (a real session kernel, a real sshd on 127.0.0.1, our tunnel; the cut made by `ss -K` when
the transfer is part way). Each must resume (the tunnel comes back) or fail in one line with the
true cause; none may hang, and no partial file may stay under its final name on either side."""

from __future__ import annotations

import hashlib
import os
import threading

import pytest
from test_faults_link import _session, _within, needs_sshd, own_sshd, runtime  # noqa: F401 - fixtures
from test_tunnel import PORTS

from gpusession.transport.tunnel import Tunnel

# integration: starts kernels, the agent or servers (tests/conftest.py: the fast tier starts none)
pytestmark = pytest.mark.integration

SIZE = 50_000_000


def _cut_at(sshd, fraction: float):
    """A progress callback that cuts the tunnel once, when `fraction` of the bytes moved."""
    state = {"cut": False}

    def progress(done, total):
        if not state["cut"] and total and done >= fraction * total:
            state["cut"] = True
            threading.Thread(target=sshd.cut_connections, daemon=True).start()

    return progress, state


def _connect(sshd, info: dict, work) -> object:
    """The session layer over our tunnel, its kernel working in `work`."""
    session = _session(Tunnel(sshd.target(), [info[p] for p in PORTS]).start(), info)
    work.mkdir(exist_ok=True)
    session.run(f"import os; os.chdir({str(work)!r})")
    return session


@pytest.fixture
def session(own_sshd, runtime, tmp_path):  # noqa: F811
    s = _connect(own_sshd, runtime[0], tmp_path / "work")
    yield s
    s.close_connections()


@needs_sshd
@pytest.mark.parametrize("kind", ["push", "pull", "upload", "download"])
def test_a_cut_inside_a_transfer_resumes(session, own_sshd, kind, tmp_path):  # noqa: F811
    blob = os.urandom(SIZE)
    digest = hashlib.sha256(blob).hexdigest()
    cwd = session.kernel.evaluate("__import__('os').getcwd()").strip("'")
    progress, state = _cut_at(own_sshd, 0.4)
    if kind == "push":
        box, took = _within(60, session.push, {"blob": blob}, progress)
    elif kind == "pull":
        session.push({"blob": blob})
        box, took = _within(60, session.pull, ["blob"], progress)
    elif kind == "upload":
        (tmp_path / "big.bin").write_bytes(blob)
        box, took = _within(60, session.upload, [str(tmp_path / "big.bin")], "in", progress)
    else:
        session.push({"blob": blob})
        session.run("open('big.bin', 'wb').write(blob)")
        box, took = _within(60, session.download, ["big.bin"], str(tmp_path / "out"), progress)
    assert state["cut"]
    assert "error" not in box, box
    if kind == "push":
        assert (
            session.kernel.evaluate("__import__('hashlib').sha256(blob).hexdigest()").strip("'")
            == digest
        )
    elif kind == "pull":
        assert hashlib.sha256(box["value"]["blob"]).hexdigest() == digest
    elif kind == "upload":
        got = session.kernel.evaluate(
            "__import__('hashlib').sha256(open('in/big.bin','rb').read()).hexdigest()"
        )
        assert got.strip("'") == digest
        assert session.kernel.evaluate("sorted(__import__('os').listdir('in'))") == "['big.bin']"
    else:
        assert hashlib.sha256((tmp_path / "out" / "big.bin").read_bytes()).hexdigest() == digest
        assert os.listdir(tmp_path / "out") == ["big.bin"]
    del cwd


def _session_files(session, folder: str) -> str:
    return session.kernel.evaluate(
        f"sorted(__import__('os').listdir({folder!r})) if __import__('os').path.isdir("
        f"{folder!r}) else []"
    )


@needs_sshd
@pytest.mark.parametrize("kind", ["upload", "download"])
def test_ctrl_c_inside_a_transfer_is_one_line_and_leaves_no_file_on_either_side(
    session, kind, tmp_path
):
    from gpusession.core.errors import TransferStopped

    def interrupt(done, total):
        if total and done >= 0.4 * total:
            raise KeyboardInterrupt

    blob = os.urandom(SIZE)
    if kind == "upload":
        (tmp_path / "big.bin").write_bytes(blob)
        box, _ = _within(30, session.upload, [str(tmp_path / "big.bin")], "in", interrupt)
        where = "in the session"
    else:
        session.push({"blob": blob})
        session.run("open('big.bin', 'wb').write(blob)")
        box, _ = _within(30, session.download, ["big.bin"], str(tmp_path / "out"), interrupt)
        where = "here"
    err = box.get("error")
    assert isinstance(err, TransferStopped), box
    assert str(err).startswith(f"interrupted: the {kind} stopped at ") and "\n" not in str(err)
    assert str(err).endswith(f"of 50 MB; nothing of it was written {where}"), str(err)
    assert _session_files(session, "in") == "[]"  # not the file, not its temporary name
    assert not (tmp_path / "out").exists() or os.listdir(tmp_path / "out") == []
    assert session.kernel.evaluate("1 + 1") == "2"  # and the session goes on


@needs_sshd
@pytest.mark.parametrize("kind", ["pull", "download", "push", "upload"])
def test_a_link_that_does_not_come_back_ends_the_transfer_in_one_line(
    own_sshd,  # noqa: F811 - the fixtures imported above
    runtime,  # noqa: F811
    kind,
    tmp_path,
    monkeypatch,
):
    from gpusession.core.errors import LinkLost

    info, _ = runtime
    monkeypatch.setenv("GPUSESSION_RECONNECT_TIMEOUT", "2s")
    session = _connect(own_sshd, info, tmp_path / "work")
    blob = os.urandom(SIZE)
    try:
        session.push({"blob": blob})
        session.run("open('big.bin', 'wb').write(blob)")
        state = {"gone": False}

        def vanish(done, total):
            if not state["gone"] and total and done >= 0.4 * total:
                state["gone"] = True
                own_sshd.close()  # sshd gone, connections cut: nothing answers on its port
                own_sshd.cut_connections()

        if kind == "pull":
            box, took = _within(30, session.pull, ["blob"], vanish)
        elif kind == "download":
            box, took = _within(30, session.download, ["big.bin"], str(tmp_path / "out"), vanish)
        elif kind == "push":
            box, took = _within(30, session.push, {"other": blob}, vanish)
        else:
            (tmp_path / "up.bin").write_bytes(blob)
            box, took = _within(30, session.upload, [str(tmp_path / "up.bin")], "in", vanish)
        err = box.get("error")
        assert isinstance(err, LinkLost), box
        text = str(err)
        assert (
            text.startswith("lost the connection to session faulty: cannot reach ")
            and "\n" not in text
        )
        assert (
            f"; the {kind} stopped at " in text and "of 50 MB; nothing of it was written " in text
        ), text
        assert took < 15
        assert not (tmp_path / "out").exists() or os.listdir(tmp_path / "out") == []
        assert not (
            tmp_path / "work" / "in" / "up.bin"
        ).exists()  # a temporary name, dropped when stale
    finally:
        session.close_connections()


# -- the raw stream: a kernel on unix sockets sends a download on a socket of its own -----------


@pytest.fixture
def raw_session(own_sshd, tmp_path, monkeypatch):  # noqa: F811
    """A real runtime whose kernel listens on unix sockets (as in a Docker session), reached
    through our tunnel's streamlocal channels (the product's TunnelLink); `streams` counts the
    downloads that came on the raw stream."""
    import types

    from gpusession.backends.base import TunnelLink
    from gpusession.session.handle import Session
    from gpusession.transport.kernel import rawstream
    from support.procs import start_runtime

    info, proc = start_runtime(
        tmp_path / "state", "rawfaults", "--agent-port", "-1", "--kernel-ip", str(tmp_path / "k/k")
    )
    streams = []
    real = rawstream.chunks
    monkeypatch.setattr(
        rawstream, "chunks", lambda *a, **k: (streams.append(a[1]["raw"]), real(*a, **k))[1]
    )
    link = TunnelLink(Tunnel(own_sshd.target()).start(), info, agent_port=None)
    record = types.SimpleNamespace(id="rawfaults", name="faulty")
    session = Session(None, record, types.SimpleNamespace(is_alive=lambda r: True), link)
    session.kernel.wait_ready(30)
    work = tmp_path / "work"
    work.mkdir()
    session.run(f"import os; os.chdir({str(work)!r})")
    session.streams = streams
    yield session
    session.close_connections()
    proc.terminate()
    proc.wait(15)


def _big_file_in(session, blob: bytes) -> None:
    session.push({"blob": blob})
    session.run("open('big.bin', 'wb').write(blob); del blob")


@needs_sshd
def test_a_raw_download_resumes_after_two_cuts_with_every_byte(raw_session, own_sshd, tmp_path):  # noqa: F811
    blob = os.urandom(SIZE)
    _big_file_in(raw_session, blob)
    cuts = {"at": []}

    def progress(done, total):  # a cut at 30% and at 70% of the bytes
        if total and len(cuts["at"]) < 2 and done >= (0.3, 0.7)[len(cuts["at"])] * total:
            cuts["at"].append(done)
            threading.Thread(target=own_sshd.cut_connections, daemon=True).start()

    box, _ = _within(90, raw_session.download, ["big.bin"], str(tmp_path / "out"), progress)
    assert "error" not in box, box
    assert len(cuts["at"]) == 2 and len(raw_session.streams) == 1, (cuts, raw_session.streams)
    got = (tmp_path / "out" / "big.bin").read_bytes()
    assert hashlib.sha256(got).hexdigest() == hashlib.sha256(blob).hexdigest()
    assert os.listdir(tmp_path / "out") == ["big.bin"]
    # the kernel let go of the stream once the download was whole (its socket stays for the next)
    left = raw_session.kernel.evaluate(
        "[len(x.streams) for x in __import__('gpusession.agent.transfer_raw', "
        "fromlist=['_'])._LISTENERS.values()]"
    )
    assert left == "[0]", left


@needs_sshd
def test_ctrl_c_inside_a_raw_download_is_one_line_and_writes_nothing(raw_session, tmp_path):
    from gpusession.core.errors import TransferStopped

    def interrupt(done, total):
        if total and done >= 0.4 * total:
            raise KeyboardInterrupt

    _big_file_in(raw_session, os.urandom(SIZE))
    box, _ = _within(30, raw_session.download, ["big.bin"], str(tmp_path / "out"), interrupt)
    err = box.get("error")
    assert isinstance(err, TransferStopped) and raw_session.streams, box
    assert str(err).startswith("interrupted: the download stopped at ") and "\n" not in str(err)
    assert str(err).endswith("of 50 MB; nothing of it was written here"), str(err)
    assert not (tmp_path / "out").exists() or os.listdir(tmp_path / "out") == []
    assert raw_session.kernel.evaluate("1 + 1") == "2"


@needs_sshd
def test_a_raw_download_whose_link_does_not_come_back_ends_in_one_line(
    raw_session,
    own_sshd,  # noqa: F811
    tmp_path,
    monkeypatch,
):
    from gpusession.core.errors import LinkLost

    raw_session.link.tunnel.give_up_after = 2.0
    _big_file_in(raw_session, os.urandom(SIZE))
    state = {"gone": False}

    def vanish(done, total):
        if not state["gone"] and total and done >= 0.4 * total:
            state["gone"] = True
            own_sshd.close()
            own_sshd.cut_connections()

    box, took = _within(30, raw_session.download, ["big.bin"], str(tmp_path / "out"), vanish)
    err = box.get("error")
    assert isinstance(err, LinkLost) and raw_session.streams, box
    assert "\n" not in str(err) and "; the download stopped at " in str(err), str(err)
    assert took < 15
    assert not (tmp_path / "out").exists() or os.listdir(tmp_path / "out") == []


def _comes_whole_as_frames(raw_session, tmp_path) -> None:
    """A 50 MB download ends whole, and not on the raw stream."""
    blob = os.urandom(SIZE)
    _big_file_in(raw_session, blob)
    box, _ = _within(60, raw_session.download, ["big.bin"], str(tmp_path / "out"))
    assert "error" not in box and raw_session.streams == [], box
    got = (tmp_path / "out" / "big.bin").read_bytes()
    assert hashlib.sha256(got).hexdigest() == hashlib.sha256(blob).hexdigest()


@needs_sshd
def test_a_raw_stream_the_login_may_not_reach_falls_back_to_frames(raw_session, tmp_path):
    """An EC2 session key older than the raw stream may forward to the kernel's five sockets
    only: sshd refuses the stream's path, and the same download comes as frames, whole."""
    real = raw_session.kernel.open_stream
    raw_session.kernel.open_stream = lambda path: real(path + "-refused")  # sshd: connect failed
    _comes_whole_as_frames(raw_session, tmp_path)


@needs_sshd
def test_a_kernel_that_cannot_make_its_stream_socket_sends_frames(raw_session, tmp_path):
    """The stream's socket path taken by something else (here a folder): the kernel offers no
    stream and the download comes as frames, whole, instead of failing."""
    raw_session.run(f"import os; os.mkdir({str(tmp_path / 'k' / 'k-r')!r})")
    _comes_whole_as_frames(raw_session, tmp_path)
