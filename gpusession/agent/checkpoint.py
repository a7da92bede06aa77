"""The kernel's user namespace, saved into the session's workspace and restored from it.

Loaded into the session kernel as an IPython extension (next to gpusession.agent.activity):

- saving is asked by the agent (gpusession.agent.saving): it writes SAVE_REQUEST in the state
  folder and sends the kernel SIGUSR1; the handler starts a thread that pickles every user
  variable (cloudpickle where the kernel can import it, else pickle) into a fresh folder of the
  workspace, records modules as names to import again, and lists what it skipped and why. A
  time bound (`deadline`) and a size cap per object (`cap_bytes`) come with the request. The
  answer is SAVE_RESULT in the state folder.
- restoring happens once, when the runtime starts the session's first kernel with
  ENV_RESTORE set: the extension loads the workspace's checkpoint into the namespace before the
  kernel answers, and leaves RESTORE_RESULT in the state folder for the agent to serve.

Layout in the workspace (`.gpusession/`): `checkpoints/<id>/<n>.pkl`, one file per variable
(an array's protocol-5 buffer written as is), `<id>/index.json` (its manifest, with `seq`, its
place in the order of commits, given under `checkpoint.lock`), fsync'ed at once and read back
before the save says it landed: the whole checkpoint with the highest `seq` is the workspace's.
After the answer, `checkpoint.json` (the manifest naming that folder, replaced atomically) is
written and the older folders removed. A kill at any moment of a save leaves the previous
checkpoint whole, and saves of several kernels into one workspace never remove each other's
folders. Reading it back (restore, damage): checkpoint_read.py.
Standard library only (cloudpickle: the image's when it has one, else the runtime bundle's);
Python 3.9 syntax.
"""

from __future__ import annotations

import base64
import concurrent.futures
import fcntl
import io
import json
import os
import pickle
import shutil
import signal
import socket
import sys
import threading
import time
import types
import uuid

from ..core.envnames import (
    ENV_RESTORE,
    ENV_STATE_DIR,
    ENV_WORKSPACE,
    RESTORE_RESULT,
    SAVE_READY,
    SAVE_REQUEST,
    SAVE_RESULT,
)
from .checkpoint_read import (
    DAMAGED,
    FORMAT,
    INDEX,
    LOCK,
    MANIFEST,
    manifest_or_none,
    meta_dir,
    newer_whole,
    not_whole,
    pickler,
    read_manifest,  # noqa: F401 - the checkpoint's API, with save and restore
    reserved,
    restore,
    write_json,
)
from .tensors import reduce_tensor

YOUNG_S = 60.0  # a folder without its index this young may be a save's, just made, not locked yet
SYNC_THREADS = 16  # fsyncs waiting together at most (a save of many variables)
INLINE_BYTES = 64 * 1024  # a variable's pickle this small is kept in the index itself,
INLINE_TOTAL = (
    256 * 1024
)  # while those of the save so far stay within this (the index is read whole)
KEEP_OPEN = 64  # files a save keeps open from their writing to their fsync (more: opened again)


class _OverCap(Exception):
    pass


class _CappedFile(io.RawIOBase):
    """A file that refuses to grow past `cap` bytes (the pickler stops at the first write over)."""

    def __init__(self, f, cap: int | None):
        self.f, self.cap, self.size = f, cap, 0

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        n = memoryview(
            data
        ).nbytes  # a protocol-5 PickleBuffer (an array's memory) has no len(): written as is
        self.size += n
        if self.cap is not None and self.size > self.cap:
            raise _OverCap()
        self.f.write(data)
        return n


class _TensorsAsBytes:
    """`module.dump` (cloudpickle's or pickle's) with torch tensors reduced to their bytes
    (gpusession.agent.tensors), the pickler's own reductions kept for everything else."""

    def __init__(self, module) -> None:
        base = getattr(module, "Pickler", pickle.Pickler)

        class Pickler(base):  # type: ignore[misc, valid-type]
            def reducer_override(self, obj):
                reduced = reduce_tensor(obj)
                if reduced is not None:
                    return reduced
                parent = getattr(super(), "reducer_override", None)
                return NotImplemented if parent is None else parent(obj)

        self._pickler = Pickler

    def dump(self, value, file, protocol: int) -> None:
        self._pickler(file, protocol=protocol).dump(value)


