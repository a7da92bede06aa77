"""The runtime bundle: what gpusession brings into any image with a python3 (3.9 or newer), so that
the image needs no sshd, no agent and no ipykernel of its own, and is never changed.

    code  (one per gpusession build)      boot.sh (POSIX sh: finds the image's Python), lib/
          = gpusession's agent and the modules it imports, and pynvml (nvidia-ml-py); fallback/
          = cloudpickle, which the kernel's checkpoint takes only where the image has none
    site  (one per Python version, platform)  deps/ = ipykernel and its dependencies as wheels for
          that Python, unpacked, and pip/ = pip; used only when the image has no ipykernel or pip

Both are tar archives made here, cached in the local data folder (`cache_dir`), and unpacked by a
backend next to the container: a Docker volume on the engine's host, a folder on an EC2 instance.
The container mounts them read-only under RUNTIME_ROOT and runs `sh BOOT_SCRIPT run ...`; first,
`sh boot.sh probe` tells what the image's Python has (`ImagePython`), which says whether a site is
needed and for which Python.

Standard library only (pip, run as a subprocess, downloads the wheels).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import gzip
import hashlib
import importlib.util
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import zipfile
from pathlib import Path
from typing import Any, Callable

from ..core.errors import GpuSessionError
from ..core.protocol import Marker, parse_marker
from ..core.wholefiles import write_whole

RUNTIME_ROOT = "/opt/gpusession-runtime"  # in the container; boot.sh says the same
CODE_DIR = f"{RUNTIME_ROOT}/code"
SITE_DIR = f"{RUNTIME_ROOT}/site"
BOOT_SCRIPT = f"{CODE_DIR}/boot.sh"
COMPLETE = ".complete"  # written last into a filled copy: boot.sh refuses a copy without it
BYTECODE = ".bytecode"  # in a site compiled ahead, here: the tag (cp311) its __pycache__ serves
MIN_PYTHON = (3, 9)
MIN_IPYKERNEL = 6
SITE_REQUIREMENTS = ("ipykernel>=6", "pip")
MAX_MANYLINUX = (
    28  # wheels up to manylinux_2_28 (glibc 2.28: Debian 10, RHEL 8, Ubuntu 20.04 and newer)
)
PACKAGE = Path(__file__).resolve().parent.parent  # the gpusession package


NO_PYTHON = (  # an image boot.sh found no python3 in: what to do
    "image {image} has no Python to run the session kernel in ({why}); use an image with python3 3.9 or "
    "newer (pytorch/pytorch, nvcr.io/nvidia/pytorch, jupyter/*, python:3.x, ...) or add one to it "
    "(Dockerfile.cuda is a recipe: nvidia/cuda + Python)"
)

CACHE_ENV = "GPUSESSION_CACHE"  # where the bundle's archives and image probes are kept


def cache_dir() -> Path:
    """This user's runtime cache ($GPUSESSION_CACHE, else the platform's user cache folder,
    ~/.cache/gpusession/runtime): shared by every session store, as it holds no session's data."""
    base = os.environ.get(CACHE_ENV)
    if not base:
        import platformdirs

        base = platformdirs.user_cache_dir("gpusession")
    return Path(base).expanduser() / "runtime"


class BundleError(GpuSessionError):
    """The runtime bundle could not be made (no pip, PyPI unreachable...); the message says why."""


