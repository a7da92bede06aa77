"""Logging in over SSH with paramiko: host keys checked against a pinned key or known_hosts
(an unknown or changed key is refused, never accepted), public-key login, clear errors, and the
per-session login keys backends make. Used by `gpusession.transport.tunnel` and the backends."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import logging
import os
import socket
import struct
import threading
import time
from pathlib import Path
from typing import Callable, Iterable

import paramiko
from paramiko.common import MSG_CHANNEL_DATA, cMSG_CHANNEL_WINDOW_ADJUST

from ..core.errors import GpuSessionError

# A channel's receive window: how much sshd may send that we have not read yet. It opens at
# OpenSSH's own (what scp's channel gets) and grows, once the link's round trip is known
# (LinkWindows), to what a far link needs (window_for), up to WINDOW. Not 16 MiB from the start:
# sshd then holds megabytes our client has not read, and a busy client (a laptop's other work)
# makes it hold them, in buffers it moves about: beside one `yes` its CPU for a 200 MB download
# swung 0.3-2.9 s and the download with it (0.44-0.86x scp; 2 MiB: 0.27-0.39 s and 1.05-1.09x).
NEAR_WINDOW = 2 * 1024 * 1024
WINDOW = 16 * 1024 * 1024  # the most a far link's channel grows to (100 ms: 160 MB/s)
# bytes/s a grown window keeps in flight (about twice what our client takes)
LINK_RATE = 512 * 1024 * 1024
READ_AHEAD = 256 * 1024  # bytes a login's socket is read by at once (ReadAhead)
# the largest packet we take (advertised in each channel's open): a server may send fewer, larger
# packets up to it; OpenSSH 9.2's sshd sends 32 KiB ones whatever we advertise, as it reads its side
# 32 KiB at a time (docs/benchmarks.md, "The raw stream's rate")
PACKET = 128 * 1024
# paramiko logs every failed try (sshd not up yet) with a traceback; with no logging set up,
# Python would print those into the notebook. Our errors say what failed instead.
LOG_CHANNEL = "gpusession.ssh"
logging.getLogger(LOG_CHANNEL).addHandler(logging.NullHandler())
# ...and so for the paramiko transports docker-py opens to an ssh:// engine: a cut connection
# would print "Socket exception: ..." into the cell that runs at that moment
logging.getLogger("paramiko").addHandler(logging.NullHandler())
CIPHERS = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com", "aes128-ctr", "aes256-ctr")


class TunnelError(GpuSessionError):
    """The SSH connection could not be made; the message says why and what to do."""


class LoginRefused(TunnelError):
    """The server answered and refused us (its host key is unknown or changed, or it refused every
    login key): trying again cannot help, so a reconnecting tunnel gives up at once."""


@dataclasses.dataclass
class HostKeyCheck:
    """Which host keys a server may present. Anything else is refused."""

    keys: paramiko.HostKeys  # the allowed keys (pinned, or loaded from known_hosts)
    forget_hint: str  # how to drop the old key, told when the server's key changed

    @classmethod
    def pinned(
        cls, host: str, port: int, key: paramiko.PKey | str, forget_hint: str
    ) -> "HostKeyCheck":
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
        return cls(
            keys,
            f"remove the old key with `ssh-keygen -R HOST -f {path}` and connect once with ssh to check the new one",
        )


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


def jump_target(url: str) -> SshTarget:
    """The SSH login `ssh user@host` would make for ssh://user@host[:port]: ~/.ssh/config (HostName,
    Port, User, IdentityFile, UserKnownHostsFile), else the default keys and ~/.ssh/known_hosts."""
    import getpass
    import urllib.parse

    parsed = urllib.parse.urlparse(url)
    if parsed.scheme != "ssh" or not parsed.hostname:
        raise TunnelError(f"not an ssh:// address: {url!r}")
    config_path = Path.home() / ".ssh" / "config"
    conf = (
        paramiko.SSHConfig.from_path(str(config_path)).lookup(parsed.hostname)
        if config_path.exists()
        else {}
    )
    host = conf.get("hostname", parsed.hostname)
    port = parsed.port or int(conf.get("port", 22))
    user = parsed.username or conf.get("user") or getpass.getuser()
    files = conf.get("identityfile") or [
        str(Path.home() / ".ssh" / n) for n in ("id_ed25519", "id_ecdsa", "id_rsa")
    ]
    keys: list[paramiko.PKey] = []
    for name in files:
        path = Path(name).expanduser()
        if path.exists():
            try:
                keys.append(paramiko.PKey.from_path(str(path)))
            except (
                paramiko.SSHException,
                ValueError,
                OSError,
            ):  # passphrase-protected: the agent may hold it
                pass
    try:
        keys.extend(paramiko.Agent().get_keys())
    except (paramiko.SSHException, OSError):
        pass
    known = HostKeyCheck.known_hosts()
    for extra in (conf.get("userknownhostsfile") or "").split():
        path = Path(extra).expanduser()
        if path.exists():
            known.keys.load(str(path))
    return SshTarget(host=host, port=port, username=user, keys=keys, host_keys=known)


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


def open_transport(
    sock, target: SshTarget, *, timeout: float = 15.0, keepalive: float = 15.0
) -> paramiko.Transport:
    """SSH handshake over `sock`, host key check, public-key login. Raises TunnelError for a
    refused host key or login, paramiko.SSHException/OSError for what may pass by retrying."""
    t = paramiko.Transport(
        ReadAhead(sock) if isinstance(sock, socket.socket) else sock,
        default_window_size=NEAR_WINDOW,
        default_max_packet_size=PACKET,
    )
    t.set_log_channel(LOG_CHANNEL)
    t.banner_timeout = timeout
    options = t.get_security_options()
    options.ciphers = [c for c in CIPHERS if c in t._preferred_ciphers] + [
        c for c in options.ciphers if c not in CIPHERS
    ]
    name = lookup_name(target.host, target.port)
    known = target.host_keys.keys.lookup(name) or {}
    if known:  # negotiate a key type we can check, as OpenSSH does
        wanted = [k for k in known.keys()] + (
            ["rsa-sha2-512", "rsa-sha2-256"] if "ssh-rsa" in known else []
        )
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


class ReadAhead:
    """A TCP socket as paramiko's transport reads it, with one `recv` of up to READ_AHEAD bytes
    serving its many small reads: paramiko asks for each packet in two or more reads (the first
    block, then the rest), a system call each, two for every 32 KiB of a stream. Reads return at
    most what was asked, as a socket's do; everything else is the socket's own (__getattr__).
    `more` reads on for ChannelData, whose packets a read's end cuts in two."""

    def __init__(self, sock: socket.socket):
        self._sock = sock
        self._buf: bytes | memoryview = b""  # read, from _pos on not yet asked for
        self._pos = 0
        self._next: bytes | memoryview = b""  # read too, after _buf (`more`)
        self._waiting: dict = {}  # what to do before the next read that may wait (in order)
        self.send = sock.send  # paramiko's writes: straight to the socket

    def has_more(self) -> bool:
        """Whether bytes read already wait to be asked for (more packets, or part of one)."""
        return self._pos < len(self._buf) or len(self._next) > 0

    def before_waiting(self, do: Callable[[], None]) -> None:
        """`do()` once, in the reading thread, before the socket is next read (that read may
        wait): what the packets read ahead gave is finished together (tunnel._Downstream)."""
        self._waiting[do] = None

    def _read(self, n: int) -> bytes:
        while self._waiting:
            do = next(iter(self._waiting))
            del self._waiting[do]
            do()
        return self._sock.recv(max(n, READ_AHEAD))  # its timeout (paramiko's 0.1 s) raises here

    def recv(self, n: int) -> bytes:
        buf, pos = self._buf, self._pos
        if pos >= len(buf):
            if len(self._next):
                buf, self._next = bytes(self._next), b""
            else:
                buf = self._read(n)
                if not buf:
                    return buf
            self._buf, pos = buf, 0
        self._pos = pos + n
        if type(buf) is not bytes:  # `more` left a view: paramiko gets bytes, as from a socket
            return bytes(buf[pos : pos + n])
        if pos == 0 and n >= len(buf):
            return buf  # all of one read: no copy
        return buf[pos : pos + n]

    def more(self, need: int) -> bool:
        """Up to `need` bytes more after the ones not yet asked for (a packet's rest), or all of
        the next read where none are left: the socket is read where nothing read is next, the
        bytes that complete the packet are joined on (the copy is the packet's only) and the
        rest stays next, not copied. False, nothing changed, where the read raised its timeout
        or an error or found the end: paramiko's reader, asked next, meets it as it would."""
        nxt = self._next
        if not len(nxt):
            try:
                got = self._read(need)
            except OSError:  # its timeout (socket.timeout is one), or a cut connection
                return False
            if not got:
                return False
            nxt = memoryview(got)
        if self._pos >= len(self._buf):
            self._buf, self._pos, self._next = nxt, 0, b""
            return True
        self._buf = b"".join((memoryview(self._buf)[self._pos :], nxt[:need]))
        self._pos, self._next = 0, nxt[need:]
        return True

    def __getattr__(self, name: str):
        return getattr(self._sock, name)


