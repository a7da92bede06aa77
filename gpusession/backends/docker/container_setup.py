"""What a session container needs on its Docker engine before it starts, for any image with a
python3: the image (pulled, with bytes and layers shown, when the engine lacks it), what Python it
has (`sh boot.sh probe` in a throwaway container, once per image: the answer is kept by image id),
and the runtime bundle (`gpusession.transport.bundle`) in named volumes on the engine's host, filled once
through a helper container and `put_archive` (so an `ssh://` engine works alike) and mounted
read-only by every session after. The image itself is never changed.

Helper containers carry the session label with a `helper-` value and the store's label, so a
crash in the middle leaves nothing that `gpusession gc` does not remove.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ...core.errors import StageError
from ...core.listening import kernel_listens
from ...core.progress import Progress
from ...core.protocol import ENV_KERNEL_KEY
from ...transport.bundle import (
    BOOT_SCRIPT,
    CODE_DIR,
    NO_PYTHON,
    SITE_DIR,
    Archive,
    BundleError,
    ImagePython,
    boot_script,
    code_archive_for,
    complete_marker,
    parse_probe,
    site_archive,
)
from ...transport.pulls import PullProgress, format_bytes, refused_pull, user_login
from .engine import (
    HELPER_LABEL,
    LABEL,
    STATE_DIR,
    docker_sdk,
    engine_errors,
    read_json_from,
    short_error,
)
from .runtime_volumes import VOLUME_LABEL  # on the bundle's volumes: "code", the site tag or "ok"
from .ssh import host_exec

log = logging.getLogger(__name__)

PROBE_VERSION = 2  # bump when boot.sh's probe says more
PROBE_TIMEOUT_S = 60.0
COMPILE_TIMEOUT_S = 300.0


@dataclasses.dataclass
class PreparedRuntime:
    python: ImagePython  # what the kernel runs with
    volumes: dict[str, dict[str, str]]  # for containers.create(volumes=...): the bundle, read-only


def local_image(client, image: str):
    """The engine's image `image`, None where it has none (find_or_pull_image pulls it)."""
    docker = docker_sdk()
    with engine_errors("while looking for the image"):
        try:
            return client.images.get(image)
        except docker.errors.ImageNotFound:
            return None


def find_or_pull_image(client, image: str, progress: Progress):
    """The engine's image `image`; pulled when it has none, with a line about bytes and layers
    done every few seconds and one saying what stays cached."""
    found = local_image(client, image)
    if found is not None:
        return found
    docker = docker_sdk()
    repo, tag = docker.utils.parse_repository_tag(image)
    pull = PullProgress(image)
    progress.step(f"pulling {image}: it is not on the engine yet")
    with engine_errors(f"while pulling {image}"):  # the engine unreachable: BackendUnavailable
        try:
            # the user's login read now (a `docker login` after a refused start counts), sent
            # with the pull request: the engine's host never stores it
            login = user_login(image)
            auth = {"username": login.username, "password": login.password} if login else None
            for event in client.api.pull(
                repo, tag=tag or "latest", stream=True, decode=True, auth_config=auth
            ):
                pull.feed(event)
                if pull.error:
                    break
                if pull.due():
                    progress.step(pull.line())
        except docker.errors.APIError as exc:  # the engine answered: the registry did not
            pull.error = short_error(exc)
        try:
            found = None if pull.error else client.images.get(image)
        except docker.errors.ImageNotFound as exc:
            pull.error = short_error(exc)
    refused = pull.error and refused_pull(image, pull.error, where="the engine's host")
    if refused:
        raise StageError("image", refused)
    if pull.error or found is None:
        raise StageError(
            "image",
            f"image {image} is not on the Docker engine and cannot be pulled ({pull.error}); "
            f"pull or build it there (`docker pull {image}`), or pass another --image",
        )
    progress.step(pull.finished_line())
    return found


