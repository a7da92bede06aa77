"""`kubernetes`: the session kernel runs in a pod of a Kubernetes cluster, from any image with a
python3, reached through the API server; nothing of gpusession runs in the cluster before.

provision  a pod labelled with the session and the store, requesting the type's GPUs as the
           extended resource nvidia.com/gpu (a MIG slice: nvidia.com/mig-<profile>), placed on
           the GPU model by NVIDIA GPU feature discovery's label nvidia.com/gpu.product; while it
           waits, the scheduler's reason is shown ("0/2 nodes are available: 2 Insufficient
           nvidia.com/gpu"), and --queue-timeout gives up. It mounts the workspace's
           PersistentVolumeClaim at /workspace, made when new and kept after the pod
           (claims.py). Once it runs, the runtime bundle is copied into its emptyDir over exec
           (runtime_copy.py) and the container boots it
connect    the runtime's READY in the pod's log, kernel.json read over exec, and the kernel's
           loopback ports forwarded here through the API server's port-forward (portforward.py)
stop       delete the pod and wait until it is gone (the claim stays, unless a failed start
           made it); an idle stop ends the pod from inside, its agent saving into the claim first
gc         pods carry gpusession.session (the session id) and gpusession.session.store labels;
           claims gpusession.workspace and the store's (`gpusession workspaces`; never gc's)

The cluster is the kubeconfig's, as kubectl finds it (KUBECONFIG, ~/.kube/config; --context,
--namespace), or the pod's own service account when gpusession runs in a pod. docs/kubernetes.md.
"""

from __future__ import annotations

import json
import logging
import secrets
import time
from typing import Any, Iterable

from ...configuration.agentargs import WORKSPACE_MOUNT, AgentArgs, workspace_name
from ...configuration.catalog import load_catalog
from ...configuration.cost import BILLED_FROM
from ...configuration.options import StartOption
from ...configuration.settings import BUILTIN_IMAGE, Setting
from ...core import textvalues
from ...core.durations import QUEUE_TIMEOUT, format_duration
from ...core.envnames import KERNEL_PORT_NAMES
from ...core.errors import BackendUnavailable, BadInput, NoCapacity, StageError
from ...core.models import LaunchSpec, SessionRecord, State
from ...core.progress import Progress
from ...core.protocol import Marker, StopDetails, StopKind, StopReason, parse_marker
from ..base import (
    Backend,
    Link,
    Place,
    RemoteResource,
    WorkspaceExport,
    before_the_last,
    log_tail,
    marker_lines,
    stop_details_from_log,
)
from . import apiserver, pods
from .apiserver import Cluster, answering, api_words, is_missing
from .claims import ClaimWorkspaces, claim_name, place_cluster, storage_class

log = logging.getLogger(__name__)

STATE_DIR = pods.STATE_DIR  # the runtime's state folder in the pod's container
START_TIMEOUT = 120.0  # from the runtime's copy to its READY
STOP_WAIT_S = 60.0  # after the delete, until the pod is gone
STOP_GRACE_S = 10  # the runtime's time to end the kernel after SIGTERM
START_LOG_BYTES = 4096
POLL_MAX_S = 2.0
# a start's waits (the pod to run, the kernel's READY) ask every POLL_FIRST_S while most starts
# end (a pod runs within seconds): a growing pause from the first ask cost up to a second of
# every start, and a 0.2 s one ~0.1 s at each of the two waits (bench_kubernetes); longer waits
# (a queue, a pull) back off to POLL_MAX_S
POLL_FIRST_S, POLL_FLAT_FOR_S = 0.05, 5.0


def _pause(started: float, delay: float, grow: float, cap: float) -> float:
    """The next pause of a start's wait that began at `started`: POLL_FIRST_S for its first
    POLL_FLAT_FOR_S, then growing by `grow` up to `cap`."""
    if time.monotonic() - started < POLL_FLAT_FOR_S:
        return POLL_FIRST_S
    return min(max(delay, POLL_FIRST_S) * grow, cap)


