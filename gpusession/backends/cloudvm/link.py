"""Reaching a session on an instance: its own sshd (pinned host key), logged in as `gpusession`
with the session key, which may only forward to the kernel's unix sockets and the agent's fixed
port on the instance's 127.0.0.1 and run access.sh (cloudinit.py). Through that login the client follows the
boot (image pull with bytes and layers, the image's Python), sends the runtime bundle the image
needs (gpusession.transport.bundle: the agent, and ipykernel when the image has none), then forwards the
kernel's ports with a `gpusession.transport.tunnel.Tunnel`, as for a remote Docker host.

GPUSESSION_AWS_ADDRESS_MAP is the seam for tests (and for unusual networks): `FROM=TO[:PORT]`
items, comma-separated, FROM an instance address or `*`, say where an instance's sshd is really
reached. Unset, the instance's own address and port 22 are used.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import socket
import threading
import time
from pathlib import Path
from typing import Callable

from ...core.errors import StageError
from ...core.models import KernelEndpoint
from ...core.protocol import KERNEL_PORT_NAMES, NOTICE_SAVE_S, Marker, agent_token, parse_marker
from ...transport.bundle import (
    BundleError,
    ImagePython,
    cache_dir,
    code_archive_for,
    site_archive,
)
from ...transport.pulls import PullProgress, format_bytes, refused_pull
from ...transport.sshlogin import exec_command
from ...transport.tunnel import (
    CONTAINER_KERNEL_PORTS,
    HostKeyCheck,
    SshTarget,
    Tunnel,
    TunnelError,
    open_transport,
)
from ..base import TunnelLink, failure_detail
from .cloudinit import SSH_USER

log = logging.getLogger(__name__)

ADDRESS_MAP_ENV = "GPUSESSION_AWS_ADDRESS_MAP"
NOTICE_POLL_S = 5.0
ENDED_WAIT_S = 60.0  # after a notice's save, how long the container's end is looked for
BOOT_POLL_S = 1.0


def map_address(address: str, port: int = 22) -> tuple[str, int]:
    for item in os.environ.get(ADDRESS_MAP_ENV, "").split(","):
        source, sep, target = item.strip().partition("=")
        if sep and source.strip() in (address, "*"):
            host, _, mapped_port = target.strip().partition(":")
            return host, int(mapped_port) if mapped_port else port
    return address, port


def instance_target(resource: dict, forget_hint: str):
    """The instance's sshd as the session's SshTarget (user gpusession, pinned host key)."""
    import paramiko

    key = paramiko.Ed25519Key.from_private_key_file(resource["key_path"])
    host, port = map_address(resource["address"])
    return SshTarget(
        host=host,
        port=port,
        username=SSH_USER,
        keys=[key],
        host_keys=HostKeyCheck.pinned(host, port, resource["instance_host_key"], forget_hint),
    )


def kernel_info(resource: dict) -> dict:
    """The kernel's connection info, known before it starts: its unix sockets on the instance
    (ZMQ ipc, `<folder>/k-1` .. `k-5`) and the key made locally (the instance's user data hands it
    to the runtime). A session started by an earlier gpusession has no `sockets`: the fixed
    loopback ports."""
    key = Path(resource["kernel_key_path"]).read_text().strip()
    if resource.get("sockets"):
        where = {
            "ip": f"{resource['sockets']}/k",
            "transport": "ipc",
            **dict(zip(KERNEL_PORT_NAMES, range(1, 6))),
        }
    else:
        where = {
            "ip": "127.0.0.1",
            "transport": "tcp",
            **dict(zip(KERNEL_PORT_NAMES, CONTAINER_KERNEL_PORTS)),
        }
    return {**where, "key": key, "signature_scheme": "hmac-sha256", "kernel_name": "python3"}


def wait_for_login(
    target, deadline: float, *, say: Callable[[str], None], gone: Callable[[], str | None]
):
    """A logged-in transport to the instance's sshd, once it lets us in (host key checked, key
    accepted). A wrong host key fails at once; anything else is retried until `deadline`, and
    `gone()` (the instance's state when it is not coming up any more) ends it."""
    import paramiko

    last, said, started = "no answer yet", 0.0, time.monotonic()
    while True:
        try:
            sock = socket.create_connection((target.host, target.port), timeout=5)
            return open_transport(sock, target, timeout=10)
        except TunnelError as exc:
            if "authentication failed" not in str(exc):  # the host key: never retried
                raise StageError("connect", f"{exc}") from None
            last = "the instance does not accept the session key yet (cloud-init still running?)"
        except (OSError, EOFError, paramiko.SSHException) as exc:
            last = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        why_gone = gone()
        if why_gone:
            raise StageError(
                "connect",
                f"the instance stopped while starting ({why_gone}); last SSH attempt: {last}",
            )
        now = time.monotonic()
        if now > deadline:
            raise StageError(
                "connect",
                f"timed out after {now - started:.0f}s waiting for the instance's sshd at "
                f"{target.host}:{target.port}; last: {last}",
            )
        if now - said > 30:
            say(f"waiting for the instance ({last})")
            said = now
        time.sleep(1.0 if now - started < 60 else 3.0)


def run_access(
    transport, command: str, data: bytes | None = None, timeout: float = 60.0
) -> tuple[int, bytes]:
    """access.sh COMMAND on the instance (the login's forced command): (exit status, stdout)."""
    status, out, _ = exec_command(transport, command, stdin=data, timeout=timeout, open_timeout=10)
    return status, out


class BootWatch:
    """What the instance's boot says (access.sh status), turned into progress lines, the image's
    Python, and failures."""

    def __init__(self, image: str, say: Callable[[str], None]):
        self.say = say
        self.image = image
        self.pull = PullProgress(image)
        self.wants_login = False  # the boot waits for the registry login (access.sh login)
        self.seen: set[str] = set()
        self.python: ImagePython | None = None
        self.waiting_for_runtime = False
        self.started = False
        self.waiting_for_files = False  # a switch's import (BootPlan.import_files)

    def read(self, text: str) -> None:
        for line in text.splitlines():
            if line.startswith("{"):
                try:
                    self.pull.feed(json.loads(line))
                except ValueError:
                    pass
                continue
            parsed = parse_marker(line)
            if parsed is None or line in self.seen:
                continue
            self.seen.add(line)
            marker, payload = parsed
            if marker is Marker.FAILED:
                stage = payload.get("stage", "boot") if isinstance(payload, dict) else "boot"
                if stage == "image":  # said as the docker backend says its pulls
                    raise StageError(
                        "image",
                        refused_pull(
                            self.image, str(payload.get("error", "")), where="the instance"
                        )
                        or f"the instance's start failed: {failure_detail(payload)}",
                    )
                raise StageError(
                    "connect",
                    f"the instance's start failed: {failure_detail(payload)}"
                    if stage != "python"
                    else str(payload.get("error")),
                )
            if marker is Marker.PYTHON and isinstance(payload, dict):
                self.python = ImagePython.from_payload(payload)
                self.say(
                    f"the image's Python {'.'.join(map(str, self.python.version))} at {self.python.executable}"
                    + ("" if self.python.has_ipykernel else ", no ipykernel: the runtime brings it")
                )
            elif marker is Marker.BOOT:
                text_ = str(payload or "")
                self.waiting_for_runtime |= text_ == "waiting for the runtime"
                self.wants_login |= text_ == "waiting for the registry login"
                self.started |= text_ in ("runtime received", "container started")
                self.waiting_for_files |= text_ == "waiting for the workspace's files"
                self.say(f"instance: {text_}")
        if (
            self.pull.layers
            and not self.pull.layers_done == len(self.pull.layers)
            and self.pull.due()
        ):
            self.say(self.pull.line())


def follow_boot(
    transport,
    watch: BootWatch,
    deadline: float,
    gone: Callable[[], str | None],
    *,
    login: Callable[[], str | None] = lambda: None,
    reconnect: Callable[[], object] | None = None,
):
    """Until the boot waits for the runtime (or has it already: another process started it);
    sends the registry login (`login()`: the X-Registry-Auth value) when the boot asks for it.
    A dropped SSH connection is made again with `reconnect()` (the boot goes on meanwhile, its
    pull included). Returns the transport it ended with."""
    import paramiko

    login_sent = False
    while not (watch.started or (watch.python and watch.waiting_for_runtime)):
        try:
            status, out = run_access(transport, "status")
            if status == 0:
                watch.read(out.decode(errors="replace"))
            if watch.wants_login and not login_sent:
                send_login(transport, login(), watch.image)
                login_sent = True
        except (
            OSError,
            EOFError,
            paramiko.SSHException,
        ) as exc:  # the instance went away (gone() says why), or our connection to it did
            log.debug("no boot status: %s", exc)
            if reconnect is not None and not transport.is_active() and not gone():
                transport = reconnect()  # closes the dropped one
                continue
        why_gone = gone()
        if why_gone:
            raise StageError("connect", f"the instance stopped while starting ({why_gone})")
        if time.monotonic() > deadline:
            raise StageError(
                "connect",
                "timed out waiting for the instance to get the image and start: "
                + (watch.pull.line() if watch.pull.layers else "no image pull seen"),
            )
        time.sleep(BOOT_POLL_S)
    return transport


def _wait_for_files_wanted(transport, watch: BootWatch, deadline: float, gone) -> None:
    """Until the boot says it waits for the workspace's files (its volume is ready)."""
    while not watch.waiting_for_files:
        status, out = run_access(transport, "status")
        if status == 0:
            watch.read(out.decode(errors="replace"))
        if watch.waiting_for_files:
            return
        why_gone = gone()
        if why_gone:
            raise StageError("connect", f"the instance stopped while starting ({why_gone})")
        if time.monotonic() > deadline:
            raise StageError("connect", "timed out waiting for the instance's workspace volume")
        time.sleep(BOOT_POLL_S)


def send_login(transport, header: str | None, image: str) -> None:
    """The registry login to the boot script, on access.sh's standard input: never in a command
    line, the user data or a log."""
    if not header:
        raise StageError(
            "image",
            f"the instance waits for a registry login to pull {image} and none was found here: "
            "stop this session and start it again where your `docker login` (or AWS identity) is",
        )
    status, _ = run_access(transport, "login", header.encode() + b"\n", timeout=60)
    if status not in (0, 3):  # 3: it waits for none (another process sent it already)
        raise StageError(
            "image", f"the instance did not take the registry login (access.sh exited {status})"
        )


def send_runtime(transport, python: ImagePython, say: Callable[[str], None]) -> None:
    """The runtime bundle the image needs: its site (ipykernel, pip) when it lacks them, then the
    code, each checked by its hash on the instance."""
    parts = []
    try:
        if python.needs_site:
            parts.append(("site", site_archive(python, cache_dir(), say)))
    except BundleError as exc:
        raise StageError("runtime", str(exc)) from None
    parts.append(("code", code_archive_for(python)))  # compiled ahead where this machine can
    for name, archive in parts:
        data = archive.data
        say(f"sending the runtime's {name} to the instance ({format_bytes(len(data))})")
        status, _ = run_access(transport, f"put {name} {archive.digest}", data, timeout=600)
        if status != 0:
            raise StageError(
                "runtime",
                f"the instance did not take the runtime's {name} (access.sh exited {status})",
            )


def _send_runtime_again_once(transport, python: ImagePython, say, reconnect) -> None:
    """send_runtime; when the connection drops meanwhile, log in again and send it again (each
    part lands whole or not at all: access.sh put checks its hash)."""
    import paramiko

    try:
        send_runtime(transport, python, say)
    except (OSError, EOFError, paramiko.SSHException) as exc:
        log.debug("sending the runtime: %s", exc)
        try:
            send_runtime(reconnect(), python, say)
        except (OSError, EOFError, paramiko.SSHException) as again:
            raise StageError(
                "runtime",
                f"the SSH connection to the instance dropped twice while sending the runtime "
                f"({type(again).__name__}: {again})",
            ) from None


def wait_for_kernel(
    tunnel,
    endpoint: KernelEndpoint,
    deadline: float,
    gone: Callable[[], str | None],
    watch: BootWatch,
) -> None:
    """Until the agent says the kernel listens; the boot's status tells first when it failed."""
    import paramiko

    host, _, port = str(endpoint.agent_url).rpartition("//")[2].partition(":")
    headers = {"Authorization": f"Bearer {agent_token(endpoint.connection_info['key'])}"}
    last, checked = "no answer from the agent yet", 0.0
    while True:
        conn = http.client.HTTPConnection(host, int(port), timeout=3)
        try:
            conn.request("GET", "/health", headers=headers)
            response = conn.getresponse()
            health = json.loads(response.read())
            kernel = health.get("kernel")
            if response.status != 200:  # 503 until the kernel's connection file exists
                last = f"the agent answered {response.status}: {health.get('error', '')}"
            elif kernel is None or kernel.get("ready"):
                return
            else:
                last = "the kernel is starting"
        except (OSError, ValueError, http.client.HTTPException) as exc:
            last = f"{type(exc).__name__}: {exc}"
        finally:
            conn.close()
        now = time.monotonic()
        if now - checked > 2 and tunnel.transport is not None:
            checked = now
            try:
                status, out = run_access(tunnel.transport, "status", timeout=10)
                if status == 0:
                    watch.read(out.decode(errors="replace"))
            except (
                OSError,
                EOFError,
                paramiko.SSHException,
            ) as exc:  # the tunnel reconnects by itself
                log.debug("no boot status: %s", exc)
        why_gone = gone()
        if why_gone:
            raise StageError(
                "kernel", f"the instance stopped while the kernel started ({why_gone})"
            )
        if now > deadline:
            raise StageError("kernel", f"the kernel did not become ready in time ({last})")
        time.sleep(0.25)


class AwsLink(TunnelLink):
    """The tunnel to one instance's session; closing it leaves the instance running. For spot
    sessions a thread reads the interruption notice the instance's boot script saves."""

    def __init__(
        self,
        tunnel,
        kernel_info: dict,
        on_notice: Callable[[dict], None] | None = None,
        on_ended: Callable[[str], None] | None = None,
    ):
        super().__init__(tunnel, kernel_info)
        self.notice: dict | None = None
        self._closed = threading.Event()
        if on_notice is not None:
            threading.Thread(
                target=self._watch_notice,
                args=(on_notice, on_ended),
                name="gpusession-spot-notice",
                daemon=True,
            ).start()

    def close(self) -> None:
        self._closed.set()
        super().close()

    def check_notice(self) -> dict | None:
        """The spot interruption notice, if the instance has received one (read once)."""
        import paramiko

        if self.notice is None and self.tunnel.transport is not None:
            try:
                status, out = run_access(self.tunnel.transport, "notice", timeout=10)
            except (OSError, EOFError, paramiko.SSHException):
                return None
            text = out.decode(errors="replace") if status == 0 else ""
            if text.strip():
                try:
                    self.notice = json.loads(text)
                except ValueError:
                    self.notice = {"raw": text.strip()}
        return self.notice

    def _watch_notice(
        self, on_notice: Callable[[dict], None], on_ended: Callable[[str], None] | None
    ) -> None:
        while not self._closed.wait(NOTICE_POLL_S):
            notice = self.check_notice()
            if notice is not None:
                try:
                    on_notice(notice)
                except Exception:  # noqa: BLE001 - must not kill the watcher silently
                    log.warning("handling the spot notice failed", exc_info=True)
                if on_ended is not None:
                    self._follow_end(on_ended)
                return

    def _follow_end(self, on_ended: Callable[[str], None]) -> None:
        """After a notice the agent saves and ends the session; the boot script then says the
        container's last markers (CHECKPOINT, STOPPED, SUMMARY) in its status and keeps the
        instance up until they were read (cloudinit's session.sh): read them here, at once,
        where the console output shows them minutes later. `on_ended(status text)`."""
        import paramiko

        deadline = time.monotonic() + NOTICE_SAVE_S + ENDED_WAIT_S
        while not self._closed.wait(1.0) and time.monotonic() < deadline:
            transport = self.tunnel.transport
            if transport is None:
                continue
            try:
                status, out = run_access(transport, "status", timeout=10)
            except (OSError, EOFError, paramiko.SSHException):
                continue
            text = out.decode(errors="replace") if status == 0 else ""
            if any(
                p is not None and p[0] is Marker.STOPPED
                for p in map(parse_marker, text.splitlines())
            ):
                try:
                    on_ended(text)
                except Exception:  # noqa: BLE001 - must not kill the watcher silently
                    log.warning("handling the session's end failed", exc_info=True)
                return


def open_link(
    resource: dict,
    *,
    deadline: float,
    forget_hint: str,
    say: Callable[[str], None],
    gone: Callable[[], str | None],
    on_event: Callable[[str], None],
    on_notice: Callable[[dict], None] | None,
    on_ended: Callable[[str], None] | None = None,
    pull_login: Callable[[], str | None] = lambda: None,
    workspace_in: Callable[[object], None] | None = None,
) -> AwsLink:
    """`workspace_in(transport)`: a switch's import, called over the login once the boot waits
    for the workspace's files (after the runtime, before the container)."""
    target = instance_target(resource, forget_hint)
    say(f"waiting for the instance's sshd at {target.host}:{target.port}")
    transport = wait_for_login(target, deadline, say=say, gone=gone)
    watch = BootWatch(resource.get("image", "the image"), say)
    held = [transport]  # the login in use: a dropped one is made again

    def reconnect():
        held[0].close()
        say("the SSH connection to the instance dropped; logging in again (its boot goes on)")
        held[0] = wait_for_login(target, deadline, say=say, gone=gone)
        return held[0]

    try:
        follow_boot(transport, watch, deadline, gone, login=pull_login, reconnect=reconnect)
        if not watch.started:
            _send_runtime_again_once(held[0], watch.python, say, reconnect)
        if workspace_in is not None:
            _wait_for_files_wanted(held[0], watch, deadline, gone)
            workspace_in(held[0])
    finally:
        held[0].close()
    say("opening the SSH tunnel")
    tunnel = Tunnel(
        target, [], connect_timeout=max(10.0, deadline - time.monotonic()), on_event=on_event
    ).start()
    try:
        link = AwsLink(tunnel, kernel_info(resource), on_notice, on_ended)
        say("waiting for the kernel")
        wait_for_kernel(tunnel, link.endpoint, max(time.monotonic() + 30, deadline), gone, watch)
    except BaseException:
        tunnel.close()
        raise
    return link
