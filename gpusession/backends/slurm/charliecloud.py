"""--image in Charliecloud on a Slurm cluster (--container charliecloud, or auto where the cluster
has no apptainer, singularity or pyxis): prepared from the login node before the job is submitted.

image    a path on the shared filesystem: an unpacked image directory (`ch-convert`, `ch-image`),
         or a SquashFS file (ch-run mounts it); else a registry reference, pulled with
         `ch-image pull` into the user's own storage ~/.gpusession/charliecloud (shared by the
         nodes), with the user's `docker login` for that registry sent over SSH (never written)
python   the image's own, found by the runtime bundle's boot.sh (`probe`); an image without a
         python3 fails the start in one line and nothing is submitted
bundle   gpusession's runtime (and ipykernel when the image lacks it) unpacked once per version
         under ~/.gpusession/bundle/, bound into the container at /mnt/0 (Charliecloud's images
         keep /mnt/0-9 as bind points); the session's folder at /mnt/1
"""

from __future__ import annotations

import dataclasses
import re
import shlex
import time
from typing import Callable

from ...core.errors import BackendUnavailable, StageError
from ...core.progress import Progress
from ...transport.bundle import (
    NO_PYTHON,
    BundleError,
    ImagePython,
    boot_script,
    cache_dir,
    code_archive,
    complete_marker,
    parse_probe,
    site_archive,
)
from ...transport.pulls import docker_login, format_bytes, registry_of
from .login import LoginShell

STORAGE = "charliecloud"  # under ~/.gpusession: the user's ch-image storage (and .pulls beside:
# a stamp per pull running, left by one that did not end well; ch-image wants no file of ours in it)
RUNTIME_MOUNT = "/mnt/0"  # the runtime bundle, in the container
SESSION_MOUNT = "/mnt/1"  # the session's folder (state, kernel sockets), in the container
q = shlex.quote
_LAYER = re.compile(r"layer (\d+)/\d+: \w+: downloading: [\d.]+/([\d.]+ [KMGT]?i?B)")
_PROGRESS = re.compile(r"layer (\d+/\d+): \w+: downloading: ([\d.]+/[\d.]+ [KMGT]?i?B)")
_CACHED = re.compile(r"layer (\d+)/\d+: \w+: using existing file")
_PGID = re.compile(r"@@pgid=(\d+)@@")
PULLED = "ch/gpusession-pulled"  # in the unpacked image: written when its pull ended well
_UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}


@dataclasses.dataclass(frozen=True)
class Prepared:
    """What the job's ch-run needs: all on the cluster's shared filesystem."""

    image: str  # the unpacked image directory (or SquashFS file)
    bundle: str  # the runtime bundle's folder (code/, site/)
    python: str  # the image's Python, as boot.sh found it
    brings: str  # what the bundle gives the kernel: "ipykernel,pip", a part, or ""


def is_path(image: str) -> bool:
    return image.startswith(("/", "~/"))


def storage_name(ref: str) -> str:
    """ch-image's folder name for a reference: 10.210.0.1:5443/ci/py:1 -> 10.210.0.1+5443%ci%py+1."""
    last = ref.rsplit("/", 1)[-1]
    if ":" not in last and "@" not in last:
        ref += ":latest"
    return ref.replace("/", "%").replace(":", "+")


def prepare(shell: LoginShell, image: str, base: str, progress: Progress) -> Prepared:
    folder = _image(shell, image, base, progress)
    python = _probe(shell, image, folder, progress)
    return Prepared(
        folder, _bundle(shell, base, python, progress), python.start_with, ",".join(python.brings)
    )


def _image(shell: LoginShell, image: str, base: str, progress: Progress) -> str:
    if is_path(image):
        return _image_on_path(shell, image)
    storage = f"{base}/{STORAGE}"
    folder = f"{storage}/img/{storage_name(image)}"
    if shell.run(f"test -f {q(folder)}/{PULLED}").ok:  # as docker run: pulled once
        progress.step(
            f"{image} is in your ch-image storage on the cluster ({storage}); "
            f"`ch-image pull` it there for a newer one"
        )
        return folder
    _pull(shell, image, storage, folder, progress)
    return folder


