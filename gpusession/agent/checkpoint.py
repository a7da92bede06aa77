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

Layout in the workspace (`.gpusession/`): `checkpoints/<id>/<n>.pkl`, one file per variable,
and `checkpoint.json`, the manifest naming the folder, replaced atomically once every file is
on disk: a kill at any moment of a save leaves the previous checkpoint whole. Standard library
only (cloudpickle is the image's, when it has it); Python 3.9 syntax.
"""

from __future__ import annotations

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

from ..protocol import ENV_RESTORE, ENV_STATE_DIR, ENV_WORKSPACE

SAVE_REQUEST = "save-request.json"
SAVE_RESULT = "save-result.json"
SAVE_READY = "save-ready"  # the kernel's pid: its SIGUSR1 handler is installed (no mark: still starting)
RESTORE_RESULT = "restored.json"
META_DIR = ".gpusession"
MANIFEST = "checkpoint.json"
FORMAT = 1


class _OverCap(Exception):
    pass


class _CappedFile(io.RawIOBase):
    """A file that refuses to grow past `cap` bytes (the pickler stops at the first write over)."""

    def __init__(self, f, cap: int | None):
        self.f, self.cap, self.size = f, cap, 0

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        n = len(data)
        self.size += n
        if self.cap is not None and self.size > self.cap:
            raise _OverCap()
        self.f.write(data)
        return n


def _pickler():
    try:
        import cloudpickle  # the image's: functions and classes defined in cells pickle by value

        return "cloudpickle", cloudpickle
    except Exception:  # noqa: BLE001 - any failure to import means: plain pickle
        return "pickle", pickle


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


_restored: set = set()  # names this kernel restored: IPython hides what exists before its first cell


def user_variables(ip) -> dict:
    """The names a user made: not IPython's own (In, Out, exit, _i1, ...) nor private ones."""
    hidden = getattr(ip, "user_ns_hidden", {})
    return {k: v for k, v in ip.user_ns.items()
            if not k.startswith("_") and (k in _restored or not (k in hidden and hidden[k] is v))}


def _unhide_restored(ip) -> None:
    """Before the first cell: restored names are the user's (%who shows them), not IPython's."""
    for name in _restored:
        ip.user_ns_hidden.pop(name, None)
    try:
        ip.events.unregister("pre_run_cell", ip._gpusession_unhide)
    except (ValueError, AttributeError):
        pass


def meta_dir(workspace: str) -> str:
    return os.path.join(workspace, META_DIR)


def read_manifest(workspace: str) -> dict | None:
    try:
        with open(os.path.join(meta_dir(workspace), MANIFEST)) as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and doc.get("format") == FORMAT else None


def _write_json(path: str, data: dict) -> None:
    tmp = f"{path}.{uuid.uuid4().hex[:8]}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def save(namespace: dict, workspace: str, *, deadline: float, cap_bytes: int | None) -> dict:
    """Save `namespace` into `workspace`; returns the result (data: counts, bytes, skipped).
    Commits (replaces the manifest) only before `deadline`; else the previous checkpoint stays."""
    started = time.time()
    kind, module = _pickler()
    root = meta_dir(workspace)
    folder = f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:8]}"
    path = os.path.join(root, "checkpoints", folder)
    os.makedirs(path, exist_ok=True)
    saved, imports, skipped, total = [], {}, [], 0
    names = sorted(namespace)
    for i, name in enumerate(names):
        value = namespace[name]
        if time.time() >= deadline:
            skipped += [{"name": n, "why": "time bound"} for n in names[i:]]
            break
        if isinstance(value, types.ModuleType):
            imports[name] = value.__name__
            continue
        why = _why_not(value)
        if why is not None:
            skipped.append({"name": name, "why": why, "type": type(value).__name__})
            continue
        file = os.path.join(path, f"{len(saved)}.pkl")
        try:
            with open(file, "wb") as f:
                capped = _CappedFile(f, cap_bytes)
                module.dump(value, capped, protocol=pickle.HIGHEST_PROTOCOL)
        except _OverCap:
            os.remove(file)
            skipped.append({"name": name, "why": "over cap", "type": type(value).__name__, "cap_bytes": cap_bytes})
            continue
        except Exception as exc:  # noqa: BLE001 - whatever a value's pickling raises: skip it, say why
            os.remove(file)
            skipped.append({"name": name, "why": "does not pickle", "type": type(value).__name__,
                            "error": f"{type(exc).__name__}: {exc}"[:200]})
            continue
        saved.append({"name": name, "file": os.path.basename(file), "bytes": capped.size, "type": type(value).__name__})
        total += capped.size
    manifest = {
        "format": FORMAT, "folder": folder, "pickler": kind, "at": time.time(),
        "python": ".".join(map(str, sys.version_info[:3])), "variables": saved, "imports": imports,
        "skipped": skipped,
    }
    result = {"saved": len(saved), "bytes": total, "imports": len(imports), "skipped": skipped,
              "pickler": kind, "seconds": round(time.time() - started, 3), "committed": False}
    if time.time() >= deadline:  # too late: the agent has given up on it; keep the previous one
        shutil.rmtree(path, ignore_errors=True)
        result["error"] = "time bound"
        return result
    _sync_folder(path)
    _write_json(os.path.join(root, MANIFEST), manifest)
    result["committed"] = True
    for old in os.listdir(os.path.join(root, "checkpoints")):  # earlier ones and saves cut short
        if old != folder:
            shutil.rmtree(os.path.join(root, "checkpoints", old), ignore_errors=True)
    return result


