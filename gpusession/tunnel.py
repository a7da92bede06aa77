"""SSH port forwarding with paramiko that survives a dropped connection.

`Tunnel` logs in to a target sshd (the session container's) with the session's key, checking the
server's host key against a pinned or known_hosts key (never accepting an unknown one), and
forwards remote loopback ports to listening sockets on this machine's 127.0.0.1. It can reach the
target through a jump host (the Docker host, logged in with the user's own key and known_hosts)
by a `direct-tcpip` channel.

When the SSH connection drops, the listening sockets stay where they are and a background thread
logs in again; the jupyter_client ZMQ sockets reconnect to the same local ports by themselves, and
the kernel, which never depended on the connection, keeps its variables.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import os
import socket
import threading
import time
from pathlib import Path
from typing import Callable

import paramiko

from .errors import GpuSessionError

WINDOW = 16 * 1024 * 1024  # per channel: fewer window adjusts, no stall on a fast link
PACKET = 128 * 1024  # we advertise it; sshd then sends 4x fewer packets than at 32 KiB (+40% MB/s)
BUFSIZE = 256 * 1024  # per recv: bytes move in big pieces, never per byte in Python
CIPHERS = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com", "aes128-ctr", "aes256-ctr")


class TunnelError(GpuSessionError):
    """The SSH connection could not be made; the message says why and what to do."""


@dataclasses.dataclass
class HostKeyCheck:
    """Which host keys a server may present. Anything else is refused."""

    keys: paramiko.HostKeys  # the allowed keys (pinned, or loaded from known_hosts)
    forget_hint: str  # how to drop the old key, told when the server's key changed

    @classmethod
    def pinned(cls, host: str, port: int, key: paramiko.PKey | str, forget_hint: str) -> "HostKeyCheck":
        """Allow exactly `key` (a PKey or an OpenSSH public key line) for host:port."""
        if isinstance(key, str):
            key = parse_public_key(key)
        keys = paramiko.HostKeys()
        keys.add(lookup_name(host, port), key.get_name(), key)
        return cls(keys, forget_hint)

    @classmethod
    def known_hosts(cls, path: str | os.PathLike[str] | None = None) -> "HostKeyCheck":
        """The user's known_hosts (default ~/.ssh/known_hosts)."""
        path = Path(path or Path.home() / ".ssh" / "known_hosts").expanduser()
        keys = paramiko.HostKeys()
        if path.exists():
            keys.load(str(path))
        return cls(keys, f"remove the old key with `ssh-keygen -R HOST -f {path}` and connect once with ssh to check the new one")


@dataclasses.dataclass
class SshTarget:
    """One sshd to log in to."""

    host: str
    port: int
    username: str
    keys: list[paramiko.PKey]  # tried in order
    host_keys: HostKeyCheck

    @property
    def label(self) -> str:
        return f"{self.username}@{self.host}:{self.port}"


def lookup_name(host: str, port: int) -> str:
    return host if port == 22 else f"[{host}]:{port}"


def parse_public_key(line: str) -> paramiko.PKey:
    """An OpenSSH public key line (`ssh-ed25519 AAAA... comment`) as a PKey."""
    parts = line.split()
    if len(parts) < 2:
        raise TunnelError(f"not an ssh public key line: {line!r}")
    return paramiko.PKey.from_type_string(parts[0], base64.b64decode(parts[1]))


def fingerprint(key: paramiko.PKey) -> str:
    digest = base64.b64encode(hashlib.sha256(key.asbytes()).digest()).decode().rstrip("=")
    return f"{key.get_name()} SHA256:{digest}"


def open_transport(sock, target: SshTarget, *, timeout: float = 15.0, keepalive: float = 15.0) -> paramiko.Transport:
    """SSH handshake over `sock`, host key check, public-key login. Raises TunnelError for a
    refused host key or login, paramiko.SSHException/OSError for what may pass by retrying."""
    t = paramiko.Transport(sock, default_window_size=WINDOW, default_max_packet_size=PACKET)
    t.banner_timeout = timeout
    options = t.get_security_options()
    options.ciphers = [c for c in CIPHERS if c in t._preferred_ciphers] + [
        c for c in options.ciphers if c not in CIPHERS
    ]
    name = lookup_name(target.host, target.port)
    known = target.host_keys.keys.lookup(name) or {}
    if known:  # negotiate a key type we can check, as OpenSSH does
        wanted = [k for k in known.keys()] + (["rsa-sha2-512", "rsa-sha2-256"] if "ssh-rsa" in known else [])
        options.key_types = [k for k in wanted if k in t._preferred_keys] + [
            k for k in options.key_types if k not in wanted
        ]
    try:
        t.start_client(timeout=timeout)
        _check_host_key(t.get_remote_server_key(), name, known, target.host_keys)
        _login(t, target)
    except BaseException:
        t.close()
        raise
    t.set_keepalive(int(keepalive))
    return t


