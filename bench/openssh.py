"""What the benchmarks share to compare against OpenSSH: a free loopback port, and `ssh -L`
forwards to a namespace host with the cipher our tunnel negotiated (`-c`), up when it returns."""

from __future__ import annotations

import socket
import subprocess
import time


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ssh_forward(
    remote: dict, ports: list[int | str], cipher: str
) -> tuple[subprocess.Popen, dict[int | str, int]]:
    """`ssh -N -L` of each remote loopback port to a free local one: (the ssh process, {remote
    port: local port}), once every local port answers. The caller terminates the process."""
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
    for there, here in local.items():  # a remote unix socket's path, or a loopback port
        cmd += [
            "-L",
            f"127.0.0.1:{here}:{there if isinstance(there, str) else f'127.0.0.1:{there}'}",
        ]
    ssh = subprocess.Popen(cmd + [remote["address"]])
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