class KubernetesBackend(ClaimWorkspaces, Backend):
    name = "kubernetes"
    takes_image = True
    keeps_workspaces = True  # a PersistentVolumeClaim per workspace (claims.py)
    shares_workspaces = False  # ReadWriteOnce: one session's pod at a time
    place_option = "context"  # a claim lives in its cluster (and namespace)
    place_here = "the kubeconfig's current context"
    image_help = "any image with a python3 the nodes can pull; pytorch/pytorch, CUDA 12.6 by default (KubernetesBackend.image)"
    order = 35
    stop_words = {
        "instance-ended": "its pod ended: {detail}",
        "gone": "its pod is gone",
        "preempted": "the cluster took its pod back: {detail}",
    }
    settings = (
        Setting(
            "image",
            "GPUSESSION_KUBERNETES_IMAGE",
            BUILTIN_IMAGE,
            "Image for kubernetes sessions when --image names none: any image with a python3 "
            "(3.9 or newer) the cluster's nodes can pull.",
        ),
        Setting(
            "gpu_products",
            "GPUSESSION_KUBERNETES_GPU_PRODUCTS",
            "",
            "The nvidia.com/gpu.product label value of each GPU type, where the cluster's "
            'nodes are labelled otherwise than GPU feature discovery does: a JSON object, e.g. {"a100": '
            '"NVIDIA-A100-PCIE-40GB"}, over the built-in names (docs/kubernetes.md). Empty means those.',
            parse=pods.products_setting,
        ),
        Setting(
            "node_selector",
            "GPUSESSION_KUBERNETES_NODE_SELECTOR",
            "",
            "More node labels a session's pod must match, key=value pairs, comma-separated "
            "(e.g. pool=gpu). Empty means the GPU model's label only.",
            parse=pods.selector_setting,
        ),
        Setting(
            "tolerations",
            "GPUSESSION_KUBERNETES_TOLERATIONS",
            "nvidia.com/gpu:NoSchedule",
            "Taints a session's pod tolerates, KEY[=VALUE][:EFFECT], comma-separated, as the "
            "GPU nodes' taints are written.",
            parse=pods.tolerations_setting,
        ),
        Setting(
            "priority_class",
            "GPUSESSION_KUBERNETES_PRIORITY_CLASS",
            "",
            "The PriorityClass of a session's pod. Empty means the cluster's default.",
        ),
        Setting(
            "service_account",
            "GPUSESSION_KUBERNETES_SERVICE_ACCOUNT",
            "",
            "The service account a session's pod runs as (its token is mounted then). Empty "
            "means the namespace's default, with no token mounted.",
        ),
    )
    start_options = (
        StartOption(
            "context",
            ("--context",),
            "text",
            "Context",
            "kubernetes: the kubeconfig context (default: its current one, as kubectl; in a pod, "
            "the pod's own service account)",
            "context",
            max_len=253,
        ),
        StartOption(
            "namespace",
            ("--namespace",),
            "text",
            "Namespace",
            "kubernetes: the namespace of the session's pod (default: the context's, else default)",
            "namespace",
            max_len=63,
        ),
        StartOption(
            "queue_timeout",
            ("--queue-timeout",),
            "duration",
            "Queue timeout",
            "kubernetes: delete the pod when it still waits for its GPUs after this long "
            "(default: off, it waits until it runs or Ctrl-C)",
            "queue timeout",
            rule=QUEUE_TIMEOUT,
        ),
        StartOption(
            "workspace_size",
            ("--workspace-size",),
            "text",
            "Workspace size (GiB)",
            "kubernetes: what a new workspace's claim requests, in GiB (default 10)",
            "workspace size",
            reader=textvalues.gib_size,
        ),
        StartOption(
            "storage_class",
            ("--storage-class",),
            "text",
            "Storage class",
            "kubernetes: the StorageClass of a new workspace's claim (default: the cluster's "
            "default class)",
            "storage class",
            max_len=253,
            reader=storage_class,
        ),
    )

    def __init__(self, config, recorder) -> None:
        super().__init__(config, recorder)
        self._handover: dict[str, Any] = {}  # session id -> release (take_workspace_over)
        self._keys: dict[str, str] = {}  # session id -> its kernel's key, from provision to connect
        # session id -> READY's payload (JSON) as the runtime's copy waited for it, to connect
        self._ready: dict[str, str | None] = {}

    def take_workspace_over(self, session_id: str, release) -> None:
        """`%gpu switch` from a running session of this cluster and namespace (its claim mounted
        there, ReadWriteOnce): the next start of `session_id` calls `release()` (the old session
        saves and stops, its pod gone) just before it mounts the claim. None forgets it."""
        if release is None:
            self._handover.pop(session_id, None)
        else:
            self._handover[session_id] = release

    @classmethod
    def discover(cls, timeout: float = 4.0) -> list[Place]:
        """Each context of the kubeconfig, asked for its nodes' GPUs (`gpusession setup`)."""
        # lazy: docs/architecture.md#imports-kept-inside-functions
        from .cluster_gpus import places

        try:
            return places(timeout)
        except BackendUnavailable as exc:  # no kubernetes client installed
            return [Place("kubeconfig", "kubeconfig", "unknown", cls.name, False, str(exc))]

    def default_image(self) -> str | None:
        return self.setting("image")

    # -- the cluster ----------------------------------------------------------------------

    def cluster(self, spec: LaunchSpec) -> Cluster:
        return apiserver.cluster(spec.extra.get("context") or None, spec.extra.get("namespace"))

    def cluster_of(self, record: SessionRecord) -> Cluster:
        """The cluster a session's pod was made in (as recorded: another process asks it)."""
        res = record.resource
        context = res.get("context", record.spec.extra.get("context"))
        namespace = res.get("namespace", record.spec.extra.get("namespace"))
        return apiserver.cluster(None if context == apiserver.IN_CLUSTER else context, namespace)

    def check(self, spec: LaunchSpec) -> None:
        """The client, the kubeconfig, the namespace and the GPU type's node label: each
        missing one is one line saying what to do; nothing is made."""
        self.placement(spec)
        cluster = self.cluster(spec)
        kubernetes = apiserver.sdk()
        with answering(cluster, "to a check"):
            try:
                cluster.api.list_namespaced_pod(
                    cluster.namespace, limit=1, label_selector=pods.LABEL, _request_timeout=10
                )
            except kubernetes.client.ApiException as exc:
                raise BackendUnavailable(
                    f"cannot list pods in namespace {cluster.namespace} of context "
                    f"{cluster.context}: {api_words(exc)} (docs/kubernetes.md gives the Role a "
                    "session needs)"
                ) from None
            try:  # a namespace that does not exist lists no pods: asked (where allowed)
                cluster.api.read_namespace(cluster.namespace, _request_timeout=10)
            except kubernetes.client.ApiException as exc:
                if is_missing(exc):
                    raise BadInput(
                        f"no namespace {cluster.namespace} in context {cluster.context}; name "
                        "one with --namespace (kubectl get namespaces lists them)"
                    ) from None

    def placement(self, spec: LaunchSpec) -> dict[str, Any]:
        """What places the pod: the GPU resource and count, the node labels, tolerations..."""
        gpu = load_catalog().get(spec.gpu_type)
        resource, model = pods.gpu_request(gpu.name, spec.gpu_count, gpu.mig_of)
        products = {**pods.PRODUCTS, **self._parsed("gpu_products", pods.products_setting)}
        if model not in products:
            raise BadInput(
                f"no nvidia.com/gpu.product value is known for {model}; name the one its nodes "
                f'carry in KubernetesBackend.gpu_products, e.g. {{"{model}": "..."}}'
            )
        return {
            "resource": (resource, spec.gpu_count),
            "node_selector": {
                **self._parsed("node_selector", pods.selector_setting),
                pods.PRODUCT_LABEL: products[model],
            },
            "tolerations": self._parsed("tolerations", pods.tolerations_setting),
            "priority_class": self.setting("priority_class") or "",
            "service_account": self.setting("service_account") or "",
        }

    def place(self, record: SessionRecord, progress: Progress) -> dict[str, Any] | None:
        """A fallback list (`--type a100,t4`) goes one type after another, as on Slurm: a type
        before the list's last is taken only when a node of its model has its GPUs free now
        (allocatable less what the pods placed there request), else NoCapacity moves the list
        on; the last type's pod waits in the queue as any start does (--queue-timeout)."""
        spec = record.spec
        if not before_the_last(spec):
            return None
        placed = self.placement(spec)
        resource, count = placed["resource"]
        cluster = self.cluster(spec)
        progress.step(f"asking the cluster for {count} free {resource} of {spec.gpu_type} now")
        try:
            with answering(cluster, "a question for its free GPUs"):
                nodes = cluster.api.list_node(_request_timeout=20).items
                running = cluster.api.list_pod_for_all_namespaces(
                    field_selector="status.phase!=Succeeded,status.phase!=Failed",
                    _request_timeout=20,
                ).items
        except (
            apiserver.sdk().client.ApiException
        ) as exc:  # an account without the cluster-wide reads
            progress.step(f"cannot see the nodes' free GPUs ({api_words(exc)}): trying it")
            return None
        free = pods.free_on_nodes(nodes, running, resource, placed["node_selector"])
        if any(f >= count for f, _ in free.values()):
            return None
        each = "; ".join(f"{n}: {f} of {t} free" for n, (f, t) in sorted(free.items()))
        raise NoCapacity(
            f"no node of context {cluster.context} has {count} free {resource} of "
            f"{spec.gpu_type} now ({each or 'no node of that model'})",
            where=cluster.context,
        )

    def _parsed(self, name: str, parse) -> Any:
        """A setting read (its built-in value comes as written)."""
        value = self.setting(name)
        return parse(value) if isinstance(value, str) else value

    # -- start ----------------------------------------------------------------------------

    def provision(self, record: SessionRecord, progress: Progress) -> None:
        # lazy: docs/architecture.md#imports-kept-inside-functions
        from .runtime_copy import EarlyCopy, bring_runtime, image_user

        spec, placement = record.spec, self.placement(record.spec)
        cluster = self.cluster(spec)
        name = pods.pod_name(record.name, record.id)
        image = spec.extra.get("image") or self.default_image()
        self.recorder.save(
            record.id, context=cluster.context, namespace=cluster.namespace, pod=name, image=image
        )  # from here the cluster may hold a pod of it (stop, gc)
        release = self._handover.pop(record.id, None)
        if release is not None:  # a switch in this cluster: the old pod lets go of the claim
            self._claim_is_here(cluster, record)
            release()
        claim = self.workspace_claim(cluster, record, progress)  # kept after the pod
        key = self._keys[record.id] = secrets.token_hex(32)
        early = EarlyCopy.known(image, key)  # the runtime goes in as the container starts
        argv = AgentArgs.for_record(
            record,
            session_id=record.id,
            state_dir=STATE_DIR,
            kernel_ip="127.0.0.1",
            workspace=WORKSPACE_MOUNT,
            cwd=WORKSPACE_MOUNT,
            notice_dir=pods.NOTICES,
            termination_log=pods.TERMINATION_LOG,
        ).argv()
        body = pods.manifest(
            name=name,
            labels=self._labels(record),
            annotations={"gpusession.owner": record.owner, "gpusession.image": image},
            image=image,
            agent_argv=argv,
            session_id=record.id,
            resource=placement["resource"],
            placement=placement,
            claim=claim,
            owner_first=image_user(image) != 0,  # a root image prepares the claim itself
            zygote=early.zygote() if early is not None else None,
        )
        resource, count = placement["resource"]
        where = placement["node_selector"][pods.PRODUCT_LABEL]
        progress.step(
            f"creating pod {name} in {cluster.context}/{cluster.namespace} "
            f"({count} x {resource}, nodes labelled {where})"
        )
        self._create(cluster, body)
        node, image_id = self._wait_running(
            cluster, name, claim, _queue_timeout(spec), progress, early
        )
        copied_early = early is not None and early.done
        billed_from = early.ran_at if copied_early else time.time()  # its container ran
        self.recorder.save(record.id, node=node, **{BILLED_FROM: billed_from})
        self._ready[record.id] = (
            early.ready
            if copied_early
            else bring_runtime(cluster, name, image, image_id, progress, key)
        )

    def _claim_is_here(self, cluster: Cluster, record: SessionRecord) -> None:
        """Before a switch's old session lets go: its claim is where the new pod will be."""
        workspace = workspace_name(record)
        if self._read_claim(cluster, claim_name(workspace, self.recorder.store_id)) is None:
            raise StageError(
                "provision",
                f"workspace {workspace} has no claim in {cluster.context}/{cluster.namespace}: "
                "a switch keeps its claim's namespace and context",
            )

    def _labels(self, record: SessionRecord) -> dict[str, str]:
        spec = record.spec
        return {
            pods.LABEL: record.id,
            pods.STORE_LABEL: self.recorder.store_id,
            "gpusession.type": pods.label_value(f"{spec.gpu_type}-{spec.gpu_count}"),
            "gpusession.name": pods.label_value(record.name),
        }

    def _create(self, cluster: Cluster, body: dict) -> None:
        kubernetes = apiserver.sdk()
        with answering(cluster, "while creating the pod"):
            try:
                cluster.api.create_namespaced_pod(cluster.namespace, body, _request_timeout=30)
            except kubernetes.client.ApiException as exc:
                raise StageError(
                    "provision", f"the cluster refused the pod: {api_words(exc)}"
                ) from None

    def _wait_running(
        self,
        cluster: Cluster,
        name: str,
        claim: str,
        timeout_s: float | None,
        progress: Progress,
        early: Any = None,
    ) -> tuple[str, str]:
        """Until the pod runs: (its node, its image's id). While it waits, why (the scheduler's
        words, an image being pulled, a claim not bound yet: its newest event) is shown when it
        changes and every 30 s with the wait. `early` (runtime_copy.EarlyCopy): tried once the
        pod has a node and its init containers have ended (pods.initialized), which ends the
        wait as soon as it copied the runtime (the image's id is then the one its image had
        before, as its copy checked)."""
        started = time.monotonic()
        said, said_at, delay = "", 0.0, POLL_FIRST_S
        while True:
            pod = self._read(cluster, name)
            if pod is None:
                raise StageError("provision", f"pod {name} was deleted while it waited")
            if pod.status.phase == "Running":
                progress.step(f"pod {name} runs on {pod.spec.node_name}")
                statuses = pod.status.container_statuses or []
                return pod.spec.node_name, (statuses[0].image_id if statuses else "") or ""
            if pod.status.phase in ("Failed", "Succeeded"):
                reason, _ = pods.termination(pod)
                raise StageError("provision", f"pod {name} ended before it ran: {reason}")
            # the early copy's tries (and their window) begin once the session's container is
            # next: an init container's seconds (the workspace's owner) are not its to wait
            if (
                early is not None
                and pod.spec.node_name
                and pods.initialized(pod)
                and early.attempt(cluster, name, progress)
            ):
                progress.step(f"pod {name} runs on {pod.spec.node_name}")
                return pod.spec.node_name, early.image_id
            reason, hopeful = pods.waiting_reason(pod)
            # 'pod has unbound immediate PersistentVolumeClaims': the claim's own words say why
            if "persistentvolumeclaim" in reason.lower():
                reason = self.claim_waits(cluster, claim) or reason
            waited = time.monotonic() - started
            if not hopeful:
                raise StageError("provision", f"pod {name} cannot start: {reason}")
            if reason != said or time.monotonic() - said_at > 30:
                progress.step(f"pod {name} waits ({format_duration(waited)}): {reason}")
                said, said_at = reason, time.monotonic()
            if timeout_s and waited > timeout_s:
                raise StageError(
                    "provision",
                    f"pod {name} still waits after {format_duration(timeout_s)} "
                    f"(--queue-timeout): {reason}",
                )
            time.sleep(delay)
            delay = _pause(started, delay, 1.5, POLL_MAX_S)

    def _read(self, cluster: Cluster, name: str):
        """The pod, None when it is gone."""
        kubernetes = apiserver.sdk()
        with answering(cluster, f"about pod {name}"):
            try:
                return cluster.api.read_namespaced_pod(
                    name, cluster.namespace, _request_timeout=apiserver.REQUEST_TIMEOUT
                )
            except kubernetes.client.ApiException as exc:
                if is_missing(exc):
                    return None
                raise StageError("provision", f"cannot read pod {name}: {api_words(exc)}") from None

    # -- connect --------------------------------------------------------------------------

    def connect(self, record: SessionRecord, progress: Progress) -> Link:
        # lazy: docs/architecture.md#imports-kept-inside-functions
        from .portforward import PortForwardLink

        name = record.resource.get("pod")
        if not name:
            raise StageError("connect", "no pod was recorded for this session")
        cluster = self.cluster_of(record)
        ready: Any = {}
        key = self._keys.pop(record.id, None)
        said = self._ready.pop(record.id, None)  # READY, as the runtime's copy waited for it
        if record.state != State.RUNNING:  # a start; an attach finds the kernel listening
            progress.step(f"waiting for the kernel in pod {name}")
            ready = _payload(said) or self._wait_ready(
                cluster, name, START_TIMEOUT, image=record.resource.get("image")
            )
        kernel, agent_port = self._connection_info(cluster, name, ready, key)
        progress.step(f"forwarding the kernel's ports through the API server {cluster.server}")
        return PortForwardLink(
            cluster, name, kernel, agent_port, on_event=lambda text: self._note(record.id, text)
        )

    @staticmethod
    def _connection_info(cluster: Cluster, name: str, ready: Any, key: Any) -> tuple[dict, Any]:
        """The kernel's connection info and the agent's port: from READY where this process
        made the kernel's key (a start), else read from the pod's files (an attach)."""
        from . import podexec

        agent_port = ready.get("agent_port") if isinstance(ready, dict) else None
        known = _connection(ready, key)
        if known is not None:
            return known, agent_port
        kernel, runtime = podexec.read_files(
            cluster,
            name,
            [f"{STATE_DIR}/kernel.json", f"{STATE_DIR}/runtime.json"],
            "reading the kernel's connection file",
        )
        if kernel is None:
            raise StageError("connect", f"pod {name} has no kernel connection file")
        if agent_port is None and runtime:
            agent_port = json.loads(runtime).get("agent_port")
        return json.loads(kernel), agent_port

    def _wait_ready(
        self, cluster: Cluster, name: str, timeout: float, image: str | None = None
    ) -> Any:
        """READY's payload from the pod's log; StageError with the log's end when the runtime
        failed, the pod ended, or `timeout` passed. The log is followed as it is written (READY
        seen the moment it is said); where that stream cannot be had or ends without READY,
        it is read again every so often, which also says why. (A start learns READY from the
        runtime's copy first: runtime_copy.READY_WAIT.) A workspace its `image`'s user could
        not write says that user: remembered, so that the next start prepares it first."""
        found = self._follow_for_ready(cluster, name, timeout)
        if found is not None:
            return found
        started = time.monotonic()
        deadline, delay, asked = started + timeout, POLL_FIRST_S, 0
        while True:
            text = self._log(cluster, name) or ""
            for line in marker_lines(text):
                parsed = parse_marker(line)
                if parsed is not None and parsed[0] is Marker.READY:
                    return parsed[1]
                if parsed is not None and parsed[0] is Marker.FAILED:
                    _remember_user_of(image, parsed[1])
                    raise StageError("connect", f"the runtime failed: {log_tail(text, 3)}")
            asked += 1
            if asked % 5 == 0:
                pod = self._read(cluster, name)
                ended, _ = (None, None) if pod is None else pods.termination(pod)
                if pod is None or ended:
                    raise StageError(
                        "connect", f"pod {name} ended ({ended or 'deleted'}): {log_tail(text, 3)}"
                    )
            if time.monotonic() > deadline:
                raise StageError(
                    "connect", f"no kernel within {timeout:.0f}s in pod {name}: {log_tail(text, 3)}"
                )
            time.sleep(delay)
            delay = _pause(started, delay, 1.3, 1.0)

    def _follow_for_ready(self, cluster: Cluster, name: str, timeout: float) -> Any:
        """READY's payload as the followed log says it; None when it says anything else first
        (FAILED), ends (the container ended), or the stream fails: _wait_ready reads again."""
        try:
            stream = cluster.api.read_namespaced_pod_log(
                name,
                cluster.namespace,
                container=pods.CONTAINER,
                follow=True,
                _preload_content=False,
                _request_timeout=(apiserver.REQUEST_TIMEOUT, timeout),
            )
        except Exception:  # noqa: BLE001 - not to be had: read by polling, which says why
            return None
        try:
            for raw in stream:  # urllib3 yields the body as it comes, by lines or chunks
                for line in marker_lines(raw.decode("utf-8", "replace")):
                    parsed = parse_marker(line)
                    if parsed is not None and parsed[0] is Marker.READY:
                        return parsed[1]
                    if parsed is not None and parsed[0] is Marker.FAILED:
                        return None
        except Exception:  # noqa: BLE001 - cut, timed out: read by polling
            return None
        finally:
            stream.close()  # a follow never ends by itself: its connection is not reused
        return None

    def _log(self, cluster: Cluster, name: str, tail: int | None = None) -> str | None:
        """The pod's container log; None when it has none (yet) or is gone."""
        kubernetes = apiserver.sdk()
        with answering(cluster, f"for pod {name}'s log"):
            try:
                return cluster.api.read_namespaced_pod_log(
                    name,
                    cluster.namespace,
                    container=pods.CONTAINER,
                    tail_lines=tail,
                    _request_timeout=apiserver.REQUEST_TIMEOUT,
                )
            except kubernetes.client.ApiException as exc:
                if exc.status in (400, 404):  # not started yet, or gone
                    return None
                raise StageError(
                    "connect", f"cannot read pod {name}'s log: {api_words(exc)}"
                ) from None

    # -- life and teardown ----------------------------------------------------------------

    def is_alive(self, record: SessionRecord) -> bool:
        if not record.resource.get("pod"):
            return False
        try:
            pod = self._read(self.cluster_of(record), record.resource["pod"])
        except (BackendUnavailable, StageError):
            return True  # the API cannot be asked now: unknown is not gone
        return pod is not None and pod.status.phase in ("Pending", "Running")

    def check_alive(self, records: list[SessionRecord]) -> dict[str, bool]:
        """One pod listing per cluster this process has loaded already (a first kubeconfig load
        and the client's import are no cheap question)."""
        found: dict[str, bool] = {}
        groups: dict[tuple[Any, Any], list[SessionRecord]] = {}
        for r in records:
            key = (r.resource.get("context"), r.resource.get("namespace"))
            if r.resource.get("pod") and apiserver.loaded(*key):
                groups.setdefault(key, []).append(r)
        for (context, namespace), mine in groups.items():
            try:
                phases = self._phases(apiserver.loaded(context, namespace))
            except Exception:  # noqa: BLE001 - a listing that fails tells nothing
                continue
            for r in mine:
                phase = phases.get(r.id)
                if phase in (None, "Running", "Failed", "Succeeded"):
                    found[r.id] = phase == "Running"
        return found

    def _phases(self, cluster: Cluster) -> dict[str, str]:
        """session id -> its pod's phase, for this store's pods in the cluster's namespace."""
        with answering(cluster, "to a pod listing"):
            listed = cluster.api.list_namespaced_pod(
                cluster.namespace, label_selector=self._selector(), _request_timeout=3
            )
        return {pods.owning_session(p.metadata.labels): p.status.phase for p in listed.items}

    def _selector(self) -> str:
        return f"{pods.LABEL},{pods.STORE_LABEL}={self.recorder.store_id}"

    def stop_details(self, record: SessionRecord) -> StopDetails | None:
        """The runtime's STOPPED and SUMMARY markers in the pod's log, else the agent's brief
        in the container's status (a pod kept by FINALIZER after its log went); told as the
        cluster's taking it back when the cluster ended the pod (an eviction, a preemption:
        `pods.ended_by_cluster`); else the pod's own end (OOMKilled, ...). None for a pod never
        made or gone."""
        name = record.resource.get("pod")
        if not name or record.spec.backend != self.name:
            return None
        try:
            cluster = self.cluster_of(record)
            pod = self._ended(cluster, name)
            if pod is None:
                return None
            logged = stop_details_from_log(self._log(cluster, name) or "") or StopDetails()
        except (BackendUnavailable, StageError, ValueError):
            return None
        if logged.reason is None:
            brief = pods.termination_brief(pod)
            logged = StopDetails(
                reason=brief.reason, at=brief.at, summary=logged.summary or brief.summary
            )
        logged = pods.ended_by_cluster(pod, logged)
        if logged.reason is not None:
            return logged
        ended, code = pods.termination(pod)
        if ended is None:
            return logged if logged.summary else None
        detail = f"{ended} (exit {code})" if code is not None else ended
        return StopDetails(
            reason=StopReason(StopKind.INSTANCE_ENDED, exit_code=code, detail=detail),
            summary=logged.summary,
        )

    def _ended(self, cluster: Cluster, name: str) -> Any:
        """The pod, once it has ended when the cluster is ending it (an eviction's grace: the
        agent saves, then says how it ended), within its grace; None when it is gone."""
        pod = self._read(cluster, name)
        deadline, delay = time.monotonic() + pods.GRACE_S + 10, 0.3
        while (
            pod is not None
            and pod.metadata.deletion_timestamp is not None
            and pod.status.phase in ("Pending", "Running")
            and time.monotonic() < deadline
        ):
            time.sleep(delay)
            delay = min(delay * 1.5, POLL_MAX_S)
            pod = self._read(cluster, name)
        return pod

    def stop(self, record: SessionRecord) -> None:
        """Delete the pod (by its recorded name, and any of the session's label), wait until it
        is gone, and record `removed_at`. A start that never reached the cluster holds nothing."""
        res = record.resource
        if record.spec.backend != self.name or "context" not in res:
            return
        cluster = self.cluster_of(record)
        names = {res["pod"]} if res.get("pod") else set()
        with answering(cluster, "while deleting the pod"):
            listed = cluster.api.list_namespaced_pod(
                cluster.namespace,
                label_selector=f"{pods.LABEL}={record.id}",
                _request_timeout=apiserver.REQUEST_TIMEOUT,
            )
        names |= {p.metadata.name for p in listed.items}
        if record.state in (State.REQUESTED, State.PROVISIONING, State.STARTING) and res.get("pod"):
            self._keep_start_log(cluster, record.id, res["pod"])
        for pod in listed.items:  # our own stop: no notice, no save the user did not ask for
            if pod.status.phase == "Running" and pod.metadata.deletion_timestamp is None:
                self._mark_stopping(cluster, pod.metadata.name)
        for name in sorted(names):
            self._delete(cluster, name)
        self.drop_claim_of_start(cluster, record)  # the workspace's claim stays, unless new
        self.recorder.save(record.id, removed_at=time.time())

    def _mark_stopping(self, cluster: Cluster, name: str) -> None:
        """Tell the pod's preStop hook that this is our own stop (pods.STOPPING): the hook then
        leaves no notice, so the agent saves only what `stop --save` asked. Best effort: a pod
        that does not answer within seconds is deleted all the same."""
        # lazy: docs/architecture.md#imports-kept-inside-functions
        from . import podexec

        mark = f"mkdir -p -m 700 {pods.NOTICES} && : > {pods.NOTICES}/{pods.STOPPING}"
        try:
            podexec.run(
                cluster,
                name,
                ["/bin/sh", "-c", mark],
                timeout=5,
                what="marking our own stop",
            )
        except (BackendUnavailable, StageError, OSError) as exc:
            log.debug("pod %s: no stop mark: %s", name, exc)

    def _let_go(self, cluster: Cluster, name: str) -> None:
        """Take our FINALIZER off the pod (its end is read by now): removed alone, by its index
        under a test, so another controller's finalizer stays (a list changed under us between
        the read and the patch is read again)."""
        kubernetes = apiserver.sdk()
        for _ in range(3):
            pod = self._read(cluster, name)
            held = list((pod.metadata.finalizers or []) if pod is not None else [])
            if pods.FINALIZER not in held:
                return
            i = held.index(pods.FINALIZER)
            patch = [
                {"op": "test", "path": f"/metadata/finalizers/{i}", "value": pods.FINALIZER},
                {"op": "remove", "path": f"/metadata/finalizers/{i}"},
            ]
            with answering(cluster, f"while letting go of pod {name}"):
                try:
                    cluster.api.patch_namespaced_pod(
                        name, cluster.namespace, patch, _request_timeout=apiserver.REQUEST_TIMEOUT
                    )
                    return
                except kubernetes.client.ApiException as exc:
                    if is_missing(exc):
                        return
                    if exc.status != 422:
                        raise StageError(
                            "stop", f"cannot let go of pod {name}: {api_words(exc)}"
                        ) from None
        raise StageError("stop", f"cannot let go of pod {name}: its finalizers keep changing")

    def _delete(self, cluster: Cluster, name: str) -> None:
        """Delete the pod, letting go of it (FINALIZER), and wait until it is gone (its GPUs
        free); StageError when it stays."""
        kubernetes = apiserver.sdk()
        self._let_go(cluster, name)
        with answering(cluster, f"while deleting pod {name}"):
            try:
                cluster.api.delete_namespaced_pod(
                    name,
                    cluster.namespace,
                    grace_period_seconds=STOP_GRACE_S,
                    _request_timeout=apiserver.REQUEST_TIMEOUT,
                )
            except kubernetes.client.ApiException as exc:
                if is_missing(exc):
                    return
                raise StageError("stop", f"cannot delete pod {name}: {api_words(exc)}") from None
        deadline, delay = time.monotonic() + STOP_WAIT_S, 0.2
        while time.monotonic() < deadline:
            if self._read(cluster, name) is None:
                return
            time.sleep(delay)
            delay = min(delay * 1.5, POLL_MAX_S)
        raise StageError("stop", f"pod {name} is still there {STOP_WAIT_S:.0f}s after its delete")

    def _keep_start_log(self, cluster: Cluster, session_id: str, name: str) -> None:
        """The end of a failed start's pod log, in the record (`start_log`), bounded."""
        try:
            text = self._log(cluster, name, tail=200) or ""
        except (BackendUnavailable, StageError) as exc:
            log.debug("no start log for %s: %s", session_id, exc)
            return
        if text:
            data = text.encode()[-START_LOG_BYTES:]
            self.recorder.save(session_id, start_log=data.decode(errors="ignore"))

    # -- a workspace moving (`%gpu switch` to or from another backend) ---------------------

    def export_workspace(self, record: SessionRecord, progress: Progress) -> WorkspaceExport:
        # lazy: docs/architecture.md#imports-kept-inside-functions
        from . import claim_moves

        return claim_moves.export(self.cluster_of(record), record, progress)

    def import_workspace(
        self, record: SessionRecord, chunks: Iterable[bytes], progress: Progress
    ) -> None:
        # lazy: docs/architecture.md#imports-kept-inside-functions
        from . import claim_moves

        cluster = self.cluster(record.spec)
        self.recorder.save(
            record.id, context=cluster.context, namespace=cluster.namespace
        )  # from here the cluster may hold a helper pod of it (stop, gc)
        claim_moves.fill(self, cluster, record, chunks, progress)

    # -- gc -------------------------------------------------------------------------------

    def places_used(self) -> list[tuple[str | None, str | None]]:
        """(context, namespace) of every place this store's sessions used, and the kubeconfig's
        current one; none when no session of this store was ever in a cluster (nothing of it
        can be there, and nothing is loaded to ask)."""
        places = {
            (r.resource.get("context"), r.resource.get("namespace"))
            for r in self.recorder.sessions(self.name)
            if "context" in r.resource
        }
        return sorted(places | {(None, None)}, key=str) if places else []

    def list_resources(self) -> list[RemoteResource]:
        """This store's pods in every place its sessions used (`places_used`)."""
        found: list[RemoteResource] = []
        places, reached = self.places_used(), 0
        for context, namespace in places:
            try:
                cluster = place_cluster(context, namespace)
                with answering(cluster, "to gc's pod listing"):
                    listed = cluster.api.list_namespaced_pod(
                        cluster.namespace,
                        label_selector=self._selector(),
                        _request_timeout=apiserver.REQUEST_TIMEOUT,
                    )
            except Exception as exc:  # noqa: BLE001 - one cluster never stops the rest
                log.warning("gc: skipping Kubernetes context %s: %s", context or "(current)", exc)
                continue
            reached += 1
            found += [_resource(self.name, cluster, pod) for pod in listed.items]
        if places and not reached:
            raise BackendUnavailable("no Kubernetes cluster answers")
        unique = {(r.details["context"], r.details["namespace"], r.resource_id): r for r in found}
        return list(unique.values())

    def remove_resource(self, resource: RemoteResource) -> None:
        cluster = place_cluster(resource.details.get("context"), resource.details.get("namespace"))
        pod = self._read(cluster, resource.resource_id)
        if pod is not None and pods.owning_session(pod.metadata.labels) == resource.session_id:
            self._delete(cluster, resource.resource_id)


