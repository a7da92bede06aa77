"""The Docker engine side of the docker backend: the SDK (imported lazily), connecting to a local
or `ssh://` engine with clear errors, finding or building the image, and reading a container's
log and files through the API."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import tarfile
import time
from pathlib import Path
from typing import Any, Iterator

from ..errors import BackendUnavailable, StageError
from ..progress import Progress
from ..protocol import Marker, parse_marker
from .base import failure_detail

INSTALL_HINT = "the docker backend needs the Docker SDK for Python: pip install 'docker>=7.1'"


def docker_sdk():
    """The `docker` package, or BackendUnavailable saying how to install it."""
    try:
        import docker
    except ImportError:
        raise BackendUnavailable(INSTALL_HINT) from None
    return docker


def short_error(exc: BaseException) -> str:
    """The engine's own words, without the HTTP wrapping of docker.errors.APIError."""
    explanation = getattr(exc, "explanation", None)
    text = explanation.decode(errors="replace") if isinstance(explanation, bytes) else explanation
    return str(text or exc).strip()


@contextlib.contextmanager
def engine_errors(where: str) -> Iterator[None]:
    """Turn 'cannot talk to the engine' failures (SDK, HTTP, SSH) into BackendUnavailable."""
    import paramiko
    import requests

    docker = docker_sdk()
    try:
        yield
    except (docker.errors.NotFound, docker.errors.ImageNotFound):
        raise
    except paramiko.BadHostKeyException as exc:
        raise BackendUnavailable(
            f"host key for {exc.hostname} changed: refusing to connect to {where} (someone may be intercepting "
            f"the connection). If you expect this, remove the old key with `ssh-keygen -R {exc.hostname}` and "
            f"connect once with `ssh {exc.hostname}` to check the new one"
        ) from None
    except paramiko.AuthenticationException as exc:
        raise BackendUnavailable(
            f"ssh authentication to {where} failed ({exc}): check that your key (IdentityFile in ~/.ssh/config, "
            "or ~/.ssh/id_ed25519) is in the host's authorized_keys; `ssh` to it must work without a password"
        ) from None
    except paramiko.SSHException as exc:
        if "not found in known_hosts" in str(exc):
            raise BackendUnavailable(
                f"{where}: the host is not in ~/.ssh/known_hosts, so its identity cannot be checked; "
                "connect once with `ssh` to check and accept its key"
            ) from None
        raise BackendUnavailable(f"ssh to {where} failed: {exc}") from None
    except docker.errors.DockerException as exc:
        raise BackendUnavailable(f"the Docker engine {where} failed: {short_error(exc)}") from None
    except (requests.exceptions.RequestException, OSError, EOFError) as exc:
        raise BackendUnavailable(f"cannot reach the Docker engine {where}: {type(exc).__name__}: {exc}") from None


def engine_client(host: str | None):
    """A DockerClient for --host (ssh://user@host[:port]) or the local engine (DOCKER_HOST)."""
    docker = docker_sdk()
    where = host or os.environ.get("DOCKER_HOST") or "(local engine)"
    if host:
        _check_reachable(host)
    with engine_errors(where):
        try:
            if host:
                # paramiko, not the ssh binary: exec_run breaks with use_ssh_client=True (docker-py #3218)
                client = docker.DockerClient(base_url=host, use_ssh_client=False, timeout=60)
            else:
                client = docker.from_env(timeout=60)
            client.ping()
        except docker.errors.DockerException as exc:
            if host:
                raise
            raise BackendUnavailable(
                f"no Docker engine answers at {where} ({short_error(exc)}): install Docker and start it "
                "(`sudo systemctl start docker`), give a remote one with --host ssh://user@host, "
                "or use --backend local"
            ) from None
    return client


def _check_reachable(url: str, timeout: float = 10.0) -> None:
    """Fail fast and clearly when the engine's host does not answer on its SSH port (docker-py's
    own SSH connect has no timeout)."""
    import socket

    from ..tunnel import TunnelError, jump_target

    try:
        login = jump_target(url)
    except TunnelError as exc:
        raise BackendUnavailable(str(exc)) from None
    try:
        socket.create_connection((login.host, login.port), timeout=timeout).close()
    except OSError as exc:
        reason = "timed out" if isinstance(exc, socket.timeout) else (exc.strerror or str(exc))
        raise BackendUnavailable(
            f"cannot reach the Docker engine {url}: {login.host}:{login.port} {reason}; "
            "is the host up, and does `ssh` to it work?"
        ) from None


