"""In the session kernel: what each kind of transfer does with its bytes (the requests and
their numbering: `gpusession.agent.transfer_handler`). push/pull: variables, pickled one by one;
upload: a tar stream extracted as it arrives (`gpusession.transport.tarsafe`: temporary names,
renamed once the whole stream arrived and its size and CRC-32 match); download: a tar stream made
by a thread.
Standard library only; Python 3.9 syntax.
"""

from __future__ import annotations

import os
import pickle
import queue
import tarfile
import threading
import zlib
from typing import Any, Callable, Optional

from ..transport.tarsafe import Extraction, ForwardReader, whole_seconds

TAR_BUFSIZE = 1 << 20
_DONE = object()


class TransferError(Exception):
    """A problem the user caused or can fix: its text goes back as the reply's message."""


def inside(cwd: str, path: str, what: str) -> str:
    """`path` (relative to `cwd`, or absolute) made absolute; TransferError when it leaves `cwd`."""
    full = os.path.realpath(os.path.join(cwd, os.path.expanduser(path)))
    root = os.path.realpath(cwd)
    if full != root and not full.startswith(root.rstrip(os.sep) + os.sep):
        raise TransferError(f"{what} {path!r} is outside the session's working directory {root}")
    return full


class _Pipe:
    """Chunks fed from another thread, read by tarfile as a file (`reader`: forward only)."""

    def __init__(self) -> None:
        self.chunks: "queue.Queue[Any]" = queue.Queue(maxsize=8)
        self.reader = ForwardReader(self._next)

    def _next(self) -> Any:
        chunk = self.chunks.get()
        if chunk is _DONE:
            self.chunks.put(_DONE)
            return None
        return chunk


class _Chunks:
    """A file object tarfile writes to; whole chunks go into a bounded queue for a reader."""

    def __init__(self, chunk: int) -> None:
        self.chunk = chunk
        self.out: "queue.Queue[Any]" = queue.Queue(maxsize=4)
        self._parts: list = []
        self._size = 0
        self.written = 0
        self.cancelled = False

    def tell(self) -> int:
        return self.written

    def write(self, data) -> int:
        if self.cancelled:  # the client gave up: the tar thread ends here
            raise TransferError("cancelled")
        self.written += len(data)
        self._parts.append(bytes(data))
        self._size += len(data)
        if self._size >= self.chunk:
            self.close()
        return len(data)

    def close(self) -> None:
        if self._parts:
            self.out.put(b"".join(self._parts))  # one copy per chunk
        self._parts, self._size = [], 0


class Upload:
    """A tar stream extracted by a thread as it arrives (gpusession.transport.tarsafe: temporary names,
    renamed once the whole stream arrived and its size and checksum match the client's)."""

    def __init__(self, cwd: str, to: str) -> None:
        self.dest = inside(cwd, to or ".", "target folder")
        if os.path.exists(self.dest) and not os.path.isdir(self.dest):
            raise TransferError(f"target {to!r} in the session is a file, not a folder")
        self.extraction = Extraction(self.dest, links=False)
        self.pipe = _Pipe()
        self.check = _Check()
        self.error: Optional[str] = None
        self.thread = threading.Thread(target=self._run, daemon=True, name="gpusession-upload")
        self.thread.start()

    def _run(self) -> None:
        try:
            with tarfile.open(fileobj=self.pipe.reader, mode="r:") as tar:
                tar.copybufsize = TAR_BUFSIZE
                self.extraction.run(tar)
        except Exception as exc:  # noqa: BLE001 - disk full, permissions, a cut stream: said, not raised
            self.error = f"cannot write the files in the session: {type(exc).__name__}: {exc}"
        finally:
            while True:  # let a writer blocked on a full queue go
                try:
                    self.pipe.chunks.get_nowait()
                except queue.Empty:
                    break
            self.pipe.chunks.put(_DONE)

    def close(self) -> None:
        """The client gave up: the extracting thread reads the end of the stream and stops, and
        what it wrote goes."""
        while True:
            try:
                self.pipe.chunks.get_nowait()
            except queue.Empty:
                break
        self.pipe.chunks.put(_DONE)
        self.thread.join(10)
        self.extraction.discard()

    def feed(self, chunk, last: bool, crc=None, size=None) -> Optional[dict]:
        if self.error is None and chunk:
            self.check.add(chunk)
            self.pipe.chunks.put(bytes(chunk))
        if self.error is not None:
            self.extraction.discard()
            return {"error": self.error}
        if not last:
            return None
        self.pipe.chunks.put(_DONE)
        self.thread.join()
        damaged = self.check.damaged(crc, size, "upload")
        if self.error is not None or damaged:
            self.extraction.discard()
            return {"error": self.error or damaged}
        self.extraction.commit()
        return {
            "files": self.extraction.files,
            "bytes": self.extraction.bytes,
            "dest": self.dest,
            "refused": self.extraction.refused,
        }


class _Check:
    """Size and CRC-32 of a stream, added up in order, against the sender's."""

    def __init__(self) -> None:
        self.crc = 0
        self.size = 0

    def add(self, part) -> None:
        self.crc = zlib.crc32(part, self.crc)
        self.size += len(part)

    def damaged(self, crc, size, what: str) -> str:
        """'' when it matches (or the sender gave no figures), else why."""
        if size is not None and size != self.size:
            return (
                f"the {what} arrived incomplete ({self.size} of {size} bytes); nothing was written"
            )
        if crc is not None and crc != self.crc:
            return f"the {what} arrived damaged (its checksum differs); nothing was written"
        return ""


