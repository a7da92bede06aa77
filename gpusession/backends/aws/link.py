"""Reaching a session on an instance: the instance's sshd (pinned host key) as the jump host,
the container's sshd on the instance's 127.0.0.1:2222 (pinned too) as the target, and the kernel
and agent ports forwarded by `gpusession.tunnel.Tunnel`, exactly as for a remote Docker host.

GPUSESSION_AWS_ADDRESS_MAP is the seam for tests (and for unusual networks): `FROM=TO[:PORT]`
items, comma-separated, FROM an instance address or `*`, say where an instance's sshd is really
reached. Unset, the instance's own address and port 22 are used.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from typing import Callable

from ...errors import StageError
from ...protocol import StopDetails
from ..base import TunnelLink
from .cloudinit import CONTAINER_SSH_PORT, NOTICES_IN_CONTAINER, SPOT_NOTICE_FILE, SSH_USER

log = logging.getLogger(__name__)

ADDRESS_MAP_ENV = "GPUSESSION_AWS_ADDRESS_MAP"
STATE_DIR = "/run/gpusession"
NOTICE_POLL_S = 5.0


def map_address(address: str, port: int = 22) -> tuple[str, int]:
    for item in os.environ.get(ADDRESS_MAP_ENV, "").split(","):
        source, sep, target = item.strip().partition("=")
        if sep and source.strip() in (address, "*"):
            host, _, mapped_port = target.strip().partition(":")
            return host, int(mapped_port) if mapped_port else port
    return address, port


def targets(resource: dict, forget_hint: str):
    """(jump, target) SshTargets for a session's saved resource."""
    import paramiko

    from ...tunnel import HostKeyCheck, SshTarget

    key = paramiko.Ed25519Key.from_private_key_file(resource["key_path"])
    host, port = map_address(resource["address"])
    jump = SshTarget(host=host, port=port, username=SSH_USER, keys=[key],
                     host_keys=HostKeyCheck.pinned(host, port, resource["instance_host_key"], forget_hint))
    target = SshTarget(host="127.0.0.1", port=CONTAINER_SSH_PORT, username="root", keys=[key],
                       host_keys=HostKeyCheck.pinned("127.0.0.1", CONTAINER_SSH_PORT, resource["container_host_key"],
                                                     forget_hint))
    return jump, target


def wait_for_container_sshd(jump, deadline: float, *, say: Callable[[str], None],
                            gone: Callable[[], str | None]) -> None:
    """Until the instance's sshd lets us in (host key checked, key accepted) and the container's
    sshd answers behind it. A wrong host key fails at once; anything else is retried until
    `deadline`, and `gone()` (the instance's state when it is not coming up any more) ends it."""
    import paramiko

    from ...tunnel import TunnelError, open_transport

    phase, last, said = "instance", "no answer yet", 0.0
    started = time.monotonic()
    while True:
        transport = None
        try:
            sock = socket.create_connection((jump.host, jump.port), timeout=5)
            transport = open_transport(sock, jump, timeout=10)
            phase = "container"
            chan = transport.open_channel("direct-tcpip", ("127.0.0.1", CONTAINER_SSH_PORT), ("127.0.0.1", 0),
                                          timeout=10)
            chan.settimeout(10)
            banner = chan.recv(64)
            chan.close()
            if banner.startswith(b"SSH-"):
                return
            last = "the container's port answered without an SSH banner yet"
        except TunnelError as exc:
            if "authentication failed" not in str(exc):  # the host key: never retried
                raise StageError("connect", f"{exc}") from None
            last = "the instance does not accept the session key yet (cloud-init still running?)"
        except (OSError, EOFError, paramiko.SSHException) as exc:
            last = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        finally:
            if transport is not None:
                transport.close()
        why_gone = gone()
        if why_gone:
            raise StageError("connect", f"the instance stopped while starting ({why_gone}); last SSH attempt: {last}")
        now = time.monotonic()
        if now > deadline:
            where = ("the instance's sshd at " + f"{jump.host}:{jump.port}") if phase == "instance" else \
                "the session container's sshd (image pull or container start still running, or it failed)"
            raise StageError("connect", f"timed out after {now - started:.0f}s waiting for {where}; last: {last}")
        if now - said > 30:
            say(f"waiting for {'the instance' if phase == 'instance' else 'the session container'} ({last})")
            said = now
        time.sleep(1.0 if now - started < 60 else 3.0)


