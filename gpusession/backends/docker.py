"""`docker`: the session kernel runs in a GPU container on a Docker engine, reached over SSH.

The engine is this machine's (DOCKER_HOST or the default socket) or a remote one at
`ssh://user@host[:port]` (the user's key and known_hosts, as `ssh` would use them). The container
(Dockerfile.cuda) runs sshd and the agent runtime; only sshd's port is published, on the engine
host's 127.0.0.1. Every session has its own ed25519 key, whose public half goes in through the
environment, and the container's host key, printed into its log, is read through the Docker API
and pinned. The kernel's ports are reached through a `gpusession.tunnel.Tunnel` (through the
engine's host over SSH for a remote engine).

Labels on every container: gpusession.session (the session id), gpusession.store (which session
store started it; gc only collects its own store's), gpusession.owner, gpusession.type,
gpusession.started (unix seconds).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shlex
import socket
import threading
import time
from typing import Any

from ..errors import BackendUnavailable, BadInput, StageError
from ..models import KernelEndpoint, LaunchSpec, SessionRecord
from ..progress import Progress
from .base import Backend, Link, RemoteResource
from .docker_engine import (
    build_or_find_image,
    container_logs,
    docker_sdk,
    engine_client,
    engine_errors,
    get_container,
    make_session_key,
    read_json_from,
    remove_container,
    short_error,
    wait_for_log,
)

log = logging.getLogger(__name__)

LABEL = "gpusession.session"
STORE_LABEL = "gpusession.store"  # which session store started it: gc leaves other stores' alone
STATE_DIR = "/run/gpusession"
START_TIMEOUT = 120.0
NO_NVIDIA = (
    "this Docker engine has no NVIDIA runtime, so the container cannot get a GPU ({detail}). "
    "On the GPU host: install the NVIDIA driver and nvidia-container-toolkit, run "
    "`sudo nvidia-ctk runtime configure --runtime=docker`, restart dockerd (`sudo systemctl restart docker`); "
    "check with `docker run --rm --gpus all IMAGE nvidia-smi`. Without a GPU, use --backend local"
)


class DockerLink(Link):
    """The tunnel to one container; closing it leaves the container running."""

    def __init__(self, endpoint: KernelEndpoint, tunnel):
        self.endpoint = endpoint
        self.tunnel = tunnel

    def close(self) -> None:
        self.tunnel.close()

    def healthy(self) -> bool:
        return self.tunnel.healthy()

    def add_forward(self, remote_port: int) -> int:
        return self.tunnel.add_forward(remote_port)

    @property
    def reconnects(self) -> int:
        return self.tunnel.reconnects


class DockerBackend(Backend):
    name = "docker"

    def __init__(self, config, store):
        super().__init__(config, store)
        self._clients: dict[str, Any] = {}
        # Another user's (or another GPUSESSION_HOME's) containers on a shared engine are not ours
        # to collect, though unknown to our store.
        where = f"{socket.gethostname()}:{os.path.realpath(store.path)}"
        self.store_tag = hashlib.sha256(where.encode()).hexdigest()[:16]

    @staticmethod
    def engine_available(timeout: float = 2.0) -> bool:
        """True when the SDK is installed and the local engine (DOCKER_HOST) answers quickly."""
        try:
            docker = docker_sdk()
            client = docker.from_env(timeout=timeout)
            try:
                return bool(client.ping())
            finally:
                client.close()
        except Exception:  # noqa: BLE001 - any failure means "not available" here
            return False

    # -- engines ------------------------------------------------------------------------

    def client(self, host: str | None):
        """The engine for a session's --host ('' or None: the local engine), cached."""
        key = host or ""
        if key not in self._clients:
            self._clients[key] = engine_client(host)
        return self._clients[key]

    def check(self, spec: LaunchSpec) -> None:
        docker_sdk()
        if spec.host and not spec.host.startswith("ssh://"):
            raise BadInput(f"--host {spec.host!r}: give a remote Docker engine as ssh://user@host[:port]")
        gpus = spec.extra.get("gpus")
        if gpus is not None and str(gpus) != "all" and not str(gpus).isdigit():
            raise BadInput(f"gpus={gpus!r}: use 'all' or a number of GPUs")

    # -- start --------------------------------------------------------------------------

    def provision(self, record: SessionRecord, progress: Progress) -> None:
        spec = record.spec
        progress.step(f"connecting to the Docker engine {spec.host or '(local)'}")
        client = self.client(spec.host)
        image = spec.image or self.config.docker_image
        build_or_find_image(client, image, progress, default_image=self.config.docker_image)
        key_path, public_key = make_session_key(self.config.data_path / "keys", record.id)
        self.store.update_resource(record.id, key_path=str(key_path), engine=spec.host or "", image=image)
        docker = docker_sdk()
        progress.step(f"creating container from {image}")
        try:
            container = client.containers.create(
                image,
                detach=True,
                init=True,
                name=f"gpusession-{record.name}-{record.id[:8]}",
                labels={
                    LABEL: record.id,
                    STORE_LABEL: self.store_tag,
                    "gpusession.owner": record.owner,
                    "gpusession.type": f"{spec.gpu_type}:{spec.gpu_count}",
                    "gpusession.started": str(int(time.time())),
                },
                environment={
                    "GPUSESSION_SESSION_ID": record.id,
                    "GPUSESSION_AUTHORIZED_KEY": public_key,
                    "GPUSESSION_AGENT_ARGS": shlex.join(_agent_args(record)),
                },
                device_requests=[_gpu_request(docker, spec)],
                ports={"22/tcp": ("127.0.0.1", None)},
            )
        except docker.errors.ImageNotFound as exc:
            raise StageError("provision", f"image {image} not found: {short_error(exc)}") from None
        except docker.errors.APIError as exc:
            raise StageError("provision", f"cannot create the container: {short_error(exc)}") from None
        self.store.update_resource(record.id, container_id=container.id)
        progress.step(f"starting container {container.short_id}")
        try:
            container.start()
        except docker.errors.APIError as exc:
            remove_container(container)
            text = short_error(exc)
            if "could not select device driver" in text:
                raise BackendUnavailable(NO_NVIDIA.format(detail=text)) from None
            raise StageError("provision", f"cannot start the container: {text}") from None
        container.reload()
        published = container.ports.get("22/tcp")
        if not published:  # it exited already: the log says why
            wait_for_log(container, "GPUSESSION_HOSTKEY ", START_TIMEOUT, stage="provision")
            raise StageError("provision", f"container {container.short_id} published no ssh port")
        port = int(published[0]["HostPort"])
        self.store.update_resource(record.id, ssh_port=port)
        progress.step("waiting for the container's sshd")
        host_key = wait_for_log(container, "GPUSESSION_HOSTKEY ", START_TIMEOUT, stage="provision")
        self.store.update_resource(record.id, host_key=host_key)

    def connect(self, record: SessionRecord, progress: Progress) -> Link:
        from ..tunnel import CONTAINER_PORTS, HostKeyCheck, SshTarget, Tunnel, jump_target, tunneled_endpoint

        res = record.resource
        client = self.client(record.spec.host)
        container = get_container(client, res.get("container_id"))
        if container is None:
            raise StageError("connect", f"container {res.get('container_id', '?')[:12]} is gone")
        import paramiko

        target = SshTarget(
            host="127.0.0.1",
            port=int(res["ssh_port"]),
            username="root",
            keys=[paramiko.Ed25519Key.from_private_key_file(res["key_path"])],
            host_keys=HostKeyCheck.pinned(
                "127.0.0.1", int(res["ssh_port"]), res["host_key"],
                forget_hint=f"stop this session (`gpusession stop {record.name}`) and start a new one",
            ),
        )
        jump = jump_target(record.spec.host) if record.spec.host else None
        progress.step("opening the SSH tunnel" + (f" through {jump.label}" if jump else ""))
        tunnel = Tunnel(
            target, list(CONTAINER_PORTS), jump=jump, connect_timeout=START_TIMEOUT,
            on_event=lambda text: self._note(record.id, text),
        )
        # log in while the kernel boots; the log tells first when the container dies meanwhile
        opening = _InThread(tunnel.start)
        try:
            progress.step("waiting for the kernel")
            wait_for_log(container, "GPUSESSION_READY", START_TIMEOUT, stage="connect")
            info = read_json_from(container, f"{STATE_DIR}/kernel.json")
            opening.result(START_TIMEOUT)
        except BaseException:
            tunnel.close()
            raise
        return DockerLink(tunneled_endpoint(tunnel, info), tunnel)

    def _note(self, session_id: str, text: str) -> None:
        try:
            self.store.note(session_id, text)
        except Exception:  # noqa: BLE001 - a note must never break the tunnel thread
            log.debug("could not record %r", text, exc_info=True)

    # -- life and teardown --------------------------------------------------------------

    def is_alive(self, record: SessionRecord) -> bool:
        try:
            container = self._find(record)
        except BackendUnavailable:
            return True  # the engine cannot be asked now: unknown is not gone, never tear down blind
        return container is not None and container.status == "running"

    def stop_reason(self, record: SessionRecord) -> str | None:
        return self.stop_details(record).get("reason")

    def stop_details(self, record: SessionRecord) -> dict:
        """What the runtime left at its end (stopped.json: reason, at, the agent's summary), read
        from the stopped container; else its GPUSESSION_STOPPED log line or exit code."""
        try:
            container = self._find(record)
            if container is None:
                return {}
            try:
                return read_json_from(container, f"{STATE_DIR}/stopped.json")
            except docker_sdk().errors.NotFound:
                pass  # still running, or it never got as far
            reason = None
            for line in container_logs(container).splitlines():
                if line.startswith("GPUSESSION_STOPPED "):
                    reason = line.split(" ", 1)[1].strip()
        except (BackendUnavailable, ValueError, OSError):
            return {}
        if reason is None and container.status == "exited":
            reason = f"container exited with code {container.attrs['State'].get('ExitCode')}"
        return {"reason": reason} if reason else {}

    def stop(self, record: SessionRecord) -> None:
        container = self._find(record)
        if container is not None:
            remove_container(container)
        (self.config.data_path / "keys" / record.id).unlink(missing_ok=True)

    def _find(self, record: SessionRecord):
        """The session's container (by saved id, else by label), None when there is none."""
        if record.spec.backend != self.name:
            return None
        client = self.client(record.spec.host)
        container = get_container(client, record.resource.get("container_id"))
        if container is None:
            with engine_errors(record.spec.host or "(local engine)"):
                found = client.containers.list(
                    all=True, ignore_removed=True, filters={"label": f"{LABEL}={record.id}"}
                )
            container = found[0] if found else None
        return container

    # -- gc -----------------------------------------------------------------------------

    def list_resources(self) -> list[RemoteResource]:
        """Containers labelled by this store, on the local engine and every remote one it used."""
        hosts = [""] + sorted({r.spec.host for r in self.store.list() if r.spec.backend == self.name and r.spec.host})
        found: list[RemoteResource] = []
        reached = 0
        for host in hosts:
            try:
                with engine_errors(host or "(local engine)"):
                    mine = {"label": [LABEL, f"{STORE_LABEL}={self.store_tag}"]}
                    containers = self.client(host).containers.list(all=True, ignore_removed=True, filters=mine)
            except BackendUnavailable as exc:
                log.warning("gc: skipping Docker engine %s: %s", host or "(local)", exc)
                continue
            reached += 1
            for c in containers:
                found.append(
                    RemoteResource(
                        backend=self.name,
                        session_id=c.labels.get(LABEL, ""),
                        resource_id=c.id,
                        description=f"container {c.name} ({c.short_id}, {c.status}) on {host or 'the local engine'}",
                        running=c.status == "running",
                        details={"host": host},
                    )
                )
        if not reached:
            raise BackendUnavailable("no Docker engine answers")
        return found

    def remove_resource(self, resource: RemoteResource) -> None:
        container = get_container(self.client(resource.details.get("host")), resource.resource_id)
        if container is not None and container.labels.get(LABEL) == resource.session_id:
            remove_container(container)
        (self.config.data_path / "keys" / resource.session_id).unlink(missing_ok=True)


class _InThread:
    """Run `fn` in a thread now; `result()` waits for it and re-raises its error."""

    def __init__(self, fn):
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self._thread.start()

    def _run(self, fn) -> None:
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001 - handed to result()
            self._error = exc

    def result(self, timeout: float) -> None:
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise StageError("connect", f"the SSH tunnel did not open within {timeout:.0f}s")
        if self._error is not None:
            raise self._error


def _agent_args(record: SessionRecord) -> list[str]:
    from .local import agent_args

    return agent_args(record)


def _gpu_request(docker, spec: LaunchSpec):
    """All of the host's GPUs, or the type's count when it names more than one (a100:4);
    spec.extra: gpus ('all' or N) overrides, gpu_driver picks the device driver."""
    gpus = spec.extra.get("gpus")
    if gpus is None:
        count = spec.gpu_count if spec.gpu_count > 1 else -1
    else:
        count = -1 if str(gpus) == "all" else int(gpus)
    return docker.types.DeviceRequest(driver=spec.extra.get("gpu_driver", ""), count=count, capabilities=[["gpu"]])