def _check_host_key(offered: paramiko.PKey, name: str, known: dict, check: HostKeyCheck) -> None:
    if not known:
        raise TunnelError(
            f"host {name} is not in known_hosts: refusing to connect to an unknown host; "
            f"connect once with `ssh` to check and accept its key ({fingerprint(offered)})"
        )
    expected = known.get(offered.get_name())
    if expected is None or expected != offered:
        want = ", ".join(fingerprint(k) for k in known.values())
        raise TunnelError(
            f"host key for {name} changed: refusing to connect; it offered {fingerprint(offered)} but {want} "
            f"was expected (someone may be intercepting the connection). If you expect this, {check.forget_hint}"
        )


def _login(t: paramiko.Transport, target: SshTarget) -> None:
    errors = []
    for key in target.keys:
        try:
            t.auth_publickey(target.username, key)
            if t.is_authenticated():
                return
        except paramiko.AuthenticationException as exc:
            errors.append(f"{key.get_name()} {fingerprint(key).split()[-1]}: {exc}")
    tried = "; ".join(errors) or "no key to offer"
    raise TunnelError(f"authentication failed for {target.label}: the server refused every key ({tried})")


def _tcp(host: str, port: int, timeout: float) -> socket.socket:
    sock = socket.create_connection((host, port), timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for opt, value in (("TCP_KEEPIDLE", 15), ("TCP_KEEPINTVL", 5), ("TCP_KEEPCNT", 3), ("TCP_USER_TIMEOUT", 45000)):
        if hasattr(socket, opt):  # Linux: a silent peer (laptop slept) is noticed in under a minute
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, opt), value)
    sock.settimeout(None)
    return sock


_RETRYABLE = (paramiko.SSHException, EOFError, OSError)


