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

import logging
import shlex
import threading
import time
from typing import Any

from ..agentargs import args_for
from ..errors import BackendUnavailable, BadInput, StageError
from ..models import LaunchSpec, SessionRecord
from ..progress import Progress
from ..protocol import ENV_AGENT_ARGS, ENV_AUTHORIZED_KEY, ENV_SESSION_ID, Marker, StopDetails, StopKind, StopReason
from .base import Backend, Link, RemoteResource, TunnelLink, stop_details_from_log
from .docker_engine import (
    build_or_find_image,
    container_logs,
    docker_sdk,
    engine_client,
    engine_errors,
    get_container,
    read_json_from,
    remove_container,
    short_error,
    wait_for_marker,
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


class DockerBackend(Backend):
    name = "docker"

    def __init__(self, config, recorder):
        super().__init__(config, recorder)
        self._clients: dict[str, Any] = {}

    @classmethod
    def available(cls, timeout: float = 2.0) -> bool:
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
        from ..sshlogin import make_session_key

        spec = record.spec
        progress.step(f"connecting to the Docker engine {spec.host or '(local)'}")
        client = self.client(spec.host)
        image = spec.image or self.config.docker_image
        build_or_find_image(client, image, progress, default_image=self.config.docker_image)
        key_path, public_key = make_session_key(self.config.data_path / "keys", record.id)
        self.recorder.save(record.id, key_path=str(key_path), engine=spec.host or "", image=image)
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
                    # another user's (or GPUSESSION_HOME's) containers on a shared engine are
                    # not ours to collect, though unknown to our store
                    STORE_LABEL: self.recorder.store_id,
                    "gpusession.owner": record.owner,
                    "gpusession.type": f"{spec.gpu_type}:{spec.gpu_count}",
                    "gpusession.started": str(int(time.time())),
                },
                environment={
                    ENV_SESSION_ID: record.id,
                    ENV_AUTHORIZED_KEY: public_key,
                    ENV_AGENT_ARGS: shlex.join(args_for(record)),
                },
                device_requests=[_gpu_request(docker, spec)],
                ports={"22/tcp": ("127.0.0.1", None)},
            )
        except docker.errors.ImageNotFound as exc:
            raise StageError("provision", f"image {image} not found: {short_error(exc)}") from None
        except docker.errors.APIError as exc:
            raise StageError("provision", f"cannot create the container: {short_error(exc)}") from None
        self.recorder.save(record.id, container_id=container.id)
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
            wait_for_marker(container, Marker.HOSTKEY, START_TIMEOUT, stage="provision")
            raise StageError("provision", f"container {container.short_id} published no ssh port")
        port = int(published[0]["HostPort"])
        self.recorder.save(record.id, ssh_port=port)
        progress.step("waiting for the container's sshd")
        host_key = wait_for_marker(container, Marker.HOSTKEY, START_TIMEOUT, stage="provision")
        self.recorder.save(record.id, host_key=host_key)

    def connect(self, record: SessionRecord, progress: Progress) -> Link:
        from ..tunnel import CONTAINER_PORTS, HostKeyCheck, SshTarget, Tunnel, jump_target

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
            wait_for_marker(container, Marker.READY, START_TIMEOUT, stage="connect")
            info = read_json_from(container, f"{STATE_DIR}/kernel.json")
            opening.result(START_TIMEOUT)
        except BaseException:
            tunnel.close()
            raise
        return TunnelLink(tunnel, info)

    # -- life and teardown --------------------------------------------------------------

    def is_alive(self, record: SessionRecord) -> bool:
        try:
            container = self._find(record)
        except BackendUnavailable:
            return True  # the engine cannot be asked now: unknown is not gone, never tear down blind
        return container is not None and container.status == "running"

    def stop_details(self, record: SessionRecord) -> StopDetails | None:
        """What the runtime left at its end (stopped.json: reason, at, the agent's summary), read
        from the stopped container; else its log markers; else the container's exit code."""
        saved = StopDetails()
        try:
            container = self._find(record)
            if container is None:
                return None
            try:
                saved = StopDetails.from_dict(read_json_from(container, f"{STATE_DIR}/stopped.json"))
            except docker_sdk().errors.NotFound:
                pass  # still running, or it never got as far
            if saved.reason is not None:
                return saved
            logged = stop_details_from_log(container_logs(container)) or StopDetails()
        except (BackendUnavailable, ValueError, OSError):
            return None
        reason = logged.reason
        if reason is None and container.status == "exited":
            reason = StopReason(StopKind.CONTAINER_EXIT, exit_code=container.attrs["State"].get("ExitCode"))
        details = StopDetails(reason=reason, at=saved.at, summary=saved.summary or logged.summary)
        return None if details == StopDetails() else details

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
        hosts = [""] + sorted({r.spec.host for r in self.recorder.sessions(self.name) if r.spec.host})
        found: list[RemoteResource] = []
        reached = 0
        for host in hosts:
            try:
                with engine_errors(host or "(local engine)"):
                    mine = {"label": [LABEL, f"{STORE_LABEL}={self.recorder.store_id}"]}
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


def _gpu_request(docker, spec: LaunchSpec):
    """All of the host's GPUs, or the type's count when it names more than one (a100:4);
    spec.extra: gpus ('all' or N) overrides, gpu_driver picks the device driver."""
    gpus = spec.extra.get("gpus")
    if gpus is None:
        count = spec.gpu_count if spec.gpu_count > 1 else -1
    else:
        count = -1 if str(gpus) == "all" else int(gpus)
    return docker.types.DeviceRequest(driver=spec.extra.get("gpu_driver", ""), count=count, capabilities=[["gpu"]])
