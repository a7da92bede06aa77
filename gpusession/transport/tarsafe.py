"""A tar stream written into a folder with the same rules on every Python (tarfile's "data"
filter is missing before 3.12, and backported only to some patch releases), on both sides of
an upload and a download:

- no absolute names, no `..`, no device files or fifos;
- nothing written through a symbolic link that leads outside the destination (a folder already
  there that is a link to elsewhere included);
- symbolic links kept only where asked (a download) and only when they stay inside; hard links
  only to a file of the same stream;
- a member that breaks a rule is refused by name and the rest goes on (`refused`);
- every file is written under a temporary name in its own folder, and renamed to its name only
  by `commit()`, once the whole stream arrived and was checked; `discard()` removes them.

Standard library only; Python 3.9 syntax (it goes into sessions with the agent).
"""

from __future__ import annotations

import collections
import os
import shutil
import tarfile
import uuid
from typing import Deque, Dict, List, Tuple

PART = ".gpusession-part-"  # in the temporary names: `.NAME.gpusession-part-<hex>`
COPY_BUFSIZE = 1 << 20


class Extraction:
    """One tar stream into `dest` (made when missing). `links`: keep symbolic links that stay
    inside (else every link is refused)."""

    def __init__(self, dest: str, *, links: bool) -> None:
        os.makedirs(dest, exist_ok=True)
        self.dest = os.path.realpath(dest)
        self.links = links
        # (temporary path, final path), in stream order; a deque: commit() takes them from the
        # front (a list's pop(0) made a commit of 200,000 files cost 2 s of copying alone)
        self.pending: Deque[Tuple[str, str]] = collections.deque()
        self._temp_of: Dict[str, str] = {}  # final path -> its (first) temporary path
        self.made: List[str] = []  # folders made here, removed again by discard() when left empty
        self.refused: List[str] = []  # "NAME (why)"
        self.files = 0
        self.bytes = 0

    def run(self, tar: tarfile.TarFile) -> None:
        for member in tar:
            why = self._member(tar, member)
            if why:
                self.refused.append(f"{member.name} ({why})")

    def commit(self) -> None:
        """Every file to its own name (after the stream was checked whole)."""
        while self.pending:
            temp, final = self.pending.popleft()
            os.replace(temp, final)
        self._temp_of.clear()

    def discard(self) -> None:
        """The stream did not arrive whole: its temporary files go, and the folders made for it."""
        for temp, _ in self.pending:
            try:
                os.unlink(temp)
            except OSError:
                pass
        self.pending.clear()
        self._temp_of.clear()
        for folder in reversed(self.made):
            try:
                os.rmdir(folder)
            except OSError:
                pass
        self.made = []

    # -- one member ------------------------------------------------------------------------------

    def _pend(self, temp: str, final: str) -> None:
        self.pending.append((temp, final))
        self._temp_of.setdefault(final, temp)

    def _inside(self, path: str) -> bool:
        return path == self.dest or path.startswith(self.dest.rstrip(os.sep) + os.sep)

    def _folder(self, parts: List[str]) -> str:
        """The folder `parts` below dest, made where missing; ValueError when an existing part of
        it is a link leading outside dest (or not a folder)."""
        path = self.dest
        for part in parts:
            path = os.path.join(path, part)
            if os.path.islink(path) and not self._inside(os.path.realpath(path)):
                raise ValueError(f"{'/'.join(parts)} is a link leading outside {self.dest}")
            if not os.path.lexists(path):
                os.mkdir(path, 0o755)
                self.made.append(path)
            elif not os.path.isdir(path):
                raise ValueError(f"{'/'.join(parts)} is a file here, not a folder")
        if not self._inside(os.path.realpath(path)):
            raise ValueError(f"{'/'.join(parts)} leads outside {self.dest}")
        return path

    def _member(self, tar: tarfile.TarFile, member: tarfile.TarInfo) -> str:
        """'' when written (or pending), else why it was refused."""
        name = member.name.rstrip("/")
        parts = [p for p in name.split("/") if p not in ("", ".")]
        if not name or name.startswith("/") or os.path.isabs(name) or ".." in parts:
            return "an absolute path or one with '..'"
        if not (member.isfile() or member.isdir() or member.issym() or member.islnk()):
            return "not a plain file, folder or link"
        if not parts:
            return ""  # "." itself
        try:
            folder = self._folder(parts if member.isdir() else parts[:-1])
        except ValueError as exc:
            return f"it would be written through a link: {exc}"
        if member.isdir():
            os.chmod(folder, (member.mode & 0o755) | 0o700)
            return ""
        final = os.path.join(folder, parts[-1])
        temp = os.path.join(folder, f".{parts[-1]}{PART}{uuid.uuid4().hex[:12]}")
        if member.issym():
            return self._symlink(member, parts, final, temp)
        if member.islnk():
            return self._hardlink(member, final, temp)
        fd = os.open(
            temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600
        )
        self._pend(temp, final)
        with os.fdopen(fd, "wb", buffering=0) as out:
            if isinstance(tar.fileobj, ForwardReader) and member.isreg() and not member.sparse:
                tar.fileobj.seek(member.offset_data)  # the bytes as they came: no copy here
                for part in tar.fileobj.views(member.size):
                    while part:  # a write to a file writes it all, or says why (ENOSPC)
                        part = part[out.write(part) :]
            else:
                source = tar.extractfile(member)
                if source is not None:
                    shutil.copyfileobj(source, out, COPY_BUFSIZE)
            os.fchmod(out.fileno(), (member.mode & 0o755) | 0o600)
        os.utime(temp, (member.mtime, member.mtime))
        self.files += 1
        self.bytes += member.size
        return ""

    def _symlink(self, member: tarfile.TarInfo, parts: List[str], final: str, temp: str) -> str:
        target = member.linkname
        lands = os.path.normpath(os.path.join(self.dest, *parts[:-1], target))
        if not self.links:
            return "a link; only plain files and folders are taken"
        if os.path.isabs(target) or not (
            self._inside(lands) and self._inside(os.path.realpath(lands))
        ):
            return f"a link to {target}, outside the folder"
        os.symlink(target, temp)
        self._pend(temp, final)
        return ""

    def _hardlink(self, member: tarfile.TarInfo, final: str, temp: str) -> str:
        target = os.path.join(
            self.dest, *[p for p in member.linkname.split("/") if p not in ("", ".")]
        )
        source = self._temp_of.get(target)
        if source is None or ".." in member.linkname.split("/"):
            return f"a hard link to {member.linkname}, not a file of this transfer"
        shutil.copy2(source, temp)
        self._pend(temp, final)
        self.files += 1
        self.bytes += os.path.getsize(temp)
        return ""


