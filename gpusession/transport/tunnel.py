"""SSH port forwarding with paramiko that survives a dropped connection.

`Tunnel` logs in to a target sshd (the session container's; `gpusession.transport.sshlogin` checks its host
key and logs in) and forwards remote loopback ports to listening sockets on this machine's
127.0.0.1, optionally through a jump host (the Docker host) by a `direct-tcpip` channel.

When the SSH connection drops, the listening sockets stay where they are and a background thread
logs in again; the jupyter_client ZMQ sockets reconnect to the same local ports by themselves, and
the kernel, which never depended on the connection, keeps its variables.

Giving up: a server that answers and refuses us (changed host key, refused login) is final, and
`healthy()` turns False at once; an unreachable one is retried for ever in the background, but
`healthy()` is False once it has been down `give_up_after` seconds (GPUSESSION_RECONNECT_TIMEOUT,
default 60s), so a waiting cell ends then. `failure` says why, in one sentence.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import Callable

import paramiko

from ..configuration.settings import RECONNECT_ENV, private_socket_dir, reconnect_give_up
from ..core.durations import format_duration
from ..core.models import KernelEndpoint
from ..core.protocol import KERNEL_PORT_NAMES
from .sshlogin import (
    NEAR_WINDOW,
    PACKET,
    ChannelData,
    HostKeyCheck,
    LinkWindows,
    LoginRefused,
    ReadAhead,
    SshTarget,
    TunnelError,
    fast_reads,
    fingerprint,
    hold_interactive,
    jump_target,
    open_transport,
    parse_public_key,
    shutdown_write,
    tcp_socket,
    window_adjust,
)

__all__ = [
    "Tunnel",
    "TunnelError",
    "SshTarget",
    "HostKeyCheck",
    "jump_target",
    "fingerprint",
    "parse_public_key",
]

BUFSIZE = 256 * 1024  # per recv: bytes move in big pieces, never per byte in Python

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
        give_up_after: float | None | str = "env",
        on_event: Callable[[str], None] | None = None,
    ):
        self.target = target
        self.jump = jump
        self.connect_timeout = connect_timeout
        self.keepalive = keepalive
        # healthy() turns False after this long down (None: never); "env": GPUSESSION_RECONNECT_TIMEOUT
        self.give_up_after = reconnect_give_up() if give_up_after == "env" else give_up_after
        self.on_event = on_event or (lambda text: None)
        self.reconnects = 0
        self._remote_ports = list(remote_ports)
        self._listeners: dict[
            int | str, socket.socket
        ] = {}  # remote port, or remote unix socket path
        self._socket_dir: str | None = (
            None  # the 0700 folder of the local unix sockets, made at the first
        )
        self._transport: paramiko.Transport | None = None
        self._jump_transport: paramiko.Transport | None = None
        self._windows: LinkWindows | None = None  # the target login's channels' windows
        self._up = threading.Event()
        self._closed = threading.Event()
        self._lock = threading.RLock()
        self._conns: set[socket.socket] = set()
        self._down_since: float | None = None
        self._refused: LoginRefused | None = None  # the server refused us: no more tries
        self._last_error = ""

    # -- life -------------------------------------------------------------------------

    def start(self) -> "Tunnel":
        """Log in (retrying while sshd is not answering yet) and open the local ports."""
        self._connect(deadline=time.monotonic() + self.connect_timeout)
        try:
            if self._closed.is_set():
                raise TunnelError("the tunnel was closed while it was connecting")
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
        if self._socket_dir is not None:
            import shutil

            shutil.rmtree(self._socket_dir, ignore_errors=True)
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
        """Up, or down for less than give_up_after while reconnecting; never after a refusal."""
        return self.failure is None

    @property
    def failure(self) -> TunnelError | None:
        """Why the tunnel is not healthy (None while it is): closed, refused for good, or down
        for longer than give_up_after (it keeps trying; healthy again once it is back)."""
        if self._closed.is_set():
            return TunnelError("the tunnel is closed")
        if self._refused is not None:
            return self._refused
        t = self._transport
        if t is not None and t.is_active():
            return None
        down_since = self._down_since
        if down_since is None or self.give_up_after is None:
            return None
        if time.monotonic() - down_since < self.give_up_after:
            return None
        last = f" (last error: {self._last_error})" if self._last_error else ""
        return TunnelError(
            f"cannot reach {self.target.label}: down for over {format_duration(self.give_up_after)}, "
            f"the reconnect give-up time ({RECONNECT_ENV}){last}; still trying in the background"
        )

    def local_port(self, remote_port: int) -> int:
        return self._listeners[remote_port].getsockname()[1]

    def add_forward(self, remote_port: int, local_port: int = 0) -> int:
        """Listen on 127.0.0.1:local_port (0: any free port) for remote_port; returns the port."""
        with self._lock:
            if self._closed.is_set():
                raise TunnelError("the tunnel is closed")
            if remote_port in self._listeners:
                return self.local_port(remote_port)
            listener = socket.socket()
            try:
                listener.bind(("127.0.0.1", local_port))
            except OSError as exc:
                listener.close()
                raise TunnelError(
                    f"cannot listen on 127.0.0.1:{local_port} for remote port {remote_port}: {exc}"
                ) from None
            listener.listen(64)
            self._listeners[remote_port] = listener
        threading.Thread(
            target=self._accept,
            args=(listener, remote_port),
            name=f"gpusession-tunnel-{remote_port}",
            daemon=True,
        ).start()
        return listener.getsockname()[1]

    def add_socket_forward(self, remote_path: str, name: str = "") -> str:
        """Listen on a unix socket `name` (default: a new one) in a 0700 folder of this user's for
        the remote unix socket `remote_path` (OpenSSH's direct-streamlocal channel); returns the
        local socket's path.
        Unlike a loopback port, no other user of this machine can connect to it."""
        with self._lock:
            if self._closed.is_set():
                raise TunnelError("the tunnel is closed")
            if remote_path in self._listeners:
                return self._listeners[remote_path].getsockname()
            if self._socket_dir is None:
                self._socket_dir = private_socket_dir("gpusession-tunnel-")
            listener = socket.socket(socket.AF_UNIX)
            local = os.path.join(self._socket_dir, name or f"s{len(self._listeners)}")
            listener.bind(local)
            listener.listen(64)
            self._listeners[remote_path] = listener
        threading.Thread(
            target=self._accept,
            args=(listener, remote_path),
            name="gpusession-tunnel-unix",
            daemon=True,
        ).start()
        return local

    def open_stream(self, remote_path: str) -> paramiko.Channel | None:
        """A channel to the remote unix socket `remote_path`, read here directly (no local socket,
        no forwarding thread); None when the tunnel is down (it may come back: ask again)."""
        chan = self._open_channel(None, remote_path)
        if chan is not None:
            fast_reads(chan)
        return chan

    # -- connecting ---------------------------------------------------------------------

    def _connect(self, deadline: float) -> None:
        """Log in to the target; retry what sshd-not-ready-yet looks like until `deadline`."""
        last: BaseException | None = None
        delay = 0.05
        while not self._closed.is_set():
            try:
                sock = self._target_socket()
                transport = open_transport(sock, self.target, keepalive=self.keepalive)
            except TunnelError:
                raise
            except _RETRYABLE as exc:
                last = exc
                self._last_error = f"{type(exc).__name__}: {exc}"
                if time.monotonic() + delay > deadline:
                    raise TunnelError(
                        f"cannot reach sshd at {self.target.label} within {self.connect_timeout:.0f}s: "
                        f"{type(exc).__name__}: {exc}"
                    ) from None
                self._closed.wait(delay)
                delay = min(delay * 1.5, 1.0)
                continue
            with self._lock:
                if self._closed.is_set():
                    transport.close()
                    return
                old, self._transport = self._transport, transport
                via_jump = isinstance(sock, paramiko.Channel)
                tcp = getattr(self._jump_transport, "sock", None) if via_jump else sock
                self._windows = windows = LinkWindows(transport, tcp)
            if via_jump:  # the jump host's channel carries them all: it grows with them
                windows.add(sock)
            windows.measure_soon()
            if old is not None:
                old.close()
            with self._lock:
                self._down_since = None
                self._last_error = ""
                self._up.set()
            _interactive_soon(transport)
            return
        if last is not None:
            raise TunnelError(f"tunnel closed while connecting: {last}")

    def _target_socket(self):
        if self.jump is None:
            return tcp_socket(self.target.host, self.target.port, timeout=10)
        jt = self._jump_transport
        if jt is None or not jt.is_active():
            try:
                sock = tcp_socket(self.jump.host, self.jump.port, timeout=10)
            except OSError as exc:
                raise TunnelError(f"cannot reach {self.jump.label}: {exc}") from None
            try:
                jt = open_transport(sock, self.jump, keepalive=self.keepalive)
            except (paramiko.SSHException, EOFError, OSError) as exc:
                raise TunnelError(
                    f"ssh to {self.jump.label} failed: {type(exc).__name__}: {exc}"
                ) from None
            with self._lock:
                if self._closed.is_set():
                    jt.close()
                    raise TunnelError("the tunnel was closed while it was connecting")
                self._jump_transport = jt
            _interactive_soon(jt)  # the jump host's sshd relays every reply too
        return jt.open_channel(
            "direct-tcpip",
            (self.target.host, self.target.port),
            ("127.0.0.1", 0),
            window_size=NEAR_WINDOW,  # grows with the target login's (_connect)
            max_packet_size=PACKET,
            timeout=10,
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
            delay, failures = 0.2, 0
            while not self._closed.is_set():
                try:
                    self._connect(deadline=time.monotonic() + 30)
                    break
                except LoginRefused as exc:  # asking again gets the same answer
                    self._refused = exc
                    self.on_event(f"tunnel: reconnect refused, giving up ({exc})")
                    return
                except (TunnelError, *_RETRYABLE) as exc:
                    failures += 1
                    if isinstance(exc, TunnelError):
                        self._last_error = str(exc)
                    if failures == 1:  # once per outage: the session's record is no log file
                        self.on_event(f"tunnel: reconnect failed ({exc}); still trying")
                    if self._closed.wait(delay):
                        return
                    delay = min(delay * 2, 5.0)
            if not self._closed.is_set():
                self.reconnects += 1
                self.on_event("tunnel: reconnected")

    # -- forwarding ---------------------------------------------------------------------

    def _accept(self, listener: socket.socket, remote_port: int | str) -> None:
        while not self._closed.is_set():
            try:
                conn, peer = listener.accept()
            except OSError:
                return  # closed
            if conn.family == socket.AF_INET:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(
                target=self._forward, args=(conn, peer, remote_port), daemon=True
            ).start()

    def _forward(self, conn: socket.socket, peer, remote_port: int | str) -> None:
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

    def _open_channel(self, peer, remote_port: int | str) -> paramiko.Channel | None:
        """None when the remote port does not answer (the kernel is not listening yet, or the
        tunnel is down): the local connection is closed, and its client (ZMQ) retries."""
        if not self._up.wait(5.0):
            return None
        with self._lock:
            t, windows = self._transport, self._windows
        if t is None or windows is None:
            return None
        try:
            if isinstance(remote_port, str):
                chan = _open_streamlocal(t, remote_port, timeout=10, window=windows.window)
            else:
                chan = t.open_channel(
                    "direct-tcpip",
                    ("127.0.0.1", remote_port),
                    peer,
                    window_size=windows.window,
                    max_packet_size=PACKET,
                    timeout=10,
                )
            return windows.add(chan)
        except (paramiko.ChannelException, paramiko.SSHException, EOFError, OSError):
            return None

    def _cut_connections(self) -> None:
        with self._lock:
            conns = list(self._conns)
        for conn in conns:
            _shut(conn)


def _open_streamlocal(
    transport: paramiko.Transport, path: str, timeout: float, window: int = NEAR_WINDOW
) -> paramiko.Channel:
    """A `direct-streamlocal@openssh.com` channel to the unix socket `path` on the server (sshd's
    AllowStreamLocalForwarding, on by default). paramiko's open_channel packs addresses only for
    the tcpip kinds; this is its open sequence with this kind's fields: the path, then a
    reserved empty string and a reserved 0."""
    from paramiko.common import cMSG_CHANNEL_OPEN
    from paramiko.message import Message

    if not transport.active:
        raise paramiko.SSHException("SSH session not active")
    with transport.lock:
        window = transport._sanitize_window_size(window)
        packet = transport._sanitize_packet_size(PACKET)
        chanid = transport._next_channel()
        m = Message()
        m.add_byte(cMSG_CHANNEL_OPEN)
        m.add_string("direct-streamlocal@openssh.com")
        m.add_int(chanid)
        m.add_int(window)
        m.add_int(packet)
        m.add_string(path)
        m.add_string("")
        m.add_int(0)
        chan = paramiko.Channel(chanid)
        transport._channels.put(chanid, chan)
        transport.channel_events[chanid] = event = threading.Event()
        transport.channels_seen[chanid] = True
        chan._set_transport(transport)
        chan._set_window(window, packet)
    transport._send_user_message(m)
    deadline = time.monotonic() + timeout
    while not event.wait(0.1):
        if not transport.active:
            raise transport.get_exception() or paramiko.SSHException("Unable to open channel.")
        if time.monotonic() > deadline:
            raise paramiko.SSHException("Timeout opening channel.")
    opened = transport._channels.get(chanid)
    if opened is None:  # refused: no such socket (the kernel not listening yet), or forwarding off
        raise transport.get_exception() or paramiko.ChannelException(2, "Connect failed")
    return opened


def _interactive_soon(transport: paramiko.Transport) -> None:
    """hold_interactive, off the start path: the tunnel forwards at once, without the tail soon."""
    threading.Thread(
        target=hold_interactive, args=(transport,), name="gpusession-tunnel-pty", daemon=True
    ).start()


def _pump(conn: socket.socket, chan: paramiko.Channel) -> None:
    """Copy both ways until the remote end closes; a local EOF is passed on as a half-close."""
    fast_reads(chan)
    down = _Downstream(conn, chan) if _Downstream.fits(chan) else None

    def upstream() -> None:
        try:
            while True:
                data = conn.recv(BUFSIZE)
                if not data:
                    break
                chan.sendall(data)
            # the remote end may have closed already: an EOF after its CLOSE makes sshd drop
            # the whole connection (sshlogin.shutdown_write sends none to a closed channel)
            if not chan.eof_received:
                shutdown_write(chan)
        except (OSError, EOFError, paramiko.SSHException):
            pass

    up = threading.Thread(target=upstream, daemon=True)
    up.start()
    try:
        if down is not None:
            down.run()
        else:  # a paramiko whose channel buffer is not the one _Downstream was written for
            while data := chan.recv(BUFSIZE):
                conn.sendall(data)
    except (OSError, EOFError, paramiko.SSHException):
        pass
    finally:
        if down is not None and down.data is not None:
            down.data.remove(chan)
        _shut(conn)
        try:
            chan.close()
        except (OSError, EOFError, paramiko.SSHException):
            pass  # the transport is gone already
        up.join(timeout=5)


class _Downstream:
    """The remote end's bytes for one forwarded connection, into its local socket, in order.
    paramiko's transport thread, which decrypts them, sends them on itself where the socket takes
    them at once (nothing queued ahead of them, no key exchange under way) and gives the window
    back; the rest waits in the channel's buffer for `run`, this connection's own thread. Where
    the login's socket has more bytes read already (sshlogin.ReadAhead), the packets they hold
    are decrypted first and sent on together, once those are done: one send and one wake-up of
    the reader for many packets, as OpenSSH's client writes what it has. Handing every packet
    from one thread to the other (a wake-up and two copies each) was what kept a stream under
    OpenSSH's rate (docs/benchmarks.md, "The raw stream's rate")."""

    def __init__(self, conn: socket.socket, chan: paramiko.Channel):
        self.conn, self.chan, self.pipe = conn, chan, chan.in_buffer
        self.sending = False  # a thread is in conn.send: the other one sends nothing meanwhile
        self.owed = 0  # window the transport thread could not give back (a key exchange began)
        self.direct = 0  # bytes sent on by the transport thread (tests/test_tunnel.py)
        sock = chan.transport.sock
        self.ahead = sock if isinstance(sock, ReadAhead) else None
        self.data = None  # the login's ChannelData, where it hands this channel's bytes here
        if _DONTWAIT:  # else (Windows) all through `run`
            self.pipe.feed = self.feed  # what paramiko's Channel._feed calls, per channel
            self.data = ChannelData.of(chan.transport)
            if self.data is not None:
                self.data.add(chan, self.take)

    @staticmethod
    def fits(chan: paramiko.Channel) -> bool:
        """Whether this paramiko's channel and buffer have what _Downstream uses of them
        (tests/test_tunnel.py notices when they do not; _pump then reads as before)."""
        pipe, t = chan.in_buffer, chan.transport
        return (
            all(hasattr(pipe, a) for a in ("_lock", "_cv", "_buffer", "_closed", "_event", "feed"))
            and hasattr(chan, "_check_add_window")
            and all(hasattr(t, a) for a in ("clear_to_send", "clear_to_send_lock", "_send_message"))
        )

    def feed(self, data: bytes) -> None:
        """In the transport thread, for each packet's bytes: into the buffer, then sent on now
        or once the bytes read ahead are decrypted (`flush`). The buffer's reader (`run`) is woken
        only for what the transport thread does not send; it may take them any time, in order."""
        with self.pipe._lock:
            self.pipe._buffer.frombytes(data)
        self._then()

    def take(self, views: list[memoryview]) -> None:
        """`feed` for packets' bytes from ChannelData (a read's): kept as they are, not copied."""
        with self.pipe._lock:
            self.pipe._buffer.keep(views)
        self._then()

    def _then(self) -> None:
        if self.ahead is not None and self.ahead.has_more():
            self.ahead.before_waiting(self.flush)
        else:
            self.flush()

    def flush(self) -> None:
        """In the transport thread: what the buffer holds, into the local socket as far as it
        takes it at once; the rest for `run`."""
        pipe = self.pipe
        with pipe._lock:
            if (
                self.sending
                or not len(pipe._buffer)
                or pipe._closed  # its end came in the same reads: `run` sends what is left
                or not self.chan.transport.clear_to_send.is_set()
            ):
                self._wake()
                return
            buffer = pipe._buffer
            size, parts = len(buffer), _pieces(buffer)
            del buffer[:size]
            self.sending = True
        try:  # the pieces as they are, in one system call
            sent = self.conn.sendmsg(parts, (), _DONTWAIT)
        except OSError:  # full (BlockingIOError), or the local side gone: `run` finds out
            sent = 0
        with pipe._lock:
            self.sending = False
            if sent < size:  # the rest back for `run` (the buffer is empty: only we fill it)
                rest = sent
                for part in parts:
                    if rest >= len(part):
                        rest -= len(part)
                        continue
                    buffer.frombytes(part[rest:] if rest else part)
                    rest = 0
                self._wake()
            elif pipe._closed:
                self._wake()
        if sent:
            self.direct += sent
            self._give_back_here(self.chan._check_add_window(sent))

    def _wake(self) -> None:
        """`run`, for what waits in the buffer (called under its lock)."""
        pipe = self.pipe
        if pipe._event is not None:
            pipe._event.set()
        pipe._cv.notify_all()

    def _give_back_here(self, n: int) -> None:
        """A WINDOW_ADJUST from the transport thread, which must not wait for a key exchange
        (it is the one that runs it): where one began, `run` sends it instead."""
        if n <= 0:
            return
        t = self.chan.transport
        if t.clear_to_send_lock.acquire(blocking=False):
            try:
                if t.clear_to_send.is_set():
                    t._send_message(window_adjust(self.chan, n))
                    return
            finally:
                t.clear_to_send_lock.release()
        with self.pipe._lock:
            self.owed += n
            self._wake()

    def run(self) -> None:
        """Until the channel closes: what waits in the buffer, sent in order; the windows."""
        pipe, chan = self.pipe, self.chan
        while True:
            with pipe._lock:
                while not self.owed and (
                    self.sending or (not len(pipe._buffer) and not pipe._closed)
                ):
                    pipe._cv.wait()  # (a send of the transport thread ends in a wake-up)
                owed, self.owed = self.owed, 0
                data = b""
                if not self.sending and len(pipe._buffer):
                    size = len(pipe._buffer)
                    data = pipe._buffer[:size].tobytes()
                    del pipe._buffer[:size]
                    self.sending = True
                elif pipe._closed and not len(pipe._buffer) and not self.sending:
                    return  # the remote end closed, and everything it sent is sent on
            if data:
                try:
                    self.conn.sendall(data)
                finally:
                    with pipe._lock:
                        self.sending = False
                owed += chan._check_add_window(len(data))
            if owed > 0:
                chan.transport._send_user_message(window_adjust(chan, owed))


def _pieces(buffer) -> list[bytes]:
    """A channel buffer's bytes: its pieces as they came (sshlogin._Pieces), else in one."""
    parts = getattr(buffer, "parts", None)
    return list(parts) if parts is not None else [buffer[: len(buffer)].tobytes()]


_DONTWAIT = getattr(socket, "MSG_DONTWAIT", 0)  # 0 (Windows): no sends from the transport thread


def _shut(sock: socket.socket) -> None:
    """Close a socket and wake any thread blocked on it."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()


# The agent's fixed loopback port on an EC2 instance (backends/cloudvm/cloudinit.py; elsewhere the runtime
# takes a free one and says which), and the kernel's, for a session started before its unix sockets.
CONTAINER_KERNEL_PORTS = (50001, 50002, 50003, 50004, 50005)
CONTAINER_AGENT_PORT = 50010
CONTAINER_PORTS = (*CONTAINER_KERNEL_PORTS, CONTAINER_AGENT_PORT)


def tunneled_endpoint(
    tunnel: Tunnel, info: dict, agent_port: int | None = CONTAINER_AGENT_PORT
) -> KernelEndpoint:
    """The remote kernel.json with this tunnel's local ports in place of its remote ones (each
    forwarded by the tunnel), and the agent's remote port (None: no agent) likewise. A kernel on
    unix sockets (ipc transport) is reached through local unix sockets in a 0700 folder."""
    if info.get("transport") == "ipc":
        # ZMQ's ipc endpoints are `<ip>-<port>`: the local ones are <folder>/k-1 .. <folder>/k-5
        local = [
            tunnel.add_socket_forward(f"{info['ip']}-{info[name]}", f"k-{i}")
            for i, name in enumerate(KERNEL_PORT_NAMES, 1)
        ]
        info = dict(
            info, ip=local[0][:-2], **{name: i for i, name in enumerate(KERNEL_PORT_NAMES, 1)}
        )
        agent_url = (
            f"http://127.0.0.1:{tunnel.add_forward(int(agent_port))}" if agent_port else None
        )
        return KernelEndpoint(connection_info=info, agent_url=agent_url)
    info = dict(info, ip="127.0.0.1")
    for name in KERNEL_PORT_NAMES:
        info[name] = tunnel.add_forward(int(info[name]))
    agent_url = f"http://127.0.0.1:{tunnel.add_forward(int(agent_port))}" if agent_port else None
    return KernelEndpoint(connection_info=info, agent_url=agent_url)
