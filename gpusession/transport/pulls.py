"""Progress of an image pull, from the Docker Engine API's JSON events (`POST /images/create`, as
the SDK's `api.pull(..., stream=True, decode=True)` yields them, or as an instance's boot script
saves them): bytes and layers done, said as one line every few seconds.

    pull = PullProgress("pytorch/pytorch:2.7.1-cuda12.6-cudnn9-runtime")
    for event in events:
        pull.feed(event)
        if pull.due():
            progress.step(pull.line())
"""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import re
import subprocess
import time
from pathlib import Path
from typing import Any, Callable

DONE = ("Pull complete", "Already exists")


@dataclasses.dataclass
class _Layer:
    total: int = 0  # bytes to download (0 until the registry says)
    current: int = 0  # bytes downloaded
    done: bool = False  # extracted, or present already
    cached: bool = False  # "Already exists": nothing to download


class PullProgress:
    def __init__(
        self, image: str, *, every_s: float = 5.0, clock: Callable[[], float] = time.monotonic
    ):
        self.image = image
        self.every_s = every_s
        self.clock = clock
        self.layers: dict[str, _Layer] = {}
        self.error: str | None = None
        self.started = clock()
        self._said = self.started

    def feed(self, event: dict[str, Any]) -> None:
        if event.get("error"):
            self.error = str(event.get("error")).strip()
            return
        layer_id, status = event.get("id"), str(event.get("status") or "")
        if (
            not layer_id
            or ":" in str(layer_id)
            or status.startswith(("Pulling from", "Digest", "Status"))
        ):
            return  # a tag or the whole image, not a layer
        layer = self.layers.setdefault(str(layer_id), _Layer())
        detail = event.get("progressDetail") or {}
        if status == "Downloading" and detail.get("total"):
            layer.total = int(detail["total"])
            layer.current = min(int(detail.get("current") or 0), layer.total)
        elif status in ("Download complete", "Verifying Checksum", "Extracting"):
            layer.total = layer.total or int(
                detail.get("total") or 0
            )  # polled late: first seen unpacking
            layer.current = layer.total
        elif status in DONE:
            layer.done = True
            layer.cached = layer.cached or (status == "Already exists" and not layer.total)
            layer.current = layer.total

    @property
    def bytes_done(self) -> int:
        return sum(layer.current for layer in self.layers.values())

    @property
    def bytes_total(self) -> int:
        return sum(layer.total for layer in self.layers.values())

    @property
    def layers_done(self) -> int:
        return sum(layer.done for layer in self.layers.values())

    @property
    def layers_cached(self) -> int:
        return sum(layer.cached for layer in self.layers.values())

    def due(self) -> bool:
        """Time for another line (every `every_s` seconds)?"""
        now = self.clock()
        if now - self._said < self.every_s:
            return False
        self._said = now
        return True

    def line(self) -> str:
        total, done = self.bytes_total, self.bytes_done
        if not total:
            size = "sizes not known yet"
        elif done >= total:
            size = f"{format_bytes(total)} downloaded, unpacking"
        else:
            size = f"{format_bytes(done)} of {format_bytes(total)}"
        return f"pulling {self.image}: {size}, {self.layers_done} of {len(self.layers)} layers done"

    def finished_line(self) -> str:
        took = self.clock() - self.started
        cached = f", {self.layers_cached} of them already on the host" if self.layers_cached else ""
        return (
            f"pulled {self.image} ({format_bytes(self.bytes_total)} downloaded, {len(self.layers)} layers"
            f"{cached}) in {took:.0f}s; it stays on the host for the next session"
        )


def format_bytes(n: int | float) -> str:
    """1234567890 -> '1.23 GB' (decimal units, as registries and `docker images` count)."""
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.2f} {unit}" if unit == "GB" else f"{n / size:.0f} {unit}"
    return f"{int(n)} B"


# -- the user's registry logins (docker login), for pulls that docker itself does not make -------

DOCKER_HUB = "docker.io"
_HUB_KEYS = ("https://index.docker.io/v1/", "index.docker.io", "docker.io", "registry-1.docker.io")


