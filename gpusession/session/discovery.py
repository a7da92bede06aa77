"""Where GPUs are, for `gpusession setup`: what each installed backend finds itself
(`Backend.discover`: this machine's GPU, Docker engines and contexts, AWS credentials, this machine
as a Slurm login), the SSH hosts of ~/.ssh/config (each logged in to with the pinned host keys of
known_hosts only, never accepting a new one, within a short timeout: its nvidia-smi, and whether
it runs docker or Slurm) and a kubeconfig. Nothing is created or paid for; what is found is data
(`Place`), put into words by gpusession/words/setup.py."""

from __future__ import annotations

import concurrent.futures
import logging
import os
from pathlib import Path
from typing import Callable

from ..backends.base import PROBE_TIMEOUT_S, Backend, Place, gpu_words
from ..configuration.registry import loaded_classes
from ..configuration.settings import write_user_settings
from ..core.errors import BadInput

log = logging.getLogger(__name__)

# in a login shell (a cluster's PATH is set up there): the GPUs, then docker's path, then the
# cluster's GPUs and "sinfo" when sinfo answers (a login node; a sinfo with no cluster is none)
_SSH_PROBE = (
    "sh -lc 'command -v nvidia-smi >/dev/null && nvidia-smi -L; echo ---; command -v docker; "
    "command -v sinfo >/dev/null && sinfo -h -o %G 2>/dev/null && echo sinfo'"
)


def ssh_config_hosts() -> list[str]:
    """The hosts ~/.ssh/config names (no patterns)."""
    path = Path.home() / ".ssh" / "config"
    if not path.is_file():
        return []
    import paramiko  # lazy: docs/architecture.md#imports-kept-inside-functions (paramiko)

    try:
        names = paramiko.SSHConfig.from_path(str(path)).get_hostnames()
    except (OSError, ValueError):
        return []
    return sorted(n for n in names if not set(n) & set("*?!"))


def ssh_host(alias: str, timeout: float = PROBE_TIMEOUT_S) -> Place:
    """A host of ~/.ssh/config, logged in to as `ssh alias` would (its User, IdentityFile) with
    the host keys known_hosts pins: its nvidia-smi's GPUs; docker there (a remote engine) or
    sinfo (a Slurm login node, with the cluster's GPUs). A host whose key is not known is not
    logged in to, and said so."""
    # lazy: docs/architecture.md#imports-kept-inside-functions
    from ..transport import sshlogin

    where = f"ssh://{alias}"
    try:
        target = sshlogin.jump_target(where)
        sock = sshlogin.tcp_socket(target.host, target.port, timeout)
        transport = sshlogin.open_transport(sock, target, timeout=timeout)
        try:
            _, out, _ = sshlogin.exec_command(transport, _SSH_PROBE, timeout=timeout)
        finally:
            transport.close()
    except sshlogin.LoginRefused as exc:
        return Place("ssh host", where, "unknown", None, False, f"not probed: {exc}")
    except Exception as exc:  # noqa: BLE001 - unreachable, timed out: said so, one line
        why = (str(exc).splitlines() or [type(exc).__name__])[0][:100] or type(exc).__name__
        return Place("ssh host", where, "unknown", None, False, f"does not answer: {why}")
    return _ssh_place(where, out.decode(errors="replace"))


def _ssh_place(where: str, said: str) -> Place:
    """What the SSH probe printed, as a Place."""
    listing, _, rest = said.partition("---")
    lines = [line.strip() for line in rest.splitlines() if line.strip()]
    has = {Path(line).name for line in lines if line.startswith("/")}
    has |= {"sinfo"} if "sinfo" in lines else set()
    gres = sorted({g for line in lines for g in line.split(",") if g.startswith("gpu")})
    if "sinfo" in has:  # a login node: the cluster's GPUs, as Slurm counts them
        gpus = ", ".join(gres) or "none in Slurm"
    else:
        gpus = gpu_words(listing) if "GPU " in listing else "no nvidia-smi"
    backend = "slurm" if "sinfo" in has else ("docker" if "docker" in has else None)
    installed = backend is None or backend in loaded_classes()
    note = ", ".join(f"has {t}" for t in ("docker", "sinfo") if t in has) or "no docker, no sinfo"
    usable = backend is not None and installed and (bool(gres) or gpus[:1].isdigit())
    return Place("ssh host", where, gpus, backend if installed else None, usable, note, where)


def kubeconfig() -> list[Place]:
    """A kubeconfig (KUBECONFIG, else ~/.kube/config) that no installed backend asks: listed,
    saying so (the kubernetes backend's own `discover` asks each context's cluster)."""
    paths = [p for p in (os.environ.get("KUBECONFIG") or "").split(os.pathsep) if p]
    found = [p for p in paths or [str(Path.home() / ".kube" / "config")] if Path(p).is_file()]
    if not found:
        return []
    if any(n in ("kubernetes", "kube", "k8s") for n in loaded_classes()):
        return []  # that backend's own discover() asks the cluster
    note = "no gpusession backend for Kubernetes is installed"
    return [Place("kubeconfig", found[0], "unknown", None, False, note)]


def discover(timeout: float = PROBE_TIMEOUT_S) -> list[Place]:
    """Every place, probed side by side (each within about `timeout` seconds), in the backends'
    order, then the SSH hosts, then a kubeconfig."""
    probes: list[Callable[[], list[Place]]] = [
        (lambda cls=cls: cls.discover(timeout))
        for _, cls in sorted(loaded_classes().items(), key=lambda item: item[1].order)
    ]
    probes += [(lambda h=h: [ssh_host(h, timeout)]) for h in ssh_config_hosts()]
    probes.append(kubeconfig)
    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(_safely, probes))
    return [place for found in results for place in found]


def _safely(probe: Callable[[], list[Place]]) -> list[Place]:
    try:
        return probe()
    except Exception:  # noqa: BLE001 - a backend's probe that broke its promise: nothing found
        return []


def chosen_place(places: list[Place], number: int) -> Place:
    """Place `number` of the setup table (1-based), as a default can be made of it; BadInput
    (one line, what to do) when there is no such row or no installed backend runs there."""
    if not 1 <= number <= len(places):
        raise BadInput(f"--choose takes a number from 1 to {len(places)} (the table's #)")
    place = places[number - 1]
    if place.backend is None:
        raise BadInput(f"no installed backend runs sessions on {place.where}: choose another")
    return place


def make_default(place: Place) -> Path:
    """Write `place` as the user's default (backend and its --host): the settings file path."""
    return write_user_settings({"default_backend": place.backend, "default_host": place.host or ""})


def free_now(backend: Callable[[str], Backend]) -> list[dict]:
    """What the backends' shared places (docker pools) have free now, each row with its
    `backend`: the backends that say (`Backend.free_now`), built by `backend(name)`."""
    rows: list[dict] = []
    for name, cls in loaded_classes().items():
        if getattr(cls, "free_now", Backend.free_now) is Backend.free_now:
            continue
        try:
            rows += [dict(row, backend=name) for row in backend(name).free_now()]
        except Exception:  # noqa: BLE001 - one backend's listing never takes `types` down
            log.warning("the %s backend could not say what is free now", name, exc_info=True)
    return rows
