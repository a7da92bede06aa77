"""A session's pod: its manifest (the GPUs as an extended resource, the GPU model by node label,
the runtime's emptyDir, a command that waits for the runtime to arrive), and what its status
says while it waits (the scheduler's reason, an image that cannot be pulled) or after it ended.

Plain data in, dicts out: the client accepts a manifest as a dict, and its status objects are
read here with `getattr`, so this module never imports the apiserver."""

from __future__ import annotations

import json
import re
from typing import Any

from ...configuration.catalog import mig_profile
from ...core.errors import BadInput
from ...core.protocol import ENV_SESSION_ID

LABEL = "gpusession.session"  # on every pod of a session: its id
STORE_LABEL = "gpusession.session.store"  # which session store made it: gc takes only its own
CONTAINER = "session"  # the pod's one container
RUNTIME_VOLUME = "gpusession-runtime"  # the emptyDir at RUNTIME_ROOT the runtime is copied into
LAUNCH_ENV = "launch.env"  # in RUNTIME_ROOT: what the probe found, sourced before boot.sh
PRODUCT_LABEL = "nvidia.com/gpu.product"  # NVIDIA GPU feature discovery's label of the model
GPU_RESOURCE = "nvidia.com/gpu"
RUNTIME_WAIT_S = 600  # a pod whose runtime never arrives (its starter died) ends itself

# NVIDIA GPU feature discovery's product names for the catalog's types (a MIG slice is placed
# by its card's); KubernetesBackend.gpu_products adds or overrides, for clusters that differ
PRODUCTS = {
    "t4": "Tesla-T4",
    "l4": "NVIDIA-L4",
    "a10g": "NVIDIA-A10G",
    "v100": "Tesla-V100-SXM2-16GB",
    "a100": "NVIDIA-A100-SXM4-40GB",
    "a100-80gb": "NVIDIA-A100-SXM4-80GB",
    "h100": "NVIDIA-H100-80GB-HBM3",
    "h200": "NVIDIA-H200",
}

# Waiting reasons of a container that will not start by waiting longer
FATAL_WAITING = ("ErrImageNeverPull", "InvalidImageName", "CreateContainerConfigError")


def products_setting(text: str) -> dict[str, str]:
    """KubernetesBackend.gpu_products: a JSON object, our type -> the node label's value."""
    if not text.strip():
        return {}
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise BadInput(f'not JSON ({exc}); e.g. {{"a100": "A100-PCIE-40GB"}}') from None
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise BadInput('a JSON object of type -> label value, e.g. {"a100": "A100-PCIE-40GB"}')
    return value


def selector_setting(text: str) -> dict[str, str]:
    """KubernetesBackend.node_selector: key=value pairs, comma-separated."""
    pairs = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        key, eq, value = part.partition("=")
        if not eq or not key.strip():
            raise BadInput(f"{part!r} is no key=value (e.g. pool=gpu,zone=a)")
        pairs[key.strip()] = value.strip()
    return pairs


def tolerations_setting(text: str) -> list[dict[str, str]]:
    """KubernetesBackend.tolerations: KEY[=VALUE][:EFFECT], comma-separated, as taints are
    written (`nvidia.com/gpu:NoSchedule`); no value tolerates any (operator Exists)."""
    found = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        taint, _, effect = part.partition(":")
        key, eq, value = taint.partition("=")
        if not key.strip() or effect not in ("", "NoSchedule", "PreferNoSchedule", "NoExecute"):
            raise BadInput(
                f"{part!r}: write a toleration as KEY[=VALUE][:EFFECT], e.g. nvidia.com/gpu:NoSchedule"
            )
        toleration = {"key": key.strip(), "operator": "Equal" if eq else "Exists"}
        toleration.update({"value": value.strip()} if eq else {})
        toleration.update({"effect": effect} if effect else {})
        found.append(toleration)
    return found


def gpu_request(gpu_type: str, count: int, mig_of: str | None) -> tuple[str, str]:
    """(the extended resource the pod requests, the GPU model whose product label places it):
    nvidia.com/gpu of the type, or a MIG slice's nvidia.com/mig-<profile> on its card."""
    profile = mig_profile(gpu_type)
    if mig_of and profile:
        return f"nvidia.com/mig-{profile}", mig_of
    return GPU_RESOURCE, gpu_type


def pod_name(session_name: str, session_id: str) -> str:
    """gpusession-NAME-ID8, as DNS-1123 allows (lower case, digits, '-'; 63 at most)."""
    name = re.sub(r"[^a-z0-9-]+", "-", session_name.lower()).strip("-")[:40].strip("-")
    return f"gpusession-{name}-{session_id[:8]}" if name else f"gpusession-{session_id[:8]}"


