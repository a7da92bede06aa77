"""Cuts inside transfers (issue 19 item 3): push, pull, upload and download across real tunnel
cuts (a real session kernel, a real sshd on 127.0.0.1, our tunnel; the cut made by `ss -K` when
the transfer is part way). Each must resume (the tunnel comes back) or fail in one line with the
true cause; none may hang, and no partial file may stay under its final name on either side."""

from __future__ import annotations

import hashlib
import os
import threading

import pytest

from gpusession.tunnel import Tunnel
from test_faults_link import _session, _within, needs_sshd, own_sshd, runtime  # noqa: F401 - fixtures
from test_tunnel import PORTS

SIZE = 50_000_000


def _cut_at(sshd, fraction: float):
    """A progress callback that cuts the tunnel once, when `fraction` of the bytes moved."""
    state = {"cut": False}

    def progress(done, total):
        if not state["cut"] and total and done >= fraction * total:
            state["cut"] = True
            threading.Thread(target=sshd.cut_connections, daemon=True).start()

    return progress, state


@pytest.fixture
def session(own_sshd, runtime):  # noqa: F811
    info, _ = runtime
    tunnel = Tunnel(own_sshd.target(), [info[p] for p in PORTS]).start()
    s = _session(tunnel, info)
    yield s
    s.close_connections()


@needs_sshd
@pytest.mark.parametrize("kind", ["push", "pull", "upload", "download"])
def test_a_cut_inside_a_transfer_resumes(session, own_sshd, kind, tmp_path):
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
        assert session.kernel.evaluate("__import__('hashlib').sha256(blob).hexdigest()").strip("'") == digest
    elif kind == "pull":
        assert hashlib.sha256(box["value"]["blob"]).hexdigest() == digest
    elif kind == "upload":
        got = session.kernel.evaluate("__import__('hashlib').sha256(open('in/big.bin','rb').read()).hexdigest()")
        assert got.strip("'") == digest
        assert session.kernel.evaluate("sorted(__import__('os').listdir('in'))") == "['big.bin']"
    else:
        assert hashlib.sha256((tmp_path / "out" / "big.bin").read_bytes()).hexdigest() == digest
        assert os.listdir(tmp_path / "out") == ["big.bin"]
    del cwd
