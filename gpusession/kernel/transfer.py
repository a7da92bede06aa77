"""Bulk bytes to and from a session kernel as binary ZMQ frames on its shell channel (the kernel
side and the message format: `gpusession.agent.transfer`). Chunks of CHUNK bytes, WINDOW of them
in flight, so the link stays full while each side works; no base64, no JSON of the payload.

`progress(done, total)` is called as bytes move (total None when not known ahead)."""

from __future__ import annotations

import collections
import io
import os
import pickle
import queue
import tarfile
import time
import uuid
from typing import TYPE_CHECKING, Any, Callable, Iterable

from ..errors import BadInput, KernelDied
from ..protocol import TRANSFER_REPLY, TRANSFER_REQUEST

if TYPE_CHECKING:
    from .client import KernelClient

CHUNK = 4 << 20
WINDOW = 8  # 32 MiB in flight: at 4 a single big download sometimes stalled to ~250 MB/s (bench_data.py)
TAR_BUFSIZE = 1 << 20
Progress = Callable[[int, "int | None"], None]


def _none(done: int, total: int | None) -> None:
    pass


class _Channel:
    """One transfer's requests and their in-order replies on the kernel's shell channel."""

    def __init__(self, kc: "KernelClient", progress: Progress | None):
        self.kc = kc
        self.id = uuid.uuid4().hex
        self.progress = progress or _none
        self.waiting: collections.deque[str] = collections.deque()
        self.unsupported = False

    def send(self, content: dict, buffers: list | None = None) -> None:
        client = self.kc.client
        msg = client.session.send(client.shell_channel.socket, TRANSFER_REQUEST, dict(content, id=self.id, chunk=CHUNK),
                                  buffers=buffers or None)
        self.waiting.append(msg["header"]["msg_id"])

    def reply(self) -> dict:
        """The reply to the oldest request in flight (others' replies are skipped)."""
        want = self.waiting[0]
        handled_at = None  # when iopub said the kernel was done with the request
        while True:
            try:
                msg = self.kc.client.get_shell_msg(timeout=1.0)
            except queue.Empty:
                if not self.kc.healthy():
                    raise KernelDied("the session kernel stopped answering during the transfer") from None
                handled_at = handled_at or self._handled(want)
                if handled_at and time.monotonic() - handled_at > 2.0:  # done, and no reply: it knows no transfers
                    self.waiting.clear()  # nothing will come back: nothing to drain or abort
                    self.unsupported = True
                    raise BadInput("the session kernel cannot move data this way (its gpusession runtime is older "
                                   "than this one); start a new session") from None
                continue
            if msg["parent_header"].get("msg_id") != want or msg["msg_type"] != TRANSFER_REPLY:
                continue
            self.waiting.popleft()
            content = msg["content"]
            if content.get("status") != "ok":
                self.drain()
                raise BadInput(content.get("message") or "the transfer failed in the session")
            content["buffers"] = msg.get("buffers") or []
            return content

    def _handled(self, msg_id: str) -> float | None:
        """Did the kernel go idle after `msg_id` (iopub), i.e. handle it without a reply?"""
        while True:
            try:
                msg = self.kc.client.get_iopub_msg(timeout=0)
            except queue.Empty:
                return None
            if (msg["msg_type"] == "status" and msg["parent_header"].get("msg_id") == msg_id
                    and msg["content"].get("execution_state") == "idle"):
                return time.monotonic()

    def drain(self) -> None:
        """After an error: the replies still in flight, so the next cell's reply is not mistaken."""
        ids = set(self.waiting)
        self.waiting.clear()
        while ids:
            try:
                msg = self.kc.client.get_shell_msg(timeout=5.0)
            except queue.Empty:
                return
            ids.discard(msg["parent_header"].get("msg_id"))

    def abort(self) -> None:
        if self.unsupported:
            return
        try:
            self.drain()
            self.send({"op": "abort"})
            self.drain()
        except Exception:  # noqa: BLE001 - best effort on the way out
            pass


class _Sender(io.RawIOBase):
    """A writable file object: whole chunks go out as `data` requests, WINDOW in flight."""

    def __init__(self, channel: _Channel, total: int | None):
        super().__init__()
        self.channel, self.total, self.sent = channel, total, 0
        self.buf = bytearray()
        self.result: dict = {}

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
            self._data(view[at:at + CHUNK], last=False)

    def _data(self, part, last: bool) -> None:
        self.channel.send({"op": "data", "last": last}, [part] if len(part) else [])
        self.sent += len(part)
        while len(self.channel.waiting) >= (1 if last else WINDOW):
            self.result = self.channel.reply()
            self.channel.progress(min(self.sent, self.total or self.sent), self.total)

    def finish(self) -> dict:
        self._data(bytes(self.buf), last=True)
        self.buf = bytearray()
        return self.result


def _receive(channel: _Channel, total: int | None, sink: Callable[[Any], None]) -> None:
    done, eof = 0, False
    for _ in range(WINDOW):
        channel.send({"op": "read"})
    while channel.waiting:
        content = channel.reply()
        for part in content["buffers"]:
            sink(part)
            done += len(part)
        eof = eof or content.get("eof", False)
        if not eof:
            channel.send({"op": "read"})
        channel.progress(done, total)


def _open(channel: _Channel, **content: Any) -> dict:
    channel.send(dict(content, op="open"))
    return channel.reply()


