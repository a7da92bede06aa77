"""The runtime bundle (`gpusession.transport.bundle`) brought into a running pod, for any image
with a python3: the pod's container waits (pods.wait_then_boot) while its image's Python is
probed (`sh boot.sh probe`, over exec; kept by image id, as the docker backend keeps it), the
site (ipykernel, pip) copied when the image lacks them, then the agent's code, and last what the
probe found and the `.complete` mark, which lets the container go on to `boot.sh run`.

Everything lands in the pod's emptyDir at RUNTIME_ROOT, gone with the pod: nothing is installed
in the image or left on the node."""

from __future__ import annotations

import io
import json
import shlex
import tarfile
from pathlib import Path

from ...core.errors import StageError
from ...core.progress import Progress
from ...core.protocol import ENV_KERNEL_KEY, ENV_RUNTIME_BRINGS, ENV_RUNTIME_PYTHON
from ...core.wholefiles import write_whole
from ...transport.bundle import (
    CODE_DIR,
    COMPLETE,
    NO_PYTHON,
    RUNTIME_ROOT,
    SITE_DIR,
    BundleError,
    ImagePython,
    boot_script,
    cache_dir,
    code_archive_for,
    parse_probe,
    site_archive,
)
from ...transport.pulls import format_bytes
from . import podexec
from .apiserver import Cluster
from .pods import LAUNCH_ENV

PROBE_VERSION = 2  # as the docker backend's: bump when boot.sh's probe says more
PROBE_TIMEOUT_S = 60.0


def bring_runtime(
    cluster: Cluster, pod: str, image: str, image_id: str, progress: Progress, kernel_key: str
) -> ImagePython:
    """Copy the runtime into the waiting pod, with the kernel's key (made here: the start then
    knows the kernel's connection from READY's ports, without reading kernel.json back); the
    image's Python it found."""
    python = image_python(cluster, pod, image, image_id, progress)
    remember_user(image, python.uid)
    progress.step(
        f"{image}: Python {python.short_version} at {python.executable}, "
        + (
            f"ipykernel {python.ipykernel}"
            if python.has_ipykernel
            else "no ipykernel: the runtime brings it"
        )
    )
    archives, parts = [], []
    if python.needs_site:
        try:
            site = site_archive(python, cache_dir(), progress.step)
        except BundleError as exc:
            raise StageError("runtime", str(exc)) from None
        archives.append((site.data, SITE_DIR))
        parts.append(f"ipykernel and pip ({format_bytes(len(site.data))})")
    code = code_archive_for(python)
    archives.append((code.data, CODE_DIR))
    parts.append(f"gpusession's agent ({format_bytes(len(code.data))})")
    archives.append((launch_archive(python, kernel_key), RUNTIME_ROOT))  # .complete last
    what = " and ".join(parts)
    progress.step(f"runtime: copying {what} into the pod")
    podexec.send_archives(cluster, pod, python.start_with, archives, what)
    return python


def launch_archive(python: ImagePython, kernel_key: str | None = None) -> bytes:
    """A tar for RUNTIME_ROOT: LAUNCH_ENV (the image's Python and what the bundle brings it,
    for boot.sh and the agent: one Python start less; the kernel's key, readable by the
    container's user alone, as kernel.json is), then code/.complete, last."""
    env = (
        f"export {ENV_RUNTIME_PYTHON}={shlex.quote(python.start_with)}\n"
        f"export {ENV_RUNTIME_BRINGS}={shlex.quote(','.join(python.brings))}\n"
    )
    if kernel_key:
        env += f"export {ENV_KERNEL_KEY}={shlex.quote(kernel_key)}\n"
    complete = f"{CODE_DIR}/{COMPLETE}"[len(RUNTIME_ROOT) + 1 :]
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, content in ((LAUNCH_ENV, env.encode()), (complete, b"gpusession runtime\n")):
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(content), 0o600 if name == LAUNCH_ENV else 0o644
            tar.addfile(info, io.BytesIO(content))
    return buffer.getvalue()


def probe_path(image_id: str) -> Path:
    """Where what the probe found of an image's Python is kept, by the image's digest."""
    digest = image_id.rpartition("sha256:")[2] or image_id.replace("/", "_")
    return cache_dir() / "probes" / f"k8s-{digest[:64]}-v{PROBE_VERSION}.json"


def _users_path() -> Path:
    return cache_dir() / "probes" / f"k8s-image-users-v{PROBE_VERSION}.json"


def _known_users() -> dict:
    try:
        known = json.loads(_users_path().read_text())
    except (OSError, ValueError):
        return {}
    return known if isinstance(known, dict) else {}


def image_user(image: str) -> int | None:
    """The user the last pod of `image` (as named: a tag may move) ran as; None when unknown.
    Before its pod runs, an image is known by name only: its id (what the probe is kept by)
    comes with the running pod."""
    uid = _known_users().get(image)
    return uid if isinstance(uid, int) else None


def remember_user(image: str, uid: int) -> None:
    """What image_user answers next (two starts at once: the last write wins, each whole)."""
    known = _known_users()
    if known.get(image) == uid:
        return
    path = _users_path()
    known[image] = uid
    path.parent.mkdir(parents=True, exist_ok=True)
    write_whole(path, json.dumps(known))


def image_python(
    cluster: Cluster, pod: str, image: str, image_id: str, progress: Progress
) -> ImagePython:
    """The image's Python: known from an earlier probe of the same image id, else probed in the
    pod (`sh -c BOOT_SCRIPT boot.sh probe`)."""
    cached = probe_path(image_id) if image_id else None
    if cached is not None:
        try:
            return ImagePython.from_payload(json.loads(cached.read_text()))
        except (OSError, ValueError, KeyError, TypeError):
            pass
    progress.step(f"looking for Python in {image} (once per image)")
    status, output = podexec.run(
        cluster,
        pod,
        ["/bin/sh", "-c", boot_script().decode(), "boot.sh", "probe"],
        timeout=PROBE_TIMEOUT_S,
        what=f"looking for Python in {image}",
    )
    found = parse_probe(output)
    if isinstance(found, str):
        if status is None:
            found = f"the probe took over {PROBE_TIMEOUT_S:.0f}s"
        raise StageError("image", NO_PYTHON.format(image=image, why=found))
    if cached is not None:
        cached.parent.mkdir(parents=True, exist_ok=True)
        write_whole(cached, json.dumps(found.to_payload()))
    return found
