"""Does a kernel listen on its ports (or unix sockets), asked with a connect: the runtime's first
step before it says READY (gpusession.agent.kernelspawn) and the local side looking at a
container's sockets (gpusession.backends.docker.container_setup.sockets_listen) ask the same.
`_socket` only: the socket module's imports (enum, selectors) wait for the runtime."""

from __future__ import annotations

from .envnames import KERNEL_PORT_NAMES


def port_open(info: dict, name: str) -> bool:
    """The kernel listens on its `name` port (a unix socket `<ip>-<port>` with the ipc transport)."""
    import _socket

    if info.get("transport") == "ipc":
        family, address = _socket.AF_UNIX, f"{info['ip']}-{info[name]}"
    else:
        family = _socket.AF_INET6 if ":" in str(info["ip"]) else _socket.AF_INET
        address = (info["ip"], info[name])
    try:
        s = _socket.socket(family, _socket.SOCK_STREAM)
        try:
            s.settimeout(0.2)
            s.connect(address)
        finally:
            s.close()
        return True
    except OSError:
        return False


def kernel_listens(info: dict) -> bool:
    """The kernel listens: with unix sockets, on all five (the runtime gives
    them their group's access next: kernelspawn.share_sockets); on TCP, on shell, control and iopub."""
    waited = (
        KERNEL_PORT_NAMES
        if info.get("transport") == "ipc"
        else ("shell_port", "control_port", "iopub_port")
    )
    return all(port_open(info, p) for p in waited)
