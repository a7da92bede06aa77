"""The Docker engines `gpusession setup` finds (DockerBackend.discover): DOCKER_HOST or the local
socket, and each docker context; for each, whether it answers and whether it gives containers a
GPU. An ssh:// engine is reached with the pinned host keys of known_hosts only."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from ...core.errors import BackendUnavailable
from ..base import Place, gpu_words, run_probe
from .engine import docker_sdk

LOCAL_SOCKET = "unix:///var/run/docker.sock"


def endpoints() -> list[tuple[str, str]]:
    """(what, address) of every engine configured here: DOCKER_HOST or the local socket, and each
    docker context (~/.docker/contexts/meta/*/meta.json, as the docker CLI keeps them)."""
    found = [("docker engine", os.environ.get("DOCKER_HOST") or LOCAL_SOCKET)]
    meta = Path(os.environ.get("DOCKER_CONFIG") or Path.home() / ".docker") / "contexts" / "meta"
    for path in sorted(meta.glob("*/meta.json")) if meta.is_dir() else []:
        try:
            doc = json.loads(path.read_text())
            address = doc["Endpoints"]["docker"]["Host"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if address not in {a for _, a in found}:
            found.append((f"docker context {doc.get('Name', '?')}", address))
    return found


#: what dockerd runs for `--gpus` when no nvidia runtime is registered (nvidia-container-toolkit's
#: hook, found on dockerd's PATH): `docker info` does not show it
GPU_HOOKS = ("nvidia-container-runtime-hook", "nvidia-container-cli")


def on_this_machine(host: str | None) -> bool:
    """Whether the engine of `host` (None: DOCKER_HOST, else the local socket) runs here."""
    return not host and (os.environ.get("DOCKER_HOST") or LOCAL_SOCKET).startswith("unix://")


def gives_gpus(info: dict[str, Any], *, here: bool = False) -> bool:
    """Whether an engine (its `docker info`) gives containers NVIDIA GPUs: the nvidia runtime, or
    NVIDIA devices by CDI; for this machine's engine (`here`) also the toolkit's hook, which
    `--gpus` runs without a registered runtime (the most common setup), when this machine's
    `nvidia-smi` lists a GPU."""
    if "nvidia" in (info.get("Runtimes") or {}) or any(
        "nvidia" in str(d).lower() for d in info.get("DiscoveredDevices") or []
    ):
        return True
    if not here or not any(shutil.which(hook) for hook in GPU_HOOKS):
        return False
    status, listing = run_probe(["nvidia-smi", "-L"])
    return status == 0 and gpu_words(listing) != "none"


#: why an engine reached over TCP (a `tcp://` DOCKER_HOST or context, with TLS or not) is listed
#: but not used: the kernel's ports are reached through the engine host's SSH login
NOT_OVER_TCP = (
    "not used: gpusession reaches a remote engine over ssh:// (the kernel's ports go through that "
    "SSH login, never an open port); `docker context create NAME --docker host=ssh://USER@HOST`"
)


def engine_place(what: str, address: str, timeout: float) -> Place:
    """One engine, probed: it answers or not, gives GPUs or not. A tcp:// one is not probed."""
    if address.startswith(("tcp://", "http://", "https://")):
        return Place(what, address, "unknown", None, False, NOT_OVER_TCP)
    host = address if address.startswith("ssh://") else None
    try:
        docker = docker_sdk()
        # paramiko, not the ssh binary, for ssh://: it refuses a host key known_hosts lacks
        client = docker.DockerClient(base_url=address, timeout=timeout, use_ssh_client=False)
        try:
            info = client.info()
        finally:
            client.close()
    except BackendUnavailable as exc:
        return Place(what, address, "unknown", "docker", False, str(exc), host)
    except Exception as exc:  # noqa: BLE001 - any failure: it does not answer, said as such
        why = (str(exc).splitlines() or [type(exc).__name__])[0][:100]
        return Place(what, address, "unknown", "docker", False, f"does not answer: {why}", host)
    if gives_gpus(info, here=address.startswith("unix://")):
        return Place(what, address, "GPU runtime (nvidia)", "docker", True, "", host)
    note = "answers, but gives containers no GPU (no nvidia runtime)"
    return Place(what, address, "none", "docker", False, note, host)
