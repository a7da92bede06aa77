"""The Docker engine side of the docker backend: the SDK (imported lazily), connecting to a local
or `ssh://` engine with clear errors, and reading a container's log and files through the API
(the image and the runtime bundle: `runtime`)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import queue
import threading
import time
from typing import Any, Callable, Iterator

from ...core.errors import BackendUnavailable, StageError
from ...core.protocol import Marker, parse_marker
from ..base import failure_detail, log_tail, marker_lines
from .ssh import make_resilient

STATE_DIR = "/tmp/gpusession"  # the runtime's state folder in a session's container
LABEL = "gpusession.session"  # on every container of a session: its id
STORE_LABEL = (
    "gpusession.session.store"  # which session store started it: gc leaves other stores' alone
)
HELPER_LABEL = (
    "gpusession.helper-of"  # on a start's throwaway helpers: the session whose start made it
)


def owning_session(labels: dict[str, str]) -> str:
    """The session a labelled container belongs to: its own, or for a start's helper the session
    being started (gc judges a helper by that session's record, as the session's container)."""
    return labels.get(HELPER_LABEL) or labels.get(LABEL, "")


INSTALL_HINT = "the docker backend needs the Docker SDK for Python: pip install 'docker>=7.1'"


def docker_sdk():
    """The `docker` package, or BackendUnavailable saying how to install it."""
    try:
        import docker
    except ImportError:
        raise BackendUnavailable(INSTALL_HINT) from None
    return docker


def short_error(exc: BaseException) -> str:
    """The engine's own words, without the HTTP wrapping of docker.errors.APIError."""
    explanation = getattr(exc, "explanation", None)
    text = explanation.decode(errors="replace") if isinstance(explanation, bytes) else explanation
    return str(text or exc).strip()


@contextlib.contextmanager
def engine_errors(where: str) -> Iterator[None]:
    """Turn 'cannot talk to the engine' failures (SDK, HTTP, SSH) into BackendUnavailable."""
    import paramiko
    import requests

    docker = docker_sdk()
    try:
        yield
    except (docker.errors.NotFound, docker.errors.ImageNotFound):
        raise
    except paramiko.BadHostKeyException as exc:
        raise BackendUnavailable(
            f"host key for {exc.hostname} changed: refusing to connect to {where} (someone may be intercepting "
            f"the connection). If you expect this, remove the old key with `ssh-keygen -R {exc.hostname}` and "
            f"connect once with `ssh {exc.hostname}` to check the new one"
        ) from None
    except paramiko.AuthenticationException as exc:
        raise BackendUnavailable(
            f"ssh authentication to {where} failed ({exc}): check that your key (IdentityFile in ~/.ssh/config, "
            "or ~/.ssh/id_ed25519) is in the host's authorized_keys; `ssh` to it must work without a password"
        ) from None
    except paramiko.SSHException as exc:
        if "not found in known_hosts" in str(exc):
            raise BackendUnavailable(
                f"{where}: the host is not in ~/.ssh/known_hosts, so its identity cannot be checked; "
                "connect once with `ssh` to check and accept its key"
            ) from None
        if "protocol banner" in str(exc) or "protocol version" in str(exc):
            # the port took the connection, then closed it or said no SSH: a wrong port, a
            # firewall or proxy that accepts every connection, an sshd refusing us before it speaks
            raise BackendUnavailable(
                f"cannot reach the Docker engine {where}: its SSH port took the connection but no SSH "
                f"server answered on it ({exc}); check the host and port (`ssh` to it must work) and "
                "that sshd runs there, or try again if it was only busy (sshd's MaxStartups)"
            ) from None
        raise BackendUnavailable(f"ssh to {where} failed: {exc}") from None
    except docker.errors.DockerException as exc:
        raise BackendUnavailable(f"the Docker engine {where} failed: {short_error(exc)}") from None
    except (requests.exceptions.RequestException, OSError, EOFError) as exc:
        raise BackendUnavailable(
            f"cannot reach the Docker engine {where}: {type(exc).__name__}: {exc}"
        ) from None