@dataclasses.dataclass(frozen=True)
class ImagePython:
    """What `boot.sh probe` found in an image: the Python its kernel will run with."""

    executable: str  # e.g. /opt/conda/bin/python3
    version: tuple[int, ...]  # (3, 11, 2)
    machine: str  # platform.machine(): x86_64, aarch64
    libc: tuple[str, str]  # ("glibc", "2.36"); ("", "") for musl
    ipykernel: str | None  # its version, None when the image has none
    pip: str | None  # its version, None when the image has none
    uid: int  # the image's USER, as a number
    venv: bool  # a virtual environment
    command: str = (
        ""  # how boot.sh found it (PATH's python3 may be a wrapper): the runtime starts that
    )

    @property
    def start_with(self) -> str:
        return self.command or self.executable

    @classmethod
    def from_payload(cls, data: dict[str, Any]) -> "ImagePython":
        libc = data.get("libc") or ["", ""]
        return cls(
            executable=str(data["executable"]),
            version=tuple(int(v) for v in data["version"]),
            machine=str(data.get("machine") or "x86_64"),
            libc=(str(libc[0]), str(libc[1])),
            ipykernel=data.get("ipykernel"),
            pip=data.get("pip"),
            uid=int(data.get("uid", 0)),
            venv=bool(data.get("venv")),
            command=str(data.get("command") or ""),
        )

    def to_payload(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def short_version(self) -> str:
        return ".".join(str(v) for v in self.version[:2])

    @property
    def has_ipykernel(self) -> bool:
        try:
            return self.ipykernel is not None and (
                self.ipykernel == "unknown" or int(self.ipykernel.split(".")[0]) >= MIN_IPYKERNEL
            )
        except ValueError:
            return True

    @property
    def brings(self) -> list[str]:
        """What the bundle's site gives the kernel, as the image lacks it: ipykernel, pip."""
        return [
            name
            for name, lacking in (("ipykernel", not self.has_ipykernel), ("pip", self.pip is None))
            if lacking
        ]

    @property
    def needs_site(self) -> bool:
        """Does the kernel need the bundle's ipykernel or pip?"""
        return bool(self.brings)

    @property
    def tag(self) -> str:
        """cp311: bytecode is per Python version."""
        return f"cp{self.version[0]}{self.version[1]}"

    @property
    def platforms(self) -> list[str]:
        """pip's --platform tags for wheels that run on this image."""
        libc, version = self.libc
        if libc != "glibc":
            return [f"musllinux_1_2_{self.machine}", f"musllinux_1_1_{self.machine}"]
        try:
            glibc = min(int(version.split(".")[1]), MAX_MANYLINUX)
        except (IndexError, ValueError):
            glibc = 17
        tags = [f"manylinux_2_{minor}_{self.machine}" for minor in range(glibc, 4, -1)]
        legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
        return tags + [f"{name}_{self.machine}" for minor, name in legacy.items() if minor <= glibc]

    @property
    def site_tag(self) -> str:
        """Which site this Python takes: cp311-manylinux_2_28_x86_64."""
        return f"{self.tag}-{self.platforms[0]}"


def parse_probe(text: str) -> ImagePython | str:
    """The probe's ImagePython from its output, or the reason it found none (text)."""
    for line in text.splitlines():
        parsed = parse_marker(line)
        if parsed is None:
            continue
        marker, payload = parsed
        if marker is Marker.PYTHON and isinstance(payload, dict):
            return ImagePython.from_payload(payload)
        if marker is Marker.FAILED:
            return str(payload.get("error") if isinstance(payload, dict) else payload)
    return "the probe printed nothing: " + (
        " | ".join(text.strip().splitlines()[-5:]) or "(no output)"
    )


@dataclasses.dataclass(frozen=True)
class Archive:
    """A gzip'd tar to unpack at the copy's folder (CODE_DIR or SITE_DIR)."""

    kind: str  # "code" or the site tag
    digest: str  # sha256 of the data: a copy's name carries its start
    size: int  # bytes unpacked
    files: int
    content: bytes | None = None  # the tar itself, or:
    path: Path | None = None  # where it is kept (read only when a copy is made)
    bytecode: str | None = None  # cp311: compiled ahead for that Python (no compile on the engine)
    source: str | None = (
        None  # compiled ahead: the digest of the archive it compiles (names copies)
    )

    @property
    def data(self) -> bytes:
        return self.content if self.content is not None else Path(self.path).read_bytes()

    @property
    def copy_name(self) -> str:
        """The name of an unpacked copy (a Docker volume, a folder on an instance)."""
        return f"gpusession-runtime-{self.kind}-{(self.source or self.digest)[:12]}"


def boot_script() -> bytes:
    return (PACKAGE / "agent" / "boot.sh").read_bytes()


def zygote_source() -> str:
    """gpusession.agent.kernelzygote's text, for `python -c` where the package is not yet (a
    Kubernetes pod begins its kernel before the runtime's copy: pods.wait_then_boot)."""
    return (PACKAGE / "agent" / "kernelzygote.py").read_text()


def complete_marker() -> bytes:
    """A tar with just COMPLETE, put last into a copy."""
    return _tar({COMPLETE: b"gpusession runtime bundle\n"}, compress=False)


@functools.lru_cache(maxsize=1)
def code_archive() -> Archive:
    """boot.sh, lib/ with the agent, what it imports of gpusession, and pynvml; fallback/ with
    cloudpickle (pure Python), kept off the PYTHONPATH: the agent's checkpoint appends it to the
    kernel's sys.path only where the image has no cloudpickle (gpusession.agent.kernelenv).
    Kept in the cache by its files' digest (`_kept`): a notebook process's first start packs
    nothing that an earlier process packed."""
    files = _code_files()
    return _kept(f"code-{_files_digest(files)}", lambda: _archive("code", files))


def _code_files() -> dict[str, bytes]:
    files: dict[str, bytes] = {"boot.sh": boot_script()}
    for rel in agent_modules():
        files[f"lib/gpusession/{rel}"] = (PACKAGE / rel).read_bytes()
    spec = importlib.util.find_spec("pynvml")
    if spec is not None and spec.origin:
        files["lib/pynvml.py"] = Path(spec.origin).read_bytes()
    spec = importlib.util.find_spec("cloudpickle")
    if spec is not None and spec.origin:
        package = Path(spec.origin).parent
        for source in sorted(package.glob("*.py")):
            files[f"fallback/cloudpickle/{source.name}"] = source.read_bytes()
    return files


def _files_digest(files: dict[str, bytes]) -> str:
    """sha256 over the names and contents, in name order (no tar, no gzip: ~1 ms a MB)."""
    h = hashlib.sha256()
    for name in sorted(files):
        h.update(f"{name}\0{len(files[name])}\0".encode())
        h.update(files[name])
    return h.hexdigest()[:32]


KEPT_DIR = "archives"  # in cache_dir(): archives made once, by what they were made from


def _kept(
    key: str, make: Callable[[], Archive], keep: Callable[[Archive], bool] = lambda a: True
) -> Archive:
    """The archive `key` names, made once and kept in the cache (its tar, then a JSON of the
    rest, each written whole and renamed into place: the JSON is there only once the tar is);
    made afresh where the cache cannot be read or written, or what was made is not to `keep`."""
    folder = cache_dir() / KEPT_DIR
    tar, meta = folder / f"{key}.tgz", folder / f"{key}.json"
    try:
        fields = json.loads(meta.read_text())
        data = tar.read_bytes()
        if hashlib.sha256(data).hexdigest() == fields["digest"]:
            return Archive(**{**fields, "content": data, "path": None})
    except (OSError, ValueError, KeyError, TypeError):
        pass
    made = make()
    if not keep(made):
        return made
    try:
        folder.mkdir(parents=True, exist_ok=True)
        write_whole(tar, made.data)
        fields = dataclasses.asdict(made)
        fields.pop("content"), fields.pop("path")
        write_whole(meta, json.dumps(fields))
    except OSError:  # a read-only cache: made again next time
        pass
    return made


_CODE_FOR: dict[str, Archive] = {}
_CODE_FOR_LOCK = threading.Lock()


def code_archive_for(python: ImagePython) -> Archive:
    """code_archive() with its bytecode for `python`'s version compiled here, where this machine
    has a Python of that version (else code_archive() itself: the engine compiles it). A copy of
    it is named as one the engine compiled (the source's digest and the version), so gc keeps it
    with this build."""
    with _CODE_FOR_LOCK:
        found = _CODE_FOR.get(python.tag)
        if found is None:
            base = code_archive()
            found = _kept(  # kept only once compiled: a later try may find the interpreter
                f"code-{base.digest[:32]}-{python.tag}",
                lambda: _compiled(base, python),
                keep=lambda made: made.bytecode is not None,
            )
            _CODE_FOR[python.tag] = found
        return found


def _compiled(base: Archive, python: ImagePython) -> Archive:
    interpreter = _interpreter(python)
    if interpreter is None:
        return base
    files = _members_of(base.data)
    _compile_ahead(interpreter, python, files)
    if BYTECODE not in files:
        return base
    compiled = _archive("code", files)
    return dataclasses.replace(compiled, source=base.digest, bytecode=files[BYTECODE].decode())


def agent_modules() -> list[str]:
    """Files of gpusession (relative to the package) that `python -m gpusession.agent` needs:
    the agent package and every gpusession module it imports, at any depth. Kept in the cache
    by the package's files as they stand (names, sizes, times): read through once per build."""
    stand = hashlib.sha256()
    for path in sorted(PACKAGE.rglob("*.py")):
        st = path.stat()
        stand.update(f"{path.relative_to(PACKAGE)}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    kept = cache_dir() / KEPT_DIR / f"modules-{stand.hexdigest()[:32]}.json"
    try:
        found = json.loads(kept.read_text())
        if isinstance(found, list) and all(isinstance(x, str) for x in found):
            return found
    except (OSError, ValueError):
        pass
    found = _follow_imports()
    try:
        kept.parent.mkdir(parents=True, exist_ok=True)
        write_whole(kept, json.dumps(found))
    except OSError:
        pass
    return found


def _follow_imports() -> list[str]:
    agent = {f"agent/{p.name}" for p in (PACKAGE / "agent").glob("*.py")}
    wanted = {
        "__init__.py"
    } | agent  # the package's __init__ imports only for Jupyter, lazily: not followed
    todo = sorted(agent)
    while todo:
        rel = todo.pop()
        for target in _imports(rel):
            if target not in wanted:
                wanted.add(target)
                todo.append(target)
    return sorted(wanted)


def _imports(rel: str) -> set[str]:
    """The gpusession files `rel` imports (relative and absolute imports, lazy ones too)."""
    tree = ast.parse((PACKAGE / rel).read_text())
    package = ["gpusession", *Path(rel).parent.parts]
    found = set()
    for node in ast.walk(tree):
        names: list[list[str]] = []
        if isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = base + (node.module.split(".") if node.module else [])
            names = [module + [alias.name] for alias in node.names] + [module]
        elif isinstance(node, ast.Import):
            names = [alias.name.split(".") for alias in node.names]
        for parts in names:
            if parts[:1] != ["gpusession"]:
                continue
            path = Path(*parts[1:]) if len(parts) > 1 else Path()
            for candidate in (path.with_suffix(".py") if parts[1:] else None, path / "__init__.py"):
                if candidate is not None and (PACKAGE / candidate).is_file():
                    found.add(candidate.as_posix())
                    # importing a module runs its packages' __init__ first
                    for folder in candidate.parents:
                        if folder.parts and (PACKAGE / folder / "__init__.py").is_file():
                            found.add((folder / "__init__.py").as_posix())
                    break
    return found


def current_digests(cache: Path) -> set[str]:
    """The copies this build uses, by their names' digest (12 hex): the code's and the sites'
    kept in `cache` (what gc keeps of the engines' runtime volumes)."""
    found = {code_archive().digest[:12]}
    for about in (cache / "sites").glob("*.json"):
        try:
            found.add(str(json.loads(about.read_text())["digest"])[:12])
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return found


def site_archive(python: ImagePython, cache_dir: Path, say: Callable[[str], None]) -> Archive:
    """ipykernel with its dependencies (deps/) and pip (pip/) as wheels for `python`, unpacked and,
    where this machine has a Python of the same version, compiled to bytecode here (so that a new
    engine or instance only unpacks it); made once per site tag and kept in `cache_dir`."""
    folder = cache_dir / "sites"
    cached, about = folder / f"{python.site_tag}.tar.gz", folder / f"{python.site_tag}.json"
    files: dict[str, bytes] | None = None
    try:
        meta = json.loads(about.read_text())
        if cached.is_file():
            archive = Archive(
                python.site_tag,
                meta["digest"],
                meta["size"],
                meta["files"],
                path=cached,
                bytecode=meta.get("bytecode"),
            )
            if "bytecode" in meta or _interpreter(python) is None:  # compiled, or tried
                return archive
            files = _members_of(archive.data)  # made before bytecode came ahead: compile it now
    except (OSError, ValueError, KeyError, tarfile.TarError):
        pass
    if files is None:
        say(
            f"downloading ipykernel and pip for Python {python.short_version} ({python.platforms[0]}) from PyPI, "
            f"once: kept in {folder}"
        )
        files = {}
        with tempfile.TemporaryDirectory(prefix="gpusession-wheels-") as tmp:
            wheels = Path(tmp)
            _download(python, wheels)
            for wheel in sorted(wheels.glob("*.whl")):
                _unpack(wheel, "pip" if wheel.name.startswith("pip-") else "deps", files)
    interpreter = _interpreter(python)
    if interpreter is not None:
        say(
            f"compiling it for Python {python.short_version} here, once: new engines only unpack it"
        )
        _compile_ahead(interpreter, python, files)
    archive = _archive(python.site_tag, files)
    archive = dataclasses.replace(archive, bytecode=files.get(BYTECODE, b"").decode() or None)
    folder.mkdir(parents=True, exist_ok=True)
    meta = {
        "digest": archive.digest,
        "size": archive.size,
        "files": archive.files,
        "bytecode": archive.bytecode,
    }
    write_whole(cached, archive.data)
    write_whole(about, json.dumps(meta))
    return archive


def _interpreter(python: ImagePython) -> str | None:
    """A CPython of `python`'s version on this machine (this one, else python3.X on PATH): its
    bytecode is what the image's Python reads (the .pyc format changes only between versions)."""
    if sys.implementation.name == "cpython" and sys.version_info[:2] == tuple(python.version[:2]):
        return sys.executable
    found = shutil.which(f"python{python.short_version}")
    if found is None:
        return None
    try:  # a pyenv shim of a version not selected is on PATH, and fails
        said = subprocess.run(
            [found, "-c", "import sys; print(sys.implementation.cache_tag)"],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    return found if said == f"cpython-{python.version[0]}{python.version[1]}" else None


def _compile_ahead(interpreter: str, python: ImagePython, files: dict[str, bytes]) -> None:
    """Add to `files` the bytecode of its .py files for `python`'s version, compiled here as
    unchecked-hash .pyc (the copy never changes: its name is its digest, and sessions mount it
    read-only), and BYTECODE naming that version. Without a working interpreter, nothing: the
    engine compiles it as before."""
    tag = f"cpython-{python.version[0]}{python.version[1]}"
    with tempfile.TemporaryDirectory(prefix="gpusession-bytecode-") as tmp:
        root = Path(tmp)
        for name, data in files.items():
            if name.endswith(".py"):
                (root / name).parent.mkdir(parents=True, exist_ok=True)
                (root / name).write_bytes(data)
        cmd = [interpreter, "-m", "compileall", "-q", "-j", "0"]
        cmd += ["--invalidation-mode", "unchecked-hash", str(root)]
        try:  # exits 1 when a file does not compile (a wheel's py2-only test data): others did
            subprocess.run(cmd, capture_output=True, timeout=600)
        except (OSError, subprocess.TimeoutExpired):
            return
        compiled = {
            pyc.relative_to(root).as_posix(): pyc.read_bytes()
            for pyc in root.rglob(f"__pycache__/*.{tag}.pyc")
        }
    if compiled:
        files.update(compiled)
        files[BYTECODE] = python.tag.encode()


def _members_of(data: bytes) -> dict[str, bytes]:
    """The files of an archive made by _archive."""
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def _download(python: ImagePython, into: Path) -> None:
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--disable-pip-version-check",
        "--quiet",
        "--only-binary=:all:",
        "--python-version",
        python.short_version,
        "--implementation",
        "cp",
        "--dest",
        str(into),
    ]
    for tag in python.platforms:
        cmd += ["--platform", tag]
    cmd += list(SITE_REQUIREMENTS)
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BundleError(f"pip download failed: {exc}") from None
    if done.returncode != 0:
        last = " | ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
        raise BundleError(
            f"cannot download ipykernel for Python {python.short_version} ({python.platforms[0]}): {last}; the image "
            "has no ipykernel: let this machine reach PyPI once (pip's own settings apply), or use an image with "
            "ipykernel installed"
        )


NOT_FOR_LINUX = (
    ".dll",
    ".dylib",
    ".exe",
    ".pdb",
    ".lib",
)  # debugpy carries Windows and macOS helpers: 17 MB


def _unpack(wheel: Path, under: str, files: dict[str, bytes]) -> None:
    """A wheel's importable files into `under/` (its .data purelib/platlib too; scripts, headers
    and other systems' binaries are not needed)."""
    with zipfile.ZipFile(wheel) as zf:
        for info in zf.infolist():
            if info.is_dir() or info.filename.endswith(NOT_FOR_LINUX):
                continue
            name = info.filename
            parts = name.split("/")
            if parts[0].endswith(".data"):
                if len(parts) < 3 or parts[1] not in ("purelib", "platlib"):
                    continue
                name = "/".join(parts[2:])
            files[f"{under}/{name}"] = zf.read(info)


def _archive(kind: str, files: dict[str, bytes]) -> Archive:
    data = _tar(files, compress=True)
    return Archive(
        kind,
        hashlib.sha256(data).hexdigest(),
        sum(len(v) for v in files.values()),
        len(files),
        content=data,
    )


def _tar(files: dict[str, bytes], *, compress: bool) -> bytes:
    """Reproducible: sorted, owned by root, fixed times; directories 0755, files 0644."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        dirs: set[str] = set()
        for name in sorted(files):
            parts = name.split("/")
            for depth in range(1, len(parts)):
                folder = "/".join(parts[:depth])
                if folder not in dirs:
                    dirs.add(folder)
                    tar.addfile(_info(folder, tarfile.DIRTYPE, 0o755))
            data = files[name]
            info = _info(
                name, tarfile.REGTYPE, 0o755 if name.endswith(".sh") or _is_elf(data) else 0o644
            )
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    if not compress:
        return raw.getvalue()
    return gzip.compress(raw.getvalue(), compresslevel=6, mtime=0)


def _info(name: str, kind: bytes, mode: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.mtime, info.uid, info.gid = kind, mode, 1_600_000_000, 0, 0
    return info


def _is_elf(data: bytes) -> bool:
    return data[:4] == b"\x7fELF"
