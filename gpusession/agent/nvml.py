"""Reading the GPUs through NVML, behind one seam.

The seam is the handful of NVML functions we call (`NvmlApi`). In production it is the
`pynvml` module of nvidia-ml-py, imported on first use; in tests it is `RecordedNvml`, which
replays raw values recorded from a real driver (`python -m gpusession.agent nvml-record`
writes them in that format). Everything above the seam - units, missing fields, a machine
without a driver - is our code and runs the same in both cases.

`nvmlInit` is never called at import time: only `NvmlReader.read()` starts NVML, and it
reports "no NVIDIA GPU visible" instead of raising when there is no driver or no device.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any, Callable, Mapping, Protocol

from ..configuration.metrics import nvml_error_text, nvml_kind
from .gpuvisible import visible_indices

NO_GPU_MESSAGE = "no NVIDIA GPU visible"


class NvmlApi(Protocol):
    """The NVML calls we make, with pynvml's names and raw units (bytes, mW, MHz, percent)."""

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlSystemGetDriverVersion(self) -> str: ...
    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any: ...
    def nvmlDeviceGetName(self, handle: Any) -> str: ...
    def nvmlDeviceGetUUID(self, handle: Any) -> str: ...
    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any: ...  # .gpu, .memory (%)
    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any: ...  # .used, .total (bytes)
    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int: ...  # deg C
    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int: ...  # mW
    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int: ...  # mW
    def nvmlDeviceGetClockInfo(self, handle: Any, clock: int) -> int: ...  # MHz
    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list: ...  # .pid, .usedGpuMemory
    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: Any) -> list: ...
    def nvmlSystemGetProcessName(self, pid: int) -> str: ...
    def nvmlDeviceGetMigMode(self, handle: Any) -> Any: ...  # (current, pending): 1 = MIG on
    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any) -> int: ...
    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, index: int) -> Any: ...


# pynvml's constants, repeated so that a recorded source needs no driver
NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_SM = 1


