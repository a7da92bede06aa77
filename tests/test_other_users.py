"""Another user on the same machine (GPU boxes and login nodes are shared): as uid `nobody`, it
reads nothing of a session: not the data folder (store, keys, logs, checkpoints), not the
kernel's sockets, not the agent's answers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0, reason="switching to uid nobody needs root"),
]
pytest_plugins = ["support.ec2_fixtures"]  # the aws case: moto_server, aws_env, platform

# run as nobody: which of the given paths it could list (folders) or read (files)
READ_PROBE = r"""
import json, os, sys
opened = []
for path in json.load(sys.stdin):
    try:
        if os.path.isdir(path):
            os.listdir(path)
        else:
            with open(path, "rb") as f:
                f.read(1)
        opened.append(path)
    except OSError:
        pass
print(json.dumps(opened))
"""


def nobody_python() -> str:
    """A Python of this version that uid nobody may run (ours may live under root's 0700 home)."""
    for candidate in (
        sys.executable,
        f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}",
    ):
        try:
            done = subprocess.run(
                [candidate, "-c", "import sys; print(tuple(sys.version_info[:2]))"],
                user="nobody",
                capture_output=True,
                text=True,
                cwd="/",
            )
        except OSError:
            continue
        if done.returncode == 0 and done.stdout.strip() == str(tuple(sys.version_info[:2])):
            return candidate
    pytest.skip(f"no Python {sys.version_info[:2]} that uid nobody may run")


def as_nobody(script: str, stdin: str = "", timeout: float = 30, path: str = "") -> str:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": path}
    try:
        done = subprocess.run(
            [nobody_python(), "-c", script],
            input=stdin,
            capture_output=True,
            text=True,
            env=env,
            user="nobody",
            group="nogroup",
            extra_groups=[],
            timeout=timeout,
            cwd="/",
        )
    except PermissionError as exc:
        pytest.skip(f"uid nobody cannot run Python here: {exc}")
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture
def open_parent(monkeypatch):
    """A folder every user may pass through (as a home's parent is), GPUSESSION_HOME in it not made yet."""
    parent = Path(tempfile.mkdtemp(prefix="gs-users-"))
    parent.chmod(0o711)
    monkeypatch.setenv("GPUSESSION_HOME", str(parent / "gshome"))
    monkeypatch.delenv("GPUSESSION_BACKEND", raising=False)
    yield parent
    import shutil

    from support.leftovers import remove_workspace_volumes

    remove_workspace_volumes(parent / "gshome")
    shutil.rmtree(parent, ignore_errors=True)


def test_another_user_reads_nothing_under_the_data_folder(open_parent):
    from gpusession.session import SessionManager

    home = open_parent / "gshome"
    manager = SessionManager()
    try:
        session = manager.start(manager.make_spec("t4", backend="local", idle="off", name="u1"))
        assert (
            session.kernel.execute("open('notes.txt', 'w').write('mine')\nsecret = 42")["status"]
            == "ok"
        )
        assert manager.stop(session.id, save=True).resource["checkpoint"]["saved"] == 1
    finally:
        for r in manager.list(active_only=True):
            manager.stop(r.id)
        manager.close()
    everything = [
        str(home),
        *(os.path.join(root, name) for root, dirs, files in os.walk(home) for name in dirs + files),
    ]
    names = {Path(p).name for p in everything}
    assert {"sessions.sqlite3", "runtime.log", "kernel.json", "notes.txt"} <= names, names
    assert json.loads(as_nobody(READ_PROBE, json.dumps(everything))) == []
    # and not only because the top folder is closed: each folder 0700, each file 0600
    modes = {p: oct(os.lstat(p).st_mode & 0o777) for p in everything}
    opened = {p: m for p, m in modes.items() if m not in ("0o700", "0o600")}
    assert opened == {}, opened


