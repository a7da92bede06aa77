"""The grammar of the start options written as text: a remote Docker engine's ssh:// address, a
session name, an image reference, an AWS region, a machine image id, an address range.

Each reader takes the value as the user wrote it and returns it as it will be used, or raises
BadInput saying what is wrong and what to write; a value is echoed only in part (`shown`), so a
megabyte of input never comes back in a message. The option table (gpusession/configuration/options.py) calls
these for every face, so the magic, the CLI, REST and the forms refuse the same values before
anything is recorded. Standard library only.
"""

from __future__ import annotations

import ipaddress
import json
import re

from .durations import shown
from .errors import BadInput

HOST_HINT = "write ssh://[user@]host[:port], e.g. ssh://me@gpu-box or ssh://me@10.0.0.5:2222"
_USER = re.compile(r"[A-Za-z0-9_.][A-Za-z0-9_.-]{0,63}")
_ASCII_LABEL = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_-]*)")
NAME_CHARS = set("abcdefghijklmnopqrstuvwxyz0123456789-_.")
MAX_NAME = 63
# a Docker image reference: [registry[:port]/]path[:tag][@digest], printable, no spaces
_IMAGE = re.compile(
    r"[A-Za-z0-9][A-Za-z0-9._/-]*(:[A-Za-z0-9_][A-Za-z0-9._-]{0,127})?(@[A-Za-z0-9]+:[0-9a-fA-F]{32,})?"
)
_IMAGE_REGISTRY = re.compile(r"[A-Za-z0-9][A-Za-z0-9.-]*:[0-9]{1,5}/")
_REGION = re.compile(r"[a-z]{2}(-[a-z]+)+-[0-9]{1,2}")
_AMI = re.compile(r"ami-[0-9a-f]{8,17}")


POOL_PREFIX = "pool:"  # --host pool:NAME: the box of a configured pool with free GPUs
_POOL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def host_or_pool(text: str) -> str:
    """--host: an ssh:// address (ssh_host), or pool:NAME, a pool of them the configuration
    names (the docker backend picks its box)."""
    value = text.strip()
    if value.lower().startswith(POOL_PREFIX):
        name = value[len(POOL_PREFIX) :].strip()
        if not _POOL_NAME.fullmatch(name):
            raise BadInput(
                f"pool name {shown(name)}: letters, digits, '.', '_' or '-' (up to 64); "
                "write --host pool:NAME"
            )
        return POOL_PREFIX + name
    return ssh_host(text)


def pools(text: str) -> dict[str, list[str]]:
    """DockerBackend.pools: a JSON object, pool name -> its boxes' ssh:// addresses:
    {"lab": ["ssh://gpu1", "ssh://gpu2"]}. Empty: none."""
    if not text.strip():
        return {}
    try:
        raw = json.loads(text)
    except ValueError as exc:
        raise BadInput(
            f'pools must be a JSON object, e.g. {{"lab": ["ssh://gpu1"]}} ({exc})'
        ) from None
    if not isinstance(raw, dict) or not all(
        isinstance(boxes, list) and boxes and all(isinstance(b, str) for b in boxes)
        for boxes in raw.values()
    ):
        raise BadInput(
            'pools: each pool names a list of ssh:// addresses, e.g. {"lab": ["ssh://gpu1"]}'
        )
    out = {}
    for name, boxes in raw.items():
        if not _POOL_NAME.fullmatch(str(name)):
            raise BadInput(f"pool name {shown(name)}: letters, digits, '.', '_' or '-' (up to 64)")
        out[str(name)] = [ssh_host(b) for b in boxes]
    return out


def pools_text(text: str) -> str:
    """DockerBackend.pools checked (`pools`), kept as text: a setting's value is a string."""
    found = pools(text)
    return json.dumps(found) if found else ""


