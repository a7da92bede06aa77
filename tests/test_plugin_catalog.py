"""A backend declares its own catalog rows (`Backend.gpu_types`) and columns
(`Backend.catalog_columns`): installed through the registry seam (configuration/registry.py
`backend_classes`), its type is in the catalog on every face - `%gpu types`, `gpusession types`'
table, REST GET catalog (what the sidebar's form lists), --type - priced at its reference rate,
and weighed by the backend's own prices where it has them (advice, --cheapest)."""

from __future__ import annotations

import json

import pytest

import gpusession.configuration.registry as registry
from gpusession.backends.base import Backend
from gpusession.configuration import options
from gpusession.configuration.advice import rater
from gpusession.configuration.catalog import CatalogColumn, load_catalog
from gpusession.configuration.config import GpuSessionConfig
from gpusession.core.errors import BadInput
from gpusession.faces.magics import GpuMagics


class TinyBackend(Backend):
    """A plugin's backend with a GPU the package's catalog does not know."""

    name = "tiny"
    gpu_types = {
        "MI300X": {
            "description": "AMD Instinct MI300X",
            "memory_gb": 192,
            "rate": 4.5,
            "fp16_tflops": 1307,
            "fp32_tflops": 163.4,
        },
        "t4": {"description": "not the package's t4", "memory_gb": 1, "rate": 99.0},
        "broken": {"description": "no memory said"},
    }
    price_list = {"mi300x": 3.25}
    price_source = "the tiny price list"

    @classmethod
    def catalog_columns(cls, catalog):
        return [
            CatalogColumn(
                header="TINY RACKS",
                key="tiny_racks",
                values={"mi300x": 4},
                texts={"mi300x": "4 racks"},
                note="racks: the tiny site's",
            )
        ]

    def provision(self, record, progress):
        raise NotImplementedError("a tiny backend starts nothing")

    def connect(self, record, progress):
        raise NotImplementedError

    def is_alive(self, record):
        return False

    def stop(self, record):
        pass

    def list_resources(self):
        return []

    def remove_resource(self, resource):
        pass


@pytest.fixture
def tiny(monkeypatch):
    """The seam replaced: tiny and local are the installed backends."""
    local = registry.registered()["local"]
    monkeypatch.setattr(
        registry, "backend_classes", lambda: {"tiny": f"{__name__}:TinyBackend", "local": local}
    )


def test_its_type_is_in_the_catalog_and_the_packages_types_stay_the_packages(tiny):
    cat = load_catalog()
    gpu, count = cat.parse("MI300X:2")
    assert (gpu.name, count, gpu.memory_gb, gpu.rate) == ("mi300x", 2, 192, 4.5)
    assert gpu.declared_by == "tiny" and not gpu.is_mig
    assert cat.price_per_hour(gpu, 2) == 9.0  # own hardware elsewhere: the reference rate
    assert cat.get("t4").memory_gb == 16  # a package's name is never taken over
    with pytest.raises(BadInput, match="unknown GPU type 'broken'.*mi300x"):
        cat.parse("broken")  # a row it declares badly is left out, named nowhere
    doc = options.options_document(
        GpuSessionConfig(), catalog=cat, backends=["tiny", "local"], backend_default="local"
    )
    assert "mi300x" in next(o for o in doc["options"] if o["kind"] == "gpu_type")["choices"]


def test_gone_when_its_backend_is_not_installed():
    with pytest.raises(BadInput, match="unknown GPU type 'mi300x'"):
        load_catalog().parse("mi300x")


def test_percent_gpu_types_shows_its_row_and_its_column(tiny, manager, capsys):
    GpuMagics(None, manager=manager).gpu("types")
    out = capsys.readouterr().out
    head = out.splitlines()[0].split()
    assert head[:5] == ["TYPE", "MEMORY", "FP16", "FP32", "$/GPU-HOUR"] and "TINY" in head
    row = next(line for line in out.splitlines() if line.startswith("mi300x "))
    assert "192 GB" in row and "4.500" in row and row.endswith("4 racks"), row
    assert "; racks: the tiny site's." in out
    assert "tiny (the tiny price list): mi300x $3.25 per GPU-hour" in out


async def test_rest_get_catalog_carries_its_type_and_its_column(tiny, jp_fetch):
    doc = json.loads((await jp_fetch("gpusession", "api", "catalog")).body)
    mine = next(t for t in doc["types"] if t["name"] == "mi300x")
    assert mine["memory_gb"] == 192 and mine["on_demand_per_hour"] == 4.5
    assert mine["declared_by"] == "tiny" and mine["tiny_racks"] == 4
    t4 = next(t for t in doc["types"] if t["name"] == "t4")
    assert t4["tiny_racks"] is None and "instance_types" not in t4  # no aws installed here


def test_advice_and_cheapest_weigh_by_its_own_prices(tiny):
    cat = load_catalog()
    mi = cat.get("mi300x")
    assert rater(cat, "tiny")(mi, 2) == 6.5  # its price list over the reference rate
    assert rater(cat, "local")(mi, 2) == 9.0
    order = options.type_choices(
        [("mi300x", 1), ("h100", 1)], catalog=cat, by_price=True, backend="tiny"
    )
    assert order == [("mi300x", 1), ("h100", 1)]  # 3.25 < 6.88
    order = options.type_choices(
        [("mi300x", 1), ("a100", 1)], catalog=cat, by_price=True, backend="local"
    )
    assert order == [("a100", 1), ("mi300x", 1)]  # 2.745 < 4.5
