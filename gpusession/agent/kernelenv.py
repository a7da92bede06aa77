"""How the runtime starts the kernel in someone else's image: with the image's own Python and
packages, ipykernel from the runtime bundle only when the image has none, and an environment in
which `%pip install X` works and X imports in the next cell (root or not, Debian's
externally-managed Python, a read-only venv).

Only when the runtime came in through the bundle's boot.sh (GPUSESSION_RUNTIME_ROOT is set);
otherwise (the local backend, an image that carries gpusession itself) the kernel starts as
`python -m ipykernel_launcher` with the environment unchanged.

Bundle layout below the root (gpusession/transport/bundle.py): code/lib (gpusession, pynvml), code/fallback
(pure-Python packages the kernel takes only where the image has none: cloudpickle), and, when the
image lacks ipykernel or pip, site/deps (ipykernel and its dependencies for this Python) and
site/pip (pip). Standard library only; Python 3.9 syntax.
"""

from __future__ import annotations

import os
import site
import sys
import sysconfig

from ..core.envnames import ENV_RUNTIME_BRINGS, ENV_RUNTIME_ROOT

MIN_IPYKERNEL = 6


def bundle_root() -> str | None:
    return os.environ.get(ENV_RUNTIME_ROOT) or None


def bundled_fallback() -> str | None:
    """The bundle's folder of pure-Python packages used only where the image lacks them
    (cloudpickle); None outside the bundle."""
    root = bundle_root()
    folder = os.path.join(root, "code", "fallback") if root else None
    return folder if folder and os.path.isdir(folder) else None


def _dist_version(name: str) -> str | None:
    import importlib.util

    if importlib.util.find_spec(name) is None:
        return None
    try:
        from importlib.metadata import version

        return version(name)
    except Exception:  # noqa: BLE001 - importable without metadata: take it as it is
        return "unknown"


def _major(version: str | None) -> int:
    try:
        return int((version or "0").split(".")[0])
    except ValueError:
        return MIN_IPYKERNEL  # "unknown": it imports, so use it


def _brings(name: str) -> bool:
    """Does the bundle give the kernel `name` (ipykernel, pip), as the image has none? The local
    side says so when it probed the image (GPUSESSION_RUNTIME_BRINGS); else the image is asked."""
    said = os.environ.get(ENV_RUNTIME_BRINGS)
    if said is not None:
        return name in said.split(",")
    if name == "ipykernel":
        return _major(_dist_version("ipykernel")) < MIN_IPYKERNEL
    return _dist_version(name) is None


def bundled_deps() -> str | None:
    """The bundle's ipykernel folder when the kernel needs it (the image has no ipykernel, or one
    too old for the agent's hooks), else None."""
    root = bundle_root()
    deps = os.path.join(root, "site", "deps") if root else None
    if not deps or not os.path.isdir(deps) or not _brings("ipykernel"):
        return None
    return deps


def kernel_command(connection_file: str, extensions: list[str]) -> list[str]:
    """argv of the session kernel."""
    options = ["-f", connection_file, f"--IPKernelApp.extensions={extensions!r}"]
    deps = bundled_deps()
    if deps:
        return [sys.executable, "-m", "gpusession.agent.kernelboot", deps, *options]
    return [sys.executable, "-m", "ipykernel_launcher", *options]


def _writable(path: str) -> bool:
    """Can this user create `path` (or write in it, when it exists)?"""
    while path and not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            return False
        path = parent
    return os.access(path, os.W_OK | os.X_OK)


def _made(path: str) -> bool:
    try:
        os.makedirs(path, exist_ok=True)
    except OSError:
        return False
    return True


def _scratch(name: str) -> str:
    import tempfile  # rarely needed: not on the way to the kernel's start

    return os.path.join(tempfile.gettempdir(), f"gpusession-{os.getuid()}", name)


def kernel_environment() -> dict[str, str]:
    """Variables for the kernel process, so that `%pip install` (IPython runs `sys.executable -m
    pip`) installs somewhere on the kernel's sys.path; creates that folder now, since Python puts
    a site folder on sys.path at start only when it exists."""
    root = bundle_root()
    if not root:
        return {}
    env = {
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "PIP_ROOT_USER_ACTION": "ignore",
        # Debian's and Ubuntu's python3 refuse installs (PEP 668); the container is this session's
        # alone and the image is never changed, so the session's environment is the user's to change
        "PIP_BREAK_SYSTEM_PACKAGES": "1",
    }
    path = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    bundled_pip = os.path.join(root, "site", "pip")
    if os.path.isdir(bundled_pip) and _brings("pip"):
        path.append(bundled_pip)  # only pip is there: nothing of the image's is shadowed
    purelib = sysconfig.get_paths()["purelib"]
    in_venv = sys.prefix != getattr(sys, "base_prefix", sys.prefix)
    if _writable(purelib) and _made(purelib):
        pass  # pip installs where it would anyway
    elif site.ENABLE_USER_SITE is not False and not in_venv:
        base = site.getuserbase()
        if not _writable(base):
            base = _scratch("userbase")
            env["PYTHONUSERBASE"] = base
        user_site = sysconfig.get_path("purelib", f"{os.name}_user", vars={"userbase": base})
        os.makedirs(user_site, exist_ok=True)
        env["PIP_USER"] = "1"
    else:  # a venv this user may not write to: a folder of the session's own, first on the path
        target = _scratch("site-packages")
        os.makedirs(target, exist_ok=True)
        env["PIP_TARGET"] = target
        path.insert(0, target)
    env["PYTHONPATH"] = os.pathsep.join(path)
    return env