def ssh_host(text: str) -> str:
    """A remote Docker engine, ssh://[user@]host[:port] (a trailing / is dropped). The host is a
    DNS name (each part 1-63 characters, 253 in all, IDNA-encodable: what ssh and docker-py will
    have to resolve), an ~/.ssh/config alias, an IPv4 address or a bracketed IPv6 one."""
    value = text.strip()
    if value.endswith("/") and len(value) > len("ssh://"):
        value = value[:-1]
    if not value.lower().startswith("ssh://"):
        raise BadInput(f"{shown(text)} is no ssh:// address; {HOST_HINT}")
    rest = value[len("ssh://") :]
    if any(c in rest for c in "/?#"):
        raise BadInput(f"{shown(text)} has more than an address (a path, ? or #); {HOST_HINT}")
    userinfo, at, hostport = rest.rpartition("@")
    if at:
        if ":" in userinfo:
            raise BadInput(
                "give no password in the address (ssh logs in with your key); " + HOST_HINT
            )
        if not _USER.fullmatch(userinfo):
            raise BadInput(
                f"user {shown(userinfo)}: letters, digits, '.', '_' or '-' (up to 64), "
                f"not starting with '-'; {HOST_HINT}"
            )
    host, port = _split_port(hostport, text)
    if not host:
        raise BadInput(f"no host name in {shown(text)}; {HOST_HINT}")
    if port is not None and not (port.isdigit() and len(port) <= 5 and 1 <= int(port) <= 65535):
        raise BadInput(f"port {shown(port)} must be a number from 1 to 65535; {HOST_HINT}")
    if host.startswith("["):
        return value
    try:
        ipaddress.IPv4Address(host)
        return value
    except ValueError:
        pass
    _host_name(host)
    return value


def _split_port(hostport: str, text: str) -> tuple[str, str | None]:
    """'box:22' -> ('box', '22'); '[::1]:22' -> ('[::1]', '22'); no port -> None."""
    if hostport.startswith("["):
        inside, bracket, after = hostport[1:].partition("]")
        try:
            ipaddress.IPv6Address(inside)
        except ValueError:
            raise BadInput(f"{shown(text)}: [...] holds an IPv6 address; {HOST_HINT}") from None
        if not bracket or (after and not after.startswith(":")):
            raise BadInput(f"{shown(text)}: write [IPv6]:port; {HOST_HINT}")
        return f"[{inside}]", after[1:] if after else None
    host, colon, port = hostport.partition(":")
    return host, port if colon else None


def _host_name(host: str) -> None:
    name = host[:-1] if host.endswith(".") else host
    if len(name) > 253:
        raise BadInput(f"host name {shown(host)} is longer than 253 characters; {HOST_HINT}")
    for label in name.split("."):
        if not label:
            raise BadInput(
                f"host name {shown(host)} has an empty part (two dots, or a leading dot)"
            )
        if len(label) > 63:
            raise BadInput(
                f"host name part {shown(label)} is longer than 63 characters "
                f"(a DNS name is made of parts of 1 to 63 characters); {HOST_HINT}"
            )
        if label.isascii():
            if not _ASCII_LABEL.fullmatch(label):
                raise BadInput(
                    f"host name {shown(host)}: use letters, digits, '-' and '_', not starting with "
                    f"'-'; {HOST_HINT}"
                )
        elif not all(c.isalnum() or c == "-" for c in label):
            raise BadInput(
                f"host name {shown(host)} has a character a host name cannot have; {HOST_HINT}"
            )
    try:
        encoded = name.encode("idna")
    except UnicodeError:
        raise BadInput(
            f"host name {shown(host)} cannot be written as a DNS name (IDNA); {HOST_HINT}"
        ) from None
    if len(encoded) > 253:
        raise BadInput(
            f"host name {shown(host)} is longer than 253 characters as a DNS name; {HOST_HINT}"
        )


def session_name(text: str, what: str = "session name") -> str:
    """A session name: up to 63 ASCII letters, digits, '-', '_' or '.', starting with a letter or
    digit. Checked as written: a look-alike (the Kelvin sign K, which lower() makes 'k') is refused,
    not turned into another name that Docker, a volume or a tag would then refuse in its own words."""
    name = text.strip()
    if (
        not name
        or len(name) > MAX_NAME
        or not name.isascii()
        or not set(name.lower()) <= NAME_CHARS
        or not name[0].isalnum()
    ):
        non_ascii = next((c for c in name if not c.isascii()), None)
        which = f" ({non_ascii!r} U+{ord(non_ascii):04X} is not ASCII)" if non_ascii else ""
        raise BadInput(
            f"bad {what} {shown(text)}{which}: use up to {MAX_NAME} ASCII letters, digits, '-', '_' or '.', "
            "starting with a letter or digit"
        )
    return name


