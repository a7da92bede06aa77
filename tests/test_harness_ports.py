"""The suite's own servers, JupyterLab (support/lab.py), moto's EC2 API (support/ec2.py) and the
tunnel tests' sshd (test_tunnel.Sshd),
start although the free port they were given is taken before they bind it: in a loaded CI run
another worker's kernel bound that port (a ZMQ socket) in the seconds the server spent
importing, and the wait for the server read the kernel's greeting (`BadStatusLine`), failing a
browser test's setup."""

from __future__ import annotations

import socket
import threading
import urllib.request
from urllib.parse import urlparse

import pytest

from support import ec2, lab

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

ZMQ_GREETING = b"\xff" + b"\x00" * 8 + b"\x7f"  # how a kernel's socket answers a connect


@pytest.fixture
def taken_port():
    """A port another process's ZMQ socket holds: it takes connections and greets them."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)

    def serve():
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                conn.sendall(ZMQ_GREETING)

    threading.Thread(target=serve, daemon=True).start()
    yield listener.getsockname()[1]
    listener.close()


def test_a_lab_whose_free_port_was_taken_meanwhile_starts_on_another(
    tmp_path, monkeypatch, taken_port
):
    given = iter([taken_port])
    free = lab.free_port
    monkeypatch.setattr(lab, "free_port", lambda: next(given, None) or free())
    server = lab.start_lab(tmp_path / "root", log_path=tmp_path / "lab.log", timeout=120)
    try:
        assert urlparse(server.url).port not in (taken_port, None), server.url
        request = urllib.request.Request(
            f"{server.url}api/status", headers={"Authorization": f"token {server.token}"}
        )
        with urllib.request.urlopen(request, timeout=10) as reply:  # noqa: S310 - localhost
            assert reply.status == 200
    finally:
        lab.stop_lab(server.process)


def test_a_port_the_caller_chose_is_not_changed_and_the_error_says_why(tmp_path, taken_port):
    with pytest.raises(RuntimeError, match="not as HTTP|is not available") as raised:
        lab.start_lab(
            tmp_path / "root", port=taken_port, log_path=tmp_path / "lab.log", timeout=120
        )
    assert str(taken_port) in str(raised.value)


def test_moto_whose_free_port_was_taken_meanwhile_starts_on_another(monkeypatch, taken_port):
    given = iter([taken_port])
    free = ec2.free_port
    monkeypatch.setattr(ec2, "free_port", lambda: next(given, None) or free())
    server = ec2.MotoServer()
    try:
        assert server.port != taken_port
        with urllib.request.urlopen(f"{server.url}/moto-api/", timeout=10) as reply:  # noqa: S310
            assert reply.status == 200
    finally:
        server.close()


def test_a_test_sshd_whose_free_port_was_taken_meanwhile_starts_on_another(
    tmp_path, monkeypatch, taken_port
):
    import test_tunnel

    given = iter([taken_port])
    free = test_tunnel.free_port
    monkeypatch.setattr(test_tunnel, "free_port", lambda: next(given, None) or free())
    server = test_tunnel.Sshd(tmp_path)
    try:
        assert server.port != taken_port
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as conn:
            assert conn.recv(8) == b"SSH-2.0-"  # sshd's greeting, not the other socket's
    finally:
        server.close()