class KnownVolumes:
    """The runtime's volumes on one engine that this process has seen whole: a later session on
    that engine mounts them without asking the engine again (one API call less per start). Its
    volumes are named by their contents' digest and gc removes only other builds' copies; when a
    start fails anyway, the backend drops what it knew of that engine."""

    def __init__(self, client):
        self.client = client
        self.names: set[str] = set()
        self.listed = False
        self.lock = threading.Lock()  # the code's and the site's copies ask at once

    def has(self, name: str) -> bool:
        with self.lock:
            if name not in self.names and not self.listed:  # asked once per start at most
                with engine_errors("while looking for the runtime's volumes"):
                    self.names |= {
                        v.name
                        for v in self.client.volumes.list(filters={"name": "gpusession-runtime-"})
                    }
                self.listed = True
            return name in self.names

    def add(self, *names: str) -> None:
        with self.lock:
            self.names |= set(names)


def prepare_runtime(
    client,
    image,
    *,
    cache_dir: Path,
    labels: dict[str, str],
    progress: Progress,
    known: KnownVolumes | None = None,
) -> PreparedRuntime:
    """The image's Python (probed, or known from an earlier probe of the same image id) and the
    volumes with what it lacks; StageError("image", ...) in one line when it has no Python.
    `known`: the engine's volumes this process has seen (else the engine is asked)."""
    name = image.tags[0] if image.tags else image.short_id
    python = _image_python(client, image, name, cache_dir, labels, progress)
    progress.step(
        f"{name}: Python {'.'.join(map(str, python.version))} at {python.executable}, "
        + (
            f"ipykernel {python.ipykernel}"
            if python.has_ipykernel
            else "no ipykernel: the runtime brings it"
        )
    )
    present = known if known is not None else KnownVolumes(client)
    present.client, present.listed = (
        client,
        False,
    )  # one listing per start at most, when something is new

    def site_copy() -> str:
        try:
            site = site_archive(python, cache_dir, progress.step)
        except BundleError as exc:
            raise StageError("runtime", str(exc)) from None
        return _ensure_copy(
            client, image.id, site, SITE_DIR, labels, progress, present, compile_with=python
        )

    # compiled by the image's Python (ahead, here, where this machine has its version), as every
    # copy: the volumes are read-only to the sessions. The site (ipykernel, 8,000 files) is
    # copied while the agent's code is
    with ThreadPoolExecutor(1, thread_name_prefix="gpusession-site") as pool:
        site = pool.submit(site_copy) if python.needs_site else None  # waited for on any exit
        code = _ensure_copy(
            client,
            image.id,
            code_archive_for(python),
            CODE_DIR,
            labels,
            progress,
            present,
            compile_with=python,
        )
        site_volume = site.result() if site is not None else None
    volumes = {code: {"bind": CODE_DIR, "mode": "ro"}}
    if site_volume is not None:
        volumes[site_volume] = {"bind": SITE_DIR, "mode": "ro"}
    return PreparedRuntime(python, volumes)


def probe_path(cache_dir: Path, image_id: str) -> Path:
    """Where what the probe found of an image's Python is kept: once it is there, a start from
    that image skips the probe (the forms say "runtime cached")."""
    return cache_dir / "probes" / f"{image_id.split(':')[-1]}-v{PROBE_VERSION}.json"


