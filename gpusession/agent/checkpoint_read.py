"""The checkpoint's layout in the workspace, read back: the manifest, restoring it into a
namespace, and what a restore does with a damaged one (says it, keeps it aside under a name of its
own, reads what still reads). The save is gpusession.agent.checkpoint's; both run in the kernel.
Standard library only (cloudpickle: the image's when it has one, else the runtime bundle's);
Python 3.9 syntax.
"""

from __future__ import annotations

import base64
import json
import os
import pickle
import sys
import time
import uuid

from . import tensors
from .kernelenv import bundled_fallback

META_DIR = ".gpusession"
MANIFEST = "checkpoint.json"
INDEX = "index.json"  # a copy of the manifest inside its folder: what restores when the manifest is damaged
LOCK = "checkpoint.lock"  # flock'ed by a save's commit (sessions of several kernels may share a workspace)
DAMAGED = ".damaged-"  # in the name of what a restore found damaged and kept aside
FORMAT = 1
IPYTHON_NAMES = frozenset(
    ("In", "Out", "exit", "quit", "get_ipython")
)  # with names starting with _
RESERVED = "IPython's own name"


def reserved(name: str) -> bool:
    """IPython's own names (In, Out, exit, quit, get_ipython, _, _i1, ...): never saved nor restored."""
    return name in IPYTHON_NAMES or name.startswith("_")


def plain_name(value) -> bool:
    """A file or folder name that stays inside its folder: no separator, not absolute, not . or .."""
    return (
        isinstance(value, str)
        and value not in ("", ".", "..")
        and "/" not in value
        and "\\" not in value
        and "\0" not in value
        and os.sep not in value
    )


def pickler():
    """cloudpickle (functions, lambdas and classes defined in cells pickle by value), else pickle.
    The image's cloudpickle when it has one; else the runtime bundle's, put last on sys.path so
    that it never shadows anything of the image's (a restore finds it the same way)."""
    try:
        import cloudpickle

        return "cloudpickle", cloudpickle
    except ImportError:
        pass
    except Exception:  # noqa: BLE001 - the image's cloudpickle is broken: plain pickle
        return "pickle", pickle
    fallback = bundled_fallback()
    if fallback is None:
        return "pickle", pickle
    if fallback not in sys.path:
        sys.path.append(fallback)
    try:
        import cloudpickle

        return "cloudpickle", cloudpickle
    except Exception:  # noqa: BLE001 - any failure to import means: plain pickle
        return "pickle", pickle


def meta_dir(workspace: str) -> str:
    return os.path.join(workspace, META_DIR)


class Damaged(Exception):
    """The manifest is there but does not read (empty, truncated, not JSON, a folder in its place)."""


