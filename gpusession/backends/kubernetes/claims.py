"""A session's workspace on Kubernetes: one PersistentVolumeClaim per workspace, named after it
and the session store (`gpusession-ws-<store>-<name>`), labelled with both, ReadWriteOnce, made
by the first session that names it (--workspace-size, --storage-class: the cluster's default
class when none is named) and kept after its pod. The pod mounts it at /workspace, the kernel's
working folder, where the agent saves the variables (stop --save, an idle stop); `--resume NAME`
mounts it again. One session at a time: a claim a live pod of another session mounts refuses a
second start. `gpusession workspaces` lists and removes this store's claims in every context and
namespace its sessions used.

Plain data in, dicts out, as pods.py: the client's objects are read with `getattr`."""

from __future__ import annotations

import hashlib
import logging
import re
import time
from typing import Any

from ...configuration.agentargs import WORKSPACE_LABEL, WORKSPACE_VOLUME_PREFIX, workspace_name
from ...core.errors import BackendUnavailable, BadInput, StageError
from ...core.models import SessionRecord, State
from ...core.progress import Progress
from ..base import Workspace
from . import apiserver, pods
from .apiserver import Cluster, answering, api_words, is_missing

log = logging.getLogger(__name__)

DEFAULT_SIZE_GIB = 10  # a new workspace's claim when --workspace-size names none
ACCESS_MODE = "ReadWriteOnce"  # what every cluster's storage gives; one node at a time
DELETE_WAIT_S = 30.0  # after a claim's delete (its pod gone), until it is
_DNS = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")


def claim_name(workspace: str, store_id: str) -> str:
    """gpusession-ws-STORE8-NAME, as DNS-1123 and a label's value allow (63 at most): a name
    that had to be changed to fit (upper case, '_', '.', long) gets a hash of itself, so two
    workspaces never share a claim."""
    base = re.sub(r"[^a-z0-9-]+", "-", workspace.lower()).strip("-")
    if base != workspace or len(base) > 38:
        digest = hashlib.sha256(workspace.encode()).hexdigest()[:8]
        base = f"{base[:29].strip('-')}-{digest}".lstrip("-")
    return f"{WORKSPACE_VOLUME_PREFIX}{store_id[:8]}-{base}"


def storage_class(text: str) -> str:
    """--storage-class: a StorageClass's name (a DNS subdomain)."""
    name = text.strip()
    if len(name) > 253 or not _DNS.fullmatch(name):
        raise BadInput(
            f"bad storage class {name!r}: a StorageClass's name, lower-case letters, digits, "
            "'-' and '.' (kubectl get storageclass lists them)"
        )
    return name


def manifest(
    name: str, workspace: str, store_id: str, size_gib: int, storage: str | None
) -> dict[str, Any]:
    """The claim: ReadWriteOnce, `size_gib` GiB, of `storage` (None: the cluster's default)."""
    spec: dict[str, Any] = {
        "accessModes": [ACCESS_MODE],
        "resources": {"requests": {"storage": f"{size_gib}Gi"}},
    }
    if storage:
        spec["storageClassName"] = storage
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": name,
            "labels": {WORKSPACE_LABEL: pods.label_value(workspace), pods.STORE_LABEL: store_id},
            "annotations": {WORKSPACE_LABEL: workspace},  # the name as written
        },
        "spec": spec,
    }


def mounted_by(pod_list, claim: str) -> list:
    """The pods of `pod_list` that mount `claim` and have not ended."""
    return [
        p
        for p in pod_list
        if p.status.phase in ("Pending", "Running")
        and any(
            v.persistent_volume_claim is not None and v.persistent_volume_claim.claim_name == claim
            for v in p.spec.volumes or []
        )
    ]


def describe(claim, cluster: Cluster) -> str:
    """'claim gpusession-ws-ab12cd34-w1 (10Gi, hostpath, Bound) in ctx/ns'."""
    spec, status = claim.spec, claim.status
    size = ((spec.resources and spec.resources.requests) or {}).get("storage", "?")
    parts = [str(size), spec.storage_class_name or "default class", status.phase or "?"]
    return (
        f"claim {claim.metadata.name} ({', '.join(parts)}) in {cluster.context}/{cluster.namespace}"
    )


def size_bytes(claim) -> int | None:
    """The claim's size as its volume has it (else as asked), in bytes."""
    have = (claim.status.capacity or {}).get("storage") or (
        (claim.spec.resources and claim.spec.resources.requests) or {}
    ).get("storage")
    try:
        return int(apiserver.sdk().utils.parse_quantity(have)) if have else None
    except ValueError:
        return None


