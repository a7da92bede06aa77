"""Where GPUs come from: the contract every backend implements (`base.Backend`, documented for
its callers) and the built-in backends, one package each (local, docker, aws, slurm). Backends
are found by their entry points (gpusession.configuration.registry, the one registry), never by a
list here."""

from __future__ import annotations

from .base import Backend, Link, ListedPrices, Recorder, RemoteResource, TunnelLink

__all__ = ["Backend", "Link", "ListedPrices", "Recorder", "RemoteResource", "TunnelLink"]
