"""What every sentence shares: how a session's GPUs and a GPU kernel are named, what a price is
where it is not what a cloud bills, GPU memory and sizes in words, and "never ran". Money and
durations are written by gpusession.core.durations (format_money, format_duration). The other
modules of gpusession/words import this one."""

from __future__ import annotations

from ..configuration.cost import CONFIGURED, OWN_HARDWARE, PRICE_LIST
from ..configuration.metrics import METRICS, metric_text
from ..core.durations import format_money

# a process's GPU memory reads as the GPU's memory does
_PROCESS_MEMORY = next(m for m in METRICS if m.scope == "gpu" and m.name == "memory_used")


def gpu_label(gpu_type: str, gpu_count: int) -> str:
    """'1 x t4', '8 x a100': how a session's GPUs are named everywhere."""
    return f"{gpu_count} x {gpu_type}"


def kernel_display_name(
    gpu_type: str,
    gpu_count: int,
    backend: str | None = None,
    image: str | None = None,
    price_per_hour: float | None = None,
    note: str | None = None,
) -> str:
    """A GPU kernelspec's name in JupyterLab's launcher and kernel picker: 'Python 3 (GPU · T4)',
    'Python 3 (GPU · 8 x A100 · docker · my/image:1)' (backend and image only when chosen), with
    the price when known and where it comes from (`price_note`) as the cards say it:
    'Python 3 (GPU · T4 · $0.5260/h · cloud rate, own hardware)'."""
    gpus = gpu_type.upper() if gpu_count == 1 else f"{gpu_count} x {gpu_type.upper()}"
    price = f"{format_money(price_per_hour)}/h" if price_per_hour is not None else None
    parts = ["GPU", gpus, *(part for part in (backend, image, price, price and note) if part)]
    return "Python 3 (" + " · ".join(parts) + ")"


#: an ended session that never got a billed resource (gpusession.configuration.cost.never_ran)
NEVER_RAN = "never ran"


# what a price is, where it is not what a cloud bills (gpusession.configuration.cost's price bases)
_PRICE_NOTES = {
    OWN_HARDWARE: "cloud rate, own hardware",
    CONFIGURED: "configured price",
    PRICE_LIST: "its backend's price list",
}


def price_note(basis: str | None) -> str | None:
    """'cloud rate, own hardware' for the catalog's rate applied to the user's own machine,
    'configured price' for a price the user set; None for what a cloud bills."""
    return _PRICE_NOTES.get(basis or "")


def memory_text(n: int | None) -> str:
    """GPU memory in bytes as the status lines say it ('3.1 GiB'); '?' when unknown."""
    return "?" if n is None else metric_text(_PROCESS_MEMORY, n)


def size_text(n: int | None) -> str:
    """1.2 GB, 340 MB, 12 kB, 512 bytes; '?' when unknown."""
    if n is None:
        return "?"
    for unit, size in (("TB", 1000**4), ("GB", 1000**3), ("MB", 1000**2), ("kB", 1000)):
        if n >= size:
            return f"{n / size:.1f} {unit}" if n < 10 * size else f"{n / size:.0f} {unit}"
    return f"{n} bytes"


def price_list_lines(lists: list[dict]) -> list[str]:
    """`%gpu types` / `gpusession types` under the catalog: each backend's own prices
    (registry.price_lists): 'demo (the demo price list): t4 $0.1100, a100 $1.2000 per GPU-hour'."""
    return [
        f"{row['backend']} ({row['source']}): "
        + ", ".join(f"{t} {format_money(p)}" for t, p in row["prices"].items())
        + " per GPU-hour"
        for row in lists
    ]


def free_now_lines(rows: list[dict]) -> list[str]:
    """`%gpu types` / `gpusession types` last: what each pool's boxes have free now
    (session.discovery.free_now), a line a box:
    'pool lab  ssh://gpu1  2 of 8 free (2 x NVIDIA A100-SXM4-40GB)'."""
    if not rows:
        return []
    lines = ["free now on shared boxes:"]
    for row in rows:
        where = f"  {row['place']}  {row['host']}  "
        if row.get("skipped"):
            lines.append(f"{where}skipped: {row['skipped']}")
            continue
        free = row.get("free") or {}
        kinds = ", ".join(f"{n} x {name}" for name, n in sorted(free.items()))
        count = sum(free.values())
        lines.append(
            f"{where}{count} of {row.get('gpus', 0)} free" + (f" ({kinds})" if kinds else "")
        )
    return lines
