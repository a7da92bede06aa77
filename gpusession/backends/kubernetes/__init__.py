"""The kubernetes backend: a session kernel in a pod of a Kubernetes cluster (docs/kubernetes.md)."""

from .backend import KubernetesBackend

__all__ = ["KubernetesBackend"]