def _image_on_path(shell: LoginShell, image: str) -> str:
    """An image the user named by its path on the cluster (`~/` is the login user's home): its
    full path, once it is there."""
    found = shell.run(
        f"p={q(image[2:]) if image.startswith('~/') else q(image)}; "
        + ('p="$HOME/$p"; ' if image.startswith("~/") else "")
        + 'test -e "$p" && printf "@@%s@@" "$p"'
    )
    if not found.ok or "@@" not in found.out:
        raise StageError(
            "image",
            f"--image {image}: no such image directory or SquashFS file on the cluster "
            "(give an unpacked Charliecloud image or a .sqfs on its shared filesystem, or a registry reference)",
        )
    return found.out.split("@@")[1]


def _pull(shell: LoginShell, image: str, storage: str, folder: str, progress: Progress) -> None:
    """`ch-image pull` of a registry reference into the user's storage on the cluster, with the
    user's docker login for that registry; StageError in one line when it fails."""
    registry = registry_of(image)
    login = docker_login(registry)
    progress.step(
        f"pulling {image} on the cluster with ch-image into {storage}"
        + (f" (as {login[0]}, your docker login for {registry})" if login else "")
    )
    stdin = f"{login[0]}\n{login[1]}\n".encode() if login else None
    watch = PullWatch(image, progress.step)
    try:
        result = shell.run(
            _pull_command(image, storage, folder, login),
            stdin=stdin,
            timeout=3600,
            on_out=watch,
        )
    except KeyboardInterrupt:
        _end_cut_pull(shell, storage, folder, watch.pgid)
        raise
    text = _PGID.sub("", result.out)
    if not result.ok:
        why = _pull_refused(text, registry, login, result.rc)
        raise StageError("image", f"cannot pull {image} on the cluster: {why}")
    progress.step(f"pulled {image}: {pull_summary(text)}")


def _pull_command(image: str, storage: str, folder: str, login) -> str:
    """The pull's shell command. The login's password goes on stdin, into ch-image's environment
    only. The pull says its process group first (a Ctrl-C here ends it on the login node), marks
    its start with a stamp (what it downloaded is dropped unless it ends well: a layer cut
    mid-download would be reused whole by ch-image's download cache) and the image whole with
    PULLED when it ends well."""
    return (
        (
            "IFS= read -r CH_IMAGE_USERNAME; IFS= read -r CH_IMAGE_PASSWORD; "
            "export CH_IMAGE_USERNAME CH_IMAGE_PASSWORD; "
            if login
            else ""
        )
        + f"printf '@@pgid=%s@@\\n' \"$$\"; mkdir -p {q(storage)}.pulls; {_forget_cut_pulls(storage)}; "
        + f'stamp={q(storage)}.pulls/$$; touch "$stamp"; '
        + f"CH_IMAGE_STORAGE={q(storage)} ch-image --no-cache{' --auth' if login else ''} pull {q(image)} 2>&1"
        + f' && touch {q(folder)}/{PULLED} && rm -f "$stamp"'
    )


def _pull_refused(text: str, registry: str, login, rc: int) -> str:
    """Why a pull failed, in the words a user acts on (a login refused, no such image)."""
    if "no further authentication possible" in text:
        return f"{registry} refused the login of {login[0] if login else '?'} from your Docker config: run `docker login {registry}` again"
    if "unauthorized or not in registry" in text:
        return (
            f"{registry} has no such image or wants a login: check the name, and run `docker login {registry}` here"
            if not login
            else f"{registry} has no such image (check the name)"
        )
    return (text.strip().splitlines() or [f"ch-image exited {rc}"])[-1]


def _forget_cut_pulls(storage: str) -> str:
    """Shell: what pulls that did not end well (their stamp left, their process gone: a client
    killed, a connection lost) downloaded is dropped from ch-image's download cache."""
    return (
        f"for s in {q(storage)}.pulls/*; do "
        '[ -e "$s" ] || continue; kill -0 -- -"${s##*/}" 2>/dev/null && continue; '
        f'find {q(storage)}/dlcache -type f -newer "$s" -delete 2>/dev/null; rm -f "$s"; done'
    )


