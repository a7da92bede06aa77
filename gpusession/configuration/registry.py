"""The registry of backends, the only one: the `gpusession.backends` entry-point group, and the
seam a test replaces (`backend_classes`).

A backend is found by its entry point (pyproject.toml's `[project.entry-points."gpusession.backends"]`
for the built-ins; a plugin package's own for others), never by a list here. This module knows
no backend: it reads the group and imports the class an entry point names, on demand, so the
layers below the backends (the option table, gathering each backend's start options) can ask for
them without importing one.

Scanning every installed package's entry points costs ~15 ms, a third of a `gpusession list`
that checks a running session: a built-in name is read from gpusession's own distribution
(one dist-info), and the full scan is done only for another name or for the whole list; both are
kept per import path (`sys.path`), so a test that puts a plugin on the path sees it.
"""

from __future__ import annotations

import functools
import importlib
import logging
import sys
from typing import Any

from ..core.errors import BadInput

GROUP = "gpusession.backends"
DISTRIBUTION = "gpusession"

log = logging.getLogger(__name__)


@functools.lru_cache(maxsize=8)
def _own(path: tuple[str, ...]) -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        points = distribution(DISTRIBUTION).entry_points
    except (
        PackageNotFoundError
    ):  # a source checkout never installed: `pip install -e .` registers them
        return {}
    return {ep.name: ep.value for ep in points if ep.group == GROUP}


@functools.lru_cache(maxsize=8)
def _scan(path: tuple[str, ...]) -> dict[str, str]:
    from importlib.metadata import entry_points  # reads every installed package's entry points

    found = {ep.name: ep.value for ep in entry_points(group=GROUP)}
    return found | _own(path)  # a built-in name is the built-in, whatever a plugin calls itself


def registered() -> dict[str, str]:
    """name -> 'module:Class' for every installed backend."""
    return dict(_scan(tuple(sys.path)))


def target_of(name: str) -> str | None:
    """'module:Class' of the backend called `name` (lower case), None when none is installed."""
    path = tuple(sys.path)
    return _own(path).get(name) or _scan(path).get(name)


def import_target(target: str) -> Any:
    """The object a 'module:attr' entry-point value names (ModuleNotFoundError when its module or
    one it needs is missing)."""
    module_name, _, attr = target.partition(":")
    return getattr(importlib.import_module(module_name), attr)


def backend_classes() -> dict[str, str]:
    """name -> 'module:Class' for every installed backend: THE seam a test (or a plugin host)
    replaces to change what is found, like jupyter_client's provisioner factory."""
    return registered()


_SHIPPED = backend_classes  # the seam as shipped (a test may replace backend_classes)


def backend_names() -> list[str]:
    return sorted(backend_classes())


def load_backend_class(name: str) -> type:
    """The backend class called `name` (BadInput naming the valid ones when none is)."""
    key = name.strip().lower()
    # a built-in name needs no scan of every installed package (target_of reads gpusession's own
    # entry points first); once the seam is replaced, only the seam counts
    classes = backend_classes() if backend_classes is not _SHIPPED else None
    target = classes.get(key) if classes is not None else target_of(key)
    if target is None:
        raise BadInput(
            f"unknown backend {name!r}; valid backends: "
            f"{', '.join(sorted(classes or backend_classes()))}"
        )
    try:
        return import_target(target)
    except ModuleNotFoundError as exc:
        raise BadInput(f"backend {name!r} is not available here: {exc}") from None


def loaded_classes() -> dict[str, type]:
    """name -> class of every installed backend that imports here (the seam's, when a test
    replaced it); one that does not (a plugin whose package is broken) is left out and logged:
    it is not offered anywhere."""
    if backend_classes is not _SHIPPED:
        return {name: load_backend_class(name) for name in backend_classes()}
    classes = {}
    for name, target in sorted(registered().items()):
        try:
            classes[name] = import_target(target)
        except Exception as exc:  # noqa: BLE001 - one broken plugin must not take every face down
            log.warning("backend %r (%s) is left out: it does not import: %s", name, target, exc)
    return classes


def default_order(classes: dict[str, type]) -> list[str]:
    """The backends that may be the default (no --backend given, none configured), in the order
    they are tried: by their class's `default_rank`, then name. The first whose `available()`
    answers yes is the default (docker when an engine answers, else local)."""
    ranked = [
        (cls.default_rank, name)
        for name, cls in classes.items()
        if getattr(cls, "default_rank", None) is not None
    ]
    return [name for _, name in sorted(ranked)]


def listing_order(classes: dict[str, type]) -> list[str]:
    """The backends in the order every listing shows them (workspaces, an option's backends):
    by their class's `order`, then name."""
    return [
        name
        for _, name in sorted((getattr(cls, "order", 100), name) for name, cls in classes.items())
    ]


def workspace_backends() -> list[str]:
    """The backends whose workspaces outlive their sessions (`keeps_workspaces`), in listing
    order."""
    classes = loaded_classes()
    return [name for name in listing_order(classes) if classes[name].keeps_workspaces]


def price_lists() -> list[dict[str, Any]]:
    """The backends that price GPUs themselves (their class's `price_list`), in listing order, as
    data: [{"backend", "source", "prices": {type: dollars per GPU-hour}}]."""
    classes = loaded_classes()
    return [
        {
            "backend": name,
            "source": getattr(classes[name], "price_source", ""),
            "prices": dict(classes[name].price_list),
        }
        for name in listing_order(classes)
        if getattr(classes[name], "price_list", None)
    ]


def declared_gpu_types() -> dict[str, tuple[str, dict[str, Any]]]:
    """The GPU types the installed backends declare (their class's `gpu_types`), for the
    catalog to merge: type name (lower case) -> (backend, its entry). The first backend in
    listing order that declares a name has it."""
    classes = loaded_classes()
    found: dict[str, tuple[str, dict[str, Any]]] = {}
    for name in listing_order(classes):
        for type_name, raw in dict(getattr(classes[name], "gpu_types", None) or {}).items():
            found.setdefault(str(type_name).strip().lower(), (name, dict(raw)))
    return found


def catalog_columns(catalog: Any) -> list[Any]:
    """The columns the installed backends show beside the catalog (their class's
    `catalog_columns`: a cloud's machines and spot prices), in listing order."""
    classes = loaded_classes()
    columns: list[Any] = []
    for name in listing_order(classes):
        made = getattr(classes[name], "catalog_columns", None)
        if made is not None:
            columns += made(catalog)
    return columns


def backend_places(config) -> dict[str, list[str]]:
    """The named places each backend offers for --host in the forms (`Backend.places`):
    {"docker": ["pool:lab"]}; backends with none left out."""
    places = {}
    for name, cls in loaded_classes().items():
        try:
            found = list(cls.places(config))
        except Exception:  # noqa: BLE001 - a plugin's broken hook never takes the form down
            log.warning("backend %r: its places could not be read", name, exc_info=True)
            continue
        if found:
            places[name] = found
    return places