# paramiko's Packetizer keeps its inbound state in name-mangled attributes: their names, made once
# (a name built per packet is a new string hashed each time)
(
    _AEAD_IN, _ENGINE_IN, _IV_IN, _MAC_SIZE_IN, _SEQUENCE_IN, _BYTES_IN, _PACKETS_IN,
    _NEED_REKEY, _DUMP, _COMPRESS_IN, _REMAINDER,
) = _IN_STATE = tuple(
    "_Packetizer__" + a
    for a in (
        "aead_in", "block_engine_in", "iv_in", "mac_size_in", "sequence_number_in",
        "received_bytes", "received_packets", "need_rekey", "dump_packets",
        "compress_engine_in", "remainder",
    )
)  # fmt: skip


_MOST = 256 * 1024  # the largest packet read on for here (OpenSSH's PACKET_MAX_SIZE)
_SIZE = struct.Struct(">I").unpack_from  # a packet's length
# a packet's first 10 bytes, as a channel data packet has them: its padding's length, its type,
# the channel, the data's length
_HEAD = struct.Struct(">BBII").unpack_from


class ChannelData:
    """A login's channel-data packets decrypted from the read-ahead and handed to their channel's
    receiver (tunnel._Downstream) without paramiko's message layer (a `Message`, its parsing, the
    transport loop's dispatch): about half of what a packet cost our process in Python, which a
    stream pays 1,550 times per 50 MB (sshd sends 32 KiB packets). A read's packets go together
    (their counts kept in locals, one call a receiver); a packet the read's end cuts is read on
    (ReadAhead.more) rather than left to paramiko's reader, which took one packet a read before
    (a read holds 90 KB on average: a third of a stream's packets). Everything else goes through
    paramiko's own reader, as does any packet when its state asks for care: a cipher that is not
    AES-GCM, a key exchange under way or wanted, the rekey counts near their limit, a packet over
    _MOST, a read that waits past the socket's timeout, a channel with no receiver here. The
    packetizer's counts (sequence number, nonce, bytes and packets for the rekey) move as its own
    reader moves them; `packets` counts what this path took (tests/test_sshlogin_reads.py)."""

    def __init__(self, transport: paramiko.Transport, ahead: ReadAhead):
        self.transport, self.ahead = transport, ahead
        self.packetizer = pk = transport.packetizer
        self.state = pk.__dict__
        self.slow = pk.read_message
        self.receivers: dict[int, tuple[paramiko.Channel, Callable]] = {}
        self.packets = 0
        pk.read_message = self.read_message  # what the transport thread calls for each message

    @classmethod
    def of(cls, transport: paramiko.Transport) -> ChannelData | None:
        """The transport's ChannelData, made on first use; None where its socket is not read
        ahead or its paramiko keeps other state than this was written for."""
        made = getattr(transport, "_gpusession_channel_data", None)
        if made is not None:
            return made
        pk, sock = getattr(transport, "packetizer", None), getattr(transport, "sock", None)
        if not isinstance(sock, ReadAhead) or pk is None:
            return None
        # _inc_iv_counter: the nonce rule (RFC 5647: the last 8 bytes + 1) that _read_packets
        # repeats inline on its hot path; its absence would say paramiko's AES-GCM changed
        fits = (
            all(a in pk.__dict__ for a in _IN_STATE)
            and all(hasattr(pk, a) for a in ("_inc_iv_counter", "REKEY_PACKETS", "REKEY_BYTES"))
            and hasattr(pk, "_initial_kex_done")
            and hasattr(transport, "_expected_packet")
            and hasattr(getattr(transport, "_channels", None), "get")
        )
        if not fits:
            return None
        with transport.lock:
            made = getattr(transport, "_gpusession_channel_data", None)
            if made is None:
                made = cls(transport, sock)
                transport._gpusession_channel_data = made
        return made

    def add(self, chan: paramiko.Channel, take: Callable) -> None:
        """`take(views)` gets `chan`'s data, a view of each packet's, in the transport thread, in
        order with the rest: a read's packets together."""
        self.receivers[chan.chanid] = (chan, take)

    def remove(self, chan: paramiko.Channel) -> None:
        got = self.receivers.get(chan.chanid)
        if got is not None and got[0] is chan:
            del self.receivers[chan.chanid]

    def read_message(self):
        """paramiko's `Packetizer.read_message`: the next message that is not channel data taken
        here, as (type, Message)."""
        d, pk, ahead, t = self.state, self.packetizer, self.ahead, self.transport
        while True:
            if (
                not d[_AEAD_IN]
                or d[_NEED_REKEY]
                or d[_DUMP]
                or d[_COMPRESS_IN] is not None
                or d[_REMAINDER]
                or t._expected_packet
                or not pk._initial_kex_done
            ):
                return self.slow()
            taken, message, need = self._read_packets()
            for (chan, take), pieces in taken:
                if t._channels.get(chan.chanid) is chan:
                    self.packets += len(pieces)
                    take(pieces)
            if message is not None:
                return message
            if not (need and ahead.more(need)):
                return self.slow()  # it reads the rest, waits, or asks for new keys

    def _read_packets(self) -> tuple[list, tuple | None, int]:
        """The whole packets the read holds, from where paramiko's reader stopped: channel data
        for receivers here, each receiver's views in order ([((chan, take), views)]), up to
        the first other message ((type, Message), or None) or a packet this read lacks bytes of
        (`need` of them; 0 where its rest is not read on here). The packetizer's counts are
        kept in locals and written back after."""
        d, pk, ahead, receivers = self.state, self.packetizer, self.ahead, self.receivers
        buf, pos = ahead._buf, ahead._pos
        have, whole = len(buf), memoryview(buf)
        engine, mac, iv = d[_ENGINE_IN], d[_MAC_SIZE_IN], d[_IV_IN]
        seq, got, count = d[_SEQUENCE_IN], d[_BYTES_IN], d[_PACKETS_IN]
        packets, bytes_ = pk.REKEY_PACKETS - 1, pk.REKEY_BYTES
        fixed, counter = iv[:4], int.from_bytes(iv[4:], "big")
        taken, views, to, message = [], [], None, None
        need = 0  # bytes more this read lacks for the next packet (0: none, or not ours)
        try:
            while True:
                if have - pos < 4:
                    need = 4 - have + pos
                    break
                size = _SIZE(buf, pos)[0]
                raw = 4 + size + mac
                end = pos + raw
                if count >= packets or got + raw >= bytes_ or size < 16:
                    break  # paramiko's reader asks for new keys (or refuses a short packet)
                if end > have:  # the packet's rest is in the next read
                    need = end - have if size <= _MOST else 0
                    break
                plain = engine.decrypt(iv, whole[pos + 4 : end], whole[pos : pos + 4])
                pos = end
                counter += 1
                iv = fixed + counter.to_bytes(8, "big")
                s, seq = seq, (seq + 1) & 0xFFFFFFFF
                got += raw
                count += 1
                pad, kind, chanid, n = _HEAD(plain)  # a data packet's; anything's first 10
                stop = size - pad  # the payload is plain[1:stop]: its type, its fields
                if kind == MSG_CHANNEL_DATA and stop >= 10:
                    r = receivers.get(chanid)
                    if r is not None and 10 + n <= stop:
                        if r is not to:
                            if views:
                                taken.append((to, views))
                            to, views = r, []
                        views.append(memoryview(plain)[10 : 10 + n])
                        continue
                message = paramiko.Message(plain[2:stop])
                message.seqno = s
                message = (kind, message)
                break
        finally:
            ahead._pos = pos
            d[_IV_IN], d[_SEQUENCE_IN], d[_BYTES_IN], d[_PACKETS_IN] = iv, seq, got, count
        if views:
            taken.append((to, views))
        return taken, message, need


