"""GPU types and prices, read from the data file shipped in the package (`data/catalog.json`),
with the user's own snapshot of on-demand prices over it when there is one (`catalog.json` in
the data folder, written by `gpusession catalog refresh`) and it is no older than the package's.

Names are case-insensitive and take a count, like SkyPilot's `--gpus A100:8`.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from importlib import resources
from pathlib import Path
from typing import Any

from ..core.datahome import data_dir_from_env
from ..core.durations import shown
from ..core.errors import BadInput


@dataclasses.dataclass(frozen=True)
class InstanceType:
    """A cloud machine that carries `gpu_count` GPUs of one type."""

    name: str  # EC2 instance type, e.g. "g4dn.xlarge"
    gpu_count: int  # GPUs in one instance
    vcpus: int  # virtual CPUs
    on_demand: float  # dollars per hour, whole instance
    spot: float | None  # typical spot dollars per hour, None when not offered


@dataclasses.dataclass(frozen=True)
class GpuType:
    """One GPU model in the catalog."""

    name: str  # canonical lower-case name, e.g. "a100-80gb"
    description: str  # human description
    memory_gb: int  # memory of one GPU
    instances: tuple[InstanceType, ...]  # ascending by gpu_count
    fp16_tflops: float | None = None  # dense FP16 Tensor Core TFLOPS of one GPU (data sheet)
    fp32_tflops: float | None = None  # FP32 TFLOPS of one GPU (data sheet)
    mig_of: str | None = None  # a MIG slice: the card it is a slice of ("a100-80gb")
    share: float | None = None  # a MIG slice: its share of the card (compute slices of 7)
    card_on_demand: float | None = None  # a MIG slice: its card's on-demand $/GPU-hour
    card_spot: float | None = None  # ... and typical spot

    @property
    def is_mig(self) -> bool:
        return self.mig_of is not None

    def instance_for(self, count: int) -> InstanceType:
        """Smallest instance with at least `count` GPUs."""
        if self.is_mig:
            raise BadInput(
                f"{self.name} is a MIG slice of {self.mig_of}: no cloud instance carries one; "
                "start it with --backend docker (a box whose cards are split) or slurm"
            )
        for inst in self.instances:
            if inst.gpu_count >= count:
                return inst
        biggest = self.instances[-1].gpu_count
        raise BadInput(
            f"no instance carries {count} x {self.name}; the most is {biggest} "
            f"(use --type {self.name}:{biggest} or fewer)"
        )

    @property
    def per_gpu_on_demand(self) -> float:
        if self.is_mig:  # its share of its card's price
            return (self.card_on_demand or 0.0) * (self.share or 0.0)
        inst = self.instances[0]
        return inst.on_demand / inst.gpu_count

    @property
    def per_gpu_spot(self) -> float | None:
        if self.is_mig:
            return None if self.card_spot is None else self.card_spot * (self.share or 0.0)
        inst = self.instances[0]
        return None if inst.spot is None else inst.spot / inst.gpu_count


@dataclasses.dataclass(frozen=True)
class Catalog:
    snapshot_date: str  # date of the price snapshot
    region: str  # region the prices are for
    currency: str
    source: str
    types: tuple[GpuType, ...]
    aliases: dict[str, str]
    throughput_source: str = ""  # where fp16_tflops / fp32_tflops come from

    def relative_throughput(self, gpu: GpuType, precision: str = "fp16") -> float | None:
        """One GPU's throughput relative to the slowest whole card in the catalog (1.0)."""
        values = [getattr(t, f"{precision}_tflops") for t in self.whole_types()]
        floor = min((v for v in values if v), default=None)
        mine = getattr(gpu, f"{precision}_tflops")
        return None if not floor or not mine else round(mine / floor, 2)

    @property
    def prices_line(self) -> str:
        """What every face says of the prices' age: 'on-demand prices from the catalog of
        2025-11-01'."""
        return f"on-demand prices from the catalog of {self.snapshot_date}"

    def instance_types(self) -> list[str]:
        """Every instance type the catalog prices."""
        return [i.name for t in self.types for i in t.instances]

    def names(self) -> list[str]:
        return [t.name for t in self.types]

    def whole_types(self) -> list[GpuType]:
        """The whole cards (no MIG slices): what clouds sell and --gpu-mem lists offer."""
        return [t for t in self.types if not t.is_mig]

    def get(self, name: str) -> GpuType:
        key = name.strip().lower()
        key = self.aliases.get(key, key)
        for t in self.types:
            if t.name == key:
                return t
        raise BadInput(f"unknown GPU type {shown(name)}; valid types: {', '.join(self.names())}")

    def parse(self, text: str) -> tuple[GpuType, int]:
        """'A100:8' -> (a100, 8). Raises BadInput naming the valid types."""
        if not text or not text.strip():
            raise BadInput(f"no GPU type given; valid types: {', '.join(self.names())}")
        name, _, count_text = text.strip().partition(":")
        gpu = self.get(name)
        count = 1
        if count_text:
            try:
                count = int(count_text)
            except ValueError:
                raise BadInput(
                    f"bad GPU count {shown(count_text)} in {shown(text)}; write TYPE or TYPE:COUNT, e.g. a100:8"
                ) from None
            if count < 1:
                raise BadInput(f"GPU count must be at least 1, got {count}")
        if gpu.is_mig:
            if count > MAX_SLICES:
                raise BadInput(
                    f"at most {MAX_SLICES} x {gpu.name} (use --type {gpu.name}:{MAX_SLICES} or fewer)"
                )
            return gpu, count
        gpu.instance_for(count)  # validates the count
        return gpu, count

    def price_per_hour(
        self, gpu: GpuType, count: int, *, spot: bool = False, whole_instance: bool = False
    ) -> float:
        """Dollars per hour: the whole instance for cloud backends, per-GPU times count otherwise."""
        if whole_instance:
            inst = gpu.instance_for(count)
            if spot and inst.spot is not None:
                return inst.spot
            return inst.on_demand
        per_gpu = (
            gpu.per_gpu_spot if spot and gpu.per_gpu_spot is not None else gpu.per_gpu_on_demand
        )
        return round(per_gpu * count, 6)

    def to_dict(self) -> dict[str, Any]:
        return {
            "snapshot_date": self.snapshot_date,
            "prices_line": self.prices_line,
            "region": self.region,
            "currency": self.currency,
            "throughput_source": self.throughput_source,
            "types": [
                {
                    "name": t.name,
                    "description": t.description,
                    "memory_gb": t.memory_gb,
                    "fp16_tflops": t.fp16_tflops,
                    "fp32_tflops": t.fp32_tflops,
                    "relative_fp16": self.relative_throughput(t, "fp16"),
                    "relative_fp32": self.relative_throughput(t, "fp32"),
                    "on_demand_per_hour": round(t.per_gpu_on_demand, 4),
                    "spot_per_hour": None if t.per_gpu_spot is None else round(t.per_gpu_spot, 4),
                    "mig_of": t.mig_of,
                    "share": t.share,
                    "instance_types": [
                        {
                            "name": i.name,
                            "gpu_count": i.gpu_count,
                            "on_demand_per_hour": i.on_demand,
                            "spot_per_hour": i.spot,
                        }
                        for i in t.instances
                    ],
                }
                for t in self.types
            ],
        }

    def table(self) -> str:
        """The catalog as a plain-text table (what `%gpu types` and `gpusession types` print)."""
        rows = [
            (
                "TYPE",
                "MEMORY",
                "FP16",
                "FP32",
                "$/GPU-HOUR",
                "SPOT $/GPU-H",
                "AWS INSTANCES (GPUs, $/h)",
            )
        ]
        for t in self.types:
            spot = "-" if t.per_gpu_spot is None else f"{t.per_gpu_spot:.3f}"
            inst = ", ".join(f"{i.name} ({i.gpu_count}, {i.on_demand:.2f})" for i in t.instances)
            if t.is_mig:
                inst = f"MIG slice: {round((t.share or 0) * 7)}/7 of {t.mig_of} (docker, slurm)"
            speed = [self.relative_throughput(t, p) for p in ("fp16", "fp32")]
            rows.append(
                (
                    t.name,
                    f"{t.memory_gb} GB",
                    *("-" if x is None else f"{x:g}x" for x in speed),
                    f"{t.per_gpu_on_demand:.3f}",
                    spot,
                    inst,
                )
            )
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
        lines = ["  ".join(c.ljust(w) for c, w in zip(r[:-1], widths)) + "  " + r[-1] for r in rows]
        lines.append(
            f"Prices per hour in {self.currency} ({self.region}): {self.prices_line}; "
            "spot: typical, `types --live` for now."
        )
        if self.throughput_source:
            lines.append(
                f"FP16/FP32: per GPU, relative to the slowest type; {self.throughput_source}."
            )
        return "\n".join(lines)


