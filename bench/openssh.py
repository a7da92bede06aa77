"""What the benchmarks share to compare against OpenSSH: a free loopback port, the kernel's
sockets on the host our tunnel forwards to, `ssh -L` forwards to a namespace host with the cipher
our tunnel negotiated (`-c`), up when it returns, and a timed read of a stream from a forwarded
port."""

from __future__ import annotations

import socket
import subprocess
import time


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


KERNEL_PORTS = ("shell_port", "iopub_port", "stdin_port", "control_port", "hb_port")


def kernel_sockets_there(tunnel, info: dict) -> dict[str, int | str]:
    """Each of the kernel's sockets (`info`: the connection info our tunnel serves here) as the
    host has it, by the tunnel's forwards: a remote loopback port (a kernel on TCP ports) or a
    remote socket path (on unix sockets, where ZMQ's ipc endpoints are `<ip>-<n>`)."""
    remote_of = {
        listener.getsockname() if isinstance(r, str) else tunnel.local_port(r): r
        for r, listener in list(tunnel._listeners.items())
    }
    ipc = info.get("transport") == "ipc"
    return {n: remote_of[f"{info['ip']}-{info[n]}" if ipc else info[n]] for n in KERNEL_PORTS}


def ssh_forward(
    remote: dict, ports: list[int | str], cipher: str, via: int | None = None
) -> tuple[subprocess.Popen, dict[int | str, int]]:
    """`ssh -N -L` of each remote loopback port to a free local one: (the ssh process, {remote
    port: local port}), once every local port answers. The caller terminates the process.
    `via`: a loopback port relaying to the host's sshd (bench_farlink's): ssh connects there and
    checks the host's key under the host's address (its config's Host block names the address
    only, so its key and known_hosts are given here)."""
    local = {p: free_port() for p in ports}
    cmd = [
        "ssh",
        "-N",
        "-F",
        remote["ssh_config"],
        "-c",
        cipher,
        "-o",
        "BatchMode=yes",
        "-o",
        "ExitOnForwardFailure=yes",
    ]
    if via is not None:
        cmd += ["-p", str(via), "-i", remote["key_path"], "-o", "IdentitiesOnly=yes"]
        cmd += ["-o", f"UserKnownHostsFile={remote['known_hosts']}"]
        cmd += ["-o", "StrictHostKeyChecking=yes", "-o", f"HostKeyAlias={remote['address']}"]
    for there, here in local.items():  # a remote unix socket's path, or a loopback port
        cmd += [
            "-L",
            f"127.0.0.1:{here}:{there if isinstance(there, str) else f'127.0.0.1:{there}'}",
        ]
    host = remote["address"] if via is None else f"{remote['user']}@127.0.0.1"
    ssh = subprocess.Popen(cmd + [host])
    deadline = time.monotonic() + 20
    for here in local.values():
        while True:
            try:
                socket.create_connection(("127.0.0.1", here), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or ssh.poll() is not None:
                    ssh.terminate()
                    raise RuntimeError("ssh -L did not come up") from None
                time.sleep(0.05)
    return ssh, local


def stream_s(port: int, size: int) -> float:
    """Seconds to read a stream of `size` bytes from 127.0.0.1:`port` (its server sends them
    once it has a byte), to its end."""
    t = time.perf_counter()
    n = 0
    with socket.create_connection(("127.0.0.1", port), timeout=120) as c:
        c.sendall(b"g")
        while chunk := c.recv(1 << 20):
            n += len(chunk)
    assert n == size, (n, size)
    return time.perf_counter() - t