def _check_host_key(offered: paramiko.PKey, name: str, known: dict, check: HostKeyCheck) -> None:
    if not known:
        raise LoginRefused(
            f"host {name} is not in known_hosts: refusing to connect to an unknown host; "
            f"connect once with `ssh` to check and accept its key ({fingerprint(offered)})"
        )
    expected = known.get(offered.get_name())
    if expected is None or expected != offered:
        want = ", ".join(fingerprint(k) for k in known.values())
        raise LoginRefused(
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
            if not t.is_active():  # the connection ended (sshd went away): no verdict on the key
                raise paramiko.SSHException(
                    f"connection closed during login to {target.label}"
                ) from None
            errors.append(f"{key.get_name()} {fingerprint(key).split()[-1]}: {exc}")
    tried = "; ".join(errors) or "no key to offer"
    raise LoginRefused(
        f"authentication failed for {target.label}: the server refused every key ({tried})"
    )


def hold_interactive(t: paramiko.Transport) -> paramiko.Channel | None:
    """Open one pty session (`cat`, reading a terminal nobody writes to) on the connection and
    keep it: sshd sets TCP_NODELAY only on a connection it deems interactive (a pty session), and
    without it Nagle against our delayed ACK stalls ~40 ms on a share of small kernel replies
    sent through forwarded channels. None when the server refuses (no-pty, PermitTTY no, a
    forced command): the tunnel works the same, with that tail. Closed with the transport."""
    chan = None
    try:
        chan = t.open_session(timeout=10)
        chan.get_pty(term="dumb", width=80, height=24)
        chan.exec_command("cat")
        return chan
    except (paramiko.SSHException, EOFError, OSError):
        if chan is not None:
            chan.close()
        return None


def exec_command(
    transport: paramiko.Transport,
    command: str,
    *,
    stdin: bytes | None = None,
    timeout: float = 60.0,
    open_timeout: float = 15.0,
) -> tuple[int, bytes, bytes]:
    """Run `command` on a logged-in transport: (exit status, stdout, stderr). `stdin` is sent
    then closed. TimeoutError when it does not finish within `timeout` seconds; OSError, EOFError
    or paramiko.SSHException when the connection drops."""
    return run_on_channel(
        transport.open_session(timeout=open_timeout), command, stdin=stdin, timeout=timeout
    )


def shutdown_write(chan: paramiko.Channel) -> None:
    """`chan.shutdown_write()` (the command's stdin ends), its EOF sent while the channel's lock is
    held. paramiko's own builds the EOF under the lock and sends it after: a command that ended
    meanwhile had the server's CLOSE answered by the transport's thread first, and sshd, given an
    EOF for a channel it had freed, dropped the whole login ("ieof packet referred to nonexistent
    channel"; a CI run: an aws boot's status asked beside a workspace import). Held, that answer
    waits for the EOF; a channel closed already is sent none. (A rekey at that very moment waits
    paramiko's clear_to_send_timeout at most, then raises SSHException: its callers' drop.)"""
    with chan.lock:
        if chan.closed:
            return
        message = chan._send_eof()
        if message is not None:
            chan.transport._send_user_message(message)


def run_on_channel(
    chan: paramiko.Channel,
    command: str,
    *,
    stdin: bytes | Iterable[bytes] | None = None,
    timeout: float = 60.0,
    on_out: Callable[[bytes], None] | None = None,
) -> tuple[int, bytes, bytes]:
    """`exec_command` on a session channel already open (closed when done); `on_out` sees its
    standard output as it comes (a long command's progress). `stdin` may come in chunks (a
    stream of any size, each chunk sent as it comes; `timeout` counts from the last one); a
    command that ends before it read them all is answered by its status and stderr."""
    try:
        chan.settimeout(timeout)
        chan.exec_command(command)
        if _send(chan, (stdin,) if isinstance(stdin, (bytes, bytearray)) else stdin or ()):
            shutdown_write(chan)
        deadline = time.monotonic() + timeout
        out, err = bytearray(), bytearray()
        while True:
            if chan.recv_ready():
                data = chan.recv(65536)
                out += data
                if on_out is not None:
                    on_out(data)
            elif chan.recv_stderr_ready():
                err += chan.recv_stderr(65536)
            elif chan.exit_status_ready():
                # the remote side may still be sending what is buffered: drain until EOF
                while data := chan.recv(65536):
                    out += data
                while chan.recv_stderr_ready():
                    err += chan.recv_stderr(65536)
                return chan.recv_exit_status(), bytes(out), bytes(err)
            elif time.monotonic() > deadline:
                raise TimeoutError(f"no answer within {timeout:.0f}s to {command[:60]!r}")
            else:
                time.sleep(0.01)
    finally:
        chan.close()


def _send(chan: paramiko.Channel, pieces: Iterable[bytes]) -> bool:
    """Each piece to the command's stdin; False when the command closed it first (its status and
    stderr say why). An error of the pieces' source, or a dropped connection, is raised."""
    for piece in pieces:
        try:
            chan.sendall(piece)
        except (socket.timeout, TimeoutError):
            raise
        except OSError:
            transport = chan.get_transport()
            if transport is None or not transport.is_active():
                raise  # the connection dropped, not the command
            return False
    return True


def tcp_socket(host: str, port: int, timeout: float) -> socket.socket:
    sock = socket.create_connection((host, port), timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for opt, value in (
        ("TCP_KEEPIDLE", 15),
        ("TCP_KEEPINTVL", 5),
        ("TCP_KEEPCNT", 3),
        ("TCP_USER_TIMEOUT", 45000),
    ):
        if hasattr(socket, opt):  # Linux: a silent peer (laptop slept) is noticed in under a minute
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, opt), value)
    sock.settimeout(None)
    return sock


