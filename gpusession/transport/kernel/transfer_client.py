"""Bulk bytes to and from a session kernel as binary ZMQ frames on its shell channel (the kernel
side and the message format: `gpusession.agent.transfer_handler`). Chunks of CHUNK bytes, WINDOW of
them in flight, so the link stays full while each side works; no base64, no JSON of the payload.

`progress(done, total)` is called as bytes move (total None when not known ahead)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import io
import os
import pickle
import queue
import tarfile
import zlib
from typing import Any, Callable, Generator, Iterable, Iterator

from ...core.errors import BadInput, KernelDied, LinkLost, TransferStopped
from ..pulls import format_bytes
from ..tarsafe import Extraction, ForwardReader, whole_seconds
from . import rawstream
from .channel import CHUNK, WINDOW, Channel, Progress
from .connection import Connection

TAR_BUFSIZE = 1 << 20
# Ctrl-C, and what it becomes when it lands inside jupyter_client's event loop
INTERRUPTS = (KeyboardInterrupt, asyncio.CancelledError, concurrent.futures.CancelledError)


class _Sender(io.RawIOBase):
    """A writable file object: whole chunks go out as `data` requests, WINDOW in flight; the
    last one carries the size and CRC-32 of the whole stream, checked by the kernel."""

    def __init__(self, channel: Channel, total: int | None):
        super().__init__()
        self.channel, self.total, self.sent = channel, total, 0
        self.buf = bytearray()
        self.result: dict = {}
        self.crc = 0

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.sent + len(self.buf)

    def write(self, data) -> int:
        self.buf += data
        while len(self.buf) >= CHUNK:
            with memoryview(self.buf) as view:
                part = view[:CHUNK].tobytes()  # one copy (a slice, then bytes(), made two)
            del self.buf[:CHUNK]
            self._data(part, last=False)
        return len(data)

    def send_view(self, view: memoryview) -> None:
        """Bytes already in memory: sent as slices, never copied here."""
        for at in range(0, len(view), CHUNK):
            self._data(view[at : at + CHUNK], last=False)

    def _data(self, part, last: bool) -> None:
        self.crc = zlib.crc32(part, self.crc)
        self.sent += len(part)
        check = {"crc": self.crc, "size": self.sent} if last else {}
        self.channel.send(dict(check, op="data", last=last), [part] if len(part) else [])
        while len(self.channel.waiting) >= (1 if last else WINDOW):
            self.result = self.channel.reply()
            self.channel.progress(min(self.sent, self.total or self.sent), self.total)

    def finish(self) -> dict:
        self._data(bytes(self.buf), last=True)
        self.buf = bytearray()
        return self.result


def _receive(channel: Channel, total: int | None, sink: Callable[[Any], None]) -> None:
    """The stream, in order, into `sink`; TransferStopped when it did not arrive whole."""
    done, acked, end = (
        0,
        channel.seq,
        None,
    )  # acked: the parts before it arrived (numbered by their reads)
    crc = 0
    for _ in range(WINDOW):
        channel.send({"op": "read", "acked": acked})
    while channel.waiting:
        content = channel.reply()
        for part in content["buffers"]:
            crc = zlib.crc32(part, crc)
            sink(part)
            done += len(part)
        acked += 1
        if end is None and content.get("eof"):
            end = content
            channel.send(
                {"op": "abort"}
            )  # done: the kernel forgets it (the reads in flight answer first)
        elif end is None:
            channel.send({"op": "read", "acked": acked})
        channel.progress(done, total)
    if (
        end is not None
        and end.get("size") is not None
        and (end["size"] != done or end.get("crc") != crc)
    ):
        raise TransferStopped(
            f"the {channel.verb} arrived damaged ({done} bytes, checksum {crc:08x}; the session "
            f"sent {end['size']} bytes, checksum {end.get('crc', 0):08x})"
        )


def _open(channel: Channel, **content: Any) -> dict:
    channel.send(dict(content, op="open"))
    return channel.reply()


@contextlib.contextmanager
def _stopped_said(
    channel: Channel, where: str, cleanup: Callable[[], None] = lambda: None
) -> Iterator[None]:
    """A transfer that does not end whole: the kernel drops it (best effort), what was written of it
    here goes (`cleanup`), and the error says where it stopped, in one line."""
    try:
        yield
    except BaseException as exc:
        channel.abort()
        cleanup()
        done, total = channel.at
        at = (
            f"at {format_bytes(done)} of {format_bytes(total)}"
            if total
            else f"at {format_bytes(done)}"
        )
        after = f"the {channel.verb} stopped {at}; nothing of it was written {where}"
        if isinstance(exc, INTERRUPTS):
            raise TransferStopped(f"interrupted: {after}") from None
        if isinstance(exc, (LinkLost, KernelDied, TransferStopped)):
            raise type(exc)(f"{exc}; {after}") from None
        raise


def push(kc: Connection, namespace: dict[str, Any], progress: Progress | None = None) -> None:
    """Local variables into the session kernel's namespace, pickled one by one."""
    parts = []
    for name, value in namespace.items():
        try:
            parts.append(pickle.dumps(value, protocol=4))
        except Exception as exc:  # noqa: BLE001 - pickle raises many kinds
            raise BadInput(
                f"cannot push {name!r}: it cannot be pickled ({type(exc).__name__}: {exc})"
            ) from None
    blob = parts[0] if len(parts) == 1 else b"".join(parts)
    channel = Channel(kc, progress, "push")
    with _stopped_said(channel, "in the session"):
        _open(channel, kind="push", names=list(namespace), sizes=[len(p) for p in parts])
        sender = _Sender(channel, len(blob))
        sender.send_view(memoryview(blob))
        sender.finish()


