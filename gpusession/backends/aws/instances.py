"""The aws backend's price source: the EC2 instance types that carry each GPU type, with their
on-demand and typical spot prices (`instances.json` beside this module), the on-demand prices of
the user's snapshot over them (`gpusession catalog refresh` keeps them there, under "aws").

The core catalog (configuration/catalog.py) says what a GPU type is and its reference rate; this
table says how EC2 sells it: `instance_for` picks the machine, `price` its dollars per hour.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from importlib import resources
from typing import Any

from ...configuration.catalog import CatalogColumn, GpuType, backend_snapshot
from ...core.errors import BadInput

BACKEND = "aws"  # its section of the user's snapshot


@dataclasses.dataclass(frozen=True)
class InstanceType:
    """An EC2 machine that carries `gpu_count` GPUs of one type."""

    name: str  # EC2 instance type, e.g. "g4dn.xlarge"
    gpu_count: int  # GPUs in one instance
    vcpus: int  # virtual CPUs
    on_demand: float  # dollars per hour, whole instance
    spot: float | None  # typical spot dollars per hour, None when not offered


@dataclasses.dataclass(frozen=True)
class InstanceTable:
    snapshot_date: str  # the package's table's date
    region: str  # where its prices are for
    source: str  # where its prices come from, in words
    by_type: dict[str, tuple[InstanceType, ...]]  # GPU type -> instances, ascending by gpu_count

    def instances(self, gpu: GpuType) -> tuple[InstanceType, ...]:
        return self.by_type.get(gpu.name, ())

    def names(self) -> list[str]:
        """Every instance type the table prices."""
        return [i.name for rows in self.by_type.values() for i in rows]

    def instance_for(self, gpu: GpuType, count: int) -> InstanceType:
        """The smallest instance with at least `count` x `gpu`; BadInput saying why none."""
        if gpu.is_mig:
            raise BadInput(
                f"{gpu.name} is a MIG slice of {gpu.mig_of}: no cloud instance carries one; "
                "start it with --backend docker (a box whose cards are split) or slurm"
            )
        rows = self.instances(gpu)
        if not rows:
            raise BadInput(
                f"no EC2 instance carries {gpu.name}; aws gives {', '.join(self.by_type)}"
            )
        for inst in rows:
            if inst.gpu_count >= count:
                return inst
        biggest = rows[-1].gpu_count
        raise BadInput(
            f"no instance carries {count} x {gpu.name}; the most is {biggest} "
            f"(use --type {gpu.name}:{biggest} or fewer)"
        )

    def price(self, gpu: GpuType, count: int, *, spot: bool = False) -> float:
        """Dollars per hour of the whole instance that carries them (its typical spot price
        when `spot` and it has one)."""
        inst = self.instance_for(gpu, count)
        return inst.spot if spot and inst.spot is not None else inst.on_demand

    def per_gpu(self, gpu: GpuType, *, spot: bool = False) -> float | None:
        """One GPU's share of its smallest instance's price (spot: None when not offered)."""
        rows = self.instances(gpu)
        if not rows:
            return None
        inst = rows[0]
        if spot:
            return None if inst.spot is None else inst.spot / inst.gpu_count
        return inst.on_demand / inst.gpu_count

    def columns(self, types: list[GpuType]) -> list[CatalogColumn]:
        """`%gpu types`' SPOT and AWS INSTANCES columns, and GET catalog's `spot_per_hour` and
        `instance_types` of each type."""
        spot = {t.name: self.per_gpu(t, spot=True) for t in types}
        spot = {k: v for k, v in spot.items() if v is not None}
        listed = {t.name: self.instances(t) for t in types if self.instances(t)}
        return [
            CatalogColumn(
                header="SPOT $/GPU-H",
                key="spot_per_hour",
                values={k: round(v, 4) for k, v in spot.items()},
                texts={k: f"{v:.3f}" for k, v in spot.items()},
                note="spot: typical, `types --live` for now",
            ),
            CatalogColumn(
                header="AWS INSTANCES (GPUs, $/h)",
                key="instance_types",
                values={k: [_row(i) for i in rows] for k, rows in listed.items()},
                texts={
                    k: ", ".join(f"{i.name} ({i.gpu_count}, {i.on_demand:.2f})" for i in rows)
                    for k, rows in listed.items()
                },
                missing=[],
            ),
        ]


def _row(inst: InstanceType) -> dict[str, Any]:
    return {
        "name": inst.name,
        "gpu_count": inst.gpu_count,
        "on_demand_per_hour": inst.on_demand,
        "spot_per_hour": inst.spot,
    }


def instance_table() -> InstanceTable:
    """The table: the package's, with the user's refreshed on-demand prices over it."""
    mine = backend_snapshot(BACKEND).get("on_demand", {})
    try:
        key = tuple(sorted((str(k), float(v)) for k, v in mine.items()))
    except (AttributeError, TypeError, ValueError):  # a hand-edited snapshot: the package's
        key = ()
    return _table(key)


def packaged_table() -> InstanceTable:
    """The table shipped in the package, without the user's snapshot."""
    return _table(())


@functools.lru_cache(maxsize=4)
def _table(on_demand: tuple[tuple[str, float], ...]) -> InstanceTable:
    raw = json.loads(
        resources.files(__package__).joinpath("instances.json").read_text(encoding="utf-8")
    )
    mine = dict(on_demand)
    by_type = {
        name: tuple(
            sorted(
                (
                    InstanceType(
                        name=i["name"],
                        gpu_count=int(i["gpu_count"]),
                        vcpus=int(i.get("vcpus", 0)),
                        on_demand=mine.get(i["name"], float(i["on_demand"])),
                        spot=None if i.get("spot") is None else float(i["spot"]),
                    )
                    for i in rows
                ),
                key=lambda i: i.gpu_count,
            )
        )
        for name, rows in raw["instances"].items()
    }
    return InstanceTable(
        snapshot_date=raw["snapshot_date"],
        region=raw["region"],
        source=raw.get("source", ""),
        by_type=by_type,
    )