class Tunnel:
    """Forward remote loopback ports of `target` to local ports, reconnecting when dropped.

    tunnel = Tunnel(target, [50001, 50002], jump=docker_host).start()
    tunnel.local_port(50001)  # -> a port on 127.0.0.1 here
    """

    def __init__(
        self,
        target: SshTarget,
        remote_ports: list[int] | tuple[int, ...] = (),
        *,
        jump: SshTarget | None = None,
        connect_timeout: float = 60.0,
        keepalive: float = 15.0,
        give_up_after: float = 300.0,
        on_event: Callable[[str], None] | None = None,
    ):
        self.target = target
        self.jump = jump
        self.connect_timeout = connect_timeout
        self.keepalive = keepalive
        self.give_up_after = give_up_after  # healthy() turns False after this long down
        self.on_event = on_event or (lambda text: None)
        self.reconnects = 0
        self._remote_ports = list(remote_ports)
        self._listeners: dict[int, socket.socket] = {}
        self._transport: paramiko.Transport | None = None
        self._jump_transport: paramiko.Transport | None = None
        self._up = threading.Event()
        self._closed = threading.Event()
        self._lock = threading.RLock()
        self._conns: set[socket.socket] = set()
        self._down_since: float | None = None

    # -- life -------------------------------------------------------------------------

    def start(self) -> "Tunnel":
        """Log in (retrying while sshd is not answering yet) and open the local ports."""
        self._connect(deadline=time.monotonic() + self.connect_timeout)
        try:
            for port in self._remote_ports:
                self.add_forward(port)
        except BaseException:
            self.close()
            raise
        threading.Thread(target=self._watch, name="gpusession-tunnel-watch", daemon=True).start()
        return self

    def close(self) -> None:
        """Stop listening, cut every forwarded connection, log out. The remote side keeps running."""
        self._closed.set()
        with self._lock:
            listeners, self._listeners = list(self._listeners.values()), {}
            transports = (self._transport, self._jump_transport)
            self._transport = self._jump_transport = None
        for sock in listeners:
            _shut(sock)
        self._cut_connections()
        for t in transports:
            if t is not None:
                t.close()

    def __enter__(self) -> "Tunnel":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def transport(self) -> paramiko.Transport | None:
        return self._transport

    def healthy(self) -> bool:
        """Up, or down for less than give_up_after while reconnecting."""
        if self._closed.is_set():
            return False
        t = self._transport
        if t is not None and t.is_active():
            return True
        return self._down_since is None or time.monotonic() - self._down_since < self.give_up_after

    def local_port(self, remote_port: int) -> int:
        return self._listeners[remote_port].getsockname()[1]

    def add_forward(self, remote_port: int, local_port: int = 0) -> int:
        """Listen on 127.0.0.1:local_port (0: any free port) for remote_port; returns the port."""
        with self._lock:
            if remote_port in self._listeners:
                return self.local_port(remote_port)
            listener = socket.socket()
            try:
                listener.bind(("127.0.0.1", local_port))
            except OSError as exc:
                listener.close()
                raise TunnelError(f"cannot listen on 127.0.0.1:{local_port} for remote port {remote_port}: {exc}") from None
            listener.listen(64)
            self._listeners[remote_port] = listener
        threading.Thread(
            target=self._accept, args=(listener, remote_port), name=f"gpusession-tunnel-{remote_port}", daemon=True
        ).start()
        return listener.getsockname()[1]

    # -- connecting ---------------------------------------------------------------------

    def _connect(self, deadline: float) -> None:
        """Log in to the target; retry what sshd-not-ready-yet looks like until `deadline`."""
        last: BaseException | None = None
        delay = 0.05
        while not self._closed.is_set():
            try:
                transport = open_transport(self._target_socket(), self.target, keepalive=self.keepalive)
            except TunnelError:
                raise
            except _RETRYABLE as exc:
                last = exc
                if time.monotonic() + delay > deadline:
                    raise TunnelError(
                        f"cannot reach sshd at {self.target.label} within {self.connect_timeout:.0f}s: "
                        f"{type(exc).__name__}: {exc}"
                    ) from None
                time.sleep(delay)
                delay = min(delay * 1.5, 1.0)
                continue
            with self._lock:
                if self._closed.is_set():
                    transport.close()
                    return
                old, self._transport = self._transport, transport
            if old is not None:
                old.close()
            with self._lock:
                self._down_since = None
                self._up.set()
            return
        if last is not None:
            raise TunnelError(f"tunnel closed while connecting: {last}")

    def _target_socket(self):
        if self.jump is None:
            return _tcp(self.target.host, self.target.port, timeout=10)
        jt = self._jump_transport
        if jt is None or not jt.is_active():
            try:
                sock = _tcp(self.jump.host, self.jump.port, timeout=10)
            except OSError as exc:
                raise TunnelError(f"cannot reach {self.jump.label}: {exc}") from None
            try:
                jt = open_transport(sock, self.jump, keepalive=self.keepalive)
            except (paramiko.SSHException, EOFError, OSError) as exc:
                raise TunnelError(f"ssh to {self.jump.label} failed: {type(exc).__name__}: {exc}") from None
            self._jump_transport = jt
        return jt.open_channel(
            "direct-tcpip", (self.target.host, self.target.port), ("127.0.0.1", 0),
            window_size=WINDOW, max_packet_size=PACKET, timeout=10,
        )

    def _watch(self) -> None:
        """Notice a dropped connection and log in again, for as long as the tunnel is open."""
        while not self._closed.wait(0.2):
            t = self._transport
            if t is not None and t.is_active():
                continue
            with self._lock:
                self._up.clear()
                if self._down_since is None:
                    self._down_since = time.monotonic()
            self.on_event("tunnel: connection lost; reconnecting")
            self._cut_connections()
            delay = 0.2
            while not self._closed.is_set():
                try:
                    self._connect(deadline=time.monotonic() + 30)
                    break
                except (TunnelError, *_RETRYABLE) as exc:
                    self.on_event(f"tunnel: reconnect failed ({exc}); retrying in {delay:.0f}s")
                    if self._closed.wait(delay):
                        return
                    delay = min(delay * 2, 5.0)
            if not self._closed.is_set():
                self.reconnects += 1
                self.on_event("tunnel: reconnected")

    # -- forwarding ---------------------------------------------------------------------

    def _accept(self, listener: socket.socket, remote_port: int) -> None:
        while not self._closed.is_set():
            try:
                conn, peer = listener.accept()
            except OSError:
                return  # closed
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=self._forward, args=(conn, peer, remote_port), daemon=True).start()

    def _forward(self, conn: socket.socket, peer, remote_port: int) -> None:
        with self._lock:
            self._conns.add(conn)
        try:
            chan = self._open_channel(peer, remote_port)
            if chan is not None:
                _pump(conn, chan)
        finally:
            with self._lock:
                self._conns.discard(conn)
            conn.close()

    def _open_channel(self, peer, remote_port: int) -> paramiko.Channel | None:
        """None when the remote port does not answer (the kernel is not listening yet, or the
        tunnel is down): the local connection is closed, and its client (ZMQ) retries."""
        if not self._up.wait(5.0):
            return None
        t = self._transport
        if t is None:
            return None
        try:
            return t.open_channel(
                "direct-tcpip", ("127.0.0.1", remote_port), peer,
                window_size=WINDOW, max_packet_size=PACKET, timeout=10,
            )
        except (paramiko.ChannelException, paramiko.SSHException, EOFError, OSError):
            return None

    def _cut_connections(self) -> None:
        with self._lock:
            conns = list(self._conns)
        for conn in conns:
            _shut(conn)


def _pump(conn: socket.socket, chan: paramiko.Channel) -> None:
    """Copy both ways until the remote end closes; a local EOF is passed on as a half-close."""

    def upstream() -> None:
        try:
            while True:
                data = conn.recv(BUFSIZE)
                if not data:
                    break
                chan.sendall(data)
            chan.shutdown_write()
        except (OSError, EOFError, paramiko.SSHException):
            pass

    up = threading.Thread(target=upstream, daemon=True)
    up.start()
    try:
        while True:
            data = chan.recv(BUFSIZE)
            if not data:
                break
            conn.sendall(data)
    except (OSError, EOFError, paramiko.SSHException):
        pass
    finally:
        _shut(conn)
        chan.close()
        up.join(timeout=5)


def _shut(sock: socket.socket) -> None:
    """Close a socket and wake any thread blocked on it."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()
