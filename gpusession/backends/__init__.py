"""Backend discovery through the `gpusession.backends` entry-point group (`gpusession.configuration.registry`:
the entry points are the one registry; pyproject.toml registers the built-ins).

`backend_classes()` is the one function tests (or a plugin host) replace to change what is
found, like jupyter_client's provisioner factory.
"""

from __future__ import annotations

from ..configuration import registry
from ..configuration.registry import GROUP
from ..core.errors import BadInput
from .base import Backend, Link, Recorder, RemoteResource, TunnelLink


def backend_classes() -> dict[str, str]:
    """name -> 'module:Class' for every installed backend."""
    return registry.registered()


_scan = backend_classes  # the seam as shipped (a test may replace backend_classes)


def backend_names() -> list[str]:
    return sorted(backend_classes())


def load_backend_class(name: str) -> type[Backend]:
    key = name.strip().lower()
    # a built-in name needs no scan of every installed package (registry.target_of reads
    # gpusession's own entry points first); once the seam is replaced, only the seam counts
    classes = backend_classes() if backend_classes is not _scan else None
    target = classes.get(key) if classes is not None else registry.target_of(key)
    if target is None:
        raise BadInput(
            f"unknown backend {name!r}; valid backends: {', '.join(sorted(classes or backend_classes()))}"
        )
    try:
        return registry.import_target(target)
    except ModuleNotFoundError as exc:
        raise BadInput(f"backend {name!r} is not available here: {exc}") from None


def default_order(classes: dict[str, type[Backend]]) -> list[str]:
    """The backends that may be the default (no --backend given, none configured), in the order
    they are tried: by their class's `default_rank`, then name. The first whose `available()`
    answers yes is the default (docker when an engine answers, else local)."""
    ranked = [
        (cls.default_rank, name)
        for name, cls in classes.items()
        if getattr(cls, "default_rank", None) is not None
    ]
    return [name for _, name in sorted(ranked)]


def listing_order(classes: dict[str, type[Backend]]) -> list[str]:
    """The backends in the order every listing shows them (workspaces, an option's backends):
    by their class's `order`, then name."""
    return [
        name
        for _, name in sorted((getattr(cls, "order", 100), name) for name, cls in classes.items())
    ]


def loaded_classes() -> dict[str, type[Backend]]:
    """name -> class of every installed backend (the seam's, when a test replaced it)."""
    if backend_classes is _scan:
        return registry.loaded_classes()
    return {name: load_backend_class(name) for name in backend_classes()}


def workspace_backends() -> list[str]:
    """The backends whose workspaces outlive their sessions (`Backend.keeps_workspaces`), in
    listing order."""
    classes = loaded_classes()
    return [name for name in listing_order(classes) if classes[name].keeps_workspaces]


__all__ = [
    "Backend",
    "Link",
    "Recorder",
    "RemoteResource",
    "TunnelLink",
    "backend_classes",
    "backend_names",
    "load_backend_class",
    "loaded_classes",
    "default_order",
    "listing_order",
    "workspace_backends",
    "GROUP",
]
