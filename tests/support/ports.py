"""Loopback ports for the harness's own servers (JupyterLab, moto, test sshds)."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port nothing listens on right now (on 127.0.0.1). Bound, read and closed: another
    process may take it before the caller binds it, so a server started on it retries on another
    (support/lab.py, support/ec2.py)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
