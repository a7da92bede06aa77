"""A session's pod: its manifest (the GPUs as an extended resource, the GPU model by node label,
the runtime's emptyDir, a command that waits for the runtime to arrive), and what its status
says while it waits (the scheduler's reason, an image that cannot be pulled) or after it ended.

Plain data in, dicts out: the client accepts a manifest as a dict, and its status objects are
read here with `getattr`, so this module never imports the apiserver."""

from __future__ import annotations

import json
import re
import shlex
from typing import Any

from ...configuration.agentargs import WORKSPACE_MOUNT
from ...configuration.catalog import mig_profile
from ...core.errors import BadInput
from ...core.protocol import (
    ENV_RUNTIME_ROOT,
    ENV_SESSION_ID,
    ENV_ZYGOTE,
    NOTICE_FILES,
    Notice,
    StopDetails,
    StopKind,
    StopReason,
)

LABEL = "gpusession.session"  # on every pod of a session: its id
STORE_LABEL = "gpusession.session.store"  # which session store made it: gc takes only its own
CONTAINER = "session"  # the pod's one container
RUNTIME_VOLUME = "gpusession-runtime"  # the emptyDir at RUNTIME_ROOT the runtime is copied into
WORKSPACE_VOLUME = "workspace"  # the workspace's claim, at WORKSPACE_MOUNT
# the group that may write the workspace whatever the image's USER ("users", jupyter's jovyan's):
# the pod's fsGroup (a managed volume is given to it by the kubelet), and an init container
# gives it the volume's root folder where the kubelet does not (hostPath, some drivers)
WORKSPACE_GID = 100
LAUNCH_ENV = "launch.env"  # in RUNTIME_ROOT: what the probe found, sourced before boot.sh
PRODUCT_LABEL = "nvidia.com/gpu.product"  # NVIDIA GPU feature discovery's label of the model
GPU_RESOURCE = "nvidia.com/gpu"
RUNTIME_WAIT_S = 600  # a pod whose runtime never arrives (its starter died) ends itself
STATE_DIR = "/tmp/gpusession"  # the runtime's state folder in the pod's container
NOTICES = f"{STATE_DIR}/notices"  # the agent's notice folder (gpusession.agent.notices)
STOPPING = ".stopping"  # in NOTICES: our own stop deletes the pod, no notice to write
# the pod is kept, ended, until the session's record has read how it ended (the Job
# controller's pod tracking finalizer does the same): a pod the cluster deletes (an eviction, a
# preemption, a drained node) would otherwise take its status and log with it
FINALIZER = "gpusession.session/keep-until-read"
# a pod the cluster ends: its preStop hook has the agent save (at most NOTICE_SAVE_S), then the
# kernel gets its SIGTERM; the grace covers both (a preemption's and an eviction's are the pod's)
GRACE_S = 60
PRESTOP_WAIT_S = 40  # the hook's wait for the save (NOTICE_SAVE_S 20 and the kernel's pause)
TERMINATION_LOG = "/dev/termination-log"  # the agent's brief of its end (--termination-log)
# the reasons of the DisruptionTarget condition (Kubernetes' PodDisruptionConditions)
DISRUPTIONS = {
    "PreemptionByScheduler": "preempted by the scheduler for a higher-priority pod",
    "EvictionByEvictionAPI": "evicted (the Eviction API: a drained node, kubectl drain)",
    "DeletionByTaintManager": "its node was tainted NoExecute",
    "DeletionByPodGC": "its node is gone",
    "TerminationByKubelet": "its node's kubelet ended it (node pressure or shutdown)",
}

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