def label_value(text: str) -> str:
    """A label's value as Kubernetes takes it: [A-Za-z0-9_.-], 63 at most, alphanumeric ends."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text)[:63].strip("-_.")


def wait_then_boot() -> str:
    """The container's command: wait for the runtime's copy (its .complete mark is written
    last), take what the probe found (LAUNCH_ENV), then the bundle's boot with the agent's
    options ("$@"). A pod whose runtime never arrives (its starter died) ends itself."""
    # lazy: docs/architecture.md#imports-kept-inside-functions
    from ...transport.bundle import CODE_DIR, COMPLETE, RUNTIME_ROOT

    failed = '{"stage":"runtime","error":"the runtime was never copied into the pod"}'
    return (
        f"i=0; while [ ! -f {CODE_DIR}/{COMPLETE} ]; do i=$((i+1)); "
        f"if [ $i -gt {RUNTIME_WAIT_S * 5} ]; then echo 'GPUSESSION_FAILED {failed}'; exit 4; fi; "
        "sleep 0.2 2>/dev/null || sleep 1; done; "
        f"[ ! -f {RUNTIME_ROOT}/{LAUNCH_ENV} ] || . {RUNTIME_ROOT}/{LAUNCH_ENV}; "
        f'exec sh {CODE_DIR}/boot.sh run "$@"'
    )


def manifest(
    *,
    name: str,
    labels: dict[str, str],
    annotations: dict[str, str],
    image: str,
    agent_argv: list[str],
    session_id: str,
    resource: tuple[str, int],
    placement: dict[str, Any],
) -> dict[str, Any]:
    """The session's pod. `placement`: node_selector, tolerations, priority_class,
    service_account (the settings, read)."""
    # lazy: docs/architecture.md#imports-kept-inside-functions
    from ...transport.bundle import RUNTIME_ROOT as runtime_root

    spec: dict[str, Any] = {
        "restartPolicy": "Never",  # a kernel that ended is not started again by the kubelet
        "enableServiceLinks": False,
        "automountServiceAccountToken": bool(placement.get("service_account")),
        "nodeSelector": placement["node_selector"],
        "tolerations": placement["tolerations"],
        "volumes": [{"name": RUNTIME_VOLUME, "emptyDir": {}}],  # the runtime, copied in
        "containers": [
            {
                "name": CONTAINER,
                "image": image,
                "imagePullPolicy": "IfNotPresent",
                "command": ["/bin/sh", "-c", wait_then_boot(), "gpusession-boot", *agent_argv],
                "env": [{"name": ENV_SESSION_ID, "value": session_id}],
                "resources": {"limits": {resource[0]: str(resource[1])}},
                "volumeMounts": [{"name": RUNTIME_VOLUME, "mountPath": runtime_root}],
            }
        ],
    }
    if placement.get("priority_class"):
        spec["priorityClassName"] = placement["priority_class"]
    if placement.get("service_account"):
        spec["serviceAccountName"] = placement["service_account"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels, "annotations": annotations},
        "spec": spec,
    }


def waiting_reason(pod) -> tuple[str, bool]:
    """Why a pending pod waits, in the cluster's words, and whether waiting longer can help:
    the scheduler's message ('0/2 nodes are available: 2 Insufficient nvidia.com/gpu.'), else
    its container's ('ErrImageNeverPull: ...'), else its phase."""
    status = pod.status
    for condition in status.conditions or []:
        if condition.type == "PodScheduled" and condition.status == "False":
            return _scheduler_words(
                condition.message or condition.reason or "not scheduled yet"
            ), True
    for container in status.container_statuses or []:
        waiting = container.state.waiting if container.state else None
        if waiting is not None and waiting.reason not in (None, "ContainerCreating"):
            text = f"{waiting.reason}: {waiting.message}" if waiting.message else waiting.reason
            return text, waiting.reason not in FATAL_WAITING
    if pod.spec.node_name:
        return f"scheduled on {pod.spec.node_name}, its container is being created", True
    return status.reason or status.phase or "Pending", True


def _scheduler_words(message: str) -> str:
    """The scheduler's first sentence, which says why ('0/2 nodes are available: 1 Insufficient
    nvidia.com/gpu, 1 node(s) didn't match Pod's node affinity/selector.'), without what it
    adds of claims and preemption."""
    text = message.split(" preemption:")[0].strip()
    if re.match(r"\d+/\d+ nodes are available:", text):
        text = text.split(". ")[0].rstrip(".") + "."
    return text.rstrip(", ")


def termination(pod) -> tuple[str | None, int | None]:
    """(the container's or the pod's reason, the exit code) of an ended pod; (None, None) while
    it runs: 'OOMKilled', 'Error', 'Evicted: The node was low on resource: memory.'"""
    for container in pod.status.container_statuses or []:
        ended = container.state.terminated if container.state else None
        if ended is not None:
            return ended.reason or "ended", ended.exit_code
    if pod.status.phase in ("Failed", "Succeeded"):
        reason = pod.status.reason or pod.status.phase
        return (f"{reason}: {pod.status.message}" if pod.status.message else reason), None
    return None, None


def owning_session(labels: dict[str, str] | None) -> str:
    return (labels or {}).get(LABEL, "")


def free_on_nodes(nodes: list, running: list, resource: str, labels: dict[str, str]) -> dict:
    """{node name: (free, allocatable)} of `resource` on the nodes whose labels hold `labels`:
    their allocatable less what the pods placed there request (pods that ended hold nothing)."""
    held: dict[str, int] = {}
    for pod in running:
        node = pod.spec.node_name
        if not node or pod.status.phase in ("Succeeded", "Failed"):
            continue
        for container in pod.spec.containers or []:
            requests = (container.resources and container.resources.requests) or {}
            limits = (container.resources and container.resources.limits) or {}
            held[node] = held.get(node, 0) + int(
                str(requests.get(resource) or limits.get(resource) or 0)
            )
    free = {}
    for node in nodes:
        have = node.metadata.labels or {}
        if all(have.get(k) == v for k, v in labels.items()):
            total = int(str((node.status.allocatable or {}).get(resource, "0")) or 0)
            free[node.metadata.name] = (max(0, total - held.get(node.metadata.name, 0)), total)
    return free
