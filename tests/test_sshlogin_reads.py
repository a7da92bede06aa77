"""sshlogin.ReadAhead: a login's socket read by one large `recv` for paramiko's many small ones.
paramiko's packet layer relies on a socket's contract: at most what was asked, every byte once,
in order, b"" at the end, its timeout raised as socket.timeout. No sshd: a socketpair."""

from __future__ import annotations

import os
import random
import socket
import threading
import time

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


def test_more_joins_a_cut_packets_rest_and_keeps_the_read_after_it_next():
    """ReadAhead.more, as ChannelData calls it where a read's end cuts a packet: the bytes
    asked for are joined on, the rest of that read comes next without another read, and where
    the read waits past the socket's timeout or finds the end nothing changes (False)."""
    a, b = socket.socketpair()
    reader = ReadAhead(b)
    reader.settimeout(0.05)
    done = []
    a.sendall(b"0123456789")
    assert reader.recv(4) == b"0123"
    a.sendall(b"ABCDEFGH")
    reader.before_waiting(lambda: done.append("flushed"))
    assert reader.more(3)
    assert done == ["flushed"]  # what waits for a read ran before it, as in recv
    assert reader.has_more()
    assert reader.recv(100) == b"456789ABC"  # the cut part and what completes it, together
    assert reader.has_more()
    assert reader.recv(2) == b"DE"  # the read's rest: no socket read (nothing more was sent)
    assert reader.recv(100) == b"FGH"
    assert not reader.has_more()
    with pytest.raises(socket.timeout):
        reader.recv(1)
    a.sendall(b"xy")
    assert reader.recv(1) == b"x"
    assert not reader.more(4)  # the rest does not come within the timeout
    a.sendall(b"z!")
    assert reader.recv(100) == b"y"  # kept as it was
    assert reader.more(1)  # nothing left before it: all the read gave, as it is
    assert reader.recv(100) == b"z!"
    a.close()
    assert not reader.more(1)  # the end: paramiko's reader finds it
    assert reader.recv(1) == b""
    b.close()


