"""In the session kernel: bulk bytes between the notebook and the session as ZMQ binary frames on
the kernel's own shell channel (no new port, no base64, no JSON of the payload).

The client (`gpusession.kernel.transfer`) sends TRANSFER_REQUEST messages; each gets one
TRANSFER_REPLY, in order, so the client keeps a few requests in flight (its window):

- {"op": "open", "id", "kind": "push"|"upload", ...}, then {"op": "data", "id", "last"} with the
  bytes in the message's `buffers`; the reply to the last one says what was done;
- {"op": "open", "id", "kind": "pull"|"download", ...}, then {"op": "read", "id"} answered with
  the next bytes in the reply's `buffers` and "eof" once all were sent;
- {"op": "abort", "id"} drops a transfer a client gave up on.

push/pull: variables, pickled one by one (names with their sizes, so each failure names its
variable). upload/download: a tar stream of files, paths relative to the kernel's working
directory and never outside it. Every request counts as kernel activity for the idle watchdog.
Installed by the kernel extension (`gpusession.agent.activity`). Standard library only; Python
3.9 syntax.
"""

from __future__ import annotations

import os
import pickle
import queue
import tarfile
import threading
from typing import Any, Callable, Optional

from ..protocol import TRANSFER_REPLY, TRANSFER_REQUEST

TAR_BUFSIZE = 1 << 20
MAX_OPEN = 8  # transfers open at once; older ones are dropped
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
    """A file object fed chunk by chunk from another thread (tarfile reads it as a stream)."""

    def __init__(self) -> None:
        self.chunks: "queue.Queue[Any]" = queue.Queue(maxsize=8)
        self._buf = memoryview(b"")

    def read(self, n: int = -1) -> bytes:
        if not self._buf:
            chunk = self.chunks.get()
            if chunk is _DONE:
                self.chunks.put(_DONE)
                return b""
            if n < 0 or len(chunk) <= n:
                return chunk  # a whole chunk: no copy
            self._buf = memoryview(chunk)
        out = bytearray()
        while n < 0 or len(out) < n:
            if not self._buf:
                chunk = self.chunks.get()
                if chunk is _DONE:
                    self.chunks.put(_DONE)
                    break
                self._buf = memoryview(chunk)
            take = len(self._buf) if n < 0 else min(n - len(out), len(self._buf))
            out += self._buf[:take]
            self._buf = self._buf[take:]
        return bytes(out)


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


def _extract(tar: tarfile.TarFile, dest: str) -> tuple[int, int]:
    files = size = 0
    data_filter = getattr(tarfile, "data_filter", None)
    for member in tar:
        name = member.name
        if name.startswith("/") or ".." in name.split("/") or member.issym() or member.islnk() or member.isdev():
            raise TransferError(f"refused {name!r}: only plain files and folders below the target may be uploaded")
        if data_filter is not None:
            tar.extract(member, dest, filter="data")
        else:
            tar.extract(member, dest)
        if member.isfile():
            files, size = files + 1, size + member.size
    return files, size


class _Upload:
    def __init__(self, cwd: str, to: str) -> None:
        self.dest = inside(cwd, to or ".", "target folder")
        if os.path.exists(self.dest) and not os.path.isdir(self.dest):
            raise TransferError(f"target {to!r} in the session is a file, not a folder")
        os.makedirs(self.dest, exist_ok=True)
        self.pipe = _Pipe()
        self.result: Optional[dict] = None
        self.thread = threading.Thread(target=self._run, daemon=True, name="gpusession-upload")
        self.thread.start()

    def _run(self) -> None:
        try:
            with tarfile.open(fileobj=self.pipe, mode="r|", bufsize=TAR_BUFSIZE) as tar:
                tar.copybufsize = TAR_BUFSIZE  # tarfile's 16 kB re-joins its whole buffer per read
                files, size = _extract(tar, self.dest)
            self.result = {"files": files, "bytes": size, "dest": self.dest}
        except TransferError as exc:
            self.result = {"error": str(exc)}
        except Exception as exc:  # noqa: BLE001 - disk full, permissions: said, not raised
            self.result = {"error": f"cannot write the files in the session: {type(exc).__name__}: {exc}"}
        finally:
            while True:  # let a writer blocked on a full queue go
                try:
                    self.pipe.chunks.get_nowait()
                except queue.Empty:
                    break
            self.pipe.chunks.put(_DONE)

    def close(self) -> None:
        """The client gave up: the extracting thread reads the end of the stream and stops."""
        while True:
            try:
                self.pipe.chunks.get_nowait()
            except queue.Empty:
                break
        self.pipe.chunks.put(_DONE)

    def feed(self, chunk, last: bool) -> Optional[dict]:
        if self.result is None and chunk:
            self.pipe.chunks.put(bytes(chunk))
        if self.result is not None and "error" in self.result:
            return self.result
        if last:
            self.pipe.chunks.put(_DONE)
            self.thread.join()
            return self.result
        return None


