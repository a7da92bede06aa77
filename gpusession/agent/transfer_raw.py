"""In the session kernel: a download's bytes straight onto a unix socket beside the kernel's own
(the *raw stream*), for a client that reaches those sockets (the local engine's folder, or the
tunnel's streamlocal channel to it): no ZMQ frames, no request per chunk, nothing forwarded
through a local socket on the client's side (docs/transfers.md, "The raw stream").

The client says `raw` in its download's open request; a kernel on unix sockets answers with the
path of its socket for raw streams (`<ip>-r`, one per kernel) and the stream's token (on the
shell channel, which is signed). On the socket, the client sends the token and the offset it
holds (0 the first time), then an offset again every few MB it received (its choice); the
kernel sends the tar stream from that offset and half-closes at its end. Whether that end was the
stream's is asked on the shell channel (`end`, with the client's size; the answer has the
stream's CRC-32): a stream a cut stopped is connected again from the client's offset, and the
kernel sends again what it kept (every byte not yet acknowledged). Standard library only;
Python 3.9 syntax.
"""

from __future__ import annotations

import collections
import os
import socket
import threading
import time
from typing import Any, Callable, Optional

RAW_PART = 1 << 20  # the tar thread's parts: its reads of a file's bytes, sent without joining
OFFSET_BYTES = 8
TOKEN_BYTES = 16


def stream_path() -> Optional[str]:
    """The kernel's socket for raw streams, beside its own unix sockets (ZMQ's ipc `<ip>-<n>`,
    in the owner's folder): `<ip>-r`, one for every download (a connection's token names its
    stream), so a login allowed to reach fixed paths only (an EC2 session key) reaches it too.
    None for a kernel on TCP ports (no folder the client reaches)."""
    try:
        from ipykernel.kernelapp import IPKernelApp
    except ImportError:
        return None
    if not IPKernelApp.initialized():
        return None
    app = IPKernelApp.instance()
    if getattr(app, "transport", "tcp") != "ipc" or not str(app.ip).startswith("/"):
        return None
    return f"{app.ip}-r"


def _exactly(conn: socket.socket, n: int) -> Optional[bytes]:
    data = b""
    while len(data) < n:
        got = conn.recv(n - len(data))
        if not got:
            return None
        data += got
    return data


def _shut(conn: socket.socket) -> None:
    try:
        conn.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


