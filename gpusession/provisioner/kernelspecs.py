"""GPU kernelspecs: what `gpusession kernelspec install|list|remove` writes, finds and removes.

A GPU kernelspec is a kernel.json whose `metadata.kernel_provisioner` names this package's
provisioner, with the start options it was installed with as its config (only those given: the
rest take the jupyter server's `GpuSessionConfig` defaults when the kernel starts):

    {"argv": [python, "-m", "gpusession.provisioner", "{connection_file}"],   (never run by
     "display_name": "Python 3 (GPU · T4)", "language": "python",              jupyter_client >= 7)
     "interrupt_mode": "message",
     "metadata": {"kernel_provisioner": {"provisioner_name": "gpusession-provisioner",
                                         "config": {"type": "t4", "idle": "30m"}}}}
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Mapping

from ..configuration import options
from ..configuration.catalog import load_catalog
from ..configuration.registry import backend_names
from ..core.errors import BadInput
from ..session import SessionManager
from ..words.common import kernel_display_name, price_note

PROVISIONER_NAME = "gpusession-provisioner"  # the entry point in jupyter_client.kernel_provisioners
_VALID_NAME = re.compile(
    r"^[a-z0-9._-]+$", re.IGNORECASE
)  # jupyter_client's rule for kernelspec names
NOT_IN_A_KERNELSPEC = ("name",)  # a session name is unique; one kernelspec starts many sessions


@dataclasses.dataclass
class GpuKernelSpec:
    """An installed GPU kernelspec."""

    name: str  # the kernelspec's name (jupyter kernelspec list)
    display_name: str  # what the launcher shows
    options: dict[str, Any]  # the start options it was installed with
    resource_dir: str  # where its kernel.json is


def check_options(values: Mapping[str, Any], face: str = options.FLAGS) -> dict[str, Any]:
    """The start options as the table reads them (BadOptions names each bad one); the values
    themselves are what the kernelspec keeps."""
    bad = [name for name in values if name in NOT_IN_A_KERNELSPEC]
    if bad:
        raise BadInput(
            f"a kernelspec cannot set {', '.join(bad)}: each of its kernels is a new session"
        )
    return options.parse_values(values, catalog=load_catalog(), backends=backend_names(), face=face)


def default_name(values: Mapping[str, Any]) -> str:
    """gpusession-t4, gpusession-a100-8-docker, gpusession-t4-docker-my-image-1: from the options
    that make the display name."""
    parts = [
        "gpusession",
        str(values["type"]),
        *(str(values[k]) for k in ("backend", "image") if values.get(k)),
    ]
    return re.sub(r"[^a-z0-9._-]+", "-", "-".join(parts).lower()).strip("-.")


def kernel_json(values: Mapping[str, Any]) -> dict[str, Any]:
    """The kernel.json of a GPU kernelspec with these (checked) start options. Its price is the
    one its sessions will be recorded with, said as the cards say it (`Backend.price_basis`:
    "cloud rate, own hardware", "configured price"), with the settings of this process."""
    parsed = check_options(values)
    gpu_type, gpu_count = (
        parsed["type"][0] if isinstance(parsed["type"], list) else parsed["type"]
    )  # a fallback list is named by its first type
    manager = SessionManager()
    spec = manager.spec_from(values, options.FLAGS)
    backend = manager.backend(spec.backend)
    price = backend.price_per_hour(spec, manager.catalog)
    return {
        "argv": [sys.executable, "-m", "gpusession.provisioner", "{connection_file}"],
        "display_name": kernel_display_name(
            gpu_type,
            gpu_count,
            parsed.get("backend"),
            parsed.get("image"),
            price,
            price_note(backend.price_basis(spec)),
        ),
        "language": "python",
        "interrupt_mode": "message",
        "metadata": {
            "kernel_provisioner": {"provisioner_name": PROVISIONER_NAME, "config": dict(values)},
            "debugger": False,
        },
    }


def _kernel_spec_manager():
    from jupyter_client.kernelspec import KernelSpecManager

    return KernelSpecManager()


def install(
    values: Mapping[str, Any],
    *,
    name: str | None = None,
    user: bool = True,
    prefix: str | None = None,
) -> GpuKernelSpec:
    """Install (or replace) a GPU kernelspec: for this user (the default), or under `prefix`
    (sys.prefix: the environment JupyterLab runs from). `values` must include "type"."""
    spec = kernel_json(values)
    name = name or default_name(values)
    if not _VALID_NAME.match(name):
        raise BadInput(f"kernelspec name {name!r}: use letters, digits, '.', '_' and '-' only")
    with tempfile.TemporaryDirectory(prefix="gpusession-kernelspec-") as tmp:
        (Path(tmp) / "kernel.json").write_text(
            json.dumps(spec, indent=1, ensure_ascii=False) + "\n"
        )
        _copy_logos(Path(tmp))
        where = _kernel_spec_manager().install_kernel_spec(
            tmp, kernel_name=name, user=user and prefix is None, prefix=prefix
        )
    return GpuKernelSpec(name, spec["display_name"], dict(values), where)


def _copy_logos(folder: Path) -> None:
    """The launcher card's icon: a GPU chip (logo-svg, which JupyterLab shows first), with
    ipykernel's Python logos for the sizes other front ends ask for."""
    try:
        from ipykernel.kernelspec import RESOURCES
    except ImportError:
        RESOURCES = None
    for logo in Path(RESOURCES).glob("logo-*") if RESOURCES else ():
        shutil.copy(logo, folder / logo.name)
    shutil.copy(Path(__file__).parent.parent / "data" / "kernel-logo.svg", folder / "logo-svg.svg")


def installed() -> list[GpuKernelSpec]:
    """Every GPU kernelspec jupyter finds (any prefix), by name."""
    found = []
    for name, entry in sorted(_kernel_spec_manager().get_all_specs().items()):
        spec = entry.get("spec") or {}
        provisioner = (spec.get("metadata") or {}).get("kernel_provisioner") or {}
        if provisioner.get("provisioner_name") == PROVISIONER_NAME:
            found.append(
                GpuKernelSpec(
                    name,
                    spec.get("display_name", name),
                    dict(provisioner.get("config") or {}),
                    entry.get("resource_dir", ""),
                )
            )
    return found


def remove(name: str) -> GpuKernelSpec:
    """Remove a GPU kernelspec; any other kernelspec is refused (BadInput)."""
    mine = {spec.name: spec for spec in installed()}
    if name not in mine:
        others = _kernel_spec_manager().find_kernel_specs()
        if name in others:
            raise BadInput(
                f"kernelspec {name!r} is not a gpusession kernelspec; `jupyter kernelspec remove` removes it"
            )
        known = ", ".join(mine) or "none installed"
        raise BadInput(f"no gpusession kernelspec named {name!r} (gpusession kernelspecs: {known})")
    _kernel_spec_manager().remove_kernel_spec(name)
    return mine[name]