def _pynvml() -> NvmlApi:
    try:
        import pynvml
    except ImportError as exc:  # the agent runs without it, reporting no GPU
        raise ImportError("nvidia-ml-py is not installed: pip install nvidia-ml-py") from exc
    return pynvml  # type: ignore[return-value]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlReader:
    """One reading of every GPU per `read()`; starts NVML on first use, once."""

    def __init__(self, api: NvmlApi | None = None, env: Mapping[str, str] | None = None):
        self._api = api  # None: pynvml, imported on first read
        self._env = os.environ if env is None else env  # CUDA_VISIBLE_DEVICES, SLURM_JOB_GPUS
        # where the values come from, as the stats say it: the driver, or a replayed recording
        self.source = "recorded" if isinstance(api, RecordedNvml) else "nvml"
        # a replay's recording (its GPU name and count, whether of the session's type); None live
        self.recording = api.recording if isinstance(api, RecordedNvml) else None
        self._started = False
        self._unavailable: str | None = None  # set once NVML said there is no GPU
        self.driver_version: str | None = None

    def _start(self) -> None:
        if self._api is None:
            try:
                self._api = _pynvml()
            except ImportError as exc:
                self._unavailable = f"{NO_GPU_MESSAGE} ({exc})"
                return
        try:
            self._api.nvmlInit()
        except Exception as exc:  # noqa: BLE001 - an NVMLError subclass; classified below
            self._unavailable = _describe_init_error(exc)
            return
        self._started = True
        try:
            self.driver_version = _text(self._api.nvmlSystemGetDriverVersion())
        except Exception:  # noqa: BLE001 - the version is only informative
            self.driver_version = None

    def read(self) -> tuple[bool, str | None, list[dict]]:
        """(gpus_visible, message, gpus). With no GPU: (False, "no NVIDIA GPU visible ...", [])."""
        if not self._started and self._unavailable is None:
            self._start()
        if self._unavailable is not None:
            return False, self._unavailable, []
        api = self._api
        assert api is not None
        try:
            count = api.nvmlDeviceGetCount()
        except Exception as exc:  # noqa: BLE001 - NVML failing after init (driver unloaded...)
            return False, f"{NO_GPU_MESSAGE} ({nvml_error_text(_error_name(exc))})", []
        if count == 0:
            return False, f"{NO_GPU_MESSAGE} (the driver sees 0 devices)", []
        slices = mig_visible(self._env)
        if slices:  # the session was given MIG slices: read those (their memory; no utilization)
            mine = [s for i in range(count) for s in self._slices(api, i) if _named(s, slices)]
            if not mine:
                return False, f"{NO_GPU_MESSAGE} (no MIG slice of {', '.join(slices)} here)", []
            return True, None, mine
        indices, chosen_by = visible_indices(self._env, count, lambda i: _uuid(api, i))
        if not indices:
            return (
                False,
                f"{NO_GPU_MESSAGE} ({chosen_by}={self._env.get(chosen_by or '')} selects none of the {count} the driver sees)",
                [],
            )
        return True, None, [self._device(api, i) for i in indices]

    def _slices(self, api: NvmlApi, index: int) -> list[dict]:
        """The MIG slices of GPU `index` (none when MIG is off or not supported there), each
        read as a GPU with `mig` (its profile, "1g.10gb") and `parent` (the card's index)."""
        try:
            handle = api.nvmlDeviceGetHandleByIndex(index)
            if not api.nvmlDeviceGetMigMode(handle)[0]:
                return []
            most = api.nvmlDeviceGetMaxMigDeviceCount(handle)
        except Exception:  # noqa: BLE001 - NotSupported (no MIG on this board), a lost GPU
            return []
        found = []
        for k in range(most):
            try:
                part = api.nvmlDeviceGetMigDeviceHandleByIndex(handle, k)
            except Exception:  # noqa: BLE001 - NotFound: no slice in that place
                continue
            gpu = self._read_handle(api, part, {"index": index})
            name = gpu.get("name") or ""
            gpu.update(mig=name.rpartition(" MIG ")[2] or "?", parent=index, slot=k)
            found.append(gpu)
        return found

    def _device(self, api: NvmlApi, index: int) -> dict:
        gpu: dict[str, Any] = {"index": index}
        try:
            handle = api.nvmlDeviceGetHandleByIndex(index)
        except Exception as exc:  # noqa: BLE001 - e.g. GpuIsLost: report, keep the others
            # the kind only ("GpuIsLost"): each face says it with metrics.nvml_error_text
            gpu.update(
                {k: None for k in _GPU_FIELDS}, processes=[], error=nvml_kind(_error_name(exc))
            )
            return gpu
        return self._read_handle(api, handle, gpu)

    def _read_handle(self, api: NvmlApi, handle: Any, gpu: dict) -> dict:
        """A GPU's (or a MIG slice's) fields read from its handle; None where not reported."""

        def field(call: Callable[[], Any]) -> Any:
            try:
                return call()
            except Exception:  # noqa: BLE001 - NotSupported on this board: no invented number
                return None

        util = field(lambda: api.nvmlDeviceGetUtilizationRates(handle))
        mem = field(lambda: api.nvmlDeviceGetMemoryInfo(handle))
        power = field(lambda: api.nvmlDeviceGetPowerUsage(handle))
        limit = field(lambda: api.nvmlDeviceGetEnforcedPowerLimit(handle))
        gpu.update(
            name=field(lambda: _text(api.nvmlDeviceGetName(handle))),
            uuid=field(lambda: _text(api.nvmlDeviceGetUUID(handle))),
            utilization=None if util is None else float(util.gpu),
            memory_used=None if mem is None else int(mem.used),
            memory_total=None if mem is None else int(mem.total),
            temperature=field(
                lambda: float(api.nvmlDeviceGetTemperature(handle, NVML_TEMPERATURE_GPU))
            ),
            power_draw=None if power is None else round(power / 1000.0, 1),
            power_limit=None if limit is None else round(limit / 1000.0, 1),
            sm_clock=field(lambda: int(api.nvmlDeviceGetClockInfo(handle, NVML_CLOCK_SM))),
            processes=self._processes(api, handle),
        )
        return gpu

    def _processes(self, api: NvmlApi, handle: Any) -> list[dict]:
        found: dict[int, dict] = {}
        for call in (
            api.nvmlDeviceGetComputeRunningProcesses,
            api.nvmlDeviceGetGraphicsRunningProcesses,
        ):
            try:
                procs = call(handle)
            except Exception:  # noqa: BLE001 - not supported (some vGPUs): list what we can
                continue
            for p in procs:
                used = getattr(p, "usedGpuMemory", None)
                entry = found.setdefault(
                    int(p.pid), {"pid": int(p.pid), "name": None, "memory_used": None}
                )
                if used is not None:  # NVML says "not available" with None
                    entry["memory_used"] = (entry["memory_used"] or 0) + int(used)
        for entry in found.values():
            entry["name"] = _process_name(api, entry["pid"])
        return sorted(found.values(), key=lambda e: e["pid"])

    def close(self) -> None:
        if self._started and self._api is not None:
            try:
                self._api.nvmlShutdown()
            except Exception:  # noqa: BLE001 - shutting down anyway
                pass
            self._started = False


