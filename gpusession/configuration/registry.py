"""The registry of backends: the `gpusession.backends` entry-point group, and nothing else.

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


def loaded_classes() -> dict[str, type]:
    """name -> class of every installed backend that imports here, by name; one that does not
    (a plugin whose package is broken) is left out and logged: it is not offered anywhere."""
    classes = {}
    for name, target in sorted(registered().items()):
        try:
            classes[name] = import_target(target)
        except Exception as exc:  # noqa: BLE001 - one broken plugin must not take every face down
            log.warning("backend %r (%s) is left out: it does not import: %s", name, target, exc)
    return classes