def _resource(backend: str, cluster: Cluster, pod) -> RemoteResource:
    phase = pod.status.phase
    return RemoteResource(
        backend=backend,
        session_id=pods.owning_session(pod.metadata.labels),
        resource_id=pod.metadata.name,
        description=(
            f"pod {pod.metadata.name} ({phase}{', on ' + pod.spec.node_name if pod.spec.node_name else ''}) "
            f"in {cluster.context}/{cluster.namespace}"
        ),
        running=phase in ("Pending", "Running"),
        details={"context": cluster.context, "namespace": cluster.namespace},
    )


def _connection(ready: Any, key: str | None) -> dict | None:
    """The kernel's connection info from READY's payload (where it listens) and the key this
    process made for it; None when either lacks something (then kernel.json is read)."""
    if not key or not isinstance(ready, dict) or not isinstance(ready.get("ports"), dict):
        return None
    ports = ready["ports"]
    if not all(isinstance(ports.get(n), int) for n in KERNEL_PORT_NAMES) or not ready.get("ip"):
        return None
    return {
        **{n: ports[n] for n in KERNEL_PORT_NAMES},
        "ip": ready["ip"],
        "transport": ready.get("transport") or "tcp",
        "key": key,
        "signature_scheme": "hmac-sha256",
        "kernel_name": "python3",
    }


def _payload(said: str | None) -> dict | None:
    """READY's payload from the text of the runtime's READY file; None where it is not one."""
    try:
        payload = json.loads(said) if said else None
    except ValueError:
        return None
    return payload if isinstance(payload, dict) and isinstance(payload.get("ports"), dict) else None


def _remember_user_of(image: str | None, failed: Any) -> None:
    """A FAILED start's workspace stage says its image's user (pods.wait_then_boot): the next
    start of the image gives the claim to that user first, as the message says. The user was
    remembered as root otherwise only where the runtime was probed (an image id not known), so
    a start that copied early would have ended the same way each time."""
    if not image or not isinstance(failed, dict) or failed.get("stage") != "workspace":
        return
    uid = failed.get("uid")
    if isinstance(uid, int) and not isinstance(uid, bool) and uid != 0:
        # lazy: docs/architecture.md#imports-kept-inside-functions
        from .runtime_copy import remember_user

        remember_user(image, uid)


def _queue_timeout(spec: LaunchSpec) -> float | None:
    value = spec.extra.get("queue_timeout")
    return QUEUE_TIMEOUT.parse(value) if isinstance(value, str) else value