def make_session_key(folder: Path, session_id: str) -> tuple[Path, str]:
    """A new ed25519 key for one session, saved 0600 as folder/<id>; returns (path, public line)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    )
    public = key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    path = folder / session_id
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(private)
    return path, f"{public.decode()} gpusession-{session_id[:8]}"


class _Pieces:
    """A channel's receive buffer as the pieces that came in, in place of paramiko's array('B')
    (its BufferedPipe keeps the locking and waiting; this is only its `_buffer`). The array copies
    every byte in, and out twice per read (a slice, then bytes), and moves what a read leaves to
    its front: ~4 copies per byte that a forwarded stream pays, beside the decryption's one."""

    __slots__ = ("parts", "size")

    def __init__(self):
        self.parts: list[bytes] = []
        self.size = 0

    def __len__(self) -> int:
        return self.size

    def frombytes(self, data: bytes) -> None:
        if data:
            self.parts.append(bytes(data))
            self.size += len(data)

    def keep(self, views: list[memoryview]) -> None:
        """Pieces as they are (ChannelData's views of decrypted packets), not copied."""
        for view in views:
            if view:
                self.parts.append(view)
                self.size += len(view)

    def __getitem__(self, span: slice) -> "_Taken":
        limit = self.size if span.stop is None else min(span.stop, self.size)
        first = self.parts[0] if self.parts else b""
        if len(first) >= limit:
            return _Taken(first[:limit])  # the whole first piece: no copy
        taken, got = [], 0
        for part in self.parts:
            if got + len(part) > limit:
                taken.append(part[: limit - got])
                break
            taken.append(part)
            got += len(part)
            if got == limit:
                break
        return _Taken(b"".join(taken))

    def __delitem__(self, span: slice) -> None:
        n = self.size if span.stop is None else min(span.stop, self.size)
        if n == self.size:  # all of it
            self.parts.clear()
            self.size = 0
            return
        self.size -= n
        while n:
            part = self.parts[0]
            if len(part) > n:
                self.parts[0] = part[n:]
                return
            del self.parts[0]
            n -= len(part)