class _Push:
    def __init__(self, ns: dict, names: list, sizes: list) -> None:
        self.ns, self.names, self.sizes = ns, names, sizes
        self.parts: list = []

    def close(self) -> None:
        self.parts = []

    def feed(self, chunk, last: bool) -> Optional[dict]:
        if chunk:
            self.parts.append(bytes(chunk))
        if not last:
            return None
        blob = memoryview(b"".join(self.parts))
        self.parts = []
        values, bad, at = {}, [], 0
        for name, size in zip(self.names, self.sizes):
            try:
                values[name] = pickle.loads(blob[at:at + size])
            except Exception as exc:  # noqa: BLE001 - unpickling raises many kinds
                bad.append(f"{name}: does not unpickle in the session ({type(exc).__name__}: {exc}); "
                           "is its module installed there?")
            at += size
        if bad:
            return {"error": "cannot push " + "; ".join(bad)}
        self.ns.update(values)
        return {"names": list(values)}


class _Source:
    """Bytes for the client, chunk by chunk: a blob (pull) or a tar stream made by a thread."""

    def __init__(self, chunk: int, blob: Optional[bytes] = None, make: Optional[Callable] = None) -> None:
        self.chunk = chunk
        self.blob = memoryview(blob) if blob is not None else None
        self.at = 0
        self.error: Optional[str] = None
        if make is not None:
            self.sink = _Chunks(chunk)
            threading.Thread(target=self._run, args=(make,), daemon=True, name="gpusession-download").start()

    def _run(self, make: Callable) -> None:
        try:
            make(self.sink)
            self.sink.close()
        except Exception as exc:  # noqa: BLE001 - a file vanished, unreadable: said, not raised
            self.error = f"cannot read the files in the session: {type(exc).__name__}: {exc}"
        self.sink.out.put(_DONE)

    def close(self) -> None:
        """The client gave up: a tar thread blocked on a full queue goes."""
        self.blob = memoryview(b"") if self.blob is not None else None
        sink = getattr(self, "sink", None)
        if sink is not None:
            sink.cancelled = True
            while True:
                try:
                    sink.out.get_nowait()
                except queue.Empty:
                    break

    def read(self) -> tuple[Any, bool]:
        if self.blob is not None:
            part = self.blob[self.at:self.at + self.chunk]
            self.at += len(part)
            return part, self.at >= len(self.blob)
        item = self.sink.out.get()
        if item is _DONE:
            self.sink.out.put(_DONE)
            if self.error:
                raise TransferError(self.error)
            return b"", True
        return item, False


def _pull(ns: dict, names: list, chunk: int) -> tuple[_Source, dict]:
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