MAX_SLICES = 7  # MIG: compute slices of a card


def _mig_types(raw: dict[str, Any], cards: dict[str, GpuType]) -> list[GpuType]:
    """The MIG profiles of the catalog's cards, each priced at its share of its card."""
    found = []
    for name, m in raw.items():
        card = cards[m["of"]]
        share = int(m["slices"]) / MAX_SLICES
        found.append(
            GpuType(
                name=name,
                description=f"MIG {name.partition('-')[2]} slice of an {card.description}",
                memory_gb=int(m["memory_gb"]),
                instances=(),
                fp16_tflops=None
                if card.fp16_tflops is None
                else round(card.fp16_tflops * share, 1),
                fp32_tflops=None
                if card.fp32_tflops is None
                else round(card.fp32_tflops * share, 1),
                mig_of=card.name,
                share=share,
                card_on_demand=card.per_gpu_on_demand,
                card_spot=card.per_gpu_spot,
            )
        )
    return found


USER_SNAPSHOT = "catalog.json"  # in the data folder: the user's refreshed on-demand prices


def user_snapshot_path() -> Path:
    """Where `gpusession catalog refresh` writes: catalog.json in the data folder
    (GPUSESSION_HOME, else the platform's user data folder)."""
    return Path(data_dir_from_env()) / USER_SNAPSHOT


