"""What a GPU type IS, and one reference rate per GPU-hour for each: read from the data file
shipped in the package (`data/catalog.json`), with the types the installed backends declare
(`Backend.gpu_types`) merged in, and the user's own dated snapshot of the rates over it when
there is one (`catalog.json` in the data folder, written by `gpusession catalog refresh`) and it
is no older than the package's.

The reference rate is a cloud's on-demand price of one such GPU (the data file says which, and
of what date): what a backend without prices of its own charges for the user's own hardware
(cost.OWN_HARDWARE, said so on every face). How a cloud sells the GPUs (its machines, their
prices, spot) is its backend's: its own table, shown beside the catalog through
`Backend.catalog_columns`.

Names are case-insensitive and take a count, like SkyPilot's `--gpus A100:8`.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import re
import sys
from importlib import resources
from pathlib import Path
from typing import Any, Callable

from ..core.datahome import data_dir_from_env
from ..core.durations import shown
from ..core.errors import BadInput
from ..core.wholefiles import write_whole
from . import registry

log = logging.getLogger("gpusession")

_MIG_PROFILE = re.compile(r"(?:^|-)(\d+g\.\d+gb)$")


def mig_profile(type_name: str) -> str | None:
    """A MIG type's profile, the words NVIDIA, Slurm and Kubernetes name a slice by
    ('a100-1g.10gb' -> '1g.10gb'); None for a whole card's type."""
    found = _MIG_PROFILE.search(type_name)
    return found.group(1) if found else None


@dataclasses.dataclass(frozen=True)
class GpuType:
    """One GPU model in the catalog."""

    name: str  # canonical lower-case name, e.g. "a100-80gb"
    description: str  # human description
    memory_gb: int  # memory of one GPU
    rate: float  # the reference rate: dollars per hour of one such GPU (the catalog's source)
    fp16_tflops: float | None = None  # dense FP16 Tensor Core TFLOPS of one GPU (data sheet)
    fp32_tflops: float | None = None  # FP32 TFLOPS of one GPU (data sheet)
    mig_of: str | None = None  # a MIG slice: the card it is a slice of ("a100-80gb")
    share: float | None = None  # a MIG slice: its share of the card (compute slices of 7)
    declared_by: str | None = (
        None  # the backend that declared it (Backend.gpu_types); None: the package's
    )

    @property
    def is_mig(self) -> bool:
        return self.mig_of is not None


@dataclasses.dataclass(frozen=True)
class CatalogColumn:
    """A backend's own column beside the catalog (`Backend.catalog_columns`): `%gpu types`
    shows `header` with `texts[type]` ('-' where it has none); GET catalog gives each type
    `key`: `values[type]` (`missing` where it has none)."""

    header: str  # "SPOT $/GPU-H"
    key: str  # "spot_per_hour"
    values: dict[str, Any]  # type -> the value GET catalog gives
    texts: dict[str, str]  # type -> what the table shows
    missing: Any = None  # the value of a type it has none for
    note: str = ""  # words after the table's prices line ("spot: typical, ...")