def engine_client(host: str | None):
    """A DockerClient for --host (ssh://user@host[:port]) or the local engine (DOCKER_HOST)."""
    docker = docker_sdk()
    where = host or os.environ.get("DOCKER_HOST") or "(local engine)"
    if host:
        _check_reachable(host)
    with engine_errors(where):
        try:
            if host:
                # paramiko, not the ssh binary: exec_run breaks with use_ssh_client=True (docker-py #3218)
                client = docker.DockerClient(base_url=host, use_ssh_client=False, timeout=60)
                make_resilient(
                    client
                )  # a dropped channel or SSH connection: reconnect, retry reads once
            else:
                client = docker.from_env(timeout=60)
            quiet_environment(client)
            client.ping()
        except docker.errors.DockerException as exc:
            if host:
                raise
            raise BackendUnavailable(
                f"no Docker engine answers at {where} ({short_error(exc)}): install Docker and start it "
                "(`sudo systemctl start docker`), give a remote one with --host ssh://user@host, "
                "or use --backend local"
            ) from None
    return client


def quiet_environment(client) -> None:
    """An engine on a unix socket or over SSH takes no HTTP proxy: its client stops asking the
    environment for one (requests reads every variable of os.environ at each API call, and a
    start makes seven). A tcp:// engine keeps HTTP(S)_PROXY and NO_PROXY."""
    if not str(client.api.base_url).startswith(("http://", "https://")):
        client.api.trust_env = False


def _check_reachable(url: str, timeout: float = 10.0) -> None:
    """Fail fast and clearly when the engine's host does not answer on its SSH port (docker-py's
    own SSH connect has no timeout)."""
    import socket

    # lazy: docs/architecture.md#imports-kept-inside-functions
    from ...transport.tunnel import TunnelError, jump_target

    try:
        login = jump_target(url)
    except TunnelError as exc:
        raise BackendUnavailable(str(exc)) from None
    try:
        socket.create_connection((login.host, login.port), timeout=timeout).close()
    except UnicodeError:  # a host name no resolver takes (a part over 63 characters)
        raise BackendUnavailable(
            f"cannot reach the Docker engine {url[:80]}: its host name is no valid DNS name"
        ) from None
    except OSError as exc:
        reason = "timed out" if isinstance(exc, socket.timeout) else (exc.strerror or str(exc))
        raise BackendUnavailable(
            f"cannot reach the Docker engine {url}: {login.host}:{login.port} {reason}; "
            "is the host up, and does `ssh` to it work?"
        ) from None


def local_engine_states(label: str, timeout: float = 2.0) -> dict[str, str] | None:
    """The value of `label` -> the state ("running", "exited", ...) of each container carrying
    it, asked of the local engine over its unix socket with the standard library: importing the
    SDK alone costs more than the whole question, and `gpusession list` asks it. None when the
    local engine is no unix socket (DOCKER_HOST tcp:// or ssh://) or does not answer in time."""
    import socket
    import urllib.parse

    host = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    if not host.startswith("unix://"):
        return None
    # one HTTP/1.0 request by hand (no keep-alive, no chunking: the body runs to EOF); http.client
    # would bring ssl and email, half again the time of the question
    query = urllib.parse.urlencode({"all": "1", "filters": json.dumps({"label": [label]})})
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(host[len("unix://") :])
            sock.sendall(f"GET /containers/json?{query} HTTP/1.0\r\nHost: docker\r\n\r\n".encode())
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
        status = head.split(b"\r\n", 1)[0].split()
        containers = json.loads(body) if len(status) > 1 and status[1] == b"200" else None
    except (OSError, ValueError):
        return None
    if not isinstance(containers, list):
        return None
    return container_states(containers, label)