class ClaimWorkspaces:
    """The kubernetes backend's workspace operations (mixed into KubernetesBackend, which has
    `recorder`, `name` and `places_used`)."""

    def workspace_claim(
        self, cluster: Cluster, record: SessionRecord, progress: Progress, make: bool = False
    ) -> str:
        """The session's claim, made when new (a --resume needs it to exist, unless `make`: a
        workspace moving in); refused when a live pod of another session mounts it. Recorded:
        `workspace`, `claim`, `claim_made`."""
        spec = record.spec
        workspace = workspace_name(record)
        name = claim_name(workspace, self.recorder.store_id)
        found = self._read_claim(cluster, name)
        where = f"{cluster.context}/{cluster.namespace}"
        if found is not None:
            labels = found.metadata.labels or {}
            if labels.get(pods.STORE_LABEL) != self.recorder.store_id:
                raise StageError(
                    "provision",
                    f"claim {name} in {where} belongs to another session store; name another "
                    "workspace (--workspace)",
                )
            self._refuse_in_use(cluster, name, workspace, record.id)
            progress.step(f"workspace {workspace}: {describe(found, cluster)}, kept from before")
            self.recorder.save(record.id, workspace=workspace, claim=name)
            return name
        if spec.extra.get("resume") and not make:
            raise StageError(
                "provision",
                f"no workspace {workspace} in {where} to resume (`gpusession workspaces` lists "
                "them; --context and --namespace say where to look)",
            )
        size = int(spec.extra.get("workspace_size") or DEFAULT_SIZE_GIB)
        storage = spec.extra.get("storage_class") or None
        progress.step(
            f"workspace {workspace}: new claim {name} ({size}Gi, "
            f"{f'storage class {storage}' if storage else 'the default storage class'})"
        )
        self.recorder.save(record.id, workspace=workspace, claim=name)
        body = manifest(name, workspace, self.recorder.store_id, size, storage)
        kubernetes = apiserver.sdk()
        with answering(cluster, "while creating the workspace's claim"):
            try:
                cluster.api.create_namespaced_persistent_volume_claim(
                    cluster.namespace, body, _request_timeout=30
                )
            except kubernetes.client.ApiException as exc:
                raise StageError(
                    "provision", f"the cluster refused the workspace's claim: {api_words(exc)}"
                ) from None
        self.recorder.save(record.id, claim_made=True)  # a failed start deletes it (stop)
        return name

    def _refuse_in_use(self, cluster: Cluster, claim: str, workspace: str, session_id: str) -> None:
        """StageError when a pod of another session, not ended, mounts the claim."""
        with answering(cluster, "while looking for the claim's pods"):
            listed = cluster.api.list_namespaced_pod(
                cluster.namespace, label_selector=pods.LABEL, _request_timeout=15
            ).items
        for pod in mounted_by(listed, claim):
            other = pods.owning_session(pod.metadata.labels)
            if other != session_id:
                raise StageError(
                    "provision",
                    f"workspace {workspace} is in use by pod {pod.metadata.name} (session "
                    f"{other[:8]}) in {cluster.context}/{cluster.namespace}: one session at a "
                    "time; stop that session first, or name another workspace",
                )

    def _read_claim(self, cluster: Cluster, name: str):
        """The claim, None when there is none."""
        kubernetes = apiserver.sdk()
        with answering(cluster, f"about claim {name}"):
            try:
                return cluster.api.read_namespaced_persistent_volume_claim(
                    name, cluster.namespace, _request_timeout=apiserver.REQUEST_TIMEOUT
                )
            except kubernetes.client.ApiException as exc:
                if is_missing(exc):
                    return None
                raise StageError(
                    "provision", f"cannot read claim {name}: {api_words(exc)}"
                ) from None

    def claim_waits(self, cluster: Cluster, name: str) -> str | None:
        """Why the claim is not bound yet, in the cluster's words (its newest event: 'storageclass
        .storage.k8s.io "x" not found'), None when it is bound (or cannot be asked)."""
        try:
            claim = self._read_claim(cluster, name)
        except (BackendUnavailable, StageError):
            return None
        if claim is None:
            return f"claim {name} is gone"
        if claim.status.phase == "Bound":
            return None
        said = self._newest_event(cluster, name)
        return f"claim {name} is {claim.status.phase or 'Pending'}" + (f": {said}" if said else "")

    def _newest_event(self, cluster: Cluster, name: str) -> str | None:
        """The newest event's message about the claim; None where events cannot be listed."""
        kubernetes = apiserver.sdk()
        try:
            with answering(cluster, "for the claim's events"):
                events = cluster.api.list_namespaced_event(
                    cluster.namespace,
                    field_selector=f"involvedObject.kind=PersistentVolumeClaim,involvedObject.name={name}",
                    _request_timeout=10,
                ).items
        except (kubernetes.client.ApiException, BackendUnavailable) as exc:
            log.debug("no events of claim %s: %s", name, exc)
            return None
        if not events:
            return None
        newest = max(
            events, key=lambda e: e.last_timestamp or e.event_time or e.metadata.creation_timestamp
        )
        return (newest.message or newest.reason or "").strip() or None

    def drop_claim_of_start(self, cluster: Cluster, record: SessionRecord) -> None:
        """After a start that failed (its pod deleted): the claim it made goes (nothing was ever
        saved in it); a claim that existed before stays."""
        res = record.resource
        if not res.get("claim_made") or not res.get("claim"):
            return
        if record.state not in (State.REQUESTED, State.PROVISIONING, State.STARTING):
            return
        try:  # waited for: a start again with the same workspace must not find it terminating
            self._delete_claim(cluster, res["claim"], wait=True)
        except StageError as exc:
            log.warning("%s", exc)

    def _delete_claim(self, cluster: Cluster, name: str, wait: bool) -> None:
        kubernetes = apiserver.sdk()
        with answering(cluster, f"while deleting claim {name}"):
            try:
                cluster.api.delete_namespaced_persistent_volume_claim(
                    name, cluster.namespace, _request_timeout=apiserver.REQUEST_TIMEOUT
                )
            except kubernetes.client.ApiException as exc:
                if is_missing(exc):
                    return
                raise StageError("stop", f"cannot delete claim {name}: {api_words(exc)}") from None
        deadline, delay = time.monotonic() + (DELETE_WAIT_S if wait else 0), 0.2
        while time.monotonic() < deadline:
            if self._read_claim(cluster, name) is None:
                return
            time.sleep(delay)
            delay = min(delay * 1.5, 2.0)
        if wait:
            raise StageError(
                "workspaces", f"claim {name} is still there {DELETE_WAIT_S:.0f}s after its delete"
            )

    # -- `gpusession workspaces` ----------------------------------------------------------

    def list_workspaces(self) -> list[Workspace]:
        """This store's claims in every context and namespace its sessions used (and the
        current one), with the sessions whose pods mount them now; none asked when no session
        of this store used a cluster."""
        found: dict[tuple[str, str, str], Workspace] = {}
        places, reached = self.places_used(), 0
        for context, namespace in places:
            selector = f"{WORKSPACE_LABEL},{pods.STORE_LABEL}={self.recorder.store_id}"
            try:
                cluster = place_cluster(context, namespace)
                with answering(cluster, "to the workspace listing"):
                    claims = cluster.api.list_namespaced_persistent_volume_claim(
                        cluster.namespace, label_selector=selector, _request_timeout=15
                    ).items
                    listed = cluster.api.list_namespaced_pod(
                        cluster.namespace, label_selector=pods.LABEL, _request_timeout=15
                    ).items
            except Exception as exc:  # noqa: BLE001 - one cluster never hides the others'
                log.warning(
                    "workspaces: skipping Kubernetes context %s: %s", context or "(current)", exc
                )
                continue
            reached += 1
            for claim in claims:
                key = (cluster.context, cluster.namespace, claim.metadata.name)
                found[key] = _workspace(self.name, cluster, claim, listed)
        if places and not reached:
            raise BackendUnavailable("no Kubernetes cluster answers")
        return list(found.values())

    def remove_workspace(self, workspace: Workspace) -> None:
        """Delete the claim (its volume goes as its StorageClass's reclaim policy says); refused
        while a pod not ended mounts it."""
        details = workspace.details
        cluster = place_cluster(details.get("context"), details.get("namespace"))
        with answering(cluster, "while looking for the claim's pods"):
            listed = cluster.api.list_namespaced_pod(
                cluster.namespace, label_selector=pods.LABEL, _request_timeout=15
            ).items
        using = mounted_by(listed, details["claim"])
        if using:
            raise BadInput(
                f"workspace {workspace.name} is in use by pod {using[0].metadata.name}; stop its "
                "session first"
            )
        self._delete_claim(cluster, details["claim"], wait=True)


def place_cluster(context: str | None, namespace: str | None) -> Cluster:
    """The cluster of a place as recorded (the in-cluster account's context by its mark)."""
    return apiserver.cluster(None if context == apiserver.IN_CLUSTER else context, namespace)


def _workspace(backend: str, cluster: Cluster, claim, pod_list) -> Workspace:
    annotations = claim.metadata.annotations or {}
    labels = claim.metadata.labels or {}
    name = annotations.get(WORKSPACE_LABEL) or labels.get(WORKSPACE_LABEL) or claim.metadata.name
    return Workspace(
        backend,
        name,
        describe(claim, cluster),
        size_bytes(claim),
        in_use_by=[
            pods.owning_session(p.metadata.labels)
            for p in mounted_by(pod_list, claim.metadata.name)
        ],
        details={
            "context": cluster.context,
            "namespace": cluster.namespace,
            "claim": claim.metadata.name,
        },
    )