def wait_then_boot(claim: bool = False, zygote: str | None = None) -> str:
    """The container's command: wait for the runtime's copy (its .complete mark is written
    last), take what the probe found (LAUNCH_ENV), then the bundle's boot with the agent's
    options ("$@"). A pod whose runtime never arrives (its starter died) ends itself.
    With `zygote` (the image's Python, known with its ipykernel from the last pod), the kernel
    is begun first (gpusession.agent.kernelzygote): its imports go on while the runtime is
    copied in, and the first step hands it the kernel's plan instead of starting one.
    With a `claim`: run as root, the container gives the workspace's folder to WORKSPACE_GID
    itself (workspace_owner's work, so that no init container is needed: see manifest); as
    another user, a folder it cannot write ends the start, saying so, before any kernel runs."""
    # lazy: docs/architecture.md#imports-kept-inside-functions
    from ...transport.bundle import CODE_DIR, COMPLETE, RUNTIME_ROOT, zygote_source

    failed = '{"stage":"runtime","error":"the runtime was never copied into the pod"}'
    workspace = ""
    if claim:
        # one JSON line in sh's single quotes, the user's id put in between; "uid" is what the
        # start remembers of the image (its next start then prepares the claim first, as said)
        cannot = (
            '{"stage":"workspace","error":"the workspace folder '
            + WORKSPACE_MOUNT
            + " is not writable by the image user (uid '\"$(id -u)\"'): start again: "
            + 'the next start prepares it as root first","uid":\'"$(id -u 2>/dev/null || echo null)"\'}'
        )
        workspace = (
            f'if [ "$(id -u 2>/dev/null)" = 0 ]; then {_owner_script()}; '
            f"elif [ ! -w {WORKSPACE_MOUNT} ]; then echo 'GPUSESSION_FAILED {cannot}'; exit 4; fi; "
        )
    begun = ""
    if zygote:
        # started as boot.sh starts the first step (PYTHONPATH, PYTHONUNBUFFERED, the root)
        # without a locale, the LC_CTYPE that Python's start gives the first step (PEP 538), and
        # so the kernel it would spawn, set before the zygote's Python starts (else it starts
        # itself again: kernelzygote._as_pythons_child)
        begun = (
            '( [ -n "${LC_ALL:-}${LC_CTYPE:-}${LANG:-}" ] || export LC_CTYPE=C.UTF-8; '
            f'export PYTHONPATH="{CODE_DIR}/lib${{PYTHONPATH:+:$PYTHONPATH}}" PYTHONUNBUFFERED=1 '
            f"{ENV_RUNTIME_ROOT}={RUNTIME_ROOT}; exec {shlex.quote(zygote)} "
            f"-c {shlex.quote(zygote_source())} {STATE_DIR} {RUNTIME_WAIT_S + 60} ) & "
            f"{ENV_ZYGOTE}=$!; export {ENV_ZYGOTE}; "
        )
    return begun + (
        # a look every 0.05 s (the copy's end is on the start's path); counted in 20ths of a
        # second, a shell whose sleep takes whole seconds only counting 20 a turn
        f"i=0; while [ ! -f {CODE_DIR}/{COMPLETE} ]; do i=$((i+1)); "
        f"if [ $i -gt {RUNTIME_WAIT_S * 20} ]; then echo 'GPUSESSION_FAILED {failed}'; exit 4; fi; "
        "sleep 0.05 2>/dev/null || { sleep 1; i=$((i+19)); }; done; "
        f"{workspace}"
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
    claim: str | None = None,
    owner_first: bool = True,
    zygote: str | None = None,
) -> dict[str, Any]:
    """The session's pod. `placement`: node_selector, tolerations, priority_class,
    service_account (the settings, read); `claim`: the workspace's, mounted at WORKSPACE_MOUNT.
    `owner_first`: an init container gives the workspace to WORKSPACE_GID first, for an image
    whose user may not be root; one known to run as root does it itself (wait_then_boot), and
    its pod starts ~1 s sooner (an init container's own start, the kubelet's notice of its end).
    `zygote`: the image's Python, where its kernel is begun before the runtime (wait_then_boot)."""
    volumes, mounts = _volumes(claim)
    spec: dict[str, Any] = {
        "restartPolicy": "Never",  # a kernel that ended is not started again by the kubelet
        "enableServiceLinks": False,
        "automountServiceAccountToken": bool(placement.get("service_account")),
        "nodeSelector": placement["node_selector"],
        "tolerations": placement["tolerations"],
        "volumes": volumes,
        "containers": [
            _session_container(image, agent_argv, session_id, resource, mounts, claim, zygote)
        ],
        "terminationGracePeriodSeconds": GRACE_S,
    }
    if claim:
        spec["securityContext"] = {
            "fsGroup": WORKSPACE_GID,
            "fsGroupChangePolicy": "OnRootMismatch",
        }
        if owner_first:
            spec["initContainers"] = [workspace_owner(image)]
    if placement.get("priority_class"):
        spec["priorityClassName"] = placement["priority_class"]
    if placement.get("service_account"):
        spec["serviceAccountName"] = placement["service_account"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": labels,
            "annotations": annotations,
            "finalizers": [FINALIZER],
        },
        "spec": spec,
    }


def _volumes(claim: str | None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The pod's volumes and its container's mounts: the runtime's emptyDir, the claim's."""
    # lazy: docs/architecture.md#imports-kept-inside-functions
    from ...transport.bundle import RUNTIME_ROOT as runtime_root

    volumes: list[dict[str, Any]] = [{"name": RUNTIME_VOLUME, "emptyDir": {}}]  # the runtime
    mounts = [{"name": RUNTIME_VOLUME, "mountPath": runtime_root}]
    if claim:
        volumes.append({"name": WORKSPACE_VOLUME, "persistentVolumeClaim": {"claimName": claim}})
        mounts.append({"name": WORKSPACE_VOLUME, "mountPath": WORKSPACE_MOUNT})
    return volumes, mounts


def _session_container(
    image: str,
    agent_argv: list[str],
    session_id: str,
    resource: tuple[str, int],
    mounts: list,
    claim: str | None,
    zygote: str | None = None,
) -> dict[str, Any]:
    """The pod's one container: the runtime's boot once it is copied in, the GPUs asked as
    limits, the preStop hook (a save when the cluster ends the pod), the agent's brief at its end."""
    return {
        "name": CONTAINER,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": [
            "/bin/sh",
            "-c",
            wait_then_boot(bool(claim), zygote),
            "gpusession-boot",
            *agent_argv,
        ],
        "env": [{"name": ENV_SESSION_ID, "value": session_id}],
        "resources": {"limits": {resource[0]: str(resource[1])}},
        "volumeMounts": mounts,
        "lifecycle": {"preStop": {"exec": {"command": ["/bin/sh", "-c", pre_stop()]}}},
        "terminationMessagePath": TERMINATION_LOG,
    }


