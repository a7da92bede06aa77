"""A download's bytes on a stream of their own: a connection to a socket the session kernel opened
beside its unix sockets (the kernel's side and the protocol: `gpusession.agent.transfer_raw`),
made by the session's link (directly, or a channel of its SSH tunnel), read here without ZMQ
frames or a forwarding thread. A cut connection is made again from the bytes held here; the
kernel sends again what it kept. Whether the stream is whole is asked on the shell channel."""

from __future__ import annotations

import time
import zlib
from typing import Any, Callable, Generator

from ...core.errors import TransferStopped
from .channel import STALL_S, Channel

ACK_EVERY = 8 << 20  # the kernel keeps what is not acknowledged: this, and what is in flight
RECV = 4 << 20
QUIET_S = 60.0  # nothing on the stream this long: it is connected again (a cut nobody saw)
REPORT_EVERY = 1 << 20
RETRY_S = 0.5


class _Held:
    """What arrived so far: its size and CRC-32 (kept across the connections a cut ends)."""

    def __init__(self) -> None:
        self.size, self.crc = 0, 0


def chunks(
    channel: Channel, info: dict, open_stream: Callable[[str], Any], first: Any
) -> Generator[bytes, None, None]:
    """The stream's bytes in order, as they arrive, from connection `first` and, after a cut,
    those `open_stream` makes; at its end, TransferStopped when they are not the whole stream
    the session sent (its size and CRC-32)."""
    total, token = info.get("size"), bytes.fromhex(info["token"])
    held, moved = _Held(), time.monotonic()
    while True:
        stream, before = first or _connect(channel, open_stream, info["raw"]), held.size
        first = None
        try:
            stream.settimeout(QUIET_S)
            stream.sendall(token + held.size.to_bytes(8, "big"))
            yield from _read(channel, stream, total, held)
        except Exception as exc:  # noqa: BLE001 - a cut is said as the link's own kind
            if not _a_cut(exc):
                raise
        finally:
            _close(stream)
        channel.heard = time.monotonic()  # the shell channel was quiet while the bytes came
        channel.send({"op": "end", "size": held.size})
        end = channel.reply()
        if end.get("eof"):
            break
        if held.size > before:
            moved = time.monotonic()
        elif time.monotonic() - moved > STALL_S:
            raise TransferStopped(
                f"the session sent nothing of the {channel.verb} for {STALL_S:.0f}s"
            )
        else:
            time.sleep(RETRY_S)
    if end.get("size") != held.size or end.get("crc") != held.crc:
        raise TransferStopped(
            f"the {channel.verb} arrived damaged ({held.size} bytes, checksum {held.crc:08x}; the "
            f"session sent {end.get('size')} bytes, checksum {end.get('crc', 0):08x})"
        )
    channel.progress(held.size, total)


def _read(channel: Channel, stream: Any, total, held: _Held) -> Generator[bytes, None, None]:
    """Read until the kernel's end (or a cut); the bytes held are acknowledged every ACK_EVERY
    (an acknowledgement the closing stream refuses is not needed: the kernel sent its end)."""
    acked = reported = held.size
    while True:
        data = stream.recv(RECV)
        if not data:
            return
        held.crc = zlib.crc32(data, held.crc)
        held.size += len(data)
        yield data
        if held.size - acked >= ACK_EVERY:
            acked = held.size
            try:
                stream.sendall(acked.to_bytes(8, "big"))
            except Exception as exc:  # noqa: BLE001 - as above
                if not _a_cut(exc):
                    raise
        if held.size - reported >= REPORT_EVERY:
            channel.progress(held.size, total)
            reported = held.size


def _connect(channel: Channel, open_stream: Callable[[str], Any], path: str) -> Any:
    """The stream's connection, tried until it is made (the tunnel may be reconnecting)."""
    deadline = time.monotonic() + STALL_S
    while True:
        if not channel.kc.healthy():
            raise TransferStopped("the session stopped answering")
        stream = open_stream(path)
        if stream is not None:
            return stream
        if time.monotonic() > deadline:
            raise TransferStopped(
                f"the session's download stream could not be reached for {STALL_S:.0f}s"
            )
        time.sleep(RETRY_S)


def _a_cut(exc: BaseException) -> bool:
    """A connection that broke: the socket's errors and timeouts, paramiko's own kinds."""
    return isinstance(exc, (OSError, EOFError)) or type(exc).__module__.startswith("paramiko")


def _close(stream: Any) -> None:
    try:
        stream.close()
    except Exception:  # noqa: BLE001 - best effort: the link may be gone
        pass