class Listener:
    """The kernel's socket for raw streams: each connection says which stream it wants (its
    token) and from which byte; the stream takes it over."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.streams: "dict[bytes, RawStream]" = {}
        old = os.umask(0o077)
        try:
            self.sock = socket.socket(socket.AF_UNIX)
            try:
                self.sock.bind(path)
            except OSError:  # an earlier kernel's of this session (a restart): gone with it
                os.unlink(path)
                self.sock.bind(path)
        finally:
            os.umask(old)
        # lazy: made at the first raw stream, not at the kernel's start
        from .kernelspawn import share_socket

        share_socket(path)  # as the kernel's own sockets: a 2770 folder's group connects too
        self.sock.listen(16)
        threading.Thread(target=self._serve, daemon=True, name="gpusession-raw").start()

    def close(self) -> None:
        self.sock.close()
        try:
            os.unlink(self.path)
        except OSError:
            pass

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._hello, args=(conn,), daemon=True).start()

    def _hello(self, conn: socket.socket) -> None:
        conn.settimeout(10.0)
        try:
            hello = _exactly(conn, TOKEN_BYTES + OFFSET_BYTES)
        except OSError:
            hello = None
        stream = self.streams.get(hello[:TOKEN_BYTES]) if hello is not None else None
        if stream is None or stream.closed:
            conn.close()  # not a stream of ours (or one that ended)
            return
        conn.settimeout(None)
        stream.take_over(conn, int.from_bytes(hello[TOKEN_BYTES:], "big"))


_LISTENERS: "dict[str, Listener]" = {}
_MAKING = threading.Lock()


def raw_listener() -> Optional[Listener]:
    """The kernel's Listener (made at the first raw stream); None where it has none: a kernel on
    TCP ports, or a socket that cannot be made there (the download then goes as frames)."""
    path = stream_path()
    if path is None:
        return None
    with _MAKING:
        if path not in _LISTENERS:
            try:
                _LISTENERS[path] = Listener(path)
            except OSError:
                return None
        return _LISTENERS[path]


class RawStream:
    """Serves one download's bytes (`source.read()`: (part, eof), TransferError on a failure)
    to the connections the listener hands it, one at a time, until closed."""

    def __init__(self, source: Any, listener: Listener, touch: Callable[[], None]) -> None:
        self.source, self.listener, self.touch = source, listener, touch
        self.token = os.urandom(TOKEN_BYTES)
        self.kept: "collections.deque[tuple[int, Any]]" = collections.deque()  # (offset, part)
        self.at = 0  # bytes taken from the source
        self.acked = 0  # bytes the client said it holds
        self.done = False  # the source ended (and every byte of it was taken)
        self.error: Optional[str] = None
        self.closed = False
        self.current: Optional[socket.socket] = None  # the connection being served
        self._sender: Optional[threading.Thread] = None
        self._switch = threading.Lock()
        self._acks = b""
        listener.streams[self.token] = self

    def info(self) -> dict:
        return {"raw": self.listener.path, "token": self.token.hex()}

    def end(self, size: int) -> dict:
        """The shell channel's `end`: the whole stream's size and CRC-32 when it was all sent and
        the client holds all of it; `more` when not (a cut: the client connects again)."""
        if self.error:
            return {"error": self.error}
        if self.done and size == self.at:
            check = self.source.check
            return {"eof": True, "size": check.size, "crc": check.crc}
        return {"more": True, "size": self.at}

    def close(self) -> None:
        self.closed = True
        self.listener.streams.pop(self.token, None)
        if self.current is not None:
            _shut(self.current)

    def take_over(self, conn: socket.socket, start: int) -> None:
        """A new connection (after a cut the old one may not have noticed: a send blocked on a
        dead peer) takes over from the one before."""
        with self._switch:
            if self._sender is not None:
                _shut(self.current)  # wakes its send: it ends at once
                self._sender.join()
            self.current = conn
            self._sender = threading.Thread(
                target=self._send_on, args=(conn, start), daemon=True, name="gpusession-raw-send"
            )
            self._sender.start()

    def _send_on(self, conn: socket.socket, start: int) -> None:
        try:
            with conn:
                self._send_from(conn, start)
        except OSError:
            pass  # the client went (a cut): it connects again from what it holds

    def _send_from(self, conn: socket.socket, start: int) -> None:
        if not self.acked <= start <= self.at:
            self.error = (
                f"the download cannot go on from byte {start} (the session kept bytes "
                f"{self.acked}-{self.at})"
            )
            return
        self._acks = b""
        self._ack(start)
        for offset, part in list(self.kept):  # what a cut lost, again
            if offset + len(part) > start:
                conn.sendall(memoryview(part)[max(0, start - offset) :])
        while not self.done and not self.closed and conn is self.current:
            self._read_acks(conn)
            try:
                part, eof = self._take()
            except Exception as exc:  # noqa: BLE001 - the source's failure, said by `end`
                self.error = str(exc) or type(exc).__name__
                return
            if len(part):
                conn.sendall(part)
            self.done = eof
        conn.shutdown(socket.SHUT_WR)  # the end: what was sent is read before the EOF

    def _take(self) -> tuple[Any, bool]:
        part, eof = self.source.read()
        if len(part):
            self.source.check.add(part)
            self.kept.append((self.at, part))
            self.at += len(part)
        self.source.touched = time.monotonic()  # a long download is not a stale transfer
        self.touch()  # nor an idle kernel
        return part, eof

    def _read_acks(self, conn: socket.socket) -> None:
        """Take the client's offsets that came, without waiting."""
        try:
            data = conn.recv(4096, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return
        if not data:
            return
        self._acks += data
        whole = len(self._acks) - len(self._acks) % OFFSET_BYTES
        if whole:
            self._ack(int.from_bytes(self._acks[whole - OFFSET_BYTES : whole], "big"))
            self._acks = self._acks[whole:]

    def _ack(self, offset: int) -> None:
        self.acked = max(self.acked, min(offset, self.at))
        while self.kept and self.kept[0][0] + len(self.kept[0][1]) <= self.acked:
            self.kept.popleft()