def pull(kc: Connection, names: list[str], progress: Progress | None = None) -> dict[str, Any]:
    """Variables from the session kernel's namespace."""
    channel = Channel(kc, progress, "pull")
    with _stopped_said(channel, "here"):
        info = _open(channel, kind="pull", names=names)
        blob = bytearray(info["size"])
        view, at = memoryview(blob), 0

        def sink(part) -> None:
            nonlocal at
            view[at : at + len(part)] = part
            at += len(part)

        _receive(channel, info["size"], sink)
    result, at = {}, 0
    for name, size in zip(info["names"], info["sizes"]):
        try:
            result[name] = pickle.loads(view[at : at + size])
        except Exception as exc:  # noqa: BLE001
            raise BadInput(
                f"cannot pull {name!r}: it does not unpickle here ({type(exc).__name__}: {exc}); "
                "is its module installed in this kernel?"
            ) from None
        at += size
    return result


def upload(
    kc: Connection,
    files: Iterable[tuple[str, str]],
    total: int,
    to: str = ".",
    progress: Progress | None = None,
) -> dict:
    """(local path, name in the tar) pairs, as a tar stream, into folder `to` below the session
    kernel's working directory. Returns {"files", "bytes", "dest", "refused"}."""
    channel = Channel(kc, progress, "upload")
    with _stopped_said(channel, "in the session"):
        info = _open(channel, kind="upload", to=to)
        sender = _Sender(channel, total)
        # "w", not the stream mode "w|": whose buffer is bytes, copied whole on every write
        with tarfile.open(fileobj=sender, mode="w") as tar:
            tar.copybufsize = TAR_BUFSIZE
            for full, name in files:
                tar.add(full, arcname=name, recursive=False, filter=whole_seconds)
        result = sender.finish()
    return {
        "files": result.get("files", 0),
        "bytes": result.get("bytes", 0),
        "dest": info.get("dest"),
        "refused": result.get("refused", []),
    }


def download(
    kc: Connection, paths: list[str], to: str = ".", progress: Progress | None = None
) -> dict:
    """Files or folders (relative to the session kernel's working directory) into local folder
    `to`. Returns {"files", "bytes", "dest", "refused"}. The tar stream is kept in memory only
    chunk by chunk: extraction runs as it arrives, into temporary names renamed once the whole
    stream arrived and its size and checksum match the session's (gpusession.transport.tarsafe)."""
    dest = os.path.abspath(os.path.expanduser(to))
    if os.path.exists(dest) and not os.path.isdir(dest):
        raise BadInput(f"--to {to!r} is a file here, not a folder")
    channel = Channel(kc, progress, "download")
    feed: queue.Queue = queue.Queue(maxsize=8)
    outcome: dict = {}
    open_stream = getattr(kc, "open_stream", None)
    with _stopped_said(channel, "here"):
        info = _open(channel, kind="download", paths=paths, raw=open_stream is not None)
    extraction = Extraction(dest, links=True)
    # None: not offered, or this login may not reach it (an EC2 session key older than the
    # raw stream): the same transfer's bytes come as frames, the kernel sent none yet
    first = open_stream(info["raw"]) if info.get("raw") and open_stream is not None else None
    if first is not None:
        with _stopped_said(channel, "here", extraction.discard):
            _extract_raw(rawstream.chunks(channel, info, open_stream, first), extraction)
    else:
        worker = _extract_as_it_arrives(feed, extraction, outcome)

        def stop_worker() -> None:
            feed.put(None)
            worker.join(30)
            extraction.discard()

        with _stopped_said(channel, "here", stop_worker):
            _receive(channel, info.get("size"), feed.put)
            feed.put(None)
            worker.join()
    if "error" in outcome:
        extraction.discard()
        raise BadInput(outcome["error"])
    extraction.commit()
    return {
        "files": extraction.files,
        "bytes": extraction.bytes,
        "dest": dest,
        "refused": extraction.refused,
    }


def _extract_raw(stream: Generator[bytes, None, None], extraction: Extraction) -> None:
    """The raw stream extracted as it is read, in this thread (no hand-off to another): read to
    its end, where it is checked whole (`rawstream.chunks`), before anything is committed. A
    failure to write here ends it at once (BadInput; the kernel is told to drop it)."""
    reader = ForwardReader(lambda: next(stream, None))
    try:
        with tarfile.open(fileobj=reader, mode="r:") as tar:
            tar.copybufsize = TAR_BUFSIZE
            extraction.run(tar)
        reader.drain()
    except (OSError, tarfile.TarError) as exc:
        raise BadInput(f"cannot write the files here: {exc}") from None
    finally:
        stream.close()  # its connection, when it did not end


def _extract_as_it_arrives(feed: queue.Queue, extraction: Extraction, outcome: dict):
    """A started thread that extracts the tar stream the chunks in `feed` make; a failure to
    write here goes into `outcome["error"]` (the chunks are then read to the end, unused)."""
    import threading

    def extract() -> None:
        reader = ForwardReader(feed.get)  # the chunks as they came; None in `feed` ends them
        try:
            with tarfile.open(fileobj=reader, mode="r:") as tar:
                tar.copybufsize = TAR_BUFSIZE
                extraction.run(tar)
        except (OSError, tarfile.TarError) as exc:
            outcome["error"] = f"cannot write the files here: {exc}"
        reader.drain()  # the receiver never waits on a full queue (the end, or after a failure)

    worker = threading.Thread(target=extract, daemon=True, name="gpusession-download")
    worker.start()
    return worker