class Push:
    def __init__(self, ns: dict, names: list, sizes: list) -> None:
        self.ns, self.names, self.sizes = ns, names, sizes
        self.parts: list = []

    def close(self) -> None:
        self.parts = []

    def feed(self, chunk, last: bool, crc=None, size=None) -> Optional[dict]:
        if chunk:
            self.parts.append(bytes(chunk))
        if not last:
            return None
        blob = memoryview(b"".join(self.parts))
        self.parts = []
        check = _Check()
        check.add(blob)
        damaged = check.damaged(crc, size, "push")
        if damaged:
            return {"error": damaged}
        values, bad, at = {}, [], 0
        for name, size in zip(self.names, self.sizes):
            try:
                values[name] = pickle.loads(blob[at : at + size])
            except Exception as exc:  # noqa: BLE001 - unpickling raises many kinds
                bad.append(
                    f"{name}: does not unpickle in the session ({type(exc).__name__}: {exc}); "
                    "is its module installed there?"
                )
            at += size
        if bad:
            return {"error": "cannot push " + "; ".join(bad)}
        self.ns.update(values)
        return {"names": list(values)}


class _Source:
    """Bytes for the client, chunk by chunk: a blob (pull) or a tar stream made by a thread."""

    def __init__(
        self, chunk: int, blob: Optional[bytes] = None, make: Optional[Callable] = None
    ) -> None:
        self.chunk = chunk
        self.blob = memoryview(blob) if blob is not None else None
        self.at = 0
        self.error: Optional[str] = None
        self.check = _Check()
        self.kept: dict = {}  # seq -> (part, eof): sent, not yet known to have arrived
        self.next_seq = 0
        self.ended = False
        self.raw: Any = None  # a RawStream sending these bytes (gpusession.agent.transfer_raw)
        if make is not None:
            self.sink = _Chunks(chunk)
            threading.Thread(
                target=self._run, args=(make,), daemon=True, name="gpusession-download"
            ).start()

    def _run(self, make: Callable) -> None:
        try:
            make(self.sink)
            self.sink.close()
        except Exception as exc:  # noqa: BLE001 - a file vanished, unreadable: said, not raised
            self.error = f"cannot read the files in the session: {type(exc).__name__}: {exc}"
        self.sink.out.put(_DONE)

    def close(self) -> None:
        """The client gave up (or has it all): a tar thread blocked on a full queue goes."""
        if self.raw is not None:
            self.raw.close()
        self.blob = memoryview(b"") if self.blob is not None else None
        sink = getattr(self, "sink", None)
        if sink is not None:
            sink.cancelled = True
            while True:
                try:
                    sink.out.get_nowait()
                except queue.Empty:
                    break

    def part(self, seq: int, acked: int) -> tuple[Any, bool]:
        """Part `seq` of the stream (again, when a cut lost its reply): the parts below `acked`
        arrived and are forgotten, those after the last one asked for are made in order."""
        for old in [k for k in self.kept if k < acked]:
            del self.kept[old]
        if seq in self.kept:
            return self.kept[seq]
        if seq < self.next_seq:
            raise TransferError(
                f"part {seq} of this transfer was asked for again after it was forgotten"
            )
        while self.next_seq <= seq:
            part, eof = (b"", True) if self.ended else self.read()
            self.ended = self.ended or eof  # after the end: every later part is the end again
            self.check.add(part)
            self.kept[self.next_seq] = (part, eof)
            self.next_seq += 1
        return self.kept[seq]

    def read(self) -> tuple[Any, bool]:
        if self.blob is not None:
            part = self.blob[self.at : self.at + self.chunk]
            self.at += len(part)
            return part, self.at >= len(self.blob)
        item = self.sink.out.get()
        if item is _DONE:
            self.sink.out.put(_DONE)
            if self.error:
                raise TransferError(self.error)
            return b"", True
        return item, False


def open_pull(ns: dict, names: list, chunk: int) -> tuple[_Source, dict]:
    parts, sizes, bad = [], [], []
    for name in names:
        if name not in ns:
            bad.append(f"{name}: not defined in the session kernel")
            continue
        try:
            parts.append(pickle.dumps(ns[name], protocol=4))
            sizes.append(len(parts[-1]))
        except Exception as exc:  # noqa: BLE001 - pickle raises many kinds
            bad.append(f"{name}: cannot be pickled ({type(exc).__name__}: {exc})")
    if bad:
        raise TransferError("cannot pull " + "; ".join(bad))
    blob = b"".join(parts)
    return _Source(chunk, blob=blob), {"names": names, "sizes": sizes, "size": len(blob)}


def open_download(cwd: str, paths: list, chunk: int) -> tuple[_Source, dict]:
    found = []
    for path in paths:
        full = inside(cwd, path, "path")
        if not os.path.exists(full):
            raise TransferError(
                f"no such file or folder in the session: {path!r} (in {os.path.realpath(cwd)})"
            )
        found.append(full)
    total = 0
    for full in found:
        if os.path.isdir(full):
            for top, _, files in os.walk(full):
                total += sum(
                    os.path.getsize(os.path.join(top, f))
                    for f in files
                    if os.path.isfile(os.path.join(top, f))
                )
        else:
            total += os.path.getsize(full)

    def make(sink: _Chunks) -> None:
        # "w", not the stream mode "w|": whose buffer is bytes, copied whole on every write
        with tarfile.open(fileobj=sink, mode="w") as tar:
            tar.copybufsize = TAR_BUFSIZE
            for full in found:
                name = os.path.basename(full.rstrip(os.sep)) or "."
                tar.add(full, arcname=name, filter=whole_seconds)

    return _Source(chunk, make=make), {"size": total}