def container_states(containers: list[dict], label: str) -> dict[str, str]:
    """What the engine's container list (its JSON: Labels, State) says, by `label`'s value; a
    running container wins over others with the same label."""
    states: dict[str, str] = {}
    for c in containers:
        value = (c.get("Labels") or {}).get(label)
        if value and states.get(value) != "running":
            states[value] = str(c.get("State") or "")
    return states


def get_container(client, container_id: str | None):
    if not container_id:
        return None
    docker = docker_sdk()
    try:
        with engine_errors("while looking for the container"):
            return client.containers.get(container_id)
    except docker.errors.NotFound:
        return None


def create_container(client, image: str, environment: dict[str, str], **kwargs):
    """`client.containers.create(image, environment=..., **kwargs)` without the inspect docker-py
    makes after it: a round trip between every session's create and its start. The model holds
    the id and the environment (what a start reads of it: the kernel's key); `reload()` fills the
    rest. docker 7.x's own conversion of the arguments; the SDK's call where that is not there."""
    try:
        from docker.models.containers import _create_container_args

        version = client.api._version
    except (ImportError, AttributeError):  # another docker-py: its own call, inspect and all
        return client.containers.create(image, environment=environment, **kwargs)
    made = client.api.create_container(
        **_create_container_args(
            {**kwargs, "image": image, "environment": environment, "version": version}
        )
    )
    env = [f"{name}={value}" for name, value in environment.items()]
    return client.containers.prepare_model({"Id": made["Id"], "Config": {"Env": env}})


def followed_log(container):
    """`container.logs(stdout, stderr, stream, follow)` without the inspect docker-py makes before
    it reads (is the container a TTY? ours never are): that round trip came between a start's
    request for the log and its first line. docker 7.x's own stream; the SDK's call where that
    is not there."""
    docker = docker_sdk()
    api = container.client.api
    try:
        get, check = api._get, api._raise_for_status
        helper = api._multiplexed_response_stream_helper
        url = api._url("/containers/{0}/logs", container.id)
    except AttributeError:  # another docker-py
        return container.logs(stdout=True, stderr=True, stream=True, follow=True)
    params = {"stdout": 1, "stderr": 1, "timestamps": 0, "follow": 1, "tail": "all"}
    response = get(url, params=params, stream=True)
    check(response)
    return docker.types.CancellableStream(helper(response), response)


def remove_container(container) -> None:
    docker = docker_sdk()
    try:
        container.remove(force=True)
    except docker.errors.NotFound:
        pass
    except docker.errors.APIError as exc:
        if "already in progress" not in str(exc):
            raise


def container_logs(container, tail: int | str = "all") -> str:
    with engine_errors("while reading the container's log"):
        return container.logs(stdout=True, stderr=True, tail=tail).decode(errors="replace")


def wait_for_marker(
    container,
    marker: Marker,
    timeout: float,
    stage: str,
    sooner: Callable[[Any], bool] | None = None,
) -> Any:
    """The payload of the first `marker` line in the container's log (`protocol.parse_marker`,
    also where the marker shares its line with another writer's half line); fails when the
    runtime says it failed (FAILED) or the container exits first.

    `sooner` (a followed log only): once a KERNEL line came, it is asked every SOONER_S with that
    line's payload, which stands for `marker`'s as soon as it says True (what READY would say is
    seen here first: the kernel's unix sockets take connections; the log's line comes through
    the engine's log copier, 10-20 ms later on a busy machine).

    The local engine's log is followed as a stream (one request; each line read as the engine
    passes it on): a start waits for this line, and polling would find it up to a poll interval
    late. An engine over SSH is polled: docker-py cannot cancel a followed log there."""
    if "ssh" in str(getattr(container.client.api, "base_url", "ssh")):
        return _poll_for_marker(container, marker, timeout, stage)
    deadline = time.monotonic() + timeout
    while True:
        with engine_errors("while reading the container's log"):
            stream = followed_log(container)
        try:
            found = _follow(stream, marker, deadline, timeout, stage, sooner)
        finally:
            stream.close()
        if found[0]:
            return found[1]
        text = found[1]
        container.reload()  # the stream ended: the container exited, or the engine's read timed out
        if container.status not in ("created", "running"):
            code = container.attrs["State"].get("ExitCode")
            last = log_tail(text, 8)
            raise StageError(
                stage, f"container exited with code {code} during start; last log lines: {last}"
            )


