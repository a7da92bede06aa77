"""What `gpusession setup` finds for the kubernetes backend (KubernetesBackend.discover): each
context of the kubeconfig, asked for its nodes within the probe's time, with the GPUs they can
give (`nvidia.com/gpu` allocatable, by NVIDIA GPU feature discovery's product label)."""

from __future__ import annotations

import os

from ..base import Place
from .apiserver import api_words, cluster, kubeconfig_paths, sdk

GPU = "nvidia.com/gpu"
PRODUCT = "nvidia.com/gpu.product"


def contexts() -> list[str]:
    """The kubeconfig's contexts, the current one first; [] without a kubeconfig."""
    if not any(os.path.isfile(p) for p in kubeconfig_paths().split(os.pathsep) if p):
        return []
    try:
        listed, current = sdk().config.list_kube_config_contexts(config_file=kubeconfig_paths())
    except Exception:  # noqa: BLE001 - an unreadable kubeconfig is a place that says so
        return [""]
    names = [c["name"] for c in listed]
    first = (current or {}).get("name")
    return ([first] if first in names else []) + [n for n in names if n != first]


def gpu_words_of(nodes: list) -> str:
    """'2 x Tesla-T4, 1 x NVIDIA-A100-SXM4-40GB' of the nodes' allocatable GPUs; 'none'."""
    counts: dict[str, int] = {}
    for node in nodes:
        have = int(str((node.status.allocatable or {}).get(GPU, "0")) or 0)
        if have:
            product = (node.metadata.labels or {}).get(PRODUCT, "GPU")
            counts[product] = counts.get(product, 0) + have
    return ", ".join(f"{n} x {p}" for p, n in counts.items()) or "none"


def context_place(context: str, current: bool, timeout: float) -> Place:
    """One context, asked for its nodes."""
    where = f"context {context}" if context else kubeconfig_paths()
    try:
        nodes = cluster(context or None, None).api.list_node(_request_timeout=timeout).items
    except Exception as exc:  # noqa: BLE001 - any failure: it does not answer, said as such
        return Place("kubeconfig", where, "unknown", "kubernetes", False, api_words(exc)[:120])
    gpus = gpu_words_of(nodes)
    usable = gpus != "none"
    how = "" if current else f"--context {context}"
    note = how if usable else f"{len(nodes)} node(s), none with {GPU}"
    return Place("kubernetes", where, gpus, "kubernetes", usable, note)


def places(timeout: float) -> list[Place]:
    names = contexts()
    return [context_place(name, i == 0, timeout) for i, name in enumerate(names)]