@dataclasses.dataclass(frozen=True)
class Catalog:
    snapshot_date: str  # date of the rates
    region: str  # where the reference rates are from
    currency: str
    source: str  # where the reference rates are from, in words
    own_types: tuple[GpuType, ...]  # the package's (MIG slices included)
    aliases: dict[str, str]
    throughput_source: str = ""  # where fp16_tflops / fp32_tflops come from
    declared: Callable[[], dict[str, tuple[str, dict]]] = dict  # the backends' gpu_types

    @functools.cached_property
    def types(self) -> tuple[GpuType, ...]:
        """Every type: the package's, then those the installed backends declare (a name the
        package has stays the package's). Asking for them loads every backend class."""
        mine = {t.name for t in self.own_types}
        extra = []
        for name, (backend, raw) in self.declared().items():
            if name in mine:
                continue
            try:
                extra.append(_gpu_type(name, raw, declared_by=backend))
            except (KeyError, TypeError, ValueError) as exc:
                log.warning(
                    "backend %r declares GPU type %r badly (%s): left out", backend, name, exc
                )
        return self.own_types + tuple(extra)

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

    def names(self) -> list[str]:
        return [t.name for t in self.types]

    def whole_types(self) -> list[GpuType]:
        """The whole cards (no MIG slices): what clouds sell and --gpu-mem lists offer."""
        return [t for t in self.types if not t.is_mig]

    def get(self, name: str) -> GpuType:
        key = name.strip().lower()
        key = self.aliases.get(key, key)
        for t in self.own_types:  # the package's names need no backend loaded
            if t.name == key:
                return t
        for t in self.types:
            if t.name == key:
                return t
        raise BadInput(f"unknown GPU type {shown(name)}; valid types: {', '.join(self.names())}")

    def parse(self, text: str) -> tuple[GpuType, int]:
        """'A100:8' -> (a100, 8). Raises BadInput naming the valid types. How many GPUs one
        machine carries is the backend's to say (`Backend.check`)."""
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
            if count > MAX_GPUS:
                raise BadInput(
                    f"GPU count {shown(count_text, 20)} is more than one machine carries (a "
                    f"session runs on one machine: at most {MAX_GPUS}); e.g. {gpu.name}:8"
                )
        if gpu.is_mig and count > MAX_SLICES:
            raise BadInput(
                f"at most {MAX_SLICES} x {gpu.name} (use --type {gpu.name}:{MAX_SLICES} or fewer)"
            )
        return gpu, count

    def price_per_hour(self, gpu: GpuType, count: int) -> float:
        """Dollars per hour of `count` such GPUs at the reference rate."""
        return round(gpu.rate * count, 6)

    def columns(self) -> list[CatalogColumn]:
        """The installed backends' columns beside the catalog (`Backend.catalog_columns`)."""
        return registry.catalog_columns(self)

    def to_dict(self, columns: list[CatalogColumn] | None = None) -> dict[str, Any]:
        """GET catalog: every type, with the backends' `columns` (None: the installed
        backends') beside the reference rate."""
        columns = self.columns() if columns is None else columns
        return {
            "snapshot_date": self.snapshot_date,
            "prices_line": self.prices_line,
            "region": self.region,
            "currency": self.currency,
            "source": self.source,
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
                    "on_demand_per_hour": round(t.rate, 4),
                    "mig_of": t.mig_of,
                    "share": t.share,
                    "declared_by": t.declared_by,
                    **{c.key: c.values.get(t.name, c.missing) for c in columns},
                }
                for t in self.types
            ],
        }

    def table(self, columns: list[CatalogColumn] | None = None) -> str:
        """The catalog as a plain-text table (what `%gpu types` and `gpusession types` print),
        the backends' `columns` (None: the installed backends') after the reference rate; a
        MIG slice says what it is in the last column."""
        columns = self.columns() if columns is None else columns
        heads = ("TYPE", "MEMORY", "FP16", "FP32", "$/GPU-HOUR", *(c.header for c in columns))
        rows = [heads if columns else (*heads, "")]
        for t in self.types:
            speed = [self.relative_throughput(t, p) for p in ("fp16", "fp32")]
            cells = [c.texts.get(t.name, "-") for c in columns] or [""]
            if t.is_mig and cells[-1] in ("-", ""):
                cells[-1] = (
                    f"MIG slice: {round((t.share or 0) * 7)}/7 of {t.mig_of} (docker, slurm, kubernetes)"
                )
            rows.append(
                (
                    t.name,
                    f"{t.memory_gb} GB",
                    *("-" if x is None else f"{x:g}x" for x in speed),
                    f"{t.rate:.3f}",
                    *cells,
                )
            )
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
        lines = [
            ("  ".join(c.ljust(w) for c, w in zip(r[:-1], widths)) + "  " + r[-1]).rstrip()
            for r in rows
        ]
        notes = "".join(f"; {c.note}" for c in columns if c.note)
        lines.append(
            f"Prices per hour in {self.currency} ({self.region}): {self.prices_line}{notes}."
        )
        if self.throughput_source:
            lines.append(
                f"FP16/FP32: per GPU, relative to the slowest type; {self.throughput_source}."
            )
        return "\n".join(lines)


MAX_SLICES = 7  # MIG: compute slices of a card
MAX_GPUS = 64  # GPUs of one session: one machine's (each backend may say fewer: aws's 8)


def _gpu_type(name: str, raw: dict[str, Any], *, rate: float | None = None, declared_by=None):
    """A type from its data-file entry (or a backend's `gpu_types` entry, the same fields)."""
    return GpuType(
        name=name,
        description=str(raw.get("description", "")),
        memory_gb=int(raw["memory_gb"]),
        rate=float(raw["rate"]) if rate is None else rate,
        fp16_tflops=None if raw.get("fp16_tflops") is None else float(raw["fp16_tflops"]),
        fp32_tflops=None if raw.get("fp32_tflops") is None else float(raw["fp32_tflops"]),
        declared_by=declared_by,
    )


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
                rate=card.rate * share,
                fp16_tflops=None
                if card.fp16_tflops is None
                else round(card.fp16_tflops * share, 1),
                fp32_tflops=None
                if card.fp32_tflops is None
                else round(card.fp32_tflops * share, 1),
                mig_of=card.name,
                share=share,
            )
        )
    return found