def _image_python(
    client, image, name: str, cache_dir: Path, labels: dict[str, str], progress: Progress
) -> ImagePython:
    cached = probe_path(cache_dir, image.id)
    try:
        return ImagePython.from_payload(json.loads(cached.read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        pass
    progress.step(f"looking for Python in {name} (once per image)")
    text = _run_helper(
        client,
        image.id,
        labels,
        ["-c", boot_script().decode(), "boot.sh", "probe"],
        timeout=PROBE_TIMEOUT_S,
        what=f"looking for Python in {name}",
        network_mode="none",
    )
    found = parse_probe(text)
    if isinstance(found, str):
        raise StageError("image", NO_PYTHON.format(image=name, why=found))
    cached.parent.mkdir(parents=True, exist_ok=True)
    part = cached.with_suffix(f".{uuid.uuid4().hex[:8]}.part")
    part.write_text(json.dumps(found.to_payload()))
    part.replace(cached)
    return found


def _ensure_copy(
    client,
    image_id: str,
    archive: Archive,
    folder: str,
    labels: dict[str, str],
    progress: Progress,
    present: KnownVolumes,
    compile_with: ImagePython | None = None,
) -> str:
    """The volume holding `archive` unpacked (and compiled by the image's Python, when given):
    found, or made now. Its `-ok` twin, an empty volume made once the copy is whole, is what says
    it is whole: a copy cut short (a crash, a lost connection) is filled again, never used."""
    name = archive.copy_name
    if (
        archive.kind == "code" and compile_with is not None
    ):  # one copy per Python version: its bytecode
        name = f"{name}-{compile_with.tag}"
    what = (
        "gpusession's agent" if archive.kind == "code" else f"ipykernel and pip for {archive.kind}"
    )
    if compile_with is not None and archive.bytecode == compile_with.tag:
        compile_with = None  # compiled ahead, for this Python's version: unpacking is all
    if present.has(name) and present.has(name + "-ok"):
        progress.step(f"runtime: {what} cached on the engine (volume {name})")
        return name
    progress.step(
        f"runtime: copying {what} ({format_bytes(archive.size)}, {archive.files} files) into volume "
        f"{name}, once: it stays on the engine for the next sessions"
    )
    _fill_volume(client, image_id, archive, folder, name, labels, progress, compile_with)
    present.add(name, name + "-ok")
    return name


def _fill_volume(
    client,
    image_id: str,
    archive: Archive,
    folder: str,
    name: str,
    labels: dict[str, str],
    progress: Progress,
    compile_with: ImagePython | None,
) -> None:
    """Volume `name` made and filled with `archive` through a helper container that mounts it
    at `folder` (compiled there when `compile_with`), then its `-ok` twin; a volume a failure
    left half-filled is removed."""
    # the helper is never started to copy; to compile, it runs the image's python on the copy
    entrypoint, command = (
        (["/bin/sh"], [])
        if compile_with is None
        else ([compile_with.executable], ["-m", "compileall", "-q", "-j", "0", folder])
    )
    with engine_errors("while filling the runtime's volume"):
        volume = client.volumes.create(name, labels={VOLUME_LABEL: archive.kind})
        try:
            helper = client.containers.create(
                image_id,
                entrypoint=entrypoint,
                command=command,
                labels=_helper_labels(labels),
                user="0:0",
                network_mode="none",
                volumes={name: {"bind": folder, "mode": "rw"}},
                detach=True,
            )
            try:
                helper.put_archive(folder, archive.data)
                if compile_with is not None:
                    _compile(helper, compile_with, progress)
                helper.put_archive(folder, complete_marker())
            finally:
                helper.remove(force=True)
        except BaseException:
            _remove_volume(volume)
            raise
        client.volumes.create(name + "-ok", labels={VOLUME_LABEL: "ok"})


def _compile(helper, python: ImagePython, progress: Progress) -> None:
    """Bytecode for the copied packages, by the image's own Python: the volume is read-only to
    sessions, and IPython compiled afresh at every kernel start would cost seconds. Best effort."""
    progress.step(f"runtime: compiling it with the image's Python {python.short_version}")
    docker = docker_sdk()
    try:
        helper.start()
        code = helper.wait(timeout=COMPILE_TIMEOUT_S).get("StatusCode")
        if code:
            log.info("compileall exited %s: %s", code, helper.logs(tail=5).decode(errors="replace"))
    except (docker.errors.DockerException, OSError) as exc:
        log.info("no bytecode for the runtime: %s", exc)


def _run_helper(
    client,
    image_id: str,
    labels: dict[str, str],
    command: list[str],
    *,
    timeout: float,
    what: str,
    **options: Any,
) -> str:
    """Run `/bin/sh COMMAND...` in a throwaway container of the image; its output."""
    docker = docker_sdk()
    with engine_errors(f"while {what}"):
        helper = client.containers.create(
            image_id,
            entrypoint=["/bin/sh"],
            command=command,
            labels=_helper_labels(labels),
            detach=True,
            **options,
        )
        try:
            try:
                helper.start()
            except docker.errors.APIError as exc:
                text = short_error(exc)
                if "/bin/sh" in text and (
                    "no such file" in text.lower() or "not found" in text.lower()
                ):
                    image = what.rpartition(" in ")[2]
                    raise StageError(
                        "image", NO_PYTHON.format(image=image, why="it has no /bin/sh")
                    ) from None
                raise StageError("image", f"{what} failed: {text}") from None
            try:
                helper.wait(timeout=timeout)
            except Exception as exc:  # noqa: BLE001 - requests' read timeout, or the engine went away
                raise StageError(
                    "image", f"{what} took over {timeout:.0f}s ({type(exc).__name__})"
                ) from None
            return helper.logs(stdout=True, stderr=True).decode(errors="replace")
        finally:
            helper.remove(force=True)


def _helper_labels(labels: dict[str, str]) -> dict[str, str]:
    """The caller's labels (session label, store label), the session label's value made a helper's
    (a lookup by the session's label must not find a helper), and the session it serves (gc must
    not take a starting session's helper for a leftover: `owning_session`)."""
    helper = {
        key: (f"helper-{uuid.uuid4().hex[:12]}" if key == LABEL else value)
        for key, value in labels.items()
    }
    if LABEL in labels:
        helper[HELPER_LABEL] = labels[LABEL]
    return helper


def _remove_volume(volume) -> None:
    try:
        volume.remove(force=True)
    except Exception as exc:  # noqa: BLE001 - the next start refills it anyway
        log.info("could not remove runtime volume %s: %s", getattr(volume, "name", volume), exc)


def bundle_command(agent_args: list[str]) -> tuple[list[str], list[str]]:
    """(entrypoint, command) of a session container: the bundle's boot.sh with the agent's options."""
    return ["/bin/sh"], [BOOT_SCRIPT, "run", *agent_args]


SOCKETS_PREFIX = "/tmp/gpusession-k."  # the kernel's socket folders on an engine's host
# on a remote engine's host, as the SSH login: a new folder of its own, setgid 2770, and its group
MAKE_SOCKET_DIR = (
    f'umask 077; d=$(mktemp -d {SOCKETS_PREFIX}XXXXXXXX) && chmod 2770 "$d" && echo "$d $(id -g)"'
)


def kernel_socket_dir(client, host: str | None) -> tuple[str, int]:
    """A new folder for the session kernel's unix sockets on the engine's host: (its path, the
    group id that may use it). It belongs to whoever connects to the kernel: this user on the
    local engine, the SSH login on a remote one (the tunnel reaches the sockets through that
    login's sshd). Mode 2770: the container gets its group (`group_add`), so the kernel reaches
    it whoever the image's USER is, and no other user of the host does. In /tmp, not a private
    runtime folder: the container's user must pass through its parent."""
    if not host:
        import tempfile

        path = tempfile.mkdtemp(
            prefix=os.path.basename(SOCKETS_PREFIX), dir=os.path.dirname(SOCKETS_PREFIX)
        )
        os.chmod(path, 0o2770)
        return path, os.getgid()
    import paramiko

    why = "no SSH login to it"
    try:
        done = host_exec(client, MAKE_SOCKET_DIR, timeout=30)
        if done is not None:
            status, out, err = done
            path, _, gid = out.decode(errors="replace").strip().rpartition(" ")
            if status == 0 and path.startswith(SOCKETS_PREFIX) and gid.isdigit():
                return path, int(gid)
            why = err.decode(errors="replace").strip()[-200:] or f"exit status {status}"
    except (OSError, EOFError, TimeoutError, paramiko.SSHException) as exc:
        why = f"{type(exc).__name__}: {exc}"
    raise StageError(
        "provision",
        f"cannot make a folder for the kernel's sockets in /tmp on {host} ({why}); "
        "check that /tmp there is writable, and start again",
    )


def remove_socket_dir(client, host: str | None, path: str) -> None:
    """Best effort: the session's socket folder, once its container is gone."""
    if not path.startswith(SOCKETS_PREFIX) or "/" in path[len(SOCKETS_PREFIX) :]:
        return
    if not host:
        import shutil

        shutil.rmtree(path, ignore_errors=True)
        return
    try:
        host_exec(client, f"rm -rf -- {path}", timeout=30)
    except Exception as exc:  # noqa: BLE001 - an empty folder in the host's /tmp is no loss
        log.info("could not remove %s on %s: %s", path, host, exc)


def ssh_alive(client) -> bool:
    """Is the SSH connection under an ssh:// DockerClient still up? (docker-py logs in again only
    when it has none; True when it is no such client.)"""
    ssh = getattr(getattr(client.api, "_custom_adapter", None), "ssh_client", None)
    transport = ssh.get_transport() if ssh is not None else None
    return ssh is None or (transport is not None and transport.is_active())


def gpu_request(docker, spec, devices: list[str] | None = None):
    """The GPUs chosen for the session (`devices`: UUIDs or indices, pinned); else all of the
    host's GPUs, or the type's count when it names more than one (a100:4); spec.extra: gpus
    ('all', 'shared' or N) overrides, gpu_driver picks the device driver."""
    driver = spec.extra.get("gpu_driver", "")
    if devices:
        return docker.types.DeviceRequest(
            driver=driver, device_ids=list(devices), capabilities=[["gpu"]]
        )
    gpus = spec.extra.get("gpus")
    if gpus is None or str(gpus) == "shared":
        count = spec.gpu_count if spec.gpu_count > 1 else -1
    else:
        count = -1 if str(gpus) == "all" else int(gpus)
    return docker.types.DeviceRequest(driver=driver, count=count, capabilities=[["gpu"]])


def connection_info(container, ready: Any) -> tuple[dict, int | None]:
    """(the kernel's connection info, the agent's port) from the READY marker's ports and the key
    in the container's environment (both through the Docker API only)."""
    if not (
        isinstance(ready, dict) and isinstance(ready.get("ports"), dict)
    ):  # a runtime that says less
        info = read_json_from(container, f"{STATE_DIR}/kernel.json")
        return info, read_json_from(container, f"{STATE_DIR}/runtime.json").get("agent_port")
    env = dict(item.partition("=")[::2] for item in container.attrs["Config"].get("Env") or [])
    # unix sockets (ipc): `ip` is their path prefix, the same on the host as in the container
    ipc = ready.get("transport") == "ipc"
    info = {
        **{name: int(port) for name, port in ready["ports"].items()},
        "ip": ready["ip"] if ipc else "127.0.0.1",
        "key": env[ENV_KERNEL_KEY],
        "transport": "ipc" if ipc else "tcp",
        "signature_scheme": "hmac-sha256",
        "kernel_name": "python3",
    }
    return info, ready.get("agent_port")


def sockets_listen(said: Any) -> bool:
    """The kernel's unix sockets (KERNEL's payload names them: `<ip>-<port>`, the same path here
    as in the container) all take a connection from this process: what its READY says, seen from
    here (wait_for_marker's `sooner`; the first step's own look, core.listening). Where this user
    may not use them yet (the runtime gives them their group's access before READY), no."""
    try:
        if said.get("transport") != "ipc":
            return False
        return kernel_listens({"transport": "ipc", "ip": said["ip"], **said["ports"]})
    except (AttributeError, KeyError, TypeError):
        return False


class InThread:
    """Run `fn` in a thread now; `result()` waits for it, returns what it returned and re-raises
    its error. `late`: what a wait past its timeout says (its {timeout})."""

    def __init__(self, fn, late: str = "the SSH tunnel did not open within {timeout:.0f}s"):
        self._error: BaseException | None = None
        self._value: Any = None
        self._late = late
        self._thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self._thread.start()

    def _run(self, fn) -> None:
        try:
            self._value = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to result()
            self._error = exc

    def result(self, timeout: float) -> Any:
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise StageError("connect", self._late.format(timeout=timeout))
        if self._error is not None:
            raise self._error
        return self._value
