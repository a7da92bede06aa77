"""Where a start goes: the backend's choice within what the user allowed (`Backend.place`: a
pool's box), then provisioning; and a fallback list of GPU types (`--type l4,a10g,t4`, `--gpu-mem 24G`; issue 34 §3): the start
provisions the first type; where the backend finds no capacity for it (`NoCapacity`: a box or
pool whose GPUs are all held, a cloud's insufficient capacity or unfulfilled spot), what that
attempt made is taken down and the same session moves on to the next type, on every backend
alike. The record keeps the types in order (`spec.extra["types"]`) and, for each passed over,
why (`spec.extra["passed_over"]`: [{"type": "l4:1", "why": ...}]); its timeline says each move.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from ..backends import Backend
from ..configuration.options import TYPES
from ..core.errors import NoCapacity
from ..core.models import LaunchSpec, SessionRecord
from ..core.progress import Progress
from .store import Store

PASSED_OVER = "passed_over"  # spec.extra: the types passed over, with why


def next_type(spec: LaunchSpec) -> tuple[str, int] | None:
    """The type after the current one in the spec's fallback list; None at its end (or none)."""
    listed = [t.partition(":") for t in spec.extra.get(TYPES) or []]
    choices = [(name, int(count or 1)) for name, _, count in listed]
    current = (spec.gpu_type, spec.gpu_count)
    if current not in choices:
        return None
    at = choices.index(current)
    return choices[at + 1] if at + 1 < len(choices) else None


def moved_on(spec: LaunchSpec, to: tuple[str, int], why: str) -> LaunchSpec:
    """The spec for the next type, remembering the one passed over and why."""
    passed = [
        *spec.extra.get(PASSED_OVER, []),
        {"type": f"{spec.gpu_type}:{spec.gpu_count}", "why": why},
    ]
    return dataclasses.replace(
        spec, gpu_type=to[0], gpu_count=to[1], extra={**spec.extra, PASSED_OVER: passed}
    )


def provision_placed(
    store: Store,
    backend: Backend,
    record: SessionRecord,
    progress: Progress,
    price: Callable[[LaunchSpec], float],
) -> SessionRecord:
    """Provision the session; with a fallback list, on NoCapacity take down what the attempt
    made and try the next type, until one has capacity (the last one's NoCapacity is raised).
    `price`: the backend's price of a spec (Backend.price_per_hour with the catalog)."""
    while True:
        try:
            current = store.get(record.id)
            placed = backend.place(current, progress)  # it writes nothing (Backend.place)
            if placed:
                spec = dataclasses.replace(current.spec, extra={**current.spec.extra, **placed})
                current = store.respec(record.id, spec)
            backend.provision(current, progress)
            return store.get(record.id)
        except NoCapacity as exc:
            record = store.get(record.id)
            following = next_type(record.spec)
            if following is None:
                raise
            backend.stop(record)  # what the attempt made (a cloud's key pair, security group)
            was = f"{record.spec.gpu_type}:{record.spec.gpu_count}"
            spec = moved_on(record.spec, following, exc.message)
            progress.step(
                f"no capacity for {was} ({exc.message}): trying {following[0]}:{following[1]} next"
            )
            record = store.retype(
                record.id,
                spec,
                price(spec),
                f"fallback: {was} passed over (no capacity); trying {following[0]}:{following[1]}",
            )


def taken_line(spec: LaunchSpec) -> str:
    """The start's line once a type of the list has capacity: which, and why not the earlier."""
    passed = "; ".join(f"{p['type']}: {p['why']}" for p in spec.extra.get(PASSED_OVER, []))
    return f"took {spec.gpu_type}:{spec.gpu_count} of {', '.join(spec.extra.get(TYPES, []))} (passed over {passed})"
