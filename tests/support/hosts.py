"""The real Docker engines the tests can use, made by scripts/ci-host-setup.sh
(this machine's engine, the product image) and scripts/ci-remote-host.sh (a
second engine behind sshd at 10.200.N.2, in a network namespace of this test
worker's own: tests/support/slots.py).

    from support.hosts import docker_available, product_image, ensure_remote_host, ssh_home

    remote = ensure_remote_host()            # starts it if needed; None without root/Docker
    monkeypatch.setenv("HOME", ssh_home(remote, tmp_path / "home"))
    client = docker.DockerClient(base_url=remote["url"], use_ssh_client=False)

docker-py's ssh:// transport (paramiko) reads only ~/.ssh/config (for User,
IdentityFile, ...) and ~/.ssh/known_hosts (host keys, unknown hosts rejected),
and only while the DockerClient is being constructed. Pointing HOME at a
directory made by ssh_home() gives it the test key and host key without touching
the real ~/.ssh; HOME can be restored as soon as the client exists.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

from .slots import script_env, slot, suffix

ROOT = Path(__file__).resolve().parents[2]
REMOTE_SCRIPT = ROOT / "scripts" / "ci-remote-host.sh"
CI_STATE = Path(os.environ.get("GPUSESSION_CI_STATE", "/var/lib/gpusession-ci"))
REMOTE_STATE = CI_STATE / f"remote{suffix()}"
REMOTE_ADDRESS = f"10.200.{slot()}.2"
REMOTE_HOST_SIDE = f"10.200.{slot()}.1"  # this machine's address on the link
REMOTE_NETNS = f"gpus-remote{suffix()}"
REMOTE_RUN = Path(f"/run/gpus-remote{suffix()}")


def docker_available() -> bool:
    """True when the docker SDK is installed and this machine's engine answers."""
    try:
        import docker

        client = docker.from_env(timeout=30)
    except Exception:  # noqa: BLE001 - SDK missing, or no DOCKER_HOST/socket
        return False
    # an engine whose socket is there but that answers slowly (a loaded machine: dockerd busy
    # with other workers' containers) is there: asked again for up to a minute, never skipped
    deadline = time.monotonic() + (60 if _engine_socket_present() else 0)
    try:
        while True:
            try:
                return bool(client.ping())
            except Exception:  # noqa: BLE001 - engine down or refusing
                if time.monotonic() > deadline:
                    return False
                time.sleep(1)
    finally:
        client.close()


def _engine_socket_present() -> bool:
    host = os.environ.get("DOCKER_HOST", "")
    if host and not host.startswith("unix://"):
        return True  # a tcp:// or ssh:// engine: its socket cannot be looked at from here
    return Path(host[len("unix://") :] if host else "/var/run/docker.sock").exists()


def product_image() -> str:
    """The image built from Dockerfile.cuda for the tests ($GPUSESSION_TEST_IMAGE)."""
    return os.environ.get("GPUSESSION_TEST_IMAGE", "gpusession/cuda:ci")


def _pid_alive(pid_file: Path) -> bool:
    try:
        os.kill(int(pid_file.read_text().strip()), 0)
    except (OSError, ValueError):
        return False
    return True


def _port_open(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=1):
            return True
    except OSError:
        return False


def remote_host() -> dict | None:
    """The namespace Docker host if it is up, else None.

    Keys: url (for docker-py, ssh://root@10.200.N.2), address, user, port,
    key_path (client private key), known_hosts (one line for the address),
    ssh_config (an OpenSSH config naming both, usable with `ssh -F`), and
    docker_host_env (a DOCKER_HOST value reaching the same engine directly over
    its unix socket, for test setup and cleanup without SSH).
    """
    files = {name: REMOTE_STATE / name for name in ("id_ed25519", "known_hosts", "ssh_config")}
    if not all(path.exists() for path in files.values()):
        return None
    if not (_pid_alive(REMOTE_RUN / "dockerd.pid") and _pid_alive(REMOTE_RUN / "sshd.pid")):
        return None
    if not _port_open(REMOTE_ADDRESS, 22):
        return None
    return {
        "url": f"ssh://root@{REMOTE_ADDRESS}",
        "address": REMOTE_ADDRESS,
        "user": "root",
        "port": 22,
        "key_path": str(files["id_ed25519"]),
        "known_hosts": str(files["known_hosts"]),
        "ssh_config": str(files["ssh_config"]),
        "docker_host_env": f"unix://{REMOTE_RUN / 'docker.sock'}",
    }


def ensure_remote_host() -> dict | None:
    """Bring the namespace host up (or bring it up to date: the script is
    idempotent, ~0.1 s when all is up, and reloads a rebuilt product image) and
    return remote_host(). None when it cannot run here (not root, no engine)."""
    if os.geteuid() != 0 or not docker_available():
        return remote_host()
    # Up to ~20 s the first time (the image is copied into the second engine).
    result = subprocess.run(
        ["bash", str(REMOTE_SCRIPT), "up"],
        capture_output=True,
        text=True,
        timeout=300,
        env=script_env(),
    )
    if result.returncode != 0:
        raise RuntimeError(f"{REMOTE_SCRIPT} up failed:\n{result.stdout}{result.stderr}")
    host = remote_host()
    if host is None:  # root and an engine: it must run here; a skip would hide the cause
        raise RuntimeError(f"{REMOTE_SCRIPT} up said up, but its sshd does not answer on port 22")
    return host


def ssh_home(host: dict, directory: str | os.PathLike) -> str:
    """Make `directory` a HOME whose .ssh/config and .ssh/known_hosts let
    paramiko (as docker-py uses it) log in to `host`; returns it as a str."""
    ssh_dir = Path(directory) / ".ssh"
    ssh_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    shutil.copyfile(host["ssh_config"], ssh_dir / "config")
    shutil.copyfile(host["known_hosts"], ssh_dir / "known_hosts")
    return str(directory)