def registry_of(image: str) -> str:
    """The registry host of an image reference: 'nvcr.io' for nvcr.io/nvidia/pytorch:24.01-py3,
    'docker.io' for a Docker Hub name (ubuntu:22.04, pytorch/pytorch:2.7.1-...)."""
    first, sep, _ = image.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        return first
    return DOCKER_HUB


def docker_login(registry: str) -> tuple[str, str] | None:
    """(user, password) that `docker login REGISTRY` saved for this user (DOCKER_CONFIG, else
    ~/.docker/config.json: its `auths`, or the credential helper it names), else None."""
    folder = os.environ.get("DOCKER_CONFIG") or str(Path.home() / ".docker")
    try:
        config = json.loads((Path(folder) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    keys = _HUB_KEYS if registry == DOCKER_HUB else (registry, f"https://{registry}")
    helper = next(
        (config.get("credHelpers", {}).get(k) for k in keys if k in config.get("credHelpers", {})),
        config.get("credsStore"),
    )
    if helper:
        for key in keys:
            try:
                found = subprocess.run(
                    [f"docker-credential-{helper}", "get"],
                    input=key.encode(),
                    capture_output=True,
                    timeout=30,
                )
                if found.returncode == 0:
                    data = json.loads(found.stdout)
                    return str(data["Username"]), str(data["Secret"])
            except (OSError, ValueError, KeyError, subprocess.TimeoutExpired):
                continue
    for key in keys:
        entry = config.get("auths", {}).get(key) or {}
        try:
            user, _, password = base64.b64decode(entry.get("auth", "")).decode().partition(":")
        except ValueError:
            continue
        if user and password:
            return user, password
    return None


# -- a login that goes with a pull -------------------------------------------------------------

# ACCOUNT.dkr.ecr[-fips].REGION.amazonaws.com[.cn]: an ECR registry, whose login is a token
_ECR_HOST = re.compile(r"^(\d{12})\.dkr\.ecr(?:-fips)?\.([a-z0-9-]+)\.amazonaws\.com(?:\.cn)?$")
# a registry's answers to a pull without a (valid) login, as an engine relays them
_AUTH_REFUSED = re.compile(
    r"unauthorized|authentication required|no basic auth credentials|incorrect username or password",
    re.I,
)


def ecr_registry(image: str) -> tuple[str, str] | None:
    """(account, region) when the image is in an ECR registry, else None."""
    found = _ECR_HOST.match(registry_of(image))
    return (found.group(1), found.group(2)) if found else None


@dataclasses.dataclass(frozen=True)
class PullLogin:
    """A registry login to send with one pull (never written anywhere by us)."""

    registry: str
    username: str
    password: str = dataclasses.field(repr=False)  # kept out of any repr a log might show
    source: str = "docker login"  # where it came from: "docker login", "ECR"

    def header(self) -> str:
        """The Engine API's X-Registry-Auth value (base64url JSON, as docker-py makes it)."""
        config = {
            "username": self.username,
            "password": self.password,
            "serveraddress": self.registry,
        }
        return base64.urlsafe_b64encode(json.dumps(config).encode()).decode()


def user_login(image: str) -> PullLogin | None:
    """The user's `docker login` for the image's registry, read now, else None."""
    registry = registry_of(image)
    login = docker_login(registry)
    return PullLogin(registry, login[0], login[1]) if login else None


def refused_pull(image: str, error: str, *, where: str) -> str | None:
    """One line for a pull the registry refused for want of a (valid) login, or None when
    `error` is another failure. `where`: the host that pulled (the engine's host, the
    instance), which never stores the login."""
    if not _AUTH_REFUSED.search(error):
        return None
    registry = registry_of(image)
    ecr = ecr_registry(image)
    if ecr:
        return (
            f"ECR registry {registry} refused the pull of {image} with the token of your AWS "
            f"identity ({error}): check that it may pull from that repository (ecr:BatchGetImage, "
            f"ecr:GetDownloadUrlForLayer; `aws sts get-caller-identity` says who you are)"
        )
    login = docker_login(registry)
    if login:
        return (
            f"{registry} refused the pull of {image} with your docker login as {login[0]} "
            f"({error}): run `docker login {registry}` again"
        )
    return (
        f"{registry} wants a login to pull {image} ({error}): run `docker login {registry}` "
        f"here (gpusession sends it with the pull, never writes it on {where})"
    )