def _why_not(value) -> str | None:
    """Why a value is not even tried (what never pickles), in the words of the skipped list."""
    if isinstance(value, (types.GeneratorType, types.AsyncGeneratorType, types.CoroutineType)):
        return "generator"
    if isinstance(value, io.IOBase):
        return "open file"
    if isinstance(value, socket.socket):
        return "socket"
    if isinstance(value, threading.Thread):
        return "thread"
    return None


_restored: set = (
    set()
)  # names this kernel restored: IPython hides what exists before its first cell


def user_variables(ip) -> dict:
    """The names a user made: not IPython's own (In, Out, exit, _i1, ...) nor private ones."""
    hidden = getattr(ip, "user_ns_hidden", {})
    return {
        k: v
        for k, v in ip.user_ns.items()
        if not k.startswith("_") and (k in _restored or not (k in hidden and hidden[k] is v))
    }


def _unhide_restored(ip) -> None:
    """Before the first cell: restored names are the user's (%who shows them), not IPython's."""
    for name in _restored:
        ip.user_ns_hidden.pop(name, None)
    try:
        ip.events.unregister("pre_run_cell", ip._gpusession_unhide)
    except (ValueError, AttributeError):
        pass


def _dump(module, value, file: str, cap_bytes: int | None, held: dict) -> int:
    """One variable's pickle into `file`; its fsync comes with the commit's (_sync_all). The file
    stays open until then (`held`: path -> descriptor, closed by the save) while `held` has
    room: its fsync needs no second open."""
    fd = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
    try:
        with open(fd, "wb", closefd=False) as f:
            capped = _CappedFile(f, cap_bytes)
            module.dump(value, capped, protocol=pickle.HIGHEST_PROTOCOL)
    except BaseException:
        os.close(fd)
        raise
    if len(held) < KEEP_OPEN:
        held[file] = fd
    else:
        os.close(fd)
    return capped.size


def _skip_why(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:200]


def save(
    namespace: dict,
    workspace: str,
    *,
    deadline: float,
    cap_bytes: int | None,
    cause: str | None = None,
) -> dict:
    """Save `namespace` into `workspace`; returns the result (data: counts, bytes, skipped).
    `cause`: what the save was taken for (a protocol.Notice value: an interruption notice), kept
    in the manifest and the result; None for a plain save.
    Commits only before `deadline`; else the previous checkpoint stays. Saves of several kernels
    into one workspace are independent: each writes its own folder, the commit is under a lock
    (its `seq` orders them), and `committed` is said only once all our folder holds is on disk."""
    started = time.time()
    kind, module = pickler()
    if "torch" in sys.modules:  # the kernel has imported torch: its tensors as their bytes
        module = _TensorsAsBytes(module)
    root = meta_dir(workspace)
    folder = f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:8]}"
    path = os.path.join(root, "checkpoints", folder)
    os.makedirs(path, exist_ok=True)
    writing = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    held: dict = {path: writing}  # open until the commit's fsyncs are done: path -> descriptor
    try:
        fcntl.flock(writing, fcntl.LOCK_EX)  # the folder's own flock, held until committed: no
        # other save's tidy takes it
        result = _save_into(
            namespace, root, folder, path, started, kind, module, deadline, cap_bytes, cause, held
        )
        if cause:
            result["for"] = cause
        return result
    finally:
        for fd in held.values():
            os.close(fd)


def _save_into(
    namespace, root, folder, path, started, kind, module, deadline, cap_bytes, cause, held
) -> dict:
    saved, imports, skipped = _write_variables(namespace, path, module, deadline, cap_bytes, held)
    total = sum(entry["bytes"] for entry in saved)
    manifest = {
        "format": FORMAT,
        "folder": folder,
        "pickler": kind,
        "at": time.time(),
        "python": ".".join(map(str, sys.version_info[:3])),
        "variables": saved,
        "imports": imports,
        "skipped": skipped,
    }
    if cause:
        manifest["for"] = cause
    result = {
        "saved": len(saved),
        "bytes": total,
        "imports": len(imports),
        "skipped": skipped,
        "pickler": kind,
        "seconds": round(time.time() - started, 3),
        "committed": False,
        "folder": folder,
    }
    if time.time() >= deadline:  # too late: the agent has given up on it; keep the previous one
        shutil.rmtree(path, ignore_errors=True)
        result["error"] = "time bound"
        return result
    return _commit(root, folder, path, manifest, result, held)


