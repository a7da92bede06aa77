"""An `ssh://` engine whose connection drops between two calls (issue 11 item 3): the Docker
SDK's pooled channel ends (its `docker system dial-stdio` killed on the host), then the whole
SSH connection is cut (its sshd session killed). The next calls work: the dropped channel is
not reused, the connection is made again, an idempotent request is retried once
(gpusession/backends/docker/ssh.py). Only this test's own sshd session is touched on the shared
namespace host."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from gpusession.backends.docker.engine import engine_client
from support.hosts import REMOTE_NETNS as NS
from support.hosts import docker_available

no_engine = pytest.mark.skipif(not docker_available(), reason="no Docker engine answers")


def test_the_patched_sdk_is_the_major_the_patch_was_written_for():
    """make_resilient reaches into docker-py 7.x's SSH transport; pyproject pins `<8`, and a new
    major must be read (and this test changed) before it is let in."""
    import docker
    from docker.transport.sshconn import SSHConnectionPool, SSHHTTPAdapter

    assert docker.__version__.split(".")[0] == "7", docker.__version__
    pyproject = (Path(__file__).parents[1] / "pyproject.toml").read_text()
    assert '"docker>=7.1,<8"' in pyproject
    assert hasattr(SSHConnectionPool, "_get_conn") and hasattr(SSHHTTPAdapter, "_connect")


def _our_sshd(client) -> int:
    """The pid of the sshd session process serving this client's SSH connection, on the host."""
    port = client.api._custom_adapter.ssh_client.get_transport().sock.getsockname()[1]
    out = subprocess.run(
        ["ip", "netns", "exec", NS, "ss", "-Htnp", "state", "established", "dport", f"= :{port}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    pids = {int(p) for p in re.findall(r'"sshd[^"]*",pid=(\d+)', out)}
    assert len(pids) >= 1, out
    return min(pids)  # privilege separation: the session's own process holds the socket


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        children = subprocess.run(
            ["pgrep", "-P", str(todo.pop())], capture_output=True, text=True
        ).stdout.split()
        out += [int(c) for c in children]
        todo += children
    return out


def _dial_stdio(sshd: int) -> list[int]:
    found = []
    for pid in _descendants(sshd):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"dial-stdio" in f.read():
                    found.append(pid)
        except OSError:
            continue
    return found


@pytest.mark.docker
@no_engine
def test_calls_after_a_dropped_channel_and_a_cut_ssh_connection_succeed(remote):
    client = engine_client(remote["url"])
    try:
        assert client.ping()
        client.containers.list(all=True, filters={"label": "gpusession.none"})  # a pooled channel
        sshd = _our_sshd(client)
        channels = _dial_stdio(sshd)
        assert channels, "the pooled channel's dial-stdio on the host"
        for pid in channels:
            os.kill(pid, signal.SIGKILL)  # the remote end of the pooled channel ends
        time.sleep(0.3)
        assert client.containers.list(all=True, filters={"label": "gpusession.none"}) == []
        assert client.version()["Version"]

        os.kill(_our_sshd(client), signal.SIGKILL)  # the SSH connection itself is cut
        time.sleep(0.3)
        assert client.containers.list(all=True, filters={"label": "gpusession.none"}) == []
        assert client.images.get("gpusession-ci/py-bookworm").id  # a GET on a new connection
        assert _our_sshd(client) != sshd
    finally:
        client.close()


@pytest.mark.docker
@no_engine
def test_more_calls_at_once_than_sshd_allows_sessions_all_succeed(remote):
    """Each call at once on an ssh:// engine is a session channel on one SSH connection, and
    sshd refuses an 11th by default (MaxSessions 10: ChannelException 'Connect failed', seen
    under load when a start's helpers, a pull and the pool's idle channels met). A refused
    channel open sent nothing, so it is retried once channels are free; every call succeeds."""
    import concurrent.futures

    client = engine_client(remote["url"])
    try:
        with concurrent.futures.ThreadPoolExecutor(24) as pool:
            results = list(
                pool.map(
                    lambda _: client.containers.list(
                        all=True, filters={"label": "gpusession.none"}
                    ),
                    range(48),
                )
            )
        assert results == [[]] * 48
    finally:
        client.close()


@pytest.mark.docker
@no_engine
def test_a_command_on_the_engines_login_waits_for_a_channel_sshd_refused(remote):
    """What a start runs on the box itself over the engine's SSH connection (its GPU reading,
    the kernel's socket folder) is one more session channel: with the connection's 10 taken
    (here: held by the test; under load, the pool's and the streams'), sshd refuses it
    ('Connect failed': a loaded run's MIG start failed on it with our stack). It is asked for
    again, the pool's idle channels closed, until one is free; then it runs."""
    import threading

    from gpusession.backends.docker.ssh import host_exec

    client = engine_client(remote["url"])
    held = []
    try:
        assert client.ping()
        transport = client.api._custom_adapter.ssh_client.get_transport()
        while True:  # every channel sshd allows this connection, less the pool's
            try:
                held.append(transport.open_session(timeout=10))
            except Exception:  # noqa: BLE001 - paramiko.ChannelException: the limit
                break
        assert len(held) >= 5, len(held)
        threading.Timer(1.0, held.pop().close).start()  # one comes free a second later
        status, out, _ = host_exec(client, "echo ran", timeout=30)
        assert (status, out) == (0, b"ran\n")
    finally:
        for chan in held:
            chan.close()
        client.close()