def dockerfile_dir() -> Path | None:
    """The source checkout holding Dockerfile.cuda, when gpusession runs from one."""
    root = Path(__file__).resolve().parents[2]
    return root if (root / "Dockerfile.cuda").is_file() else None


def build_or_find_image(client, image: str, progress: Progress, *, default_image: str) -> None:
    """Make sure `image` is on the engine: present, else built from Dockerfile.cuda (the default
    image, in a source checkout), else pulled; an actionable error otherwise."""
    docker = docker_sdk()
    with engine_errors("while looking for the image"):
        try:
            client.images.get(image)
            return
        except docker.errors.ImageNotFound:
            pass
    root = dockerfile_dir()
    if root is not None and image == default_image:
        with progress.stage("image", f"{image} is not on the engine: building it from {root / 'Dockerfile.cuda'}"):
            _build(client, root, image, progress)
        return
    progress.step(f"pulling {image}")
    try:
        client.images.pull(image)
        return
    except docker.errors.DockerException as exc:
        pull_error = short_error(exc)
    how = (
        f"build it from a gpusession source checkout: docker build -f Dockerfile.cuda -t {image} ."
        if root is None or image == default_image
        else f"build it ({root}: docker build -f Dockerfile.cuda -t {image} .) or pass another --image"
    )
    raise StageError("image", f"image {image} is not on the Docker engine and cannot be pulled ({pull_error}); {how}")


def _build(client, root: Path, image: str, progress: Progress) -> None:
    lines: list[str] = []
    try:
        for chunk in client.api.build(path=str(root), dockerfile="Dockerfile.cuda", tag=image, rm=True, decode=True):
            if "error" in chunk:
                raise StageError("image", f"building {image} failed: {chunk['error'].strip()}; last output: "
                                 + " | ".join(lines[-5:]))
            text = chunk.get("stream", "").strip()
            if text:
                lines.append(text)
                if re.match(r"Step \d+/\d+", text):
                    progress.step(text)
    except docker_sdk().errors.DockerException as exc:
        raise StageError("image", f"building {image} failed: {short_error(exc)}") from None


def get_container(client, container_id: str | None):
    if not container_id:
        return None
    docker = docker_sdk()
    try:
        with engine_errors("while looking for the container"):
            return client.containers.get(container_id)
    except docker.errors.NotFound:
        return None


def remove_container(container) -> None:
    docker = docker_sdk()
    try:
        container.remove(force=True)
    except docker.errors.NotFound:
        pass
    except docker.errors.APIError as exc:
        if "already in progress" not in str(exc):
            raise


def container_logs(container, tail: int | str = "all") -> str:
    with engine_errors("while reading the container's log"):
        return container.logs(stdout=True, stderr=True, tail=tail).decode(errors="replace")


def wait_for_marker(container, marker: Marker, timeout: float, stage: str) -> Any:
    """The payload of the first `marker` line in the container's log (`protocol.parse_marker`);
    fails when the runtime says it failed (FAILED) or the container exits first."""
    deadline = time.monotonic() + timeout
    delay = 0.02
    while True:
        text = container_logs(container)
        for line in text.splitlines():
            parsed = parse_marker(line)
            if parsed is None:
                continue
            if parsed[0] is marker:
                return parsed[1]
            if parsed[0] is Marker.FAILED:
                raise StageError(stage, f"the session runtime failed: {failure_detail(parsed[1])}")
        container.reload()
        if container.status not in ("created", "running"):
            code = container.attrs["State"].get("ExitCode")
            last = " | ".join(text.strip().splitlines()[-8:]) or "(no output)"
            raise StageError(stage, f"container exited with code {code} during start; last log lines: {last}")
        if time.monotonic() > deadline:
            raise StageError(stage, f"no {marker.value} line from the container within {timeout:.0f}s")
        time.sleep(delay)
        delay = min(delay * 1.5, 0.25)


def read_json_from(container, path: str) -> dict:
    """A JSON file inside the container, read through the Docker API (no exec needed)."""
    with engine_errors(f"while reading {path} in the container"):
        stream, _ = container.get_archive(path)
    with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
        member = tar.getmembers()[0]
        return json.loads(tar.extractfile(member).read())
