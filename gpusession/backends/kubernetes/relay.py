"""The loop that moves one port-forward stream's bytes between the API server's websocket and
the local socket pair the kubernetes client hands out (`PortForward.socket(port)`).

The client's own loop (`kubernetes.stream.ws_client.PortForward._proxy`) keeps what waits for
the local side in a `bytes` it grows with `+=` and cuts with `data = data[sent:]` at every send:
each send copies everything still waiting, so a download whose frames come faster than the
kernel's socket drains them costs time quadratic in the backlog (a 100 MB download took 1.3 to
7.4 s where `kubectl cp` took 0.8 to 1.2 s: docs/benchmarks.md). This one speaks the same
protocol (per port a data and an error channel, each opened by a frame naming the port; every
frame a channel byte and data) with `bytearray` buffers cut from the front (no copy), and stops
reading the websocket while `LIMIT` bytes wait for the local side, so a slow reader slows the
API server down through TCP instead of filling this process's memory. When the API server's side
closes, what still waits goes out to the local side before it is closed (the client's loop
dropped it).

Plain data in: the websocket is the client's (`recv_data_frame`, `sock`, `connected`), the ports
its `_Port`s (`python`: this end of the socket pair, `channel`, `port_number`, `error`)."""

from __future__ import annotations

import select
import ssl
from typing import Any

LIMIT = 8 * 1024 * 1024  # bytes waiting for the local side before the websocket is read again
READ = 1024 * 1024  # one read of the local side
BINARY, CLOSE, PING, PONG = 0x2, 0x8, 0x9, 0xA  # websocket opcodes (RFC 6455)


def relay(websocket, ports: list, limit: int = LIMIT) -> dict[str, Any]:
    """Move bytes both ways until both sides are done; returns {"most_waiting": bytes}, the
    largest backlog held for the local side (at most `limit` and one frame)."""
    # lazy: docs/architecture.md#imports-kept-inside-functions (the client's, imported on use)
    from websocket import ABNF, WebSocketConnectionClosedException

    channels: list = []  # channel number -> its port (data, then error, per port)
    for port in ports:
        channels += [port, port]
        port.python.setblocking(True)
    opened = [False] * len(channels)
    waiting = {port.python: bytearray() for port in ports}  # for the local side
    outgoing = bytearray()  # for the API server, as frames
    most, ended = 0, False  # ended: the API server's side closed (what waits still goes out)
    while True:
        held = sum(len(b) for b in waiting.values())
        most = max(most, held)
        reads, writes, open_ports = [], [], False
        connected = websocket.connected and not ended
        if connected:
            if held < limit:
                reads.append(websocket)
            if outgoing:
                writes.append(websocket)
        for port in ports:
            local = port.python
            if local.fileno() == -1:
                continue
            if connected:
                reads.append(local)
                open_ports = True
            if waiting[local]:
                writes.append(local)
                open_ports = True
            elif not connected:
                local.close()  # all it was sent went out first
        if not open_ports and not (connected and outgoing):
            websocket.close()
            return {"most_waiting": most}
        readable, writable, _ = select.select(reads, writes, [])
        for sock in readable:
            if sock is websocket:
                try:
                    _read_frames(websocket, channels, opened, waiting)
                except WebSocketConnectionClosedException:
                    ended = True  # the client's loop dropped what still waited here
                continue
            port = next(p for p in ports if p.python is sock)
            data = sock.recv(READ)
            if data:
                outgoing += ABNF.create_frame(port.channel + data, BINARY).format()
            else:
                sock.close()
        for sock in writable:
            if sock is websocket:
                del outgoing[: websocket.sock.send(outgoing)]
            elif sock.fileno() != -1:
                buffer = waiting[sock]
                del buffer[: sock.send(buffer)]


def _read_frames(websocket, channels: list, opened: list, waiting: dict) -> None:
    """The frames the websocket has now (all of a TLS record's, which select cannot see)."""
    while True:
        opcode, frame = websocket.recv_data_frame(True)
        if opcode == BINARY:
            data = frame.data
            if not data or data[0] >= len(channels):
                raise RuntimeError(f"unexpected port-forward frame: {bytes(data[:8])!r}")
            channel, port = data[0], channels[data[0]]
            if not opened[channel]:  # its first frame names the port
                number = data[1] + data[2] * 256 if len(data) == 3 else None
                if number != port.port_number:
                    raise RuntimeError(f"unexpected first frame on channel {channel}")
                opened[channel] = True
            elif channel % 2:  # the error channel: the API server's words, then the end
                port.error = (port.error or "") + bytes(data[1:]).decode(errors="replace")
                port.python.close()
            else:
                waiting[port.python] += memoryview(data)[1:]
        elif opcode not in (PING, PONG, CLOSE):
            raise RuntimeError(f"unexpected websocket opcode {opcode}")
        sock = websocket.sock
        if not (isinstance(sock, ssl.SSLSocket) and sock.pending()):
            return