def _download(cwd: str, paths: list, chunk: int) -> tuple[_Source, dict]:
    found = []
    for path in paths:
        full = inside(cwd, path, "path")
        if not os.path.exists(full):
            raise TransferError(f"no such file or folder in the session: {path!r} (in {os.path.realpath(cwd)})")
        found.append(full)
    total = 0
    for full in found:
        if os.path.isdir(full):
            for top, _, files in os.walk(full):
                total += sum(os.path.getsize(os.path.join(top, f)) for f in files
                             if os.path.isfile(os.path.join(top, f)))
        else:
            total += os.path.getsize(full)

    def make(sink: _Chunks) -> None:
        # "w", not the stream mode "w|": whose buffer is bytes, copied whole on every write
        with tarfile.open(fileobj=sink, mode="w") as tar:
            tar.copybufsize = TAR_BUFSIZE
            for full in found:
                tar.add(full, arcname=os.path.basename(full.rstrip(os.sep)) or ".")

    return _Source(chunk, make=make), {"size": total}


class Transfers:
    """The open transfers of one kernel, by id."""

    def __init__(self, kernel, touch: Callable[[], None]) -> None:
        self.kernel = kernel
        self.touch = touch
        self.open: dict = {}
        self.done: list = []  # the latest finished ids: a read still in flight gets eof, not an error

    def ns(self) -> dict:
        return self.kernel.shell.user_ns

    def handle(self, stream, ident, parent) -> None:
        request = parent.get("content") or {}
        buffers = parent.get("buffers") or []
        self.touch()
        tid = str(request.get("id", ""))
        try:
            content, out = self._answer(tid, request, buffers)
        except TransferError as exc:
            self._drop(tid)
            content, out = {"status": "error", "message": str(exc)}, []
        except Exception as exc:  # noqa: BLE001 - the client must get an answer, never a hang
            self._drop(tid)
            content, out = {"status": "error", "message": f"{type(exc).__name__}: {exc}"}, []
        self.kernel.session.send(stream, TRANSFER_REPLY, content, parent, ident=ident, buffers=out)

    def _drop(self, tid: str) -> None:
        transfer = self.open.pop(tid, None)
        if transfer is not None:
            transfer.close()

    def _answer(self, tid: str, request: dict, buffers: list) -> tuple[dict, list]:
        op = request.get("op")
        chunk = int(request.get("chunk") or (4 << 20))
        if op == "open":
            for stale in list(self.open)[:-MAX_OPEN + 1] if len(self.open) >= MAX_OPEN else []:
                self._drop(stale)  # the oldest, left by clients that went away
            kind = request.get("kind")
            cwd = os.getcwd()
            info: dict = {}
            if kind == "push":
                self.open[tid] = _Push(self.ns(), list(request["names"]), list(request["sizes"]))
            elif kind == "upload":
                self.open[tid] = _Upload(cwd, str(request.get("to") or "."))
                info = {"dest": self.open[tid].dest}
            elif kind == "pull":
                self.open[tid], info = _pull(self.ns(), list(request["names"]), chunk)
            elif kind == "download":
                self.open[tid], info = _download(cwd, list(request["paths"]), chunk)
            else:
                raise TransferError(f"unknown transfer kind {kind!r}")
            return dict(info, status="ok", cwd=cwd), []
        if op == "abort":
            self._drop(tid)
            return {"status": "ok"}, []
        transfer = self.open.get(tid)
        if transfer is None and op == "read" and tid in self.done:
            return {"status": "ok", "eof": True}, []
        if transfer is None:
            raise TransferError("this transfer is not open in the session (the kernel restarted?)")
        if op == "data":
            last = bool(request.get("last"))
            result = transfer.feed(buffers[0] if buffers else b"", last)
            if result is not None and "error" in result:
                raise TransferError(result["error"])
            if last:
                self.open.pop(tid, None)
            return dict(result or {}, status="ok"), []
        if op == "read":
            part, eof = transfer.read()
            if eof:
                self.open.pop(tid, None)
                self.done = self.done[-15:] + [tid]
            return {"status": "ok", "eof": eof}, [part] if len(part) else []
        raise TransferError(f"unknown transfer request {op!r}")


def install(kernel, touch: Callable[[], None]) -> Transfers:
    transfers = Transfers(kernel, touch)
    kernel.shell_handlers[TRANSFER_REQUEST] = transfers.handle
    return transfers