_GPU_FIELDS = (
    "name",
    "uuid",
    "utilization",
    "memory_used",
    "memory_total",
    "temperature",
    "power_draw",
    "power_limit",
    "sm_clock",
)


def _process_name(api: NvmlApi, pid: int) -> str | None:
    """/proc first (works for our own pid namespace); NVML's lookup as a fallback."""
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip() or None
    except OSError:
        pass
    try:
        return _text(api.nvmlSystemGetProcessName(pid)) or None
    except Exception:  # noqa: BLE001 - a pid of another namespace: no name
        return None


def mig_visible(env: Mapping[str, str]) -> list[str]:
    """The MIG slices (MIG-... UUIDs) the session was given: CUDA_VISIBLE_DEVICES, else
    NVIDIA_VISIBLE_DEVICES (a docker session pinned to slices of a shared box)."""
    for name in ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"):
        tokens = [t.strip() for t in env.get(name, "").split(",") if t.strip()]
        if tokens:
            return [t for t in tokens if t.upper().startswith("MIG-")]
    return []


def _named(gpu: dict, uuids: list[str]) -> bool:
    return any((gpu.get("uuid") or "").lower().startswith(u.lower()) for u in uuids)


def _uuid(api: NvmlApi, index: int) -> str | None:
    try:
        return _text(api.nvmlDeviceGetUUID(api.nvmlDeviceGetHandleByIndex(index)))
    except Exception:  # noqa: BLE001 - a lost GPU matches no UUID
        return None


def _error_name(exc: BaseException) -> str:
    return type(exc).__name__


def _describe_init_error(exc: BaseException) -> str:
    name = _error_name(exc)
    if name.startswith("NVMLError_"):
        return f"{NO_GPU_MESSAGE} ({nvml_error_text(name)})"
    return f"{NO_GPU_MESSAGE} (the NVIDIA driver's library did not start: {name}: {exc})"


# -- recorded values: the only fake ----------------------------------------------------------


class _Obj:
    def __init__(self, data: dict):
        self.__dict__.update(data)


def of_type(name: str, gpu_type: str) -> bool:
    """Whether an NVML device name is of a GPU type: 'Tesla T4' of t4, 'NVIDIA A100-SXM4-40GB'
    of a100; 'NVIDIA L4' is not of t4."""
    return bool(re.search(rf"(?<![A-Za-z0-9]){re.escape(gpu_type)}(?![A-Za-z0-9])", name, re.I))


def _copy(device: dict, round_: int) -> dict:
    """A recorded device replayed again as a further GPU (a 4-GPU session from a 2-GPU
    recording): the same values under a UUID of its own."""
    if not round_:
        return device
    uuid = device.get("uuid")
    return dict(device, uuid=f"{uuid}-{round_}") if isinstance(uuid, str) else device