def load_manifest(path: str) -> dict | None:
    """The manifest at `path`; None when there is none; Damaged when it does not read as one."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return None
    except OSError as exc:  # a folder in its place, unreadable
        raise Damaged(f"{type(exc).__name__}: {exc.strerror or exc}") from None
    try:
        doc = json.loads(raw.decode("utf-8"))
    except ValueError:
        raise Damaged(
            "empty" if not raw.strip() else f"not a manifest ({len(raw)} bytes of something else)"
        ) from None
    if (
        not isinstance(doc, dict)
        or doc.get("format") != FORMAT
        or not plain_name(doc.get("folder"))
        or not isinstance(doc.get("variables", []), list)
    ):
        raise Damaged("not a manifest of this format")
    return doc


def manifest_or_none(path: str) -> dict | None:
    """The manifest at `path`, None when there is none or it does not read (load_manifest)."""
    try:
        return load_manifest(path)
    except Damaged:
        return None


def read_manifest(workspace: str) -> dict | None:
    """The manifest of the workspace's checkpoint, the one a restore takes first: the whole
    checkpoint with the highest `seq` (newer_whole: a save's commit), else `checkpoint.json`'s
    (the tidy writes it after the save's answer); None when there is none or it is damaged."""
    manifest = manifest_or_none(os.path.join(meta_dir(workspace), MANIFEST))
    newer = newer_whole(workspace, after=manifest)
    return newer[0] if newer else manifest


def write_json(path: str, data: dict, *, sync: bool = True, replace: bool = True) -> None:
    """`data` into `path` under a temporary name, then renamed onto it; `sync`: fsync'ed before
    the rename; `replace` False: written at `path` itself (a name nothing reads, the caller's
    own temporary one)."""
    tmp = f"{path}.{uuid.uuid4().hex[:8]}.tmp" if replace else path
    with open(tmp, "w") as f:
        f.write(json.dumps(data))  # one string (json's C encoder); json.dump writes piece by piece
        if sync:
            f.flush()
            os.fsync(f.fileno())
    if replace:
        os.replace(tmp, path)


def _aside(path: str) -> str:
    """Keep a damaged manifest or folder under a name of its own: `<name>.damaged-<time>`."""
    stem, ext = os.path.splitext(path)  # checkpoint.json -> checkpoint.damaged-<time>.json
    target = f"{stem}{DAMAGED}{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:4]}{ext}"
    os.replace(path, target)
    return target


def newer_whole(workspace: str, after: dict | None = None) -> list[dict]:
    """The checkpoint folders whose own index reads and whose files are all there at their
    sizes, highest `seq` (the order of commits) first, past `after`'s (the committed manifest)
    when given. A save is on disk whole before it renames the manifest onto it, and that rename
    is made durable after the save's answer: a crash between them leaves the manifest naming the
    checkpoint before, and the first of these is the one said saved. Folders of saves cut short
    (no index, a file missing or short) are not among them; checkpoints of an older layout (no
    `seq`) count as the oldest, newest name first."""
    base = os.path.join(meta_dir(workspace), "checkpoints")
    floor = after.get("seq") if after else None
    try:
        folders = [f for f in os.listdir(base) if DAMAGED not in f]
    except OSError:
        return []
    found = []
    for folder in folders:
        doc = manifest_or_none(os.path.join(base, folder, INDEX))
        if doc is None or doc.get("folder") != folder:
            continue
        seq = doc.get("seq") if isinstance(doc.get("seq"), int) else -1
        if after is not None and (not isinstance(floor, int) or seq <= floor):
            continue
        if not_whole(os.path.join(base, folder), doc) is None:
            found.append(((seq, folder), doc))
    return [doc for _, doc in sorted(found, key=lambda item: item[0], reverse=True)]


def not_whole(folder: str, doc: dict) -> str | None:
    """Why the checkpoint `doc` describes is not whole in `folder` (None: it is): every variable
    file of its manifest there, at the size the save wrote (a variable kept in the index itself,
    `inline`, came whole with the index)."""
    for entry in doc.get("variables") or []:
        if isinstance(entry, dict) and isinstance(entry.get("inline"), str):
            continue
        if not isinstance(entry, dict) or not plain_name(entry.get("file")):
            return "not a manifest entry"
        try:
            size = os.stat(os.path.join(folder, entry["file"])).st_size
        except OSError:
            size = None
        if size != entry.get("bytes"):
            return f"{entry.get('name')}: its file is missing or not whole"
    return None


# torch's words when a tensor saved on a GPU is read where none is visible
CUDA_ABSENT = "torch.cuda.is_available() is False"


class _OntoCpu(pickle.Unpickler):
    """A pickle read with torch tensors and modules saved on a GPU put on the CPU (torch.load's
    map_location): a session resumed or switched where no GPU is visible keeps its work. A
    tensor's storage pickles as torch.storage._load_from_bytes(bytes of torch.save)."""

    def find_class(self, module_name: str, name: str):
        if (module_name, name) == ("torch.storage", "_load_from_bytes"):
            import io

            import torch

            return lambda b: torch.load(io.BytesIO(b), map_location="cpu", weights_only=False)
        return super().find_class(module_name, name)


def _read_variable(module, folder: str, entry) -> object:
    """One variable's value; Damaged when its bytes are not the ones the save wrote. `module`:
    the pickle module, or _OntoCpu."""
    if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
        raise Damaged("not a manifest entry")
    if isinstance(entry.get("inline"), str):
        return _read_inline(module, entry)
    if not plain_name(entry.get("file")):
        raise Damaged(
            f"its file name {str(entry.get('file'))[:80]!r} leaves the checkpoint folder; not opened"
        )
    path = os.path.join(folder, entry["file"])
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if isinstance(entry.get("bytes"), int) and size != entry["bytes"]:
                raise Damaged(f"{size} bytes of the {entry['bytes']} saved")
            head = f.read(2)
            f.seek(max(size - 1, 0))
            _check_ends(head, f.read(1))
            f.seek(0)
            try:
                return module(f).load() if module is _OntoCpu else module.load(f)
            except (EOFError, pickle.UnpicklingError) as exc:
                raise Damaged(f"{type(exc).__name__}: {exc}"[:200]) from None
    except OSError as exc:  # missing, a folder in its place
        raise Damaged(f"{type(exc).__name__}: {exc.strerror or exc}") from None


def _read_inline(module, entry: dict) -> object:
    """A small variable's pickle, kept in the index itself (base64)."""
    try:
        data = base64.b64decode(entry["inline"], validate=True)
    except ValueError:
        raise Damaged("its bytes in the index are not base64") from None
    if isinstance(entry.get("bytes"), int) and len(data) != entry["bytes"]:
        raise Damaged(f"{len(data)} bytes of the {entry['bytes']} saved")
    _check_ends(data[:2], data[-1:])
    try:
        if module is _OntoCpu:
            import io

            return module(io.BytesIO(data)).load()
        return module.loads(data)
    except (EOFError, pickle.UnpicklingError) as exc:
        raise Damaged(f"{type(exc).__name__}: {exc}"[:200]) from None


def _check_ends(head: bytes, last: bytes) -> None:
    """A pickle of protocol 2-5 starts with PROTO and ends with STOP."""
    if head[:1] != b"\x80" or head[1:2] not in b"\x02\x03\x04\x05" or last != b".":
        raise Damaged("not a pickle (its first or last bytes)")


def restore(namespace: dict, workspace: str) -> dict:
    """Load the workspace's checkpoint into `namespace`; what came back and what did not (one
    entry per variable that failed to load, with why). Never raises for a bad checkpoint: a
    damaged one is said (`damaged`), kept aside under a name of its own, and what reads comes
    back. A whole checkpoint committed after the manifest's (a crash lost the manifest's rename:
    newer_whole) is the one restored, when all of it reads; else it is kept aside
    (`passed_over`: a save cut short by a crash during its fsyncs) and the manifest's restored."""
    root = meta_dir(workspace)
    damaged: list[str] = []
    kept: list[str] = []
    committed = _committed(root, damaged, kept)
    passed_over: list[str] = []
    for newer in newer_whole(workspace, after=committed):
        if committed is None:  # nothing committed reads: the newest whole one, as it reads
            chosen = newer
            break
        trial: dict = {}
        report = _restore_checkpoint(trial, root, newer, [], passed_over, workspace, False)
        if "damaged" not in report:
            namespace.update(trial)
            return _passed_over(report, passed_over, workspace)
    else:
        chosen = committed
    if chosen is None:
        report = {"found": False, "restored": [], "failed": [], "imports": [], "skipped": []}
        return {**report, **_damage(damaged, kept, workspace)}
    report = _restore_checkpoint(
        namespace, root, chosen, damaged, kept, workspace, chosen is committed
    )
    return _passed_over(report, passed_over, workspace)


def _passed_over(report: dict, kept: list, workspace: str) -> dict:
    """Later checkpoints that did not read whole (saves cut short by a crash during their
    fsyncs, never said saved), kept aside: said in the report, not as damage."""
    if kept:
        report["passed_over"] = [os.path.relpath(k, workspace) for k in kept]
    return report


def _restore_checkpoint(
    namespace: dict, root: str, manifest: dict, damaged: list, kept: list, workspace: str, named
) -> dict:
    """The checkpoint `manifest` describes loaded into `namespace`. When a variable file is
    damaged, its folder is kept aside, and the manifest too when it names it (`named`)."""
    _, module = pickler()
    folder = os.path.join(root, "checkpoints", manifest["folder"])
    failed: list[dict] = []
    imported = _restore_imports(namespace, manifest, failed)
    on_cpu: list[str] = []
    restored, bad_files = _restore_variables(namespace, module, folder, manifest, failed, on_cpu)
    if bad_files:  # the whole checkpoint aside: the next save writes a new one, a next resume says there is none
        damaged.append(f"{bad_files} of its variable file(s)")
        if named and not kept and os.path.isfile(os.path.join(root, MANIFEST)):
            kept.append(_aside(os.path.join(root, MANIFEST)))  # (unless it is aside already)
        if os.path.isdir(folder):
            kept.append(_aside(folder))
    return {
        "found": True,
        "at": manifest.get("at"),
        "python": manifest.get("python"),
        "restored": restored,
        "imports": imported,
        "failed": failed,
        "skipped": manifest.get("skipped") or [],
        **({"on_cpu": on_cpu} if on_cpu else {}),
        **_damage(damaged, kept, workspace),
    }


def _committed(root: str, damaged: list, kept: list) -> dict | None:
    """The committed manifest; None when there is none or it is damaged (said in `damaged`, set
    aside in `kept`)."""
    try:
        return load_manifest(os.path.join(root, MANIFEST))
    except Damaged as exc:
        damaged.append(f"its manifest: {exc}")
        kept.append(_aside(os.path.join(root, MANIFEST)))
        return None


def _restore_imports(namespace: dict, manifest: dict, failed: list) -> list[str]:
    """The modules the saved namespace had imported, imported again under their aliases; those
    that do not import go into `failed`. Returns the aliases restored."""
    imported = []
    for alias, name in (manifest.get("imports") or {}).items():
        if reserved(str(alias)):
            failed.append({"name": str(alias), "error": RESERVED})
            continue
        try:
            namespace[alias] = __import__("importlib").import_module(name)
            imported.append(alias)
        except Exception as exc:  # noqa: BLE001 - a module this image lacks: say so
            failed.append(
                {"name": alias, "error": f"import {name}: {type(exc).__name__}: {exc}"[:200]}
            )
    return imported


def _restore_variables(
    namespace: dict, module, folder: str, manifest: dict, failed: list, on_cpu: list
) -> tuple[list[str], int]:
    """Each saved variable read back into `namespace`; those that do not go into `failed`, those
    saved on a GPU and read onto the CPU (no GPU visible) into `on_cpu` too.
    Returns (the names restored, how many files were damaged)."""
    restored, bad_files = [], 0
    for entry in manifest.get("variables") or []:
        name = entry.get("name", "?") if isinstance(entry, dict) else "?"
        if isinstance(name, str) and reserved(name):
            failed.append({"name": name, "error": RESERVED})
            continue
        moved = len(tensors.MOVED)
        try:
            try:
                namespace[name] = _read_variable(module, folder, entry)
            except RuntimeError as exc:  # a tensor pickled by torch itself, saved on a GPU
                if CUDA_ABSENT not in str(exc):
                    raise
                namespace[name] = _read_variable(_OntoCpu, folder, entry)
                on_cpu.append(name)
            if len(tensors.MOVED) > moved and name not in on_cpu:  # ours (tensors.rebuild)
                on_cpu.append(name)
            restored.append(name)
        except Damaged as exc:
            bad_files += 1
            failed.append({"name": str(name), "error": f"damaged: {exc}"})
        except Exception as exc:  # noqa: BLE001 - another Python or package version: one line for it
            failed.append({"name": str(name), "error": f"{type(exc).__name__}: {exc}"[:200]})
    return restored, bad_files


def _damage(damaged: list, kept: list, workspace: str) -> dict:
    return (
        {"damaged": damaged, "kept_aside": [os.path.relpath(k, workspace) for k in kept]}
        if damaged
        else {}
    )


# -- in the kernel ---------------------------------------------------------------------------