def _end_cut_pull(shell: LoginShell, storage: str, folder: str, pgid: int | None) -> None:
    """After a Ctrl-C during the pull: its processes on the login node ended (TERM, then KILL after
    5 s), what it unpacked and downloaded removed. Best effort: the pull is not reused anyway
    (no PULLED mark; a stamp left is dropped by the next pull)."""
    if pgid is None:
        return
    g = f"-{pgid}"
    try:
        shell.run(
            f"kill -TERM -- {g} 2>/dev/null; i=0; while kill -0 -- {g} 2>/dev/null && [ $i -lt 50 ]; "
            f"do sleep 0.1; i=$((i+1)); done; kill -KILL -- {g} 2>/dev/null; "
            f"chmod -R u+rwX {q(folder)} 2>/dev/null; rm -rf {q(folder)}; "
            + _forget_cut_pulls(storage),
            timeout=30,
        )
    except BackendUnavailable:
        pass


class PullWatch:
    """ch-image's output as it comes: its latest layer's download said every few seconds
    ('pulling REF: layer 2/5, 310.4/812.0 MiB')."""

    def __init__(self, image: str, say: Callable[[str], None], every_s: float = 5.0):
        self.image, self.say, self.every_s = image, say, every_s
        self.said_at = time.monotonic()
        self.pending = b""
        self.pgid: int | None = None  # the pull's process group on the login node

    def __call__(self, data: bytes) -> None:
        self.pending += data
        *lines, self.pending = self.pending.split(b"\n")
        found = None
        for line in lines:
            text = line.decode(errors="replace")
            if self.pgid is None and (group := _PGID.match(text)):
                self.pgid = int(group.group(1))
            found = _PROGRESS.search(text) or found
        now = time.monotonic()
        if found is not None and now - self.said_at >= self.every_s:
            self.said_at = now
            self.say(f"pulling {self.image}: layer {found.group(1)}, {found.group(2)}")


def pull_summary(text: str) -> str:
    """What ch-image's output says of the layers: '1 layer(s) downloaded (64 MB)', or found in
    its download cache."""
    layers: dict[str, str] = {}
    for found in _LAYER.finditer(text):
        layers[found.group(1)] = found.group(2)
    cached = len(set(_CACHED.findall(text)) - set(layers))
    said = []
    if layers:
        sizes = [float(v.split()[0]) * _UNITS.get(v.split()[1], 1) for v in layers.values()]
        said.append(f"{len(layers)} layer(s) downloaded ({format_bytes(sum(sizes))})")
    if cached:
        said.append(f"{cached} layer(s) from ch-image's download cache")
    return ", ".join(said) or "nothing downloaded"


def _probe(shell: LoginShell, image: str, folder: str, progress: Progress) -> ImagePython:
    progress.step(f"looking for Python in {image}")
    result = shell.run(
        f'USER="${{USER:-$(id -un)}}" ch-run {q(folder)} -- sh -c {q(boot_script().decode())} boot.sh probe 2>&1',
        timeout=120,
    )
    found = parse_probe(result.out)
    if isinstance(found, str):
        raise StageError("image", NO_PYTHON.format(image=image, why=found))
    return found


def _bundle(shell: LoginShell, base: str, python: ImagePython, progress: Progress) -> str:
    """The runtime bundle for this image's Python, unpacked once under ~/.gpusession/bundle."""
    parts = [("code", code_archive())]
    try:
        if python.needs_site:
            parts.append(("site", site_archive(python, cache_dir(), progress.step)))
    except BundleError as exc:
        raise StageError("runtime", str(exc)) from None
    folder = f"{base}/bundle/" + "-".join(archive.digest[:12] for _, archive in parts)
    if shell.run(f"test -f {q(folder)}/code/.complete").ok:
        return folder
    for name, archive in parts:
        progress.step(
            f"sending the runtime's {name} to the cluster ({format_bytes(len(archive.data))})"
        )
        target = f"{folder}/{name}"
        result = shell.run(
            f"set -e; umask 022; rm -rf {q(target)}.tmp; mkdir -p {q(target)}.tmp; "
            f"tar -xzf - -C {q(target)}.tmp; rm -rf {q(target)}; mv -T {q(target)}.tmp {q(target)}",
            stdin=archive.data,
            timeout=600,
        )
        if not result.ok:
            raise StageError(
                "runtime", f"cannot put the runtime's {name} in {folder}: {result.text()}"
            )
    # written last: boot.sh refuses a bundle without it
    done = shell.run(f"tar -xf - -C {q(folder)}/code", stdin=complete_marker())
    if not done.ok:
        raise StageError("runtime", f"cannot complete the runtime in {folder}: {done.text()}")
    return folder
