"""sshlogin.ReadAhead: a login's socket read by one large `recv` for paramiko's many small ones.
paramiko's packet layer relies on a socket's contract: at most what was asked, every byte once,
in order, b"" at the end, its timeout raised as socket.timeout. No sshd: a socketpair."""

from __future__ import annotations

import os
import random
import socket
import threading

import pytest

from gpusession.transport.sshlogin import READ_AHEAD, ReadAhead


def test_reads_return_the_stream_in_order_never_more_than_asked():
    rng = random.Random(3)
    blob = os.urandom(3 * READ_AHEAD + 12345)
    a, b = socket.socketpair()
    threading.Thread(target=lambda: (a.sendall(blob), a.close()), daemon=True).start()
    reader, got, calls = ReadAhead(b), bytearray(), 0
    while True:
        n = rng.choice([1, 4, 16, 1000, 32768, 40000, 1 << 20])
        piece = reader.recv(n)
        calls += 1
        assert len(piece) <= n
        if not piece:
            break
        got += piece
    assert bytes(got) == blob
    assert reader.recv(16) == b""  # and stays at its end
    b.close()


def test_the_sockets_timeout_is_raised_and_what_came_before_it_is_kept():
    a, b = socket.socketpair()
    reader = ReadAhead(b)
    reader.settimeout(0.05)  # the socket's own, as paramiko sets it (0.1 s)
    assert b.gettimeout() == 0.05
    a.sendall(b"SSH-2.0-x\r\nrest")
    assert reader.recv(4) == b"SSH-"
    assert reader.recv(100) == b"2.0-x\r\nrest"
    with pytest.raises(socket.timeout):
        reader.recv(16)
    a.sendall(b"more")
    assert reader.recv(16) == b"more"
    a.close()
    assert reader.recv(16) == b""
    reader.close()
    assert b.fileno() == -1  # closing it closes the socket