def test_an_existing_open_data_folder_is_said_once(tmp_path, nb_env):
    home = tmp_path / "open-home"
    home.mkdir(mode=0o755)
    home.chmod(0o755)
    env = dict(nb_env, GPUSESSION_HOME=str(home))
    said = [
        subprocess.run(
            [sys.executable, "-m", "gpusession", "list"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        for _ in range(2)
    ]
    for done in said:
        assert done.returncode == 0, done.stderr
        lines = [line for line in done.stderr.splitlines() if "open to other users" in line]
        assert lines == [
            f"gpusession: your data folder {home} is open to other users on this machine (mode 755): "
            f"they may read your sessions' keys and tokens there. Close it with: chmod 700 {home}"
        ], done.stderr
        assert "Traceback" not in done.stderr


# run as another user: a ZMQ SUB on each of a session's kernel sockets, for `seconds`; how many
# messages it received (a SUB needs no key: whoever connects to IOPub reads every output)
SUB_PROBE = r"""
import json, sys, time
import zmq
endpoints, seconds = json.loads(sys.argv[1]), float(sys.argv[2])
ctx = zmq.Context()
socks = []
for url in endpoints:
    s = ctx.socket(zmq.SUB)
    s.setsockopt(zmq.SUBSCRIBE, b"")
    s.setsockopt(zmq.LINGER, 0)
    s.connect(url)  # ZMQ connects in the background: a refused one just never delivers
    socks.append(s)
print("ready", flush=True)
poller = zmq.Poller()
for s in socks:
    poller.register(s, zmq.POLLIN)
got, end = [], time.monotonic() + seconds
while time.monotonic() < end:
    for s, _ in poller.poll(100):
        got.append(b"".join(s.recv_multipart()).decode(errors="replace"))
print(json.dumps(got))
"""


def zmq_endpoints(info: dict) -> list[str]:
    from gpusession.core.protocol import KERNEL_PORT_NAMES

    if info.get("transport") == "ipc":
        return [f"ipc://{info['ip']}-{info[name]}" for name in KERNEL_PORT_NAMES]
    return [f"tcp://{info['ip']}:{info[name]}" for name in KERNEL_PORT_NAMES]


def pyzmq_for_nobody(folder: Path) -> str:
    """A copy of pyzmq that uid nobody may import (ours may sit under root's 0700 home)."""
    import shutil

    import zmq

    site = Path(zmq.__file__).parent.parent
    target = folder / "site"
    for name in ("zmq", "pyzmq.libs"):
        if (site / name).is_dir():
            shutil.copytree(site / name, target / name)
    for path in [target, *target.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return str(target)


def subscribers_while_printing(
    kernel,
    endpoints: list[str],
    *,
    user: str | None,
    path: str,
    netns: str = "",
    group: str = "nogroup",
) -> list[str]:
    """Outputs a SUB on each endpoint received, as `user` (None: this one) of `group`, while a
    cell prints; in the network namespace `netns` (another host's loopback) when given."""
    python = nobody_python() if user else sys.executable
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": path}
    argv = [python, "-c", SUB_PROBE, json.dumps(endpoints), "4"]
    as_user = {"user": user, "group": group, "extra_groups": []} if user else {}
    if netns:  # enter it as root, then become `user`
        drop = ["setpriv", "--reuid", user, "--regid", group, "--clear-groups"] if user else []
        argv, as_user = ["nsenter", f"--net=/run/netns/{netns}", "--", *drop, *argv], {}
    probe = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd="/", **as_user
    )
    try:
        assert probe.stdout.readline().strip() == "ready", probe.stderr.read()
        time.sleep(0.5)  # its connects are made
        out = kernel.execute(
            "import time\nfor i in range(15):\n    print('secret-output', i, flush=True)\n"
            "    time.sleep(0.1)"
        )
        assert out["status"] == "ok"
        got, err = probe.communicate(timeout=30)
    finally:
        probe.kill()
    assert probe.returncode == 0, err
    return json.loads(got.strip().splitlines()[-1])


def test_another_user_cannot_subscribe_to_a_local_session_kernel(open_parent):
    from gpusession.session import SessionManager

    path = pyzmq_for_nobody(open_parent)
    manager = SessionManager()
    try:
        session = manager.start(manager.make_spec("t4", backend="local", idle="off", name="z1"))
        endpoints = zmq_endpoints(session.link.endpoint.connection_info)
        # the probe works: the session's owner subscribing this way reads the cell's output
        mine = subscribers_while_printing(session.kernel, endpoints, user=None, path=path)
        assert any("secret-output" in m for m in mine), mine
        theirs = subscribers_while_printing(session.kernel, endpoints, user="nobody", path=path)
        assert theirs == [], theirs[:3]
    finally:
        for r in manager.list(active_only=True):
            manager.stop(r.id)
        manager.close()


def test_another_user_cannot_subscribe_through_the_tunnel_either(open_parent, tmp_path):
    """The runtime on the far side of an SSH tunnel (slurm's compute node, an ssh:// host): its
    kernel on unix sockets in a 0700 folder there, the tunnel's ends unix sockets in a 0700
    folder here; another uid reaches neither."""
    from test_tunnel import Sshd

    from gpusession.transport.kernel.client import KernelClient
    from gpusession.transport.tunnel import Tunnel, tunneled_endpoint
    from support.procs import start_runtime

    path = pyzmq_for_nobody(open_parent)
    remote_sockets = open_parent / "remote"
    remote_sockets.mkdir(mode=0o700)
    sshd = Sshd(tmp_path / "sshd")
    info, proc = start_runtime(
        tmp_path / "state", "isotest", "--kernel-ip", str(remote_sockets / "k")
    )
    try:
        assert info["transport"] == "ipc"
        with Tunnel(sshd.target(), []) as tunnel:
            endpoint = tunneled_endpoint(tunnel, info, None)
            local = endpoint.connection_info
            assert (
                local["transport"] == "ipc"
                and os.stat(os.path.dirname(local["ip"])).st_mode & 0o777 == 0o700
            )
            kernel = KernelClient(local, healthy=tunnel.healthy)
            try:
                kernel.wait_ready(30)
                both = zmq_endpoints(local) + zmq_endpoints(info)
                mine = subscribers_while_printing(kernel, both, user=None, path=path)
                assert any("secret-output" in m for m in mine), mine
                assert subscribers_while_printing(kernel, both, user="nobody", path=path) == []
            finally:
                kernel.close()
    finally:
        proc.terminate()
        proc.wait(15)
        sshd.close()


def _docker_kernel_info(client, session_id: str) -> dict:
    """The kernel.json inside a session's container, as the runtime there wrote it."""
    from gpusession.backends.docker.engine import STATE_DIR, read_json_from

    (container,) = client.containers.list(filters={"label": f"gpusession.session={session_id}"})
    return read_json_from(container, f"{STATE_DIR}/kernel.json")


@pytest.mark.docker
def test_another_user_cannot_subscribe_to_a_docker_session_kernel(open_parent, engine, monkeypatch):
    """A container of the local engine on the host's network, its kernel as the image's USER: its
    sockets are reached by the session's owner directly, by no other uid of the host."""
    from gpusession.session import SessionManager
    from support.hosts import product_image

    monkeypatch.setenv("GPUSESSION_IMAGE", product_image())
    path = pyzmq_for_nobody(open_parent)
    manager = SessionManager()
    try:
        session = manager.start(manager.make_spec("t4", backend="docker", idle="off", name="zd1"))
        endpoints = zmq_endpoints(session.link.endpoint.connection_info)
        assert (
            zmq_endpoints(_docker_kernel_info(engine, session.id)) == endpoints
        )  # no forwarding in between
        mine = subscribers_while_printing(session.kernel, endpoints, user=None, path=path)
        assert any("secret-output" in m for m in mine), mine
        theirs = subscribers_while_printing(session.kernel, endpoints, user="nobody", path=path)
        assert theirs == [], theirs[:3]
        sockets = manager.store.get(session.id).resource.get("sockets")
    finally:
        for r in manager.list(active_only=True):
            manager.stop(r.id)
        manager.close()
    if sockets:
        assert not os.path.exists(sockets)  # the stop took the socket folder away too


@pytest.mark.docker
def test_another_user_cannot_subscribe_to_a_remote_engines_kernel(open_parent, remote, monkeypatch):
    """An ssh:// engine: neither on that host (its own loopback: another uid there, in its
    network namespace) nor here (the tunnel's local ends) does another uid read the kernel."""
    import docker

    from gpusession.session import SessionManager
    from support.hosts import REMOTE_NETNS, product_image

    monkeypatch.setenv("GPUSESSION_IMAGE", product_image())
    path = pyzmq_for_nobody(open_parent)
    direct = docker.DockerClient(base_url=remote["docker_host_env"])
    manager = SessionManager()
    try:
        session = manager.start(
            manager.make_spec("t4", backend="docker", idle="off", name="zr1", host=remote["url"])
        )
        here = zmq_endpoints(session.link.endpoint.connection_info)
        there = zmq_endpoints(_docker_kernel_info(direct, session.id))
        for endpoints, netns in ((here, ""), (there, REMOTE_NETNS)):
            mine = subscribers_while_printing(
                session.kernel, endpoints, user=None, path=path, netns=netns
            )
            assert any("secret-output" in m for m in mine), (netns, mine)
            theirs = subscribers_while_printing(
                session.kernel, endpoints, user="nobody", path=path, netns=netns
            )
            assert theirs == [], (netns, theirs[:3])
    finally:
        for r in manager.list(active_only=True):
            manager.stop(r.id)
        manager.close()
        direct.close()


@pytest.mark.docker
@pytest.mark.slow
def test_another_user_cannot_subscribe_to_an_aws_session_kernel(open_parent, manager, platform):
    """An EC2 instance (moto, its machine played in a network namespace by the fake platform):
    on the instance (its own loopback, in its namespace) only the tunnel's login (`gpusession`,
    its own group, as on a real AMI) reaches the kernel, not another uid there; here, the tunnel's
    local ends are this user's alone."""
    from support.ec2_platform import INSTANCE_ROOT, NS, SSH_CIDR
    from support.hosts import product_image

    path = pyzmq_for_nobody(open_parent)
    session = manager.start(
        manager.make_spec(
            "t4",
            backend="aws",
            idle="5m",
            name="za1",
            image=product_image(),
            ssh_cidr=SSH_CIDR,
            boot_timeout=120,
            workspace_size="1",
        )
    )
    (machine,) = platform.machines.values()
    # the login exists only on the instance: its ids from the machine's passwd
    login = next(
        line.split(":")
        for line in (machine.folder / "passwd").read_text().splitlines()
        if line.startswith("gpusession:")
    )
    here = zmq_endpoints(session.link.endpoint.connection_info)
    there = zmq_endpoints(
        json.loads((INSTANCE_ROOT / session.id / "state" / "kernel.json").read_text())
    )
    mine = subscribers_while_printing(session.kernel, here, user=None, path=path)
    assert any("secret-output" in m for m in mine), mine
    assert subscribers_while_printing(session.kernel, here, user="nobody", path=path) == []
    # on the instance: the login sshd forwards as reads it (the positive control), nobody does not
    mine = subscribers_while_printing(
        session.kernel, there, user=login[2], group=login[3], path=path, netns=NS
    )
    assert any("secret-output" in m for m in mine), mine
    theirs = subscribers_while_printing(session.kernel, there, user="nobody", path=path, netns=NS)
    assert theirs == [], theirs[:3]
    # and the session's login forwards to the kernel's sockets only, not to one open to all
    import socket

    other = socket.socket(socket.AF_UNIX)
    other.bind(str(open_parent / "open.sock"))
    os.chmod(open_parent / "open.sock", 0o777)
    other.listen(1)
    other.settimeout(3)
    with other, socket.socket(socket.AF_UNIX) as conn:
        conn.connect(session.link.tunnel.add_socket_forward(str(open_parent / "open.sock")))
        conn.settimeout(20)
        try:
            assert conn.recv(1) == b""  # refused there: closed here
        except ConnectionResetError:
            pass
        with pytest.raises(TimeoutError):
            other.accept()