class _Taken:
    __slots__ = ("data",)

    def __init__(self, data: bytes):
        self.data = data

    def tobytes(self) -> bytes:
        data = self.data
        return data if type(data) is bytes else bytes(data)  # a kept piece is a memoryview


def fast_reads(chan: paramiko.Channel) -> bool:
    """Give `chan` a receive buffer that hands on the pieces as they came (see _Pieces), under
    the buffer's own lock (data may be arriving). False, and nothing changed, where paramiko's
    buffer is not the one this was written for (tests/test_tunnel.py notices)."""
    pipe = chan.in_buffer
    lock, old = getattr(pipe, "_lock", None), getattr(pipe, "_buffer", None)
    if lock is None or not hasattr(old, "tobytes") or not hasattr(old, "frombytes"):
        return False
    with lock:
        pieces = _Pieces()
        pieces.frombytes(pipe._buffer.tobytes())
        pipe._buffer = pieces
    return True


def window_for(rtt: float | None) -> int:
    """A channel's window for a link whose round trip is `rtt` seconds (None: not measured):
    what LINK_RATE keeps in flight over one round trip, between NEAR_WINDOW and WINDOW."""
    if rtt is None:
        return NEAR_WINDOW
    return int(min(WINDOW, max(NEAR_WINDOW, rtt * LINK_RATE)))


