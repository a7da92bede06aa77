"""The backend contract: where GPUs come from.

A backend creates, connects to, and removes the remote side of a session. It never imports
`gpusession.session`; the session layer calls it in this order:

    check(spec)                -> before anything is recorded or paid for
    provision(record, progress)-> creates the paid resource, saving its handle early
    connect(record, progress)  -> waits for the kernel, opens any tunnel, returns a Link
    ... cells run through the Link ...
    stop(record)               -> idempotent teardown, also of a half-provisioned session

Every paid resource carries the session id remotely (container labels, instance tags, a process
environment variable), and `list_resources()` finds them, so `gpusession gc` can stop what a
crashed process left behind. State saved with `Store.update_resource` (like jupyter_client's
provisioner `get_provisioner_info`) is all another process needs to connect or stop.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import TYPE_CHECKING, Any, Callable, ClassVar

if TYPE_CHECKING:
    from ..catalog import Catalog
    from ..config import GpuSessionConfig
    from ..models import KernelEndpoint, LaunchSpec, SessionRecord
    from ..progress import Progress
    from ..store import Store


@dataclasses.dataclass
class RemoteResource:
    """Something a backend holds that is labelled as ours (what gc looks at)."""

    backend: str  # backend name
    session_id: str  # the label/tag value
    resource_id: str  # container id, instance id, pid...
    description: str  # one line for the user
    running: bool  # still consuming (billing) resources
    details: dict[str, Any] = dataclasses.field(default_factory=dict)


class Link(abc.ABC):
    """A live connection to a session's kernel (and agent). Owned by one process."""

    endpoint: "KernelEndpoint"

    @abc.abstractmethod
    def close(self) -> None:
        """Called by the session layer when this process lets go (stop, or interpreter exit).
        Closes tunnels; never stops the remote kernel by itself."""

    def healthy(self) -> bool:
        """Called while a cell runs: False when the link is down beyond repair."""
        return True

    def add_forward(self, remote_port: int) -> int:
        """Forward another remote loopback port; return the local port. Links without a
        tunnel (the remote side is this machine) return remote_port."""
        return remote_port

    @property
    def reconnects(self) -> int:
        """How often the link came back after dropping (0 for links that cannot drop). Read by the
        session before each cell: after a reconnect each ZMQ socket reconnects on its own, and a
        request sent before iopub is subscribed again would lose its output."""
        return 0


class Backend(abc.ABC):
    """One place GPUs come from. Registered under the `gpusession.backends` entry-point group."""

    name: ClassVar[str]

    def __init__(self, config: "GpuSessionConfig", store: "Store"):
        self.config = config
        self.store = store

    def price_per_hour(self, spec: "LaunchSpec", catalog: "Catalog") -> float:
        """Called once when a session is recorded. Own hardware: the configured price, or the
        catalog's on-demand rate for the same GPUs when none is configured."""
        if self.config.price_per_hour >= 0:
            return self.config.price_per_hour
        gpu = catalog.get(spec.gpu_type)
        return catalog.price_per_hour(gpu, spec.gpu_count)

    def check(self, spec: "LaunchSpec") -> None:
        """Called before the session is recorded: raise BadInput / BackendUnavailable with an
        actionable message when this backend cannot serve `spec` (no engine, no SDK...)."""

    @abc.abstractmethod
    def provision(self, record: "SessionRecord", progress: "Progress") -> None:
        """Called after the record exists (state provisioning). Create the remote side and save
        its handle with `self.store.update_resource(record.id, ...)` as soon as it exists, so a
        crash right after leaves it findable. Raise StageError on failure; the caller then calls
        `stop`."""

    @abc.abstractmethod
    def connect(self, record: "SessionRecord", progress: "Progress") -> Link:
        """Called after provision (state starting), or by any process that wants to use a running
        session. Wait until the kernel answers on its ports and return a Link whose endpoint's
        connection info points at local ports."""

    @abc.abstractmethod
    def stop(self, record: "SessionRecord") -> None:
        """Called by stop, by a failed start, and by gc. Remove everything the session holds;
        succeed when it is already gone; never raise for a half-provisioned session."""

    @abc.abstractmethod
    def is_alive(self, record: "SessionRecord") -> bool:
        """Called while cells run and by gc: does the remote side still exist and run?"""

    def stop_reason(self, record: "SessionRecord") -> str | None:
        """Called when a session is found gone: why the remote side ended (idle, max cost...),
        when it left a word about it."""
        return None

    @abc.abstractmethod
    def list_resources(self) -> list[RemoteResource]:
        """Called by gc: every resource labelled as ours this backend can see, any session's."""

    @abc.abstractmethod
    def remove_resource(self, resource: RemoteResource) -> None:
        """Called by gc for a resource whose session is stopped or unknown."""


BackendFactory = Callable[["GpuSessionConfig", "Store"], Backend]