def _wire(messages, key: bytes, iv: bytes) -> bytes:
    """`messages` as an sshd would send them, AES-GCM encrypted by paramiko's own packetizer."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    from paramiko.packet import Packetizer

    class Sink:
        out = bytearray()

        def send(self, b):
            self.out += b
            return len(b)

    sink = Sink()
    out = Packetizer(sink)
    out.set_outbound_cipher(AESGCM(key), 16, None, 16, None, aead=True, iv_out=iv)
    for m in messages:
        out.send_message(m)
    return bytes(sink.out)


def _reader(
    wire: bytes, key: bytes, iv: bytes, rekey_packets: int | None = None, trickle: bool = False
):
    """paramiko's packetizer on a ReadAhead socket that gets `wire`, its keys set (as after the
    first key exchange), and the transport's parts ChannelData looks at. `trickle`: the wire
    comes in pieces of 1 byte to 70 KB with pauses past the socket's timeout (paramiko's 0.1 s)
    between some, packets cut anywhere."""
    from types import SimpleNamespace

    from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    from paramiko.packet import Packetizer

    a, b = socket.socketpair()

    def send() -> None:
        if not trickle:
            a.sendall(wire)
        else:
            rng, at = random.Random(11), 0
            while at < len(wire):
                n = rng.choice([1, 3, 100, 5000, 33000, 70000])
                a.sendall(wire[at : at + n])
                at += n
                if rng.random() < 0.05:
                    time.sleep(0.15)
        a.close()

    threading.Thread(target=send, daemon=True).start()
    sock = ReadAhead(b)
    if trickle:
        sock.settimeout(0.1)
    pk = Packetizer(sock)
    pk.set_inbound_cipher(AESGCM(key), 16, None, 16, None, aead=True, iv_in=iv)
    pk._initial_kex_done = True
    if rekey_packets:
        pk.REKEY_PACKETS = rekey_packets
    pk.rekey_asked_at = []  # the packets read when a rekey was asked for
    ask = pk._trigger_rekey

    def trigger():
        pk.rekey_asked_at.append(pk._Packetizer__received_packets)
        ask()

    pk._trigger_rekey = trigger
    chan = SimpleNamespace(chanid=7)
    transport = SimpleNamespace(
        packetizer=pk, sock=sock, lock=threading.Lock(), _expected_packet=(), _channels={7: chan}
    )
    return transport, chan, pk


@pytest.mark.parametrize(("rekey_packets", "trickle"), [(None, False), (40, False), (None, True)])
def test_channel_data_is_taken_as_paramikos_reader_reads_it_and_the_rest_is_left_to_it(
    rekey_packets, trickle
):
    """sshlogin.ChannelData against paramiko's own reader on the same encrypted bytes: channel
    7's data reaches its receiver whole and in order, every other message (another channel's
    data, an ignore, a window adjust, a short data packet) comes back from read_message as paramiko
    gives it, and the packetizer's counts (sequence number, nonce, bytes and packets read, a
    rekey asked for past its limit) end where paramiko's own end. Every packet of channel 7
    is taken, also those the reads' ends cut, unless a read waits past the socket's timeout
    (`trickle`: then paramiko's reader waits) or the rekey limit is near."""
    from paramiko.common import (
        cMSG_CHANNEL_DATA,
        cMSG_CHANNEL_WINDOW_ADJUST,
        cMSG_IGNORE,
    )
    from paramiko.message import Message

    from gpusession.transport.sshlogin import ChannelData

    rng = random.Random(5)
    key, iv = os.urandom(16), os.urandom(12)
    sent, messages, ours = bytearray(), [], 0
    for i in range(120):
        m = Message()
        kind = rng.choice(["data"] * 6 + ["other", "ignore", "adjust"])
        if kind == "data":
            data = os.urandom(rng.choice([1, 100, 32768, 32768, 20000, 131072 - 64]))
            m.add_byte(cMSG_CHANNEL_DATA), m.add_int(7), m.add_string(data)
            sent += data
            ours += 1
        elif kind == "other":
            m.add_byte(cMSG_CHANNEL_DATA), m.add_int(9), m.add_string(b"not ours %d" % i)
        elif kind == "ignore":
            m.add_byte(cMSG_IGNORE), m.add_string(b"x" * i)
        else:
            m.add_byte(cMSG_CHANNEL_WINDOW_ADJUST), m.add_int(7), m.add_int(i)
        messages.append(m)
    wire = _wire(messages, key, iv)

    def read(packetizer, taken: bytearray) -> list:
        """Until the end, as paramiko's transport loop: channel 7's data to `taken`."""
        rest = []
        while True:
            try:
                t, m = packetizer.read_message()
            except EOFError:
                return rest
            if t == 94 and m.get_int() == 7:
                taken += m.get_binary()
            else:
                rest.append((t, m.asbytes()))

    transport, _, theirs = _reader(wire, key, iv, rekey_packets)
    expected = read(theirs, bytearray())
    transport.sock.close()

    transport, chan, reader = _reader(wire, key, iv, rekey_packets, trickle)
    data = ChannelData.of(transport)
    assert data is not None and ChannelData.of(transport) is data  # one per transport
    taken = bytearray()
    data.add(chan, lambda views: [taken.extend(v) for v in views])
    rest = read(reader, taken)
    transport.sock.close()
    assert bytes(taken) == bytes(sent)
    assert rest == expected
    if rekey_packets is None and not trickle:
        assert data.packets == ours  # none left to paramiko's reader, cut or not
    else:
        assert 0 < data.packets < ours
    for name in ("sequence_number_in", "iv_in", "received_bytes", "received_packets"):
        assert getattr(reader, "_Packetizer__" + name) == getattr(theirs, "_Packetizer__" + name)
    assert reader.need_rekey() == theirs.need_rekey() == bool(rekey_packets)
    assert (
        reader.rekey_asked_at == theirs.rekey_asked_at == ([rekey_packets] if rekey_packets else [])
    )
    if rekey_packets:  # past the limit everything went paramiko's way
        assert data.packets < rekey_packets
    data.remove(chan)
    assert not data.receivers