def tcp_round_trip(sock) -> float | None:
    """The round trip the kernel has measured on `sock`, a TCP connection (Linux's TCP_INFO: the
    smallest it has seen, else its smoothed figure), in seconds; None where there is none (not a
    TCP socket, not Linux). A busy machine does not inflate it: the peer's kernel acknowledges,
    not its sshd, and nothing here waits to be scheduled."""
    if not isinstance(sock, socket.socket) or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return None
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, getattr(socket, "TCP_INFO", 11), 256)
    except OSError:
        return None
    for offset in (148, 68):  # tcpi_min_rtt (Linux 4.6+), tcpi_rtt; microseconds
        if len(info) >= offset + 4:
            us = struct.unpack_from("I", info, offset)[0]
            if us:
                return us / 1e6
    return None


def round_trip(transport: paramiko.Transport, tries: int = 3) -> float | None:
    """The link's round trip to the server, in seconds: the quickest of `tries` requests sshd
    answers at once (a `keepalive@openssh.com` global request, which it refuses), so a busy
    moment on either side does not count. None when the connection ended meanwhile. Measured
    through sshd, not from TCP: a jump host or a proxy in between counts too."""
    best = None
    for _ in range(tries):
        t0 = time.monotonic()
        transport.global_request("keepalive@openssh.com", wait=True)  # returns at the answer
        if not transport.is_active():
            return None
        took = time.monotonic() - t0
        best = took if best is None else min(best, took)
    return best