def pre_stop() -> str:
    """The container's preStop hook: when the cluster ends the pod (our own stop marks STOPPING
    first; a kernel not up yet has nothing to save) it leaves the agent a scheduler-signal notice
    and waits until the agent has answered it (NAME.done), so the kernel's SIGTERM comes after
    the save."""
    name = next(n for n, k in NOTICE_FILES.items() if k is Notice.SCHEDULER_SIGNAL)
    notice, done = f"{NOTICES}/{name}", f"{NOTICES}/{name}.done"
    return (
        f"[ -f {STATE_DIR}/kernel.json ] && [ ! -f {NOTICES}/{STOPPING} ] || exit 0; "
        f"mkdir -p -m 700 {NOTICES} && rm -f {done} && "
        f"""echo '{{"signal":"TERM","by":"kubernetes"}}' > {notice}.tmp && """
        f"mv {notice}.tmp {notice}; i=0; "
        f"while [ ! -f {done} ] && [ $i -lt {PRESTOP_WAIT_S * 5} ]; do "
        "sleep 0.2 2>/dev/null || sleep 1; i=$((i+1)); done; exit 0"
    )


def disruption(pod) -> str | None:
    """Why the cluster ended the pod, in words, when it did: its DisruptionTarget condition (a
    preemption, an eviction, a taint), else a kubelet's eviction (phase Failed, reason
    Evicted); None for a pod the cluster did not take back."""
    for condition in pod.status.conditions or []:
        if condition.type == "DisruptionTarget" and condition.status == "True":
            said = DISRUPTIONS.get(condition.reason or "", condition.reason or "disrupted")
            return f"{said}: {condition.message}" if condition.message else said
    if pod.status.phase == "Failed" and pod.status.reason == "Evicted":
        return f"evicted by its node's kubelet: {pod.status.message or 'node pressure'}"
    return None


def termination_brief(pod) -> StopDetails:
    """The agent's brief of its end (--termination-log), as the container's status keeps it
    after its log is gone; empty when it left none."""
    for container in pod.status.container_statuses or []:
        ended = container.state.terminated if container.state else None
        if ended is not None and ended.message:
            try:
                return StopDetails.from_dict(json.loads(ended.message))
            except ValueError:
                return StopDetails()
    return StopDetails()


def ended_by_cluster(pod, own: StopDetails) -> StopDetails:
    """`own` (what the agent said of its end), told as the cluster's taking the pod back
    (StopKind.PREEMPTED, the condition's words) when the cluster ended it: the agent only saw a
    SIGTERM. A stop the agent decided (idle, a limit) stays its own."""
    said = disruption(pod)
    if said is None or (own.reason is not None and own.reason.kind is not StopKind.SIGNAL):
        return own
    return StopDetails(
        reason=StopReason(StopKind.PREEMPTED, detail=said), at=own.at, summary=own.summary
    )


def workspace_owner(image: str) -> dict[str, Any]:
    """An init container (the session's image, as root, as the docker backend's helper) that
    gives the workspace's root folder to WORKSPACE_GID, group-writable and setgid, so that an
    image whose USER is not root writes there too; an image without chgrp goes on as it is."""
    return {
        "name": "workspace-owner",
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["/bin/sh", "-c", _owner_script()],
        "securityContext": {"runAsUser": 0, "runAsGroup": 0},
        "volumeMounts": [{"name": WORKSPACE_VOLUME, "mountPath": WORKSPACE_MOUNT}],
    }


def _owner_script() -> str:
    """As root: the workspace's folder to WORKSPACE_GID, group-writable and setgid (an image
    without chgrp goes on as it is)."""
    return (
        f"{{ chgrp {WORKSPACE_GID} {WORKSPACE_MOUNT} && chmod g+rwxs {WORKSPACE_MOUNT}; }} "
        "2>/dev/null || true"
    )


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
    # the workspace's init container first: while it cannot start, the session's says only
    # PodInitializing
    for container in [*(status.init_container_statuses or []), *(status.container_statuses or [])]:
        waiting = container.state.waiting if container.state else None
        if waiting is not None and waiting.reason not in (
            None,
            "ContainerCreating",
            "PodInitializing",
        ):
            text = f"{waiting.reason}: {waiting.message}" if waiting.message else waiting.reason
            return text, waiting.reason not in FATAL_WAITING
    if pod.spec.node_name:
        return f"scheduled on {pod.spec.node_name}, its container is being created", True
    return status.reason or status.phase or "Pending", True


def initialized(pod) -> bool:
    """Whether the pod's session container is what its node makes next: no init container (the
    workspace's owner, pods.workspace_owner), or every one has ended well, as its status says."""
    wanted = len(pod.spec.init_containers or [])
    ended = [
        status
        for status in pod.status.init_container_statuses or []
        if status.state is not None
        and status.state.terminated is not None
        and status.state.terminated.exit_code == 0
    ]
    return len(ended) >= wanted


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