def workspace_name(text: str) -> str:
    """A workspace name, as a session name is written (it names a Docker volume, an EBS tag, a folder)."""
    return session_name(text, "workspace name")


def size_or_off(text: str) -> int:
    """A size as `byte_size` reads it, or off (0 too): none, returned as 0."""
    return 0 if text.strip().lower() in ("off", "none", "0") else byte_size(text)


def gib_size(text: str) -> int:
    """Whole GiB for a new EBS volume (gp3 holds 1 to 16384): 50, 50G, 50GiB."""
    value = text.strip().upper().removesuffix("IB").removesuffix("I").removesuffix("G").strip()
    if not value.isdigit() or not 1 <= int(value) <= 16384:
        raise BadInput(f"bad workspace size {shown(text)}: give whole GiB from 1 to 16384, e.g. 50")
    return int(value)


def gpu_memory(text: str) -> int:
    """Whole GiB of one GPU's memory: 24, 24G, 24GB, 24GiB (1 to 1024)."""
    value = text.strip().upper()
    for unit in ("GIB", "GB", "G"):
        value = value.removesuffix(unit)
    value = value.strip()
    if not value.isdigit() or not 1 <= int(value) <= 1024:
        raise BadInput(f"bad GPU memory {shown(text)}: give whole GiB from 1 to 1024, e.g. 24G")
    return int(value)


def image_ref(text: str) -> str:
    """A container image reference: nvidia/cuda:12.4.1-runtime-ubuntu22.04, registry:5000/me/img,
    img@sha256:..."""
    value = text.strip()
    if value.startswith(("/", "~/")) and value.isprintable() and " " not in value:
        return value  # an image file or folder on a Slurm cluster's shared filesystem (.sif, Charliecloud)
    path = _IMAGE_REGISTRY.sub("", value, count=1) if _IMAGE_REGISTRY.match(value) else value
    if not _IMAGE.fullmatch(path) or "//" in path or path.endswith("/"):
        raise BadInput(
            f"image {shown(text)} is no image reference: write e.g. nvidia/cuda:12.4.1-runtime-ubuntu22.04 "
            "or registry.example.com:5000/me/image:tag (or, on a Slurm cluster, the path of an image there)"
        )
    return value


def aws_region(text: str) -> str:
    value = text.strip().lower()
    if not _REGION.fullmatch(value):
        raise BadInput(
            f"region {shown(text)} is no AWS region name: write e.g. us-east-1 or eu-central-1"
        )
    return value


def machine_image(text: str) -> str:
    value = text.strip()
    if not _AMI.fullmatch(value):
        raise BadInput(
            f"machine image {shown(text)}: write an AMI id such as ami-0123456789abcdef0"
        )
    return value


def address_range(text: str) -> str:
    value = text.strip()
    try:
        return str(ipaddress.ip_network(value, strict=False))
    except ValueError:
        raise BadInput(
            f"address range {shown(text)}: write one such as 203.0.113.7/32 or 2001:db8::/64"
        ) from None


_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "kb": 10**3,
    "m": 10**6,
    "mb": 10**6,
    "g": 10**9,
    "gb": 10**9,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
}


def byte_size(text: str) -> int:
    """A size: 500MB, 2GB, 1.5G, 300MiB; a bare number means MB. Up to 1 TB."""
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", text)
    unit = match.group(2).lower() if match else ""
    if not match or unit not in _SIZE_UNITS:
        raise BadInput(
            f"{shown(text)} is no size; write e.g. 500MB, 2GB or 300MiB (a bare number means MB)"
        )
    value = float(match.group(1)) * (_SIZE_UNITS[unit] if unit else 10**6)
    if not 0 < value <= 10**12:
        raise BadInput(f"size {shown(text)}: from 1 byte to 1TB")
    return int(value)


def local_folder(text: str) -> str:
    """A folder on this machine, made absolute (relative to where the face runs: the notebook's
    folder for `%gpu start`); whether it exists is checked when the session is made."""
    import os

    return os.path.abspath(os.path.expanduser(text.strip()))