def grow_window(chan: paramiko.Channel, window: int) -> bool:
    """Let `chan`'s sender have `window` bytes unread from now on: a WINDOW_ADJUST of what it
    lacks, and paramiko's own count of it (its adjusts give back what is read, so the window
    stays this size). False when `chan` has it already or is closed."""
    with chan.lock:
        extra = window - chan.in_window_size
        if extra <= 0 or chan.closed or not chan.active:
            return False
        chan.in_window_size = window
        chan.in_window_threshold = window // 10  # as paramiko's own
    chan.transport._send_user_message(window_adjust(chan, extra))
    return True


def give_back_after(window: int, rtt: float | None) -> int:
    """The bytes a channel reads before it gives its window back (a WINDOW_ADJUST): half the
    window where it holds what LINK_RATE puts in flight over two round trips (a near link:
    OpenSSH's client's own rule, an adjust a MiB), else a tenth (paramiko's), so that a far link's
    sender does not wait for one. Each adjust costs our process ~12 us of CPU (a message, its
    encryption, a send): at a tenth a 50 MB stream sends 250, at half 50."""
    if rtt is not None and 2 * rtt * LINK_RATE <= window:
        return window // 2
    return window // 10


def window_adjust(chan: paramiko.Channel, n: int) -> paramiko.Message:
    """The WINDOW_ADJUST that gives `chan`'s sender `n` bytes more."""
    m = paramiko.Message()
    m.add_byte(cMSG_CHANNEL_WINDOW_ADJUST)
    m.add_int(chan.remote_chanid)
    m.add_int(n)
    return m


