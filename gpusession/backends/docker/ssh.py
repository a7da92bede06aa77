"""docker-py's `ssh://` transport, made to survive a dropped connection.

Why `ssh://` engines failed now and then with `RemoteDisconnected` (docker 7.x,
`docker/transport/sshconn.py`): each pooled HTTP connection is one SSH channel running
`docker system dial-stdio`, all on one paramiko transport.

- `SSHConnectionPool._get_conn` overrides urllib3's and leaves out its check for a dropped
  connection (`is_connection_dropped`), so a channel whose dial-stdio ended, or whose SSH
  connection was cut, is handed out again; the next request on it reads EOF:
  `http.client.RemoteDisconnected`.
- each pool keeps the transport it was made with: once the SSH connection is gone, every new
  channel fails ("SSH session not active") for the life of the client.
- requests' adapters never retry (max_retries 0).

And a fourth: sshd allows 10 session channels per connection by default (MaxSessions), and
the pool keeps up to 10 idle ones, so a few calls at once beside them (a start's helpers, a
pull, a stream) were refused: "Unable to open channel" / ChannelException 'Connect failed'.

A fifth: a channel that cannot open because the SSH connection died under the pool (a restarted
sshd, a rebooted host; paramiko re-raises the reset, ECONNRESET) was passed over by urllib3 (a
server may answer before it resets) and the response read from no socket: AttributeError. It is
`TransportGone` now, and the request, of which nothing went out, goes once more on a new login.

`make_resilient(client)` fixes the five on a DockerClient made for an `ssh://` URL: a pooled
channel that is closed or at EOF is dropped before use; a dead transport is reconnected (host
key checked again, as docker-py does) and the pools made anew; idempotent requests (GET, HEAD,
PUT, DELETE) are retried once when the connection drops under them (POSTs - create, start, exec
- are not: the engine may have done them); the pool keeps at most KEPT_CHANNELS idle channels,
and a channel the server refuses to open is asked for again once idle ones are closed (nothing
was sent on it, so any request, POSTs included, goes out once).
"""

from __future__ import annotations

import queue
import time
from typing import Any

RETRIED_METHODS = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS"})
KEPT_CHANNELS = 4  # idle session channels a pool keeps open (sshd's MaxSessions is 10)
OPEN_TRIES = 120  # a refused channel open is asked again for about this many times ...
OPEN_WAIT_S = 0.25  # ... this far apart at most (about 30 s in all)


def host_exec(client, command: str, timeout: float) -> tuple[int, bytes, bytes] | None:
    """`command` on the SSH login under an ssh:// DockerClient, on a session channel of its own:
    (exit status, stdout, stderr); None when `client` is no such client or has no connection. A
    channel the server refuses to open (MaxSessions: the pool's channels and streams beside it)
    is asked for again once the pools' idle channels are closed, as the pool's own are; the
    errors of exec_command (OSError, EOFError, TimeoutError, paramiko.SSHException) when it
    still cannot run."""
    import paramiko

    # lazy: docs/architecture.md#imports-kept-inside-functions
    from ...transport.sshlogin import run_on_channel

    adapter = getattr(client.api, "_custom_adapter", None)
    ssh = getattr(adapter, "ssh_client", None)
    transport = ssh.get_transport() if ssh is not None else None
    if transport is None:
        return None
    for attempt in range(OPEN_TRIES):
        try:
            chan = transport.open_session(timeout=15.0)
            break
        except paramiko.ChannelException:  # refused: too many channels open on the connection
            if attempt == OPEN_TRIES - 1 or not transport.is_active():
                raise
            _close_idle(adapter)
            time.sleep(min(0.02 * 2**attempt, OPEN_WAIT_S))
    return run_on_channel(chan, command, timeout=timeout)


def _close_idle(adapter) -> None:
    pools = getattr(adapter, "pools", None)
    if pools is None:
        return
    with pools.lock:
        found = [pools[key] for key in list(pools.keys())]
    for pool in found:
        if hasattr(pool, "close_idle"):
            pool.close_idle()


def _dropped(sock: Any) -> bool:
    """A paramiko Channel that can carry no more requests."""
    try:
        transport = sock.get_transport()
        return bool(
            sock.closed
            or sock.eof_received
            or sock.exit_status_ready()
            or transport is None
            or not transport.is_active()
        )
    except Exception:  # noqa: BLE001 - not a channel we know: let urllib3 find out
        return False


