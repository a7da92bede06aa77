"""The agent's command line as the local side writes it: `args_for(record)`, the options every
backend passes to `python -m gpusession.agent run` (gpusession/agent/service.py parses them).
Below the backends and the agent, so both use it without importing each other.
"""

from __future__ import annotations

from .cost import billing_started_at
from .durations import exact_decimal


def args_for(record) -> list[str]:
    """The agent options for a session record (every backend passes these). Values are single
    words (a shell script passes them on: an instance's boot script, a batch job), and
    exact: durations in seconds with their unit ("1000800s"), numbers without an exponent, so
    the agent reads back the very values of the record."""
    spec = record.spec
    out = [
        "--idle", _seconds(spec.idle_timeout_s) if spec.idle_timeout_s else "off",
        "--price-per-hour", _num(record.price_per_hour or 0.0),
        "--gpu-count", str(int(spec.gpu_count or 1)),
    ]
    billed = billing_started_at(record)
    if billed is not None:
        out += ["--billed-since", f"{billed:.3f}"]
    if spec.gpu_only:
        out.append("--gpu-only")
    if spec.max_runtime_s:
        out += ["--max-runtime", _seconds(spec.max_runtime_s)]
    if spec.max_cost:
        out += ["--max-cost", _num(spec.max_cost)]
    for key, flag in (("gpu_threshold", "--gpu-threshold"), ("keepalive_limit_s", "--keepalive-limit"),
                      ("check_interval_s", "--check-interval")):
        if spec.extra.get(key) is not None:
            out += [flag, _num(float(spec.extra[key]))]
    if "save_timeout" in spec.extra:  # None: off, no save before a watchdog stop
        timeout = spec.extra["save_timeout"]
        out += ["--save-timeout", _seconds(timeout) if timeout else "off"]
    if spec.extra.get("save_cap") is not None:
        out += ["--save-cap", str(int(spec.extra["save_cap"]))]
    if spec.extra.get("resume"):
        out.append("--restore")
    if spec.extra.get("nvml_replay"):  # a recording to replay instead of the GPUs: only when asked
        out += ["--nvml-replay", str(spec.extra["nvml_replay"])]
    return out


def _num(value: float) -> str:
    """A number exactly, as a plain decimal: 1000800.0 -> "1000800", 0.1 -> "0.1"."""
    return exact_decimal(value)


def _seconds(value: float) -> str:
    """A duration in the grammar, exactly: "1000800s" (a bare number would mean minutes)."""
    return exact_decimal(value) + "s"


# -- the workspace (what outlives the session: a Docker volume, a folder) ------------------------

WORKSPACE_MOUNT = "/workspace"  # where a container session's workspace is mounted: its working folder
WORKSPACE_VOLUME_PREFIX = "gpusession-ws-"
WORKSPACE_LABEL = "gpusession.workspace"  # on the volume and on the session's container: its name


def workspace_name(record) -> str:
    """The session's workspace: --resume NAME, else --workspace NAME, else the session's name."""
    extra = record.spec.extra
    return extra.get("resume") or extra.get("workspace") or record.name


def workspace_volume(name: str, store_id: str) -> str:
    """The Docker volume of workspace `name` of the store `store_id`: two stores (two users of
    one engine) with a workspace of the same name never share a volume."""
    return f"{WORKSPACE_VOLUME_PREFIX}{store_id[:8]}-{name}"