class LinkWindows:
    """The windows of one login's channels: NEAR_WINDOW until the link's round trip is measured
    (in a thread of its own, after the login: not on a start's path), then window_for(it), and
    the channels opened before then grow to it. The round trip: the kernel's own figure for `tcp`,
    the TCP connection the login rides on (to the server, or to the jump host: the far leg), so a
    busy machine does not make a near link look far; where there is none, round_trip's requests
    (a busy moment can make those slower: seen at 22 ms for a near link under a test suite)."""

    def __init__(self, transport: paramiko.Transport, tcp: socket.socket | None = None):
        import weakref

        self.transport = transport
        self.tcp = tcp
        self.window = NEAR_WINDOW
        self.rtt: float | None = None
        self.measured_by = ""  # "tcp" or "ssh": how the round trip was taken
        self._channels: weakref.WeakSet = weakref.WeakSet()
        self._lock = threading.Lock()
        self.measured = threading.Event()

    def measure_soon(self) -> "LinkWindows":
        threading.Thread(target=self._measure, name="gpusession-ssh-rtt", daemon=True).start()
        return self

    def add(self, chan: paramiko.Channel) -> paramiko.Channel:
        """Count `chan` among this login's (opened at `window`): it grows with the others."""
        with self._lock:
            self._channels.add(chan)
            window, rtt = self.window, self.rtt
        _fit(chan, window, rtt)  # when measured since it opened
        return chan

    def _measure(self) -> None:
        rtt, by = tcp_round_trip(self.tcp), "tcp"
        if rtt is None:
            try:
                rtt, by = round_trip(self.transport), "ssh"
            except Exception:  # noqa: BLE001 - a connection cut meanwhile: the windows stay
                rtt = None
        with self._lock:
            self.rtt, self.measured_by = rtt, by
            self.window = window_for(rtt)
            channels = list(self._channels)
        for chan in channels:
            try:
                _fit(chan, self.window, rtt)
            except Exception:  # noqa: BLE001 - a channel closing meanwhile
                pass
        self.measured.set()


def _fit(chan: paramiko.Channel, window: int, rtt: float | None) -> None:
    """`chan` grown to `window`, given back as often as the link's round trip asks."""
    grow_window(chan, window)
    with chan.lock:
        chan.in_window_threshold = give_back_after(chan.in_window_size, rtt)