def whole_seconds(member: tarfile.TarInfo) -> tarfile.TarInfo:
    """A `tar.add` filter: the modification time in whole seconds, as a plain tar header holds
    it. A fraction of a second costs each member a second (pax) header, written, sent and
    parsed: a tenth of the headers' work for 2,000 small files."""
    member.mtime = int(member.mtime)
    return member


class ForwardReader:
    """A file object over byte chunks that arrive in order (`next_chunk()` returns the next one,
    None at the end), for `tarfile.open(fileobj=..., mode="r:")`: reads of exactly n bytes
    (fewer only at the end), `tell`, and `seek` forward (skipping what lies between).
    tarfile's own stream mode ("r|") copies what is left of its buffer on every read (for a tar
    of 100 kB files, ~10 copies of each byte, most of a download's CPU here); this copies each
    byte once, and a 512-byte header costs a 512-byte copy."""

    def __init__(self, next_chunk) -> None:
        self._next = next_chunk
        self._rest = memoryview(b"")
        self._at = 0
        self._ended = False

    def _fill(self) -> bool:
        while not self._rest:
            chunk = None if self._ended else self._next()
            if chunk is None:
                self._ended = True
                return False
            self._rest = memoryview(chunk).cast("B")
        return True

    def _take(self, n: int) -> memoryview:
        part, self._rest = self._rest[:n], self._rest[n:]
        self._at += len(part)
        return part

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            n = 1 << 62
        if len(self._rest) >= n:
            return bytes(self._take(n))
        parts = []
        while n and self._fill():
            part = self._take(n)
            parts.append(part)
            n -= len(part)
        return b"".join(parts)

    def views(self, n: int):
        """The next `n` bytes as views of the chunks they came in (valid until the next read);
        OSError when the stream ends before them."""
        while n and self._fill():
            part = self._take(n)
            n -= len(part)
            yield part
        if n:
            raise OSError(f"the stream ended {n} bytes short of a file's end")

    def tell(self) -> int:
        return self._at

    def seek(self, offset: int, whence: int = 0) -> int:
        target = offset + (self._at if whence == 1 else 0)
        if whence not in (0, 1) or target < self._at:
            raise OSError(f"a stream seeks forward only (to {target} from {self._at})")
        while self._at < target and self._fill():
            self._take(target - self._at)
        return self._at

    def drain(self) -> None:
        """Read to the end (what follows the archive's end marker), unused."""
        while self._fill():
            self._take(len(self._rest))


class ChunkReader:
    """A file-like reader of an iterator of byte chunks (a tar stream arriving in pieces), for
    `tarfile.open(fileobj=..., mode="r|")`."""

    def __init__(self, chunks) -> None:
        self._chunks = iter(chunks)
        self._rest = b""

    def read(self, n: int = -1) -> bytes:
        while not self._rest:
            try:
                self._rest = bytes(next(self._chunks))
            except StopIteration:
                return b""
        if n < 0 or len(self._rest) <= n:
            out, self._rest = self._rest, b""
        else:
            out, self._rest = self._rest[:n], self._rest[n:]
        return out


def folder_chunks(folder: str, arcname: str, chunk_size: int = COPY_BUFSIZE):
    """A tar stream of `folder` (its entries under `arcname/`), made by a thread as it is read,
    so a folder of any size streams in bounded memory. An error while reading the folder is
    raised to the reader at the end of the stream (a stream cut short never ends quietly)."""
    import threading

    read_fd, write_fd = os.pipe()
    failed: List[BaseException] = []

    def write() -> None:
        try:
            with os.fdopen(write_fd, "wb") as out:
                with tarfile.open(fileobj=out, mode="w|", bufsize=chunk_size) as tar:
                    tar.add(folder, arcname=arcname)
        except BaseException as exc:  # noqa: BLE001 - handed to the reader
            failed.append(exc)

    worker = threading.Thread(target=write, daemon=True, name="gpusession-tar")
    worker.start()
    with os.fdopen(read_fd, "rb") as source:
        while True:
            chunk = source.read(chunk_size)
            if not chunk:
                break
            yield chunk
    worker.join()
    if failed:
        raise OSError(f"cannot read {folder}: {failed[0]}")