def _write_variables(
    namespace: dict, path: str, module, deadline: float, cap_bytes: int | None, held: dict
) -> tuple[list[dict], dict[str, str], list[dict]]:
    """Each variable pickled into its own file in `path`, in name order, until `deadline`:
    (the saved ones, the imported modules by alias, what was left out and why)."""
    saved, imports, skipped = [], {}, []
    inlined = 0
    names = sorted(namespace)
    for i, name in enumerate(names):
        value = namespace[name]
        if time.time() >= deadline:
            skipped += [{"name": n, "why": "time bound"} for n in names[i:]]
            break
        if reserved(name):
            skipped.append({"name": name, "why": "reserved"})
            continue
        if isinstance(value, types.ModuleType):
            imports[name] = value.__name__
            continue
        why = _why_not(value)
        if why is not None:
            skipped.append({"name": name, "why": why, "type": type(value).__name__})
            continue
        file = os.path.join(path, f"{len(saved)}.pkl")
        room = INLINE_TOTAL - inlined
        entry, skip = _write_variable(module, name, value, file, cap_bytes, held, room)
        if skip is not None:
            skipped.append(skip)
        else:
            saved.append(entry)
            inlined += entry["bytes"] if "inline" in entry else 0
    return saved, imports, skipped


def _write_variable(
    module, name: str, value, file: str, cap_bytes: int | None, held: dict, room: int
) -> tuple[dict | None, dict | None]:
    """One variable: (its manifest entry, None), or (None, why it was left out), without a file
    left behind. A pickle of at most INLINE_BYTES (and `room`, what the save's INLINE_TOTAL has
    left) goes into the entry itself (`inline`, base64): a small save then writes one file, its
    index (one file fewer to create and fsync); a larger one into `file`."""
    entry = {"name": name, "type": type(value).__name__}
    try:
        small = _inline(module, value, cap_bytes, min(INLINE_BYTES, room))
        if small is not None:
            return {
                **entry,
                "inline": base64.b64encode(small).decode("ascii"),
                "bytes": len(small),
            }, None
        size = _dump(module, value, file, cap_bytes, held)
    except _OverCap:
        _unlink(file)
        return None, {**entry, "why": "over cap", "cap_bytes": cap_bytes}
    except BaseException as exc:  # noqa: BLE001 - whatever a value's pickling raises (KeyboardInterrupt,
        # SystemExit too): skip that one, say why, keep the rest
        _unlink(file)
        return None, {**entry, "why": "does not pickle", "error": _skip_why(exc)}
    return {**entry, "file": os.path.basename(file), "bytes": size}, None


def _inline(module, value, cap_bytes: int | None, limit: int) -> bytes | None:
    """`value`'s pickle when it is at most `limit` bytes (and within the cap); None when larger
    (it stops there: an array's buffer is not copied); _OverCap when over a cap below `limit`."""
    if limit <= 0:
        return None
    capped = cap_bytes is not None and cap_bytes < limit
    buffer = io.BytesIO()
    try:
        module.dump(
            value,
            _CappedFile(buffer, cap_bytes if capped else limit),
            protocol=pickle.HIGHEST_PROTOCOL,
        )
    except _OverCap:
        if capped:
            raise
        return None
    return buffer.getvalue()


def _commit(root: str, folder: str, path: str, manifest: dict, result: dict, held: dict) -> dict:
    """Under the lock: the checkpoint's index (the manifest with its `seq`, past every earlier
    commit's) written in its folder; every file of the checkpoint, the index and the folders
    naming them fsync'ed at once (_sync_all: one journal commit for them all, the save's only
    one); every file read back at its size; `result` says how it went. From then on the folder
    is on disk whole with the highest `seq`: the workspace's checkpoint, as a restore finds it
    (checkpoint_read.newer_whole). The manifest naming it, `checkpoint.json`, is written after the
    answer, by the tidy, with the old checkpoints' removal; a crash before that loses nothing
    said saved. A commit that fails takes its index away: its folder is no checkpoint then."""
    lock = os.open(os.path.join(root, LOCK), os.O_WRONLY | os.O_CREAT, 0o600)
    index = os.path.join(path, INDEX)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        manifest["seq"] = _next_seq(root)
        _write_index(index, manifest, held)  # a new folder's: nothing reads it half written
        files = [os.path.join(path, e["file"]) for e in manifest["variables"] if "file" in e]
        _sync_all([held.get(f, f) for f in (*files, index)], [held[path], os.path.dirname(path)])
        missing = not_whole(path, manifest)  # read back after the fsyncs
        if missing:
            _unlink(index)
            result["error"] = f"the checkpoint did not land ({missing})"
            return result
        result["committed"] = True
    except BaseException:
        _unlink(index)
        raise
    finally:
        os.close(lock)
    # after the answer: the manifest written and the old folders removed
    _Pools.get().tidy.submit(_tidy, root)
    return result


