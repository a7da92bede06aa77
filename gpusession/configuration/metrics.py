"""THE table of the GPU and session metrics every face shows, and their one text format.

A row names a field of the agent's stats document (docs/gpu-agent.md "The stats document"): of a
GPU (`scope="gpu"`, an item of `sample["gpus"]`) or of the sample itself (`scope="host"`: the
session's processes). The CLI and magic words (gpusession/words) and the ipywidgets card read the rows
here; the JupyterLab sidebar and charts get them with `GET options` (`options_document`'s
"metrics") and format with labextension/src/format.ts `formatMetric`, held to `metric_text` by
tests/data/format_cases.json. Adding a metric is a row here plus the sampler that fills its field.
NVML's errors are said in words here too (`nvml_error_text`), for the agent's no-GPU message and
each face's lost GPU. Standard library only: the agent imports it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Mapping

GIB = 1024**3
MIB = 1024**2


@dataclass(frozen=True)
class Metric:
    name: str  # its field in the stats document: "power_draw"
    scope: str  # "gpu": a field of each GPU; "host": of the sample (the session's processes)
    key: str  # a short id: CSS classes, data-metric ("gpusession-gpu-power")
    label: str  # a large chart's caption: "Power"
    short: str  # a sparkline's, a gauge's and the words' caption: "Power"
    unit: str  # what the number is shown in: "%", "W", "°C", "GiB", "MHz"
    scale: float  # the field's value / scale = the number in `unit` (bytes / 2**30 = GiB)
    digits: int  # decimals shown
    format: str = "number"  # "number"; "bytes": below 1 GiB in MiB without decimals ("76 MiB")
    limit: str | None = None  # the field of the same object it is drawn against: "power_limit"
    top: float | None = None  # without a limit: top of its scale, grown in these steps to fit
    charted: bool = True  # drawn (sparkline, chart, gauge); False: only in the words


METRICS: tuple[Metric, ...] = (
    Metric("utilization", "gpu", "util", "Utilization", "Util", "%", 1, 0, top=100),
    Metric(
        "memory_used",
        "gpu",
        "memory",
        "Memory",
        "Mem",
        "GiB",
        GIB,
        1,
        "bytes",
        limit="memory_total",
    ),
    Metric("temperature", "gpu", "temp", "Temperature", "Temp", "°C", 1, 0, top=100),
    Metric("power_draw", "gpu", "power", "Power", "Power", "W", 1, 0, limit="power_limit"),
    Metric("sm_clock", "gpu", "sm-clock", "SM clock", "SM", "MHz", 1, 0, charted=False),
    Metric("cpu_percent", "host", "cpu", "CPU (100% = one core)", "CPU", "%", 1, 0, top=100),
    Metric(
        "memory_used", "host", "ram", "Memory", "RAM", "GiB", GIB, 1, "bytes", limit="memory_total"
    ),
)


def metrics(scope: str) -> list[Metric]:
    """The rows of one scope ("gpu" or "host"), in the order the faces show them."""
    return [m for m in METRICS if m.scope == scope]


def metric_rows() -> list[dict[str, Any]]:
    """The table as `GET options` serves it (labextension/src/types.ts MetricView)."""
    return [asdict(m) for m in METRICS]


def _number(metric: Metric, raw: float) -> tuple[str, str]:
    """The number and the unit one value is shown in: ("67", "W"), ("76", "MiB")."""
    if metric.format == "bytes" and abs(raw) < GIB:
        return f"{raw / MIB:.0f}", "MiB"
    return f"{raw / metric.scale:.{metric.digits}f}", metric.unit


def _with_unit(number: str, unit: str) -> str:
    return number + unit if unit == "%" else f"{number} {unit}"


def metric_text(metric: Metric, value: float | None, limit: float | None = None) -> str:
    """One value as every face shows it: '57%', '70 °C', '67/70 W', '10.2/15.0 GiB',
    '76 MiB/23.5 GiB' (against its limit when the row has one and it is known); 'n/a' when the
    board does not report it."""
    if value is None:
        return "n/a"
    number, unit = _number(metric, value)
    if limit is None:
        return _with_unit(number, unit)
    top, top_unit = _number(metric, limit)
    if top_unit == unit:
        return _with_unit(f"{number}/{top}", unit)
    return f"{_with_unit(number, unit)}/{_with_unit(top, top_unit)}"


# NVML's error kinds (pynvml's NVMLError_<kind>), in words; {gpu} is "GPU 1" or "the GPU"
NVML_ERRORS = {
    "GpuIsLost": "{gpu} is lost: the driver no longer sees it",
    "LibraryNotFound": "no NVIDIA driver here: libnvidia-ml.so is not found",
    "DriverNotLoaded": "the NVIDIA driver is not loaded on this machine",
    "NoPermission": "this user may not read the GPUs",
    "NotFound": "the driver found no such GPU",
    "Uninitialized": "the NVIDIA driver's library did not start",
    "NotSupported": "this board does not report it",
    "ResetRequired": "{gpu} needs a reset",
    "InsufficientPower": "{gpu} does not get enough power: check its power cables",
    "Timeout": "the driver did not answer in time",
    "Unknown": "the driver failed with an unknown error",
}


def nvml_kind(error: str) -> str:
    """The kind of an NVML error as the agent sends it: "NVMLError_GpuIsLost: GPU is lost" or
    "GpuIsLost" -> "GpuIsLost"."""
    kind = error.split(":", 1)[0].strip()
    return kind[len("NVMLError_") :] if kind.startswith("NVMLError_") else kind


def nvml_error_text(error: str, gpu: int | None = None) -> str:
    """An NVML error in words, as every face says it: "GPU 1 is lost: the driver no longer sees
    it" (a kind not in NVML_ERRORS: its name in words, "the driver said: memory")."""
    kind = nvml_kind(error)
    words = NVML_ERRORS.get(kind)
    if words is None:
        spaced = "".join(f" {c.lower()}" if c.isupper() else c for c in kind).strip()
        words = f"the driver said: {spaced or 'an unknown error'}"
    return words.format(gpu=f"GPU {gpu}" if gpu is not None else "the GPU")


def metric_of(metric: Metric, item: Mapping[str, Any]) -> str:
    """`metric_text` of a GPU dict or a sample dict of the stats document."""
    return metric_text(
        metric, item.get(metric.name), item.get(metric.limit) if metric.limit else None
    )