USER_SNAPSHOT = "catalog.json"  # in the data folder: the user's refreshed rates


def user_snapshot_path() -> Path:
    """Where `gpusession catalog refresh` writes: catalog.json in the data folder
    (GPUSESSION_HOME, else the platform's user data folder)."""
    return Path(data_dir_from_env()) / USER_SNAPSHOT


def _stamp() -> tuple[str | None, int | None]:
    path = user_snapshot_path()
    try:
        return str(path), os.stat(path).st_mtime_ns
    except OSError:
        return None, None


def load_catalog() -> Catalog:
    """The catalog: the package's and the installed backends' types, with the user's snapshot
    of the rates over it (read again when that file changes)."""
    return _load(*_stamp(), registry.backend_classes, tuple(sys.path))


def packaged_catalog() -> Catalog:
    """The catalog shipped in the package, without the user's snapshot."""
    return _load(None, None, registry.backend_classes, tuple(sys.path))


def user_snapshot() -> dict[str, Any]:
    """The user's snapshot, as written by `write_user_snapshot`: {"snapshot_date", "source",
    "rates": {type: $/GPU-hour}, "backends": {backend: what it keeps}}; {} when there is none,
    it cannot be read, or it is older than the package's catalog."""
    return _user_snapshot(*_stamp())


def backend_snapshot(backend: str) -> dict[str, Any]:
    """What `backend`'s `list_prices` kept in the user's snapshot ({} when none)."""
    section = user_snapshot().get("backends", {}).get(backend, {})
    return section if isinstance(section, dict) else {}


def write_user_snapshot(
    rates: dict[str, float], *, date: str, source: str, backends: dict[str, Any]
) -> Path:
    """The user's snapshot: GPU type -> reference $/GPU-hour, dated, over the package's rates,
    and what each backend keeps of its own price list (`backends`)."""
    base = packaged_catalog()
    path = user_snapshot_path()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    doc = {"snapshot_date": date, "region": base.region, "currency": base.currency}
    doc.update(source=source, rates=dict(sorted(rates.items())), backends=backends)
    write_whole(path, json.dumps(doc, indent=1) + "\n")  # whole or not at all
    return path


@functools.lru_cache(maxsize=1)
def _packaged() -> dict[str, Any]:
    return json.loads(resources.files("gpusession").joinpath("data/catalog.json").read_text())


@functools.lru_cache(maxsize=4)
def _user_snapshot(path: str | None, stamp: int | None) -> dict[str, Any]:
    if path is None:
        return {}
    try:
        raw = json.loads(Path(path).read_text())
        date = str(raw["snapshot_date"])
        rates = {str(k): float(v) for k, v in raw.get("rates", {}).items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        log.warning(
            "gpusession: the catalog snapshot %s cannot be read (%s): the package's prices are "
            "used; `gpusession catalog refresh` writes it again",
            path,
            exc,
        )
        return {}
    if date < _packaged()["snapshot_date"]:  # a newer package brings newer prices
        return {}
    backends = raw.get("backends") if isinstance(raw.get("backends"), dict) else {}
    return dict(raw, rates=rates, backends=backends)


@functools.lru_cache(maxsize=8)
def _load(user_path: str | None, stamp: int | None, seam: Any, path: tuple[str, ...]) -> Catalog:
    raw = _packaged()
    header = _user_snapshot(user_path, stamp)
    mine = header.get("rates", {})
    types = [_gpu_type(name, t, rate=mine.get(name)) for name, t in raw["types"].items()]
    types += _mig_types(raw.get("mig", {}), {t.name: t for t in types})
    return Catalog(
        snapshot_date=header.get("snapshot_date", raw["snapshot_date"]),
        region=raw["region"],
        currency=raw.get("currency", "USD"),
        source=header.get("source", raw.get("source", "")),
        own_types=tuple(types),
        aliases={k.lower(): v for k, v in raw.get("aliases", {}).items()},
        throughput_source=raw.get("throughput_source", ""),
        declared=registry.declared_gpu_types,
    )