def make_resilient(client) -> None:
    """Make the `ssh://` transport of `client` (a docker.DockerClient) survive dropped channels
    and a cut SSH connection; no-op for other transports."""
    from docker.transport.sshconn import SSHConnectionPool, SSHHTTPAdapter

    pool_class = _pool_class(_connection_class())
    adapter_class = _adapter_class(pool_class)
    adapter = getattr(client.api, "_custom_adapter", None)
    if not isinstance(adapter, SSHHTTPAdapter) or adapter.ssh_client is None:
        return
    adapter.__class__ = adapter_class
    adapter.max_pool_size = KEPT_CHANNELS  # the pools made from now on
    with adapter.pools.lock:
        for key in list(adapter.pools.keys()):
            pool = adapter.pools[key]
            if type(pool) is SSHConnectionPool:
                pool.__class__ = pool_class
    adapter.max_retries = _retry()


def _connection_class():
    """A channel whose open the server refused (MaxSessions) asks again, once the pool's idle
    channels are closed, while the SSH connection lives."""
    import paramiko
    from docker.transport.sshconn import SSHConnection

    class Connection(SSHConnection):
        pool: Any = None  # the pool that made it (its idle channels are closed for a retry)

        def connect(self):
            for attempt in range(OPEN_TRIES):
                try:
                    return super().connect()
                except (paramiko.SSHException, OSError, EOFError) as exc:
                    # refused (MaxSessions), or the connection is gone
                    transport = self.ssh_transport
                    if transport is None or not transport.is_active():
                        raise TransportGone(f"the SSH connection is gone: {exc}") from exc
                    if attempt == OPEN_TRIES - 1 or not isinstance(exc, paramiko.SSHException):
                        raise
                    if self.pool is not None:
                        self.pool.close_idle()
                    time.sleep(min(0.02 * 2**attempt, OPEN_WAIT_S))

    return Connection


def _pool_class(connection_class):
    """A pool that makes `connection_class` channels, drops a pooled channel that can carry no
    more requests before use, and can close its idle channels."""
    from docker.transport.sshconn import SSHConnectionPool

    class Pool(SSHConnectionPool):
        def _new_conn(self):
            conn = connection_class(self.ssh_transport, self.timeout, self.ssh_host)
            conn.pool = self
            return conn

        def _get_conn(self, timeout=None):
            conn = super()._get_conn(timeout)
            if getattr(conn, "sock", None) is not None and _dropped(conn.sock):
                conn.close()  # urllib3 opens a new channel for this request
            return conn

        def close_idle(self) -> None:
            """Close the idle channels this pool keeps (their slots stay, empty)."""
            for _ in range(self.pool.maxsize if self.pool is not None else 0):
                try:
                    conn = self.pool.get(block=False)
                except (queue.Empty, AttributeError):
                    return
                if conn is not None:
                    conn.close()
                try:
                    self.pool.put(None, block=False)
                except queue.Full:  # another thread gave a connection back meanwhile
                    return

    return Pool


def _adapter_class(pool_class):
    """An adapter that logs in again when its SSH connection is dead (the pools made anew) and
    hands out `pool_class` pools."""
    from docker.transport.sshconn import SSHConnectionPool, SSHHTTPAdapter

    class Adapter(SSHHTTPAdapter):
        def send(self, request, *args, **kwargs):
            import requests

            try:
                return super().send(request, *args, **kwargs)
            except requests.exceptions.ConnectionError as exc:
                if not _gone_before_sending(exc):
                    raise
            # nothing of it went out: get_connection logs in again, and it goes once more
            return super().send(request, *args, **kwargs)

        def get_connection(self, url, proxies=None):
            transport = self.ssh_client.get_transport() if self.ssh_client else None
            if self.ssh_client and (transport is None or not transport.is_active()):
                with self.pools.lock:
                    self.pools.clear()  # they hold the dead transport
                self.ssh_client.close()
                self._connect()
            pool = super().get_connection(url, proxies)
            if type(pool) is SSHConnectionPool:
                pool.__class__ = pool_class
            return pool

    return Adapter


class TransportGone(ConnectionError):
    """A channel could not open: the SSH connection under the pool died (a restarted sshd, a
    rebooted host). Nothing was sent. No errno: urllib3 passes over a request's ECONNRESET (a
    server may have answered before it closed), and read a response from no socket then."""


def _gone_before_sending(exc: BaseException) -> bool:
    """Does TransportGone lie under `exc` (requests' error, urllib3's MaxRetryError, ...)?"""
    todo, seen = [exc], set()
    while todo and len(seen) < 32:
        e = todo.pop()
        if isinstance(e, TransportGone):
            return True
        seen.add(id(e))
        todo.extend(
            x
            for x in (e.__cause__, e.__context__, getattr(e, "reason", None), *e.args)
            if isinstance(x, BaseException) and id(x) not in seen
        )
    return False


def _retry():
    """Idempotent requests retried once when the connection drops under them."""
    from urllib3.util.retry import Retry

    return Retry(
        total=1,
        connect=1,
        read=1,
        status=0,
        other=0,
        redirect=0,
        allowed_methods=RETRIED_METHODS,
        raise_on_status=False,
    )