def _sync_folder(path: str) -> None:
    for entry in os.listdir(path):
        fd = os.open(os.path.join(path, entry), os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def restore(namespace: dict, workspace: str) -> dict:
    """Load the workspace's checkpoint into `namespace`; what came back and what did not (one
    entry per variable that failed to load, with why). Never raises for a bad checkpoint."""
    manifest = read_manifest(workspace)
    if manifest is None:
        return {"found": False, "restored": [], "failed": [], "imports": [], "skipped": []}
    _, module = _pickler()
    folder = os.path.join(meta_dir(workspace), "checkpoints", manifest.get("folder", ""))
    restored, failed, imported = [], [], []
    for alias, name in (manifest.get("imports") or {}).items():
        try:
            namespace[alias] = __import__("importlib").import_module(name)
            imported.append(alias)
        except Exception as exc:  # noqa: BLE001 - a module this image lacks: say so
            failed.append({"name": alias, "error": f"import {name}: {type(exc).__name__}: {exc}"[:200]})
    for entry in manifest.get("variables") or []:
        try:
            with open(os.path.join(folder, entry["file"]), "rb") as f:
                namespace[entry["name"]] = module.load(f)
            restored.append(entry["name"])
        except Exception as exc:  # noqa: BLE001 - another Python or package version: one line for it
            failed.append({"name": entry.get("name", "?"), "error": f"{type(exc).__name__}: {exc}"[:200]})
    return {"found": True, "at": manifest.get("at"), "python": manifest.get("python"), "restored": restored,
            "imports": imported, "failed": failed, "skipped": manifest.get("skipped") or []}


# -- in the kernel ---------------------------------------------------------------------------


def _state_file(name: str) -> str | None:
    d = os.environ.get(ENV_STATE_DIR)
    return os.path.join(d, name) if d else None


_saving = threading.Lock()  # one save at a time: a save removes the folders of others


def _serve_request(ip) -> None:
    with _saving:
        _answer_request(ip)


def _answer_request(ip) -> None:
    request_path, result_path = _state_file(SAVE_REQUEST), _state_file(SAVE_RESULT)
    request: dict = {}
    try:
        with open(request_path) as f:
            request = json.load(f)
        result = save(user_variables(ip), os.environ[ENV_WORKSPACE], deadline=float(request["deadline"]),
                      cap_bytes=request.get("cap_bytes"))
    except Exception as exc:  # noqa: BLE001 - said to the agent, which says it in the summary
        result = {"error": f"{type(exc).__name__}: {exc}"[:300], "committed": False}
    result["id"] = request.get("id")
    _write_json(result_path, result)


def load_ipython_extension(ip) -> None:
    workspace = os.environ.get(ENV_WORKSPACE)
    if not workspace:
        return
    if os.environ.pop(ENV_RESTORE, "") == "1":  # this kernel only: a restart starts empty
        try:
            report = restore(ip.user_ns, workspace)
        except Exception as exc:  # noqa: BLE001 - never a failed start
            report = {"found": False, "restored": [], "failed": [], "error": f"{type(exc).__name__}: {exc}"[:300]}
        _restored.update(report.get("restored") or [], report.get("imports") or [])
        path = _state_file(RESTORE_RESULT)
        if path:
            _write_json(path, report)
        ip._gpusession_unhide = lambda *a: _unhide_restored(ip)
        ip.events.register("pre_run_cell", ip._gpusession_unhide)

    def on_signal(signum, frame) -> None:
        threading.Thread(target=_serve_request, args=(ip,), name="gpusession-save", daemon=True).start()

    signal.signal(signal.SIGUSR1, on_signal)  # until now ignored (gpusession.agent.kernelspawn.kernel_plan)
    path = _state_file(SAVE_READY)
    if path:  # the agent asks for saves from now on (gpusession.agent.saving)
        with open(path + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.replace(path + ".tmp", path)