# how often wait_for_marker's `sooner` is asked (the floor's client looks at its ports so often)
SOONER_S = 0.005


def _follow(
    stream,
    marker: Marker,
    deadline: float,
    timeout: float,
    stage: str,
    sooner: Callable[[Any], bool] | None = None,
) -> tuple[bool, Any]:
    """(True, payload) once `marker` is in the followed log (or `sooner` says yes to KERNEL's,
    wait_for_marker); (False, the log so far) when the stream ended without it. Raises for FAILED
    and at the deadline."""
    chunks: queue.Queue = queue.Queue()

    def pump() -> None:
        try:
            for chunk in stream:
                chunks.put(chunk)
        except Exception:  # noqa: BLE001 - closed by us, or the engine went away: the end of the stream
            pass
        chunks.put(None)

    threading.Thread(target=pump, name="gpusession-log-follow", daemon=True).start()
    text = ""
    kernel = None  # KERNEL's payload, once said (with `sooner`)
    while True:
        left = max(0.0, deadline - time.monotonic())
        try:
            chunk = chunks.get(timeout=left if kernel is None else min(left, SOONER_S))
        except queue.Empty:
            if kernel is not None and left > 0:
                if sooner(kernel):
                    return True, kernel
                continue
            last = log_tail(text, 8)
            raise StageError(
                stage,
                f"no {marker.value} line from the container within {timeout:.0f}s; "
                f"last log lines: {last}",
            ) from None
        if chunk is not None:
            text += chunk.decode(errors="replace")
        whole = (
            text if chunk is None else text[: text.rfind("\n") + 1]
        )  # a line may come in two chunks
        for line in marker_lines(whole):
            parsed = parse_marker(line)
            if parsed is None:
                continue
            if parsed[0] is marker:
                return True, parsed[1]
            if parsed[0] is Marker.FAILED:
                raise StageError(stage, f"the session runtime failed: {failure_detail(parsed[1])}")
            if parsed[0] is Marker.KERNEL and sooner is not None:
                kernel = parsed[1]
        if kernel is not None and sooner(kernel):
            return True, kernel
        if chunk is None:
            return False, text


def _poll_for_marker(container, marker: Marker, timeout: float, stage: str) -> Any:
    """wait_for_marker by reading the whole log every 20-30 ms: for an engine over SSH, whose
    followed log docker-py cannot cancel."""
    deadline = time.monotonic() + timeout
    delay = 0.02
    while True:
        text = container_logs(container)
        for line in marker_lines(text):
            parsed = parse_marker(line)
            if parsed is None:
                continue
            if parsed[0] is marker:
                return parsed[1]
            if parsed[0] is Marker.FAILED:
                raise StageError(stage, f"the session runtime failed: {failure_detail(parsed[1])}")
        container.reload()
        if container.status not in ("created", "running"):
            code = container.attrs["State"].get("ExitCode")
            last = log_tail(text, 8)
            raise StageError(
                stage, f"container exited with code {code} during start; last log lines: {last}"
            )
        if time.monotonic() > deadline:
            last = log_tail(text, 8)
            raise StageError(
                stage,
                f"no {marker.value} line from the container within {timeout:.0f}s; "
                f"last log lines: {last}",
            )
        time.sleep(delay)
        delay = min(
            delay * 1.5, 0.03
        )  # a start waits for this: found within 30 ms, one cheap call each


def read_json_from(container, path: str) -> dict:
    """A JSON file inside the container, read through the Docker API (no exec needed)."""
    with engine_errors(f"while reading {path} in the container"):
        stream, _ = container.get_archive(path)
    import tarfile

    with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
        member = tar.getmembers()[0]
        return json.loads(tar.extractfile(member).read())