class RecordedNvml:
    """Replays raw NVML values from a JSON file (format: what `nvml-record` writes).

        {"driver_version": "550.54", "init_error": null | "NVMLError_LibraryNotFound",
         "frames": [{"devices": [{"name": ..., "uuid": ..., "utilization": {"gpu": 97, "memory": 40},
                                  "memory": {"used": B, "total": B}, "temperature": C,
                                  "power_usage": mW, "power_limit": mW, "sm_clock": MHz,
                                  "compute_processes": [{"pid": 1, "usedGpuMemory": B}],
                                  "graphics_processes": [], "process_names": {"1": "python"},
                                  "mig_devices": [{...a slice, the same keys...}, null, ...]}]}]}

    A device with `mig_devices` is in MIG mode: its slices (null: an empty place) answer the
    same calls through their handles (a slice's utilization: {"error": "NVMLError_NotSupported"},
    as a real one's).

    A value may be {"error": "NVMLError_NotSupported"} to replay that error. Each
    nvmlDeviceGetCount() moves to the next frame; the last frame repeats, or with loop=True
    the frames start over (the agent's `--nvml-replay`, so that a replay keeps moving).
    """

    def __init__(
        self, data: dict, *, loop: bool = False, gpus: int | None = None, gpu_type: str = ""
    ):
        self.data = data
        self.loop = loop
        self._frame = -1
        self.init_calls = 0
        self._gpus = gpus  # replayed as this many GPUs (the session's): the recorded ones in turn
        first = next((f.get("devices") for f in data.get("frames") or [] if f.get("devices")), [])
        name = str(first[0].get("name", "")) if first and isinstance(first[0], dict) else ""
        # what was recorded, for the stats: a replay of another machine says so
        self.recording = {
            "gpu_name": name or None,
            "gpu_count": len(first),
            "of_this_type": of_type(name, gpu_type) if gpu_type else None,
        }

    @classmethod
    def from_file(
        cls,
        path: str | os.PathLike[str],
        *,
        loop: bool = False,
        gpus: int | None = None,
        gpu_type: str = "",
    ) -> "RecordedNvml":
        with open(path) as f:
            return cls(json.load(f), loop=loop, gpus=gpus, gpu_type=gpu_type)

    def _frame_index(self, count: int) -> int:
        if self.loop and count:
            return max(0, self._frame) % count
        return max(0, min(self._frame, count - 1))

    def _raise(self, name: str):
        import pynvml  # the real error classes, so our code sees what the driver would raise

        for code, cls in pynvml.NVMLError._valClassMapping.items():
            if cls.__name__ == name:
                raise pynvml.NVMLError(code)
        raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)

    def _value(self, device: int | dict, key: str) -> Any:
        dev = device if isinstance(device, dict) else self._devices()[device]
        value = dev.get(key, {"error": "NVMLError_NotSupported"})
        if isinstance(value, dict) and "error" in value:
            self._raise(value["error"])
        return value

    def _devices(self) -> list[dict]:
        frames = self.data.get("frames") or [{"devices": []}]
        recorded = frames[self._frame_index(len(frames))]["devices"]
        if self._gpus is None or not recorded or self._gpus == len(recorded):
            return recorded
        return [_copy(recorded[i % len(recorded)], i // len(recorded)) for i in range(self._gpus)]

    def nvmlInit(self) -> None:
        self.init_calls += 1
        if self.data.get("init_error"):
            self._raise(self.data["init_error"])

    def nvmlShutdown(self) -> None:
        pass

    def nvmlSystemGetDriverVersion(self) -> str:
        return self.data.get("driver_version", "")

    def nvmlDeviceGetCount(self) -> int:
        self._frame += 1
        frames = self.data.get("frames") or [{}]
        frame = frames[self._frame_index(len(frames))]
        if "count_error" in frame:
            self._raise(frame["count_error"])
        return len(self._devices())

    def nvmlDeviceGetHandleByIndex(self, index: int) -> dict:
        dev = self._devices()[index]
        if "handle_error" in dev:
            self._raise(dev["handle_error"])
        return dev

    def nvmlDeviceGetName(self, h: dict) -> str:
        return self._value(h, "name")

    def nvmlDeviceGetUUID(self, h: dict) -> str:
        return self._value(h, "uuid")

    def nvmlDeviceGetUtilizationRates(self, h: dict) -> _Obj:
        return _Obj(self._value(h, "utilization"))

    def nvmlDeviceGetMemoryInfo(self, h: dict) -> _Obj:
        return _Obj(self._value(h, "memory"))

    def nvmlDeviceGetTemperature(self, h: dict, sensor: int) -> int:
        return self._value(h, "temperature")

    def nvmlDeviceGetPowerUsage(self, h: dict) -> int:
        return self._value(h, "power_usage")

    def nvmlDeviceGetEnforcedPowerLimit(self, h: dict) -> int:
        return self._value(h, "power_limit")

    def nvmlDeviceGetClockInfo(self, h: dict, clock: int) -> int:
        return self._value(h, "sm_clock")

    def nvmlDeviceGetComputeRunningProcesses(self, h: dict) -> list:
        return [_Obj(p) for p in self._value(h, "compute_processes")]

    def nvmlDeviceGetGraphicsRunningProcesses(self, h: dict) -> list:
        return [_Obj(p) for p in self._value(h, "graphics_processes")]

    def nvmlDeviceGetMigMode(self, h: dict) -> tuple[int, int]:
        if "mig_devices" not in h:
            self._raise("NVMLError_NotSupported")
        return (1, 1)

    def nvmlDeviceGetMaxMigDeviceCount(self, h: dict) -> int:
        return 7 if "mig_devices" in h else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: dict, index: int) -> dict:
        parts = h.get("mig_devices") or []
        if index >= len(parts) or parts[index] is None:
            self._raise("NVMLError_NotFound")
        return parts[index]

    def nvmlSystemGetProcessName(self, pid: int) -> str:
        for dev in self._devices():
            name = dev.get("process_names", {}).get(str(pid))
            if name:
                return name
        self._raise("NVMLError_NotFound")


def record_raw(api: NvmlApi | None = None) -> dict:
    """One frame of raw NVML values from the real driver, in RecordedNvml's format."""
    api = api or _pynvml()
    out: dict[str, Any] = {"driver_version": None, "init_error": None, "frames": []}
    try:
        api.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - recorded as it is
        out["init_error"] = _error_name(exc)
        return out
    out["driver_version"] = _text(api.nvmlSystemGetDriverVersion())
    devices = []
    for i in range(api.nvmlDeviceGetCount()):
        h = api.nvmlDeviceGetHandleByIndex(i)
        dev: dict[str, Any] = {}

        def rec(
            key: str, call: Callable[[], Any], convert: Callable[[Any], Any] = lambda v: v
        ) -> None:
            try:
                dev[key] = convert(call())
            except Exception as exc:  # noqa: BLE001 - recorded as it is
                dev[key] = {"error": _error_name(exc)}

        rec("name", lambda: api.nvmlDeviceGetName(h), _text)
        rec("uuid", lambda: api.nvmlDeviceGetUUID(h), _text)
        rec(
            "utilization",
            lambda: api.nvmlDeviceGetUtilizationRates(h),
            lambda u: {"gpu": u.gpu, "memory": u.memory},
        )
        rec(
            "memory",
            lambda: api.nvmlDeviceGetMemoryInfo(h),
            lambda m: {"used": m.used, "total": m.total},
        )
        rec("temperature", lambda: api.nvmlDeviceGetTemperature(h, NVML_TEMPERATURE_GPU))
        rec("power_usage", lambda: api.nvmlDeviceGetPowerUsage(h))
        rec("power_limit", lambda: api.nvmlDeviceGetEnforcedPowerLimit(h))
        rec("sm_clock", lambda: api.nvmlDeviceGetClockInfo(h, NVML_CLOCK_SM))
        procs = lambda ps: [{"pid": p.pid, "usedGpuMemory": p.usedGpuMemory} for p in ps]  # noqa: E731
        rec("compute_processes", lambda: api.nvmlDeviceGetComputeRunningProcesses(h), procs)
        rec("graphics_processes", lambda: api.nvmlDeviceGetGraphicsRunningProcesses(h), procs)
        pids = {
            p["pid"]
            for k in ("compute_processes", "graphics_processes")
            if isinstance(dev[k], list)
            for p in dev[k]
        }
        dev["process_names"] = {str(pid): _process_name(api, pid) for pid in pids}
        devices.append(dev)
    out["frames"].append({"devices": devices})
    api.nvmlShutdown()
    return out
