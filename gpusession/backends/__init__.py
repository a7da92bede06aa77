"""Backend discovery through the `gpusession.backends` entry-point group.

`backend_classes()` is the one function tests (or a plugin host) replace to change what is
found, like jupyter_client's provisioner factory.
"""

from __future__ import annotations

from ..errors import BadInput
from .base import Backend, Link, Recorder, RemoteResource, TunnelLink

GROUP = "gpusession.backends"

# Built-in backends, so a source checkout that was never pip-installed still finds them.
_BUILTIN = {
    "local": "gpusession.backends.local:LocalBackend",
    "docker": "gpusession.backends.docker:DockerBackend",
    "aws": "gpusession.backends.aws:AwsBackend",
    "slurm": "gpusession.backends.slurm:SlurmBackend",
}


def backend_classes() -> dict[str, str]:
    """name -> 'module:Class' for every installed backend."""
    from importlib.metadata import entry_points  # scans every installed package: ~15 ms

    found = {ep.name: ep.value for ep in entry_points(group=GROUP)}
    return found | _BUILTIN  # a built-in name is the built-in (load_backend_class needs no scan for it)


_scan = backend_classes  # the seam as shipped (a test may replace backend_classes)


def backend_names() -> list[str]:
    return sorted(backend_classes())


def load_backend_class(name: str) -> type[Backend]:
    key = name.strip().lower()
    # a built-in name needs no scan of the installed packages (importlib.metadata and the scan:
    # a third of a `gpusession list` that checks a running session); a plugin's name does, and
    # so does every name once the seam is replaced
    target = _BUILTIN.get(key) if backend_classes is _scan else None
    if target is None:
        classes = backend_classes()
        target = classes.get(key)
    if target is None:
        raise BadInput(f"unknown backend {name!r}; valid backends: {', '.join(sorted(classes))}")
    module_name, _, attr = target.partition(":")
    import importlib

    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise BadInput(f"backend {name!r} is not available here: {exc}") from None
    return getattr(module, attr)


__all__ = ["Backend", "Link", "Recorder", "RemoteResource", "TunnelLink", "backend_classes", "backend_names", "load_backend_class", "GROUP"]
