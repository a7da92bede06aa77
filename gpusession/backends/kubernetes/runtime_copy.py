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
import time
from pathlib import Path

from ...core.errors import StageError
from ...core.progress import Progress
from ...core.protocol import ENV_KERNEL_KEY, ENV_RUNTIME_BRINGS, ENV_RUNTIME_PYTHON, READY_FILE
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
from .pods import LAUNCH_ENV, STATE_DIR

PROBE_VERSION = 2  # as the docker backend's: bump when boot.sh's probe says more
PROBE_TIMEOUT_S = 60.0
# EarlyCopy's tries, from its first (once the session's container is next, pods.initialized): a
# pull is not waited here; a loaded node may take seconds to make the container (the project's
# CI, two cores with the suite beside, once copied late), and the tries past the start's first
# seconds are few (its wait's pauses grow)
EARLY_FOR_S = 10.0
# the copy's exec then waits for the runtime's READY file this long (podexec.WAIT_READY); a
# kernel slower than that is waited for in the pod's log
READY_WAIT = (f"{STATE_DIR}/{READY_FILE}", 20.0)


def bring_runtime(
    cluster: Cluster, pod: str, image: str, image_id: str, progress: Progress, kernel_key: str
) -> str | None:
    """Copy the runtime into the waiting pod, with the kernel's key (made here: the start then
    knows the kernel's connection from READY's ports, without reading kernel.json back); READY's
    payload (JSON), as the copy waited for it (READY_WAIT), or None."""
    python = image_python(cluster, pod, image, image_id, progress)
    remember_user(image, python.uid)
    remember_image_id(image, image_id)
    _say_python(image, python, progress)
    archives, what = runtime_archives(python, kernel_key, progress)
    progress.step(f"runtime: copying {what} into the pod")
    return podexec.send_archives(cluster, pod, python.start_with, archives, what, ready=READY_WAIT)


def _say_python(image: str, python: ImagePython, progress: Progress) -> None:
    progress.step(
        f"{image}: Python {python.short_version} at {python.executable}, "
        + (
            f"ipykernel {python.ipykernel}"
            if python.has_ipykernel
            else "no ipykernel: the runtime brings it"
        )
    )


def runtime_archives(
    python: ImagePython, kernel_key: str, progress: Progress
) -> tuple[list[tuple[bytes, str]], str]:
    """The archives (data, folder) the pod's emptyDir gets for `python`, `.complete` last, and
    what they are in words."""
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
    return archives, " and ".join(parts)


class EarlyCopy:
    """The runtime copied the moment the pod's container runs, before the pod's status says so:
    the kubelet reports a started container at its next relist, up to a second later (measured
    on the test cluster: exec answers 0.3 s after the pod is made, the status says Running at
    1.0 s), and the floor's kernel (`kubectl run`) starts in that time too. Only for an image
    whose Python is known from the last pod of the same name (a tag may have moved since: the
    copy's Python checks first that it is the one probed, podexec.GUARD, and copies nothing
    where it is not; the start then waits for the status and probes, as for a new image).
    Tried while the pod is scheduled, its init containers ended, and not yet said to run, for
    EARLY_FOR_S at most (an image being pulled is not waited for here)."""

    def __init__(self, image: str, image_id: str, python: ImagePython, kernel_key: str):
        self.image, self.image_id, self.python = image, image_id, python
        self.kernel_key = kernel_key
        self.archives: list[tuple[bytes, str]] | None = None
        self.what = ""
        self.first: float | None = None
        self.given_up = False
        self.done = False  # the runtime is in the pod
        self.ran_at: float | None = None  # when the copy found the container running (time.time)
        self.ready: str | None = None  # READY's payload (JSON), as the copy waited for it

    @classmethod
    def known(cls, image: str, kernel_key: str) -> "EarlyCopy | None":
        """One for `image` when its last pod's Python is known here, else None."""
        image_id = _known_ids().get(image)
        if not isinstance(image_id, str) or not image_id:
            return None
        try:
            python = ImagePython.from_payload(json.loads(probe_path(image_id).read_text()))
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return cls(image, image_id, python, kernel_key)

    def zygote(self) -> str | None:
        """The image's Python, where the pod begins its kernel before the runtime is in
        (gpusession.agent.kernelzygote): an image with its own ipykernel and pip, which the
        kernel's start takes as they are (the bundle brings nothing to its sys.path)."""
        return None if self.python.brings else self.python.start_with

    def attempt(self, cluster: Cluster, pod: str, progress: Progress) -> bool:
        """True once the runtime is in the pod; False while its container does not run yet (or
        when this gave up: the start copies it after the status, as without this)."""
        now = time.monotonic()
        self.first = now if self.first is None else self.first
        if self.given_up or now - self.first > EARLY_FOR_S:
            return False
        if self.archives is None:
            try:
                self.archives, self.what = runtime_archives(self.python, self.kernel_key, progress)
            except StageError:  # the site cannot be made now: the status path says why
                self.given_up = True
                return False
        python = self.python
        want = {"version": list(python.version), "uid": python.uid}
        want.update(ipykernel=python.ipykernel is not None, pip=python.pip is not None)
        ran_at = time.time()
        try:
            self.ready = podexec.send_archives(
                cluster, pod, python.start_with, self.archives, self.what, want, READY_WAIT
            )
        except Exception as exc:  # noqa: BLE001 - the status path says what is wrong
            # tried again only where the exec was refused (its container not running yet); one
            # that ran and refused or failed, or an API that did not answer, is not tried again
            self.given_up = not (isinstance(exc, StageError) and exc.stage == "provision")
            return False
        self.done, self.ran_at = True, ran_at
        _say_python(self.image, python, progress)
        kernel = ", and its kernel listens" if self.ready else ""
        progress.step(f"runtime: copied {self.what} as the container started{kernel}")
        return True


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


def _ids_path() -> Path:
    return cache_dir() / "probes" / f"k8s-image-ids-v{PROBE_VERSION}.json"


def _known_ids() -> dict:
    return _read_map(_ids_path())


def remember_image_id(image: str, image_id: str) -> None:
    """The id the last pod of `image` (as named) ran, whose probe EarlyCopy.known reads."""
    if image_id:
        _remember(_ids_path(), image, image_id)


def _read_map(path: Path) -> dict:
    try:
        known = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return known if isinstance(known, dict) else {}


def _remember(path: Path, key: str, value) -> None:
    """One entry of a small JSON map kept whole; read and written under the map's own flock, so
    two processes remembering different images both keep theirs (without it one's read-then-
    write put back the map as it was before the other's: a start then took a known image for a
    new one, CI). Two starts of one image at once: the last write wins."""
    import fcntl

    if _read_map(path).get(key) == value:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        known = _read_map(path)
        known[key] = value
        write_whole(path, json.dumps(known))


def _users_path() -> Path:
    return cache_dir() / "probes" / f"k8s-image-users-v{PROBE_VERSION}.json"


def _known_users() -> dict:
    return _read_map(_users_path())


def image_user(image: str) -> int | None:
    """The user the last pod of `image` (as named: a tag may move) ran as; None when unknown.
    Before its pod runs, an image is known by name only: its id (what the probe is kept by)
    comes with the running pod."""
    uid = _known_users().get(image)
    return uid if isinstance(uid, int) else None


def remember_user(image: str, uid: int) -> None:
    """What image_user answers next (two starts at once: the last write wins, each whole)."""
    _remember(_users_path(), image, uid)


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
