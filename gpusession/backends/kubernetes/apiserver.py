"""The cluster as the official `kubernetes` client reaches it: the kubeconfig `kubectl` reads
(KUBECONFIG, else ~/.kube/config; a context by name or its current one), or the pod's own service
account when gpusession itself runs in a pod (JupyterHub), and the API's refusals in one line.

The client is imported here only, and only when a cluster is asked: the option table imports
every backend, and `kubernetes` takes most of a second to load.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import threading
from typing import Any, Iterator

from ...core.errors import BackendUnavailable

INSTALL_HINT = (
    "the kubernetes backend needs the Kubernetes client for Python: "
    "pip install 'gpusession[kubernetes]' (kubernetes==34.1.0)"
)
IN_CLUSTER_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
IN_CLUSTER = "(in-cluster)"  # the context's name when the pod's service account is used
REQUEST_TIMEOUT = 15.0  # seconds a plain API call may take before it counts as unanswered


def sdk():
    """The `kubernetes` package, or BackendUnavailable saying how to install it."""
    try:
        import kubernetes  # noqa: PLC0415 - a second to load: only when a cluster is asked
        import kubernetes.stream  # noqa: F401, PLC0415 - exec and port-forward
    except ImportError:
        raise BackendUnavailable(INSTALL_HINT) from None
    return kubernetes


@dataclasses.dataclass
class Cluster:
    """One context of the kubeconfig (or the in-cluster account): its API and its namespace."""

    context: str  # its name in the kubeconfig, IN_CLUSTER for the pod's own account
    namespace: str  # --namespace, else the context's, else "default"
    server: str  # the API server's address, for messages
    configuration: Any  # kubernetes.client.Configuration
    api: Any  # CoreV1Api for plain calls (streams get their own: `stream_api`)

    def stream_api(self):
        """A CoreV1Api of its own for one exec or port-forward stream: the client swaps its
        ApiClient's `request` while it opens a stream, so a shared one would send a plain call
        of another thread as a websocket."""
        kubernetes = sdk()
        return kubernetes.client.CoreV1Api(kubernetes.client.ApiClient(self.configuration))


_CLUSTERS: dict[tuple[str, str, str], Cluster] = {}  # (kubeconfig, context, namespace)
_LOCK = threading.Lock()


def cluster(context: str | None, namespace: str | None) -> Cluster:
    """The cluster of `context` (None: the kubeconfig's current one, or the in-cluster account
    where there is no kubeconfig and this runs in a pod), cached per process."""
    key = (kubeconfig_paths(), context or "", namespace or "")
    with _LOCK:
        if key not in _CLUSTERS:
            _CLUSTERS[key] = _load(context, namespace)
        return _CLUSTERS[key]


def forget(context: str | None, namespace: str | None) -> None:
    """Load the kubeconfig again next time (its credentials may have changed)."""
    with _LOCK:
        _CLUSTERS.pop((kubeconfig_paths(), context or "", namespace or ""), None)


def kubeconfig_paths() -> str:
    """KUBECONFIG (a list, as kubectl reads it), else ~/.kube/config: read now, not when the
    client was imported (a notebook may set KUBECONFIG after)."""
    return os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")


def _kubeconfig_present() -> bool:
    return any(os.path.isfile(p) for p in kubeconfig_paths().split(os.pathsep) if p)


def _load(context: str | None, namespace: str | None) -> Cluster:
    kubernetes = sdk()
    config, Configuration = kubernetes.config, kubernetes.client.Configuration
    configuration = Configuration()
    if not context and not _kubeconfig_present() and os.environ.get("KUBERNETES_SERVICE_HOST"):
        try:
            config.load_incluster_config(client_configuration=configuration)
        except config.ConfigException as exc:
            raise BackendUnavailable(f"this pod's service account cannot be used: {exc}") from None
        own = _read(IN_CLUSTER_NAMESPACE) or "default"
        name = IN_CLUSTER
    else:
        name, own = _context(config, context)
        try:
            config.load_kube_config(
                config_file=kubeconfig_paths(), context=name, client_configuration=configuration
            )
        except (config.ConfigException, OSError, ValueError) as exc:
            raise BackendUnavailable(f"kubeconfig context {name!r} cannot be used: {exc}") from None
    api = kubernetes.client.CoreV1Api(kubernetes.client.ApiClient(configuration))
    return Cluster(name, namespace or own or "default", configuration.host, configuration, api)


def _context(config, context: str | None) -> tuple[str, str]:
    """(the context's name, its namespace) from the kubeconfig; one line when there is none."""
    where = os.environ.get("KUBECONFIG") or "~/.kube/config"
    try:
        contexts, current = config.list_kube_config_contexts(config_file=kubeconfig_paths())
    except (config.ConfigException, OSError, ValueError) as exc:
        raise BackendUnavailable(
            f"no kubeconfig to reach a cluster ({where}: {exc}); set KUBECONFIG, or run where "
            "`kubectl get pods` works"
        ) from None
    names = [c["name"] for c in contexts]
    if context and context not in names:
        raise BackendUnavailable(
            f"no context {context!r} in {where} (its contexts: {', '.join(names) or 'none'}); "
            "name one of them with --context"
        )
    chosen = next(c for c in contexts if c["name"] == (context or current["name"]))
    return chosen["name"], (chosen.get("context") or {}).get("namespace") or ""


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().strip()
    except OSError:
        return ""


def api_words(exc: BaseException) -> str:
    """An API refusal in the cluster's words: its Status message ('pods "x" is forbidden: User
    "u" cannot create resource "pods" ...', 'exceeded quota: gpus, requested: ...'), also when a
    stream's handshake was refused (the client then puts the status in its reason), else the
    connection's error."""
    for text in (getattr(exc, "body", None), *str(getattr(exc, "reason", "")).split("-+-+-")[::-1]):
        try:
            message = json.loads(text).get("message") if text else None
        except (ValueError, AttributeError, TypeError):
            message = None
        if message:
            return str(message)
    reason = str(getattr(exc, "reason", "") or "").split("-+-+-")[0].strip()
    status = getattr(exc, "status", None)
    if reason:
        return f"{reason} (HTTP {status})" if status else reason
    return f"{type(exc).__name__}: {exc}"


def is_missing(exc: BaseException) -> bool:
    """Is it the API's 404 (the object is gone)?"""
    return getattr(exc, "status", None) == 404


def unreachable(exc: BaseException) -> bool:
    """Did the API server not answer at all (no HTTP status: refused, timed out, TLS)?"""
    return not getattr(exc, "status", None)


@contextlib.contextmanager
def answering(cluster: Cluster, what: str) -> Iterator[None]:
    """An API server that does not answer (refused, timed out, TLS) as BackendUnavailable in one
    line naming it and `what` was being done; the API's own refusals (ApiException) pass on."""
    kubernetes = sdk()
    import urllib3  # noqa: PLC0415 - the client's transport, loaded with it

    try:
        yield
    except kubernetes.client.ApiException as exc:
        if unreachable(exc):
            raise BackendUnavailable(
                f"the Kubernetes API at {cluster.server} does not answer {what}: {api_words(exc)}"
            ) from None
        raise
    except (OSError, urllib3.exceptions.HTTPError) as exc:
        raise BackendUnavailable(
            f"the Kubernetes API at {cluster.server} does not answer {what}: "
            f"{type(exc).__name__}: {str(exc)[:200]}"
        ) from None


def loaded(context: str | None, namespace: str | None) -> Cluster | None:
    """The cluster of `context` when this process has loaded it already, else None (no load)."""
    if context == IN_CLUSTER:
        context = None
    with _LOCK:
        return _CLUSTERS.get((kubeconfig_paths(), context or "", namespace or ""))
