"""Old runtime volumes on an engine: what `gpusession gc` removes of them.

A start copies the runtime bundle into volumes named by the content's digest
(`runtime`): every gpusession build, and every change of the ipykernel site, makes new
ones and the old ones stayed for ever (tens of MB each). gc removes a runtime volume (with its
`-ok` twin) when all of these hold:

- it is not of this build: its digest is neither the code's of this gpusession nor one of the
  ipykernel sites in this machine's cache (`bundle.current_digests`);
- no container uses it, running or stopped (the engine's `dangling` filter), so a session of an
  older build that still runs keeps its copy;
- it is older than STALE_AFTER_S: a start of another build on the same engine may be filling a
  volume it just made and not yet mounted.

Removing one is safe anyway: a later start of that build copies it again (seconds).
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import re
import time
from typing import Callable

from ..base import RemoteResource
from .engine import engine_errors

log = logging.getLogger(__name__)

VOLUME_LABEL = "gpusession.runtime"
STALE_AFTER_S = 600.0
_DIGEST = re.compile(r"-([0-9a-f]{12})(?:-cp\d+)?$")


@dataclasses.dataclass(frozen=True)
class StaleCopy:
    name: str  # the copy's volume
    names: tuple[str, ...]  # it and its -ok twin, those that exist


def _created(volume) -> float | None:
    text = (volume.attrs or {}).get("CreatedAt") or ""
    try:
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def stale_copies(
    client, current: set[str], now: float, stale_after_s: float | None = None
) -> list[StaleCopy]:
    """The runtime copies on `client`'s engine that gc may remove (see the module's rules)."""
    grace = STALE_AFTER_S if stale_after_s is None else stale_after_s
    every = {v.name: v for v in client.volumes.list(filters={"label": VOLUME_LABEL})}
    unused = {
        v.name for v in client.volumes.list(filters={"label": VOLUME_LABEL, "dangling": True})
    }
    found = []
    for name in sorted({n.removesuffix("-ok") for n in every}):
        match = _DIGEST.search(name)
        if match is None or match.group(1) in current:
            continue
        names = tuple(n for n in (name, name + "-ok") if n in every)
        if not set(names) <= unused:
            continue  # a container (a running session of that build) still mounts it
        ages = [_created(every[n]) for n in names]
        if any(a is None or now - a < grace for a in ages):
            continue
        found.append(StaleCopy(name, names))
    return found


def remove_copy(client, names: list[str]) -> None:
    """Remove a copy's volumes; one a container took since it was listed stays (the engine refuses)."""
    import docker

    for name in names:
        try:
            client.volumes.get(name).remove()
        except docker.errors.NotFound:
            pass


def stale_resources(
    backend: str, client_for: Callable[[str], object], hosts: list[str], current: set[str]
) -> list[RemoteResource]:
    """stale_copies of each engine (host "" is the local one) as gc's resources; an engine that
    does not answer is skipped."""
    found = []
    for host in hosts:
        where = host or "the local engine"
        try:
            with engine_errors(where):
                stale = stale_copies(client_for(host), current, time.time())
        except Exception as exc:  # noqa: BLE001 - another engine may answer
            log.warning("gc: not looking at the runtime volumes on %s: %s", where, exc)
            continue
        found += [
            RemoteResource(
                backend=backend,
                session_id="",
                resource_id=s.name,
                running=False,
                description=f"runtime volume {s.name} on {where}",
                details={
                    "host": host,
                    "volumes": list(s.names),
                    "why": "another gpusession build's copy, used by no container",
                },
            )
            for s in stale
        ]
    return found