def read_remote(transport, path: str, timeout: float = 10.0) -> str | None:
    """A file's text in the container, through an exec channel; None when it is not there."""
    chan = transport.open_session(timeout=timeout)
    try:
        chan.settimeout(timeout)
        chan.exec_command(f"cat {path} 2>/dev/null")
        data = b""
        while True:
            piece = chan.recv(65536)
            if not piece:
                break
            data += piece
        status = chan.recv_exit_status()
    finally:
        chan.close()
    return data.decode(errors="replace") if status == 0 else None


def wait_for_kernel(tunnel, deadline: float, gone: Callable[[], str | None]) -> dict:
    """The kernel's connection file, once the runtime says the kernel is ready."""
    import paramiko

    last = "no runtime.json yet"
    while True:
        transport = tunnel.transport
        try:
            if transport is not None:
                text = read_remote(transport, f"{STATE_DIR}/runtime.json")
                runtime = json.loads(text) if text else {}
                if runtime.get("ready"):
                    return json.loads(read_remote(transport, f"{STATE_DIR}/kernel.json") or "{}")
                stopped = read_remote(transport, f"{STATE_DIR}/stopped.json")
                if stopped:
                    raise StageError("kernel", f"the session runtime stopped while starting: {_why(stopped)}")
        except (OSError, EOFError, ValueError, paramiko.SSHException) as exc:
            last = f"{type(exc).__name__}: {exc}"
        why_gone = gone()
        if why_gone:
            raise StageError("kernel", f"the instance stopped while the kernel started ({why_gone})")
        if time.monotonic() > deadline:
            raise StageError("kernel", f"the kernel did not become ready in time ({last})")
        time.sleep(0.25)


def _why(stopped_json: str) -> str:
    """The reason in a runtime's stopped.json, for an error message."""
    reason = StopDetails.from_dict(json.loads(stopped_json)).reason
    if reason is None:
        return "no reason given"
    return f"{reason.kind.value}: {reason.detail}" if reason.detail else reason.kind.value


class AwsLink(TunnelLink):
    """The tunnel to one instance's session container; closing it leaves the instance running.
    For spot sessions a thread reads the interruption notice the instance's boot script saves."""

    def __init__(self, tunnel, kernel_info: dict, on_notice: Callable[[dict], None] | None = None):
        super().__init__(tunnel, kernel_info)
        self.notice: dict | None = None
        self._closed = threading.Event()
        if on_notice is not None:
            threading.Thread(target=self._watch_notice, args=(on_notice,), name="gpusession-spot-notice",
                             daemon=True).start()

    def close(self) -> None:
        self._closed.set()
        super().close()

    def check_notice(self) -> dict | None:
        """The spot interruption notice, if the instance has received one (read once)."""
        import paramiko

        if self.notice is None and self.tunnel.transport is not None:
            try:
                text = read_remote(self.tunnel.transport, f"{NOTICES_IN_CONTAINER}/{SPOT_NOTICE_FILE}")
            except (OSError, EOFError, paramiko.SSHException):
                return None
            if text:
                try:
                    self.notice = json.loads(text)
                except ValueError:
                    self.notice = {"raw": text.strip()}
        return self.notice

    def _watch_notice(self, on_notice: Callable[[dict], None]) -> None:
        while not self._closed.wait(NOTICE_POLL_S):
            notice = self.check_notice()
            if notice is not None:
                try:
                    on_notice(notice)
                except Exception:  # noqa: BLE001 - must not kill the watcher silently
                    log.warning("handling the spot notice failed", exc_info=True)
                return


def open_link(resource: dict, *, deadline: float, forget_hint: str, say: Callable[[str], None],
              gone: Callable[[], str | None], on_event: Callable[[str], None],
              on_notice: Callable[[dict], None] | None) -> AwsLink:
    from ...tunnel import CONTAINER_PORTS, Tunnel

    jump, target = targets(resource, forget_hint)
    say(f"waiting for the instance's sshd at {jump.host}:{jump.port} and the session container behind it")
    wait_for_container_sshd(jump, deadline, say=say, gone=gone)
    say("opening the SSH tunnel")
    tunnel = Tunnel(target, list(CONTAINER_PORTS), jump=jump,
                    connect_timeout=max(10.0, deadline - time.monotonic()), on_event=on_event).start()
    try:
        say("waiting for the kernel")
        info = wait_for_kernel(tunnel, max(time.monotonic() + 30, deadline), gone)
    except BaseException:
        tunnel.close()
        raise
    return AwsLink(tunnel, info, on_notice)