def _write_index(index: str, manifest: dict, held: dict) -> None:
    """The index into its new file, kept open (in `held`) for the commit's fsync."""
    fd = os.open(index, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the folder is new
    held[index] = fd
    data = memoryview(json.dumps(manifest).encode())  # one string (json's C encoder)
    while data:  # no file object around it: its setup cost more than the write of a small one
        data = data[os.write(fd, data) :]


_last_seq = 0  # the last `seq` this process gave (a manifest the tidy has not written yet)


def _next_seq(root: str) -> int:
    """The new checkpoint's place in the order of commits (under the lock): the clock's
    nanoseconds, and always past the manifest's and this process's last (a workspace moved
    between machines whose clocks differ, a tidy still to come)."""
    global _last_seq
    doc = manifest_or_none(os.path.join(root, MANIFEST))
    before = doc.get("seq") if doc else None
    seq = max(time.time_ns(), _last_seq + 1, before + 1 if isinstance(before, int) else 0)
    _last_seq = seq
    return seq


def tidied(timeout: float) -> None:
    """Wait until the removals of the saves made so far are done (the tidy's one thread takes
    them in order)."""
    _Pools.get().tidy.submit(lambda: None).result(timeout)


def _tidy(root: str) -> None:
    """Under the lock: the manifest written naming the workspace's checkpoint (the whole one with
    the highest `seq`) and made durable (its bytes, then the workspace's folder), then every
    other checkpoint goes (_remove_others); a save committing meanwhile waits, so none removes a
    folder named after it."""
    try:
        lock = os.open(os.path.join(root, LOCK), os.O_WRONLY | os.O_CREAT, 0o600)
    except OSError:
        return  # the workspace went: nothing to tidy
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        newest = newer_whole(os.path.dirname(root))
        if not newest:
            return
        _write_manifest(root, newest[0])
        _remove_others(root, newest[0]["folder"])
    except OSError:
        return  # a full disk, a folder gone: the next save's tidy tries again
    finally:
        os.close(lock)


def _write_manifest(root: str, doc: dict) -> None:
    """`checkpoint.json` naming `doc`'s folder, replaced atomically and fsync'ed (unless it is
    so already)."""
    path = os.path.join(root, MANIFEST)
    current = manifest_or_none(path)
    if current is not None and current.get("folder") == doc["folder"]:
        return
    staged = f"{path}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        write_json(staged, doc, sync=True, replace=False)
        os.replace(staged, path)
    finally:
        _unlink(staged)
    _fsync(root)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _remove_others(root: str, keep: str) -> None:
    """Earlier checkpoints and saves cut short; never a folder a save is writing (it holds the
    folder's flock) nor one a restore kept aside as damaged."""
    base = os.path.join(root, "checkpoints")
    for old in os.listdir(base):
        if old == keep or DAMAGED in old:
            continue
        folder = os.path.join(base, old)
        try:
            fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        except OSError:
            continue  # gone meanwhile, or no folder
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # a save is writing it
            if _young(folder) and not os.path.exists(os.path.join(folder, INDEX)):
                continue  # a save that made it and is about to lock it (taken here in between,
                # its folder went under it: seen under load); committed ones hold their index
            shutil.rmtree(folder, ignore_errors=True)
        finally:
            os.close(fd)


def _young(folder: str) -> bool:
    try:
        return time.time() - os.stat(folder).st_mtime < YOUNG_S
    except OSError:
        return False


def _fsync(path: str | int) -> None:
    """fsync a path, or a descriptor the save holds open already."""
    if isinstance(path, int):
        os.fsync(path)
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _Pools:
    """The threads a save waits with, started once per process and kept: starting a thread
    waits for it to run, ~0.8 ms each on a loaded machine, and a small save started five (four
    fsyncs and the tidy), more than the fsyncs themselves cost. A forked child (the kernel's
    multiprocessing) has none of its parent's threads: it makes its own."""

    _pid = 0
    sync: concurrent.futures.ThreadPoolExecutor
    tidy: concurrent.futures.ThreadPoolExecutor

    @classmethod
    def get(cls) -> type[_Pools]:
        if cls._pid != os.getpid():
            # not daemons: a process that ends right after a save still finishes its tidy
            cls.sync = concurrent.futures.ThreadPoolExecutor(SYNC_THREADS, "gpusession-sync")
            cls.tidy = concurrent.futures.ThreadPoolExecutor(1, "gpusession-tidy")
            cls._pid = os.getpid()
        return cls


def _sync_all(files: list, folders: list) -> None:
    """Every file's bytes on disk, fsync'ed at once (the first here, the others from the pool's
    threads): the file system commits its journal once for those that wait together, where one
    after another paid a commit (a disk flush) each. Then the folders' entries (the files' and
    the checkpoint's names), one after the other here: that commit holds them already on a
    journaling file system, so their fsyncs find it done; waited for together, each was one more
    thread to wake, the largest part of a small save's time beside a busy process (1.30-1.43 ms
    against 1.06 ms for 1 KB, docs/benchmarks.md). Returns when all are; the first error is
    raised."""

    def sync(batch: list) -> None:
        for path in batch:
            _fsync(path)

    batches = [files[i::SYNC_THREADS] for i in range(min(SYNC_THREADS, len(files)))]
    pool = _Pools.get().sync
    futures = [pool.submit(sync, batch) for batch in batches[1:]]
    error: BaseException | None = None
    try:
        sync(batches[0])  # the index at least
    except BaseException as exc:  # noqa: BLE001 - raised below, once the others are done
        error = exc
    for future in futures:
        try:
            future.result()
        except BaseException as exc:  # noqa: BLE001
            error = error or exc
    if error is not None:
        raise error
    sync(folders)


def _state_file(name: str) -> str | None:
    d = os.environ.get(ENV_STATE_DIR)
    return os.path.join(d, name) if d else None


_saving = (
    threading.Lock()
)  # one save of this kernel at a time (the request and result files are one each)


def _serve_request(ip) -> None:
    with _saving:
        _answer_request(ip)


def _answer_request(ip) -> None:
    request_path, result_path = _state_file(SAVE_REQUEST), _state_file(SAVE_RESULT)
    request: dict = {}
    try:
        with open(request_path) as f:
            request = json.load(f)
        result = save(
            user_variables(ip),
            os.environ[ENV_WORKSPACE],
            deadline=float(request["deadline"]),
            cap_bytes=request.get("cap_bytes"),
            cause=request.get("for"),
        )
    except BaseException as exc:  # noqa: BLE001 - said to the agent, which says it in the summary (never 60 s of silence)
        result = {"error": f"{type(exc).__name__}: {exc}"[:300], "committed": False}
    result["id"] = request.get("id")
    write_json(result_path, result)


def load_ipython_extension(ip) -> None:
    workspace = os.environ.get(ENV_WORKSPACE)
    if not workspace:
        return
    if os.environ.pop(ENV_RESTORE, "") == "1":  # this kernel only: a restart starts empty
        try:
            report = restore(ip.user_ns, workspace)
        except Exception as exc:  # noqa: BLE001 - never a failed start
            report = {
                "found": False,
                "restored": [],
                "failed": [],
                "error": f"{type(exc).__name__}: {exc}"[:300],
            }
        _restored.update(report.get("restored") or [], report.get("imports") or [])
        path = _state_file(RESTORE_RESULT)
        if path:
            write_json(path, report)
        ip._gpusession_unhide = lambda *a: _unhide_restored(ip)
        ip.events.register("pre_run_cell", ip._gpusession_unhide)

    def on_signal(signum, frame) -> None:
        threading.Thread(
            target=_serve_request, args=(ip,), name="gpusession-save", daemon=True
        ).start()

    signal.signal(
        signal.SIGUSR1, on_signal
    )  # until now ignored (gpusession.agent.kernelspawn.kernel_plan)
    path = _state_file(SAVE_READY)
    if path:  # the agent asks for saves from now on (gpusession.agent.saving)
        with open(path + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.replace(path + ".tmp", path)