def load_catalog() -> Catalog:
    """The catalog: the package's, with the user's snapshot of on-demand prices over it (read
    again when that file changes)."""
    path = user_snapshot_path()
    try:
        stamp = os.stat(path).st_mtime_ns
    except OSError:
        stamp = None
    return _load(str(path) if stamp is not None else None, stamp)


def packaged_catalog() -> Catalog:
    """The catalog shipped in the package, without the user's snapshot."""
    return _load(None, None)


def write_user_snapshot(on_demand: dict[str, float], *, date: str, source: str) -> Path:
    """The user's snapshot: instance type -> on-demand $/h, dated, over the package's prices."""
    base = packaged_catalog()
    path = user_snapshot_path()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    doc = {"snapshot_date": date, "region": base.region, "currency": base.currency}
    doc.update(source=source, on_demand=dict(sorted(on_demand.items())))
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(partial, path)  # whole or not at all
    return path


def _user_prices(path: str | None, packaged_date: str) -> tuple[dict[str, float], dict]:
    """The user's snapshot's prices and header; none when it is older than the package's."""
    if path is None:
        return {}, {}
    try:
        raw = json.loads(Path(path).read_text())
        prices = {str(k): float(v) for k, v in raw["on_demand"].items()}
        date = str(raw["snapshot_date"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        import logging

        logging.getLogger("gpusession").warning(
            "gpusession: the catalog snapshot %s cannot be read (%s): the package's prices are "
            "used; `gpusession catalog refresh` writes it again",
            path,
            exc,
        )
        return {}, {}
    if date < packaged_date:  # a newer package brings newer prices
        return {}, {}
    return prices, raw


@functools.lru_cache(maxsize=4)
def _load(user_path: str | None, stamp: int | None) -> Catalog:
    raw = json.loads(resources.files("gpusession").joinpath("data/catalog.json").read_text())
    mine, header = _user_prices(user_path, raw["snapshot_date"])
    types = []
    for name, t in raw["types"].items():
        insts = tuple(
            sorted(
                (
                    InstanceType(
                        name=i["name"],
                        gpu_count=int(i["gpu_count"]),
                        vcpus=int(i.get("vcpus", 0)),
                        on_demand=mine.get(i["name"], float(i["on_demand"])),
                        spot=None if i.get("spot") is None else float(i["spot"]),
                    )
                    for i in t["instances"]
                ),
                key=lambda i: i.gpu_count,
            )
        )
        types.append(
            GpuType(
                name=name,
                description=t.get("description", ""),
                memory_gb=int(t["memory_gb"]),
                instances=insts,
                fp16_tflops=None if t.get("fp16_tflops") is None else float(t["fp16_tflops"]),
                fp32_tflops=None if t.get("fp32_tflops") is None else float(t["fp32_tflops"]),
            )
        )
    types += _mig_types(raw.get("mig", {}), {t.name: t for t in types})
    return Catalog(
        snapshot_date=header.get("snapshot_date", raw["snapshot_date"]),
        region=raw["region"],
        currency=raw.get("currency", "USD"),
        source=header.get("source", raw.get("source", "")),
        types=tuple(types),
        aliases={k.lower(): v for k, v in raw.get("aliases", {}).items()},
        throughput_source=raw.get("throughput_source", ""),
    )
