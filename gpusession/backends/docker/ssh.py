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

`make_resilient(client)` fixes the three on a DockerClient made for an `ssh://` URL: a pooled
channel that is closed or at EOF is dropped before use; a dead transport is reconnected (host
key checked again, as docker-py does) and the pools made anew; and idempotent requests (GET,
HEAD, PUT, DELETE) are retried once when the connection drops under them. POSTs (create, start,
exec) are not retried: the engine may have done them.
"""

from __future__ import annotations

from typing import Any

RETRIED_METHODS = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS"})


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
    from urllib3.util.retry import Retry

    class Pool(SSHConnectionPool):
        def _get_conn(self, timeout=None):
            conn = super()._get_conn(timeout)
            if getattr(conn, "sock", None) is not None and _dropped(conn.sock):
                conn.close()  # urllib3 opens a new channel for this request
            return conn

    class Adapter(SSHHTTPAdapter):
        def get_connection(self, url, proxies=None):
            transport = self.ssh_client.get_transport() if self.ssh_client else None
            if self.ssh_client and (transport is None or not transport.is_active()):
                with self.pools.lock:
                    self.pools.clear()  # they hold the dead transport
                self.ssh_client.close()
                self._connect()
            pool = super().get_connection(url, proxies)
            if type(pool) is SSHConnectionPool:
                pool.__class__ = Pool
            return pool

    adapter = getattr(client.api, "_custom_adapter", None)
    if not isinstance(adapter, SSHHTTPAdapter) or adapter.ssh_client is None:
        return
    adapter.__class__ = Adapter
    with adapter.pools.lock:
        for key in list(adapter.pools.keys()):
            pool = adapter.pools[key]
            if type(pool) is SSHConnectionPool:
                pool.__class__ = Pool
    adapter.max_retries = Retry(
        total=1,
        connect=1,
        read=1,
        status=0,
        other=0,
        redirect=0,
        allowed_methods=RETRIED_METHODS,
        raise_on_status=False,
    )