def push(kc: "KernelClient", namespace: dict[str, Any], progress: Progress | None = None) -> None:
    """Local variables into the session kernel's namespace, pickled one by one."""
    parts = []
    for name, value in namespace.items():
        try:
            parts.append(pickle.dumps(value, protocol=4))
        except Exception as exc:  # noqa: BLE001 - pickle raises many kinds
            raise BadInput(f"cannot push {name!r}: it cannot be pickled ({type(exc).__name__}: {exc})") from None
    blob = parts[0] if len(parts) == 1 else b"".join(parts)
    channel = _Channel(kc, progress)
    try:
        _open(channel, kind="push", names=list(namespace), sizes=[len(p) for p in parts])
        sender = _Sender(channel, len(blob))
        sender.send_view(memoryview(blob))
        sender.finish()
    except BaseException:
        channel.abort()
        raise


def pull(kc: "KernelClient", names: list[str], progress: Progress | None = None) -> dict[str, Any]:
    """Variables from the session kernel's namespace."""
    channel = _Channel(kc, progress)
    info = _open(channel, kind="pull", names=names)
    blob = bytearray(info["size"])
    view, at = memoryview(blob), 0

    def sink(part) -> None:
        nonlocal at
        view[at:at + len(part)] = part
        at += len(part)

    try:
        _receive(channel, info["size"], sink)
    except BaseException:
        channel.abort()
        raise
    result, at = {}, 0
    for name, size in zip(info["names"], info["sizes"]):
        try:
            result[name] = pickle.loads(view[at:at + size])
        except Exception as exc:  # noqa: BLE001
            raise BadInput(f"cannot pull {name!r}: it does not unpickle here ({type(exc).__name__}: {exc}); "
                           "is its module installed in this kernel?") from None
        at += size
    return result


def upload(kc: "KernelClient", files: Iterable[tuple[str, str]], total: int, to: str = ".",
           progress: Progress | None = None) -> dict:
    """(local path, name in the tar) pairs, as a tar stream, into folder `to` below the session
    kernel's working directory. Returns {"files", "bytes", "dest"}."""
    channel = _Channel(kc, progress)
    try:
        info = _open(channel, kind="upload", to=to)
        sender = _Sender(channel, total)
        # "w", not the stream mode "w|": whose buffer is bytes, copied whole on every write
        with tarfile.open(fileobj=sender, mode="w") as tar:
            tar.copybufsize = TAR_BUFSIZE
            for full, name in files:
                tar.add(full, arcname=name, recursive=False)
        result = sender.finish()
    except BaseException:
        channel.abort()
        raise
    return {"files": result.get("files", 0), "bytes": result.get("bytes", 0), "dest": info.get("dest")}


def _extract(tar: tarfile.TarFile, dest: str) -> tuple[int, int]:
    """Plain files and folders below `dest` only (the data filter where this Python has it)."""
    files = size = 0
    data_filter = hasattr(tarfile, "data_filter")
    for member in tar:
        if member.name.startswith("/") or ".." in member.name.split("/") or not (member.isfile() or member.isdir()):
            raise BadInput(f"refused {member.name!r} from the session: not a plain file or folder below the target")
        tar.extract(member, dest, **({"filter": "data"} if data_filter else {}))
        if member.isfile():
            files, size = files + 1, size + member.size
    return files, size


def download(kc: "KernelClient", paths: list[str], to: str = ".", progress: Progress | None = None) -> dict:
    """Files or folders (relative to the session kernel's working directory) into local folder
    `to`. Returns {"files", "bytes", "dest"}. The tar stream is kept in memory only chunk by
    chunk: extraction runs as it arrives."""
    import threading

    dest = os.path.abspath(os.path.expanduser(to))
    if os.path.exists(dest) and not os.path.isdir(dest):
        raise BadInput(f"--to {to!r} is a file here, not a folder")
    channel = _Channel(kc, progress)
    info = _open(channel, kind="download", paths=paths)
    os.makedirs(dest, exist_ok=True)
    feed: queue.Queue = queue.Queue(maxsize=8)
    outcome: dict = {}

    class _Feed:
        """What tarfile's stream reads: the received chunks, whole when they fit (no copy)."""

        rest = memoryview(b"")

        def read(self, n: int = -1) -> "bytes | memoryview":
            if not self.rest:
                part = feed.get()
                if part is None:
                    feed.put(None)
                    return b""
                self.rest = memoryview(part)
            if n < 0 or len(self.rest) <= n:
                out, self.rest = self.rest, memoryview(b"")
                return out
            out, self.rest = self.rest[:n], self.rest[n:]  # views: tarfile joins what it reads anyway
            return out

    def extract() -> None:
        try:
            with tarfile.open(fileobj=_Feed(), mode="r|", bufsize=TAR_BUFSIZE) as tar:
                tar.copybufsize = TAR_BUFSIZE  # tarfile's 16 kB re-joins its whole buffer per read
                outcome["files"], outcome["bytes"] = _extract(tar, dest)
        except (BadInput, OSError, tarfile.TarError) as exc:
            outcome["error"] = f"cannot write the files here: {exc}"
            while feed.get() is not None:  # let the receiver finish
                pass

    worker = threading.Thread(target=extract, daemon=True, name="gpusession-download")
    worker.start()
    try:
        _receive(channel, info.get("size"), feed.put)
    except BaseException:
        channel.abort()
        feed.put(None)
        raise
    feed.put(None)
    worker.join()
    if "error" in outcome:
        raise BadInput(outcome["error"])
    return dict(outcome, dest=dest)
