"""The machine behind each test EC2 instance (scripts/ci-ec2-host.sh makes its network).

moto keeps the EC2 *records*; nothing listens at the addresses it hands out. `FakePlatform`
plays the rest, one machine at a time at 10.201.N.2 inside the gpus-ec2(-N) network namespace
of this test worker's own (tests/support/slots.py):

- cloud-init: reads the instance's user data back from the EC2 API (DescribeInstanceAttribute),
  installs its `ssh_keys` host key and its `users` logins (each with a group of its own, as on an
  AMI) into the machine's own passwd and group files, which its sshd and boot script see, writes
  its `write_files` (only below /var/lib/gpusession/, where they must be real paths for dockerd),
  and runs its `runcmd` with the namespace's dockerd as the machine's Docker;
- the hypervisor: `poweroff` on the machine is a shim that tells the platform, which then applies
  the instance's InstanceInitiatedShutdownBehavior attribute (set by the backend) in EC2; and an
  instance that EC2 says is no longer running loses its machine (processes, containers, files);
- instance metadata (IMDSv2) with the spot `instance-action` notice, after `interrupt()`, and the
  rebalance recommendation (`events/recommendations/rebalance`), after `recommend_rebalance()`;
- EBS: a volume EC2 says is attached to the machine's instance is a loop device backed by one
  sparse file per volume id (kept across instances, as the volume is), shown to the boot script
  where a Nitro instance shows it, as `nvme-Amazon_Elastic_Block_Store_vol...` in the machine's
  own by-id folder (GPUSESSION_DISKS_DIR); detached (loop device freed) when the machine goes.

The backend reaches the machine through its address-map seam (GPUSESSION_AWS_ADDRESS_MAP=*=10.201.N.2).
"""

from __future__ import annotations

import base64
import http.server
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from .ec2 import inspector
from .slots import script_env, slot, suffix

NS = f"gpus-ec2{suffix()}"
HOST_IP, MACHINE_IP = f"10.201.{slot()}.1", f"10.201.{slot()}.2"
SSH_CIDR = f"{HOST_IP}/32"  # where this machine's SSH comes from, as the instances see it
NS_DOCKER = f"unix:///run/gpus-ec2{suffix()}/docker.sock"
KEYS_ROOT = Path(
    f"/run/gpus-ec2{suffix()}/authorized-keys"
)  # sshd reads these as the user, so not below tmp_path
INSTANCE_ROOT = Path(
    "/var/lib/gpusession"
)  # where user data's files must really be (dockerd mounts them)
SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "ci-ec2-host.sh"
# the machine's users, for its sshd and its boot script alike (run where $FAKE_MACHINE_DIR is set)
USERS_MOUNT = (
    'mount --bind "$FAKE_MACHINE_DIR/passwd" /etc/passwd '
    '&& mount --bind "$FAKE_MACHINE_DIR/group" /etc/group'
)


def ensure_ec2_host() -> str | None:
    """Bring the namespace up; None when it works, else why not (for pytest.skip)."""
    if os.geteuid() != 0:
        return "needs root (network namespace, sshd)"
    if (
        not shutil.which("docker")
        or subprocess.run(["docker", "info"], capture_output=True, timeout=30).returncode
    ):
        return "needs a Docker engine (scripts/ci-host-setup.sh)"
    result = subprocess.run(
        ["bash", str(SCRIPT), "up"], capture_output=True, text=True, timeout=300, env=script_env()
    )
    if result.returncode:
        return f"{SCRIPT.name} up failed: {result.stdout[-500:]}{result.stderr[-1500:]}"
    return None


def _processes() -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, session id) of every process."""
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            found[int(entry)] = (int(fields[1]), int(fields[3]))
    return found


def _kill_machine_processes(leader: int) -> None:
    """SIGKILL a process this platform started, its session and every descendant (sshd puts each
    connection in a session of its own): what a machine that powers off does to its processes."""
    table = _processes()
    doomed = {leader} | {pid for pid, (_, sid) in table.items() if sid == leader}
    grew = True
    while grew:
        more = {pid for pid, (ppid, _) in table.items() if ppid in doomed} - doomed
        doomed |= more
        grew = bool(more)
    for pid in doomed:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


class Machine:
    def __init__(self, instance_id: str, folder: Path, session_id: str):
        self.instance_id = instance_id
        self.folder = folder
        self.session_id = session_id
        self.sessions: list[subprocess.Popen] = []  # sshd, runcmd: each its own process session
        self.sshd: subprocess.Popen | None = None
        self.files: list[Path] = []
        self.powered_off = False
        self.console = folder / "console.log"
        self.disks = folder / "disks"  # the machine's /dev/disk/by-id
        self.loops: dict[str, str] = {}  # volume id -> loop device
        self.ec2 = None  # its region's EC2 client

    @property
    def passwd(self) -> Path:
        return self.folder / "passwd"

    @property
    def group(self) -> Path:
        return self.folder / "group"

    @property
    def poweroff_requested(self) -> bool:
        return (self.folder / "poweroff").exists()


def _content(item: dict) -> bytes:
    """A write_files entry's bytes, as cloud-init decodes its `encoding` (b64, gz, gz+b64)."""
    import gzip

    data, encoding = item.get("content", ""), str(item.get("encoding", "text/plain")).lower()
    raw = base64.b64decode(data) if "b64" in encoding or "base64" in encoding else data.encode()
    return gzip.decompress(raw) if encoding.startswith("gz") else raw


def _folders(folder: Path) -> None:
    """A write_files path's folders, as cloud-init (root, umask 022) makes them: 0755, whatever
    this test process's umask (a 0700 /var/lib/gpusession, shared by every worker's instances, let
    no instance's login read its boot's status). Another worker's machine may remove an empty
    INSTANCE_ROOT meanwhile (its end): made again then."""
    for attempt in range(5):
        try:
            for made in reversed([f for f in (folder, *folder.parents) if not f.is_dir()]):
                made.mkdir(exist_ok=True)
                made.chmod(0o755)
            return
        except FileNotFoundError:
            if attempt == 4:
                raise


def _end_stale_machines() -> None:
    """End the instance sshds a killed run left in this slot's EC2 namespace: one still listening
    on the machine's address would answer the next run's instance with its own host key (the
    pinned key then "changed": three aws tests failed so after a run was killed)."""
    listed = subprocess.run(["ip", "netns", "pids", NS], capture_output=True, text=True)
    for pid in listed.stdout.split():
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes()  # sshd retitles it: one string
        except OSError:
            continue
        if b"/usr/sbin/sshd" in command and b"/platform/i-" in command:
            try:
                os.kill(int(pid), signal.SIGTERM)
            except ProcessLookupError:
                pass


def _end_stale_containers(session_id: str) -> None:
    """A new machine starts with no container of an earlier one: a removal at an earlier
    machine's end that did not finish under load (errors ignored, 60 s bound) left its agent on
    the agent's port, and the new session's tunnel reached it (401: wrong agent token)."""
    env = dict(os.environ, DOCKER_HOST=NS_DOCKER)
    listed = subprocess.run(
        ["docker", "ps", "-a", "--filter", "label=gpusession.session",  # -q would drop --format
         "--format", '{{.ID}} {{.Label "gpusession.session"}}'],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    stale = [
        line.split()[0]
        for line in listed.stdout.splitlines()
        if line.split()[1:] and line.split()[1] != session_id
    ]
    if stale:
        subprocess.run(["docker", "rm", "-f", *stale], env=env, capture_output=True, timeout=120)


class FakePlatform:
    def __init__(self, moto_url: str, folder: Path, *, poll_s: float = 0.25):
        self.moto_url = moto_url
        self.ec2 = inspector(moto_url)
        self.regions = {self.ec2.meta.region_name: self.ec2}  # where it plays instances
        self.folder = folder
        self.poll_s = poll_s
        self.machines: dict[str, Machine] = {}
        self.seen: set[str] = set()
        self.tamper_host_key = False  # boot with a host key other than the user data's
        self.events: list[str] = []
        self._notice: dict | None = None
        self._rebalance: dict | None = None
        self._closed = threading.Event()
        self._lock = threading.Lock()
        _end_stale_machines()
        self._imds = self._start_imds()
        self.imds_url = f"http://{HOST_IP}:{self._imds.server_address[1]}"
        self._shim = self._make_shims()
        self._thread = threading.Thread(target=self._run, name="fake-ec2-platform", daemon=True)
        self._thread.start()

    # -- what tests do ---------------------------------------------------------------------

    def play_region(self, region: str) -> None:
        """Play the instances of this region too (one machine at a time, whichever region)."""
        self.regions.setdefault(region, inspector(self.moto_url, region))

    def interrupt(self, action: str = "terminate") -> dict:
        """From now on, instance metadata carries a spot interruption notice."""
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 120))
        self._notice = {"action": action, "time": when}
        return self._notice

    def calm(self) -> None:
        """Instance metadata carries no notice any more (the next instance starts in peace)."""
        self._notice = self._rebalance = None

    def recommend_rebalance(self) -> dict:
        """From now on, instance metadata carries a rebalance recommendation (nothing ends)."""
        self._rebalance = {"noticeTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        return self._rebalance

    def instances_ending(self, params: dict[str, str]) -> None:
        """EC2 took a stop or terminate of these instances: their machines' sshd ends now, not at
        the next tick. Every instance here answers at one address: a new instance's first login,
        made right after the old one's stop (a switch's hand-over), met the old machine's sshd
        and its host key under load (refused, as a changed key must be)."""
        for iid in [v for k, v in params.items() if k.startswith("InstanceId")]:
            machine = self.machines.get(iid)
            if machine is not None and machine.sshd is not None:
                _kill_machine_processes(machine.sshd.pid)
                machine.sshd.wait(timeout=10)
                self.events.append(f"{iid}: its sshd ended with the instance")

    def wait_for(self, what, timeout: float = 60.0, step: float = 0.25):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = what()
            if value:
                return value
            time.sleep(step)
        raise TimeoutError(f"platform: not within {timeout:.0f}s; events: {self.events[-10:]}")

    def close(self) -> None:
        self._closed.set()
        self._thread.join(timeout=10)
        for machine in list(self.machines.values()):
            self._shut_down(machine)
        self._imds.shutdown()
        self._imds.server_close()
        self._tell()

    def _tell(self) -> None:
        """What the machines went through, on stderr: pytest shows it under a failed test (a boot
        that never got its image said only "no image pull seen")."""
        print(f"fake EC2 platform ({NS}): events: {self.events}", file=sys.stderr)
        for folder in sorted(self.folder.glob("i-*")):
            for name in ("console.log", "log/runcmd.log", "log/sshd.log"):
                try:
                    lines = (folder / name).read_text(errors="replace").splitlines()[-25:]
                except OSError:
                    continue
                print(f"--- {folder.name}/{name} (last lines)", *lines, sep="\n", file=sys.stderr)

    # -- the loop ------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._closed.wait(self.poll_s):
            try:
                self._tick()
            except Exception as exc:  # noqa: BLE001 - keep playing; the test sees the events
                self.events.append(f"error: {type(exc).__name__}: {exc}")

    def _tick(self) -> None:
        states = {}
        for ec2 in list(self.regions.values()):
            found = ec2.describe_instances(
                Filters=[{"Name": "tag-key", "Values": ["gpusession:session"]}]
            )
            for r in found["Reservations"]:
                for i in r["Instances"]:
                    states[i["InstanceId"]] = (i, i["State"]["Name"], ec2)
        for iid, machine in list(self.machines.items()):
            if machine.poweroff_requested and not machine.powered_off:
                machine.powered_off = True
                self._power_off(machine)
            state = states.get(iid, (None, "gone", None))[1]
            if state not in ("pending", "running"):
                self.events.append(f"{iid}: {state}: machine removed")
                self._shut_down(machine)
            else:
                self._attach_volumes(machine)
        for iid, (inst, state, ec2) in states.items():
            if iid not in self.seen and state in ("pending", "running") and not self.machines:
                self.seen.add(iid)
                self._boot(inst, ec2)

    def _attach_volumes(self, machine: Machine) -> None:
        found = machine.ec2.describe_volumes(
            Filters=[{"Name": "attachment.instance-id", "Values": [machine.instance_id]}]
        )
        for volume in found["Volumes"]:
            vid = volume["VolumeId"]
            if vid in machine.loops or volume["Attachments"][0].get("Device") in (
                "/dev/sda1",
                "/dev/xvda",
            ):
                continue  # the root volume is the machine's own disk
            backing = self.folder / "volumes" / f"{vid}.img"
            backing.parent.mkdir(parents=True, exist_ok=True)
            moved_from = next(
                (
                    t["Value"]
                    for t in volume.get("Tags") or []
                    if t["Key"] == "gpusession:moved-from"
                ),
                "",
            )
            source = self.folder / "volumes" / f"{moved_from}.img"
            if not backing.exists() and moved_from and source.exists():  # made from a snapshot
                shutil.copyfile(source, backing)  # of that volume, deleted since: its content
                self.events.append(f"volume {vid}: from the snapshot of {moved_from}")
            if not backing.exists():
                with open(backing, "wb") as f:  # sparse: only what the filesystem writes takes room
                    f.truncate(volume["Size"] * 2**30)
            loop = subprocess.run(
                ["losetup", "-f", "--show", str(backing)],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
            machine.loops[vid] = loop
            machine.disks.mkdir(exist_ok=True)
            (machine.disks / f"nvme-Amazon_Elastic_Block_Store_{vid.replace('-', '')}").symlink_to(
                loop
            )
            self.events.append(f"{machine.instance_id}: volume {vid} attached as {loop}")

    def _power_off(self, machine: Machine) -> None:
        """What EC2 does when the OS powers off: the shutdown behavior the instance was given."""
        iid, ec2 = machine.instance_id, machine.ec2
        attr = ec2.describe_instance_attribute(
            InstanceId=iid, Attribute="instanceInitiatedShutdownBehavior"
        )
        behavior = attr["InstanceInitiatedShutdownBehavior"]["Value"]
        self.events.append(f"{iid}: powered off; shutdown behavior {behavior}")
        if behavior == "terminate":
            ec2.terminate_instances(InstanceIds=[iid])
        else:
            ec2.stop_instances(InstanceIds=[iid])

    # -- cloud-init ----------------------------------------------------------------------

    def _boot(self, inst: dict, ec2) -> None:
        import yaml

        iid = inst["InstanceId"]
        session_id = next(t["Value"] for t in inst["Tags"] if t["Key"] == "gpusession:session")
        raw = ec2.describe_instance_attribute(InstanceId=iid, Attribute="userData")["UserData"][
            "Value"
        ]
        text = base64.b64decode(raw).decode()
        if not text.startswith("#cloud-config\n"):
            raise ValueError(f"{iid}: user data is not #cloud-config")
        config = yaml.safe_load(text)
        _end_stale_containers(session_id)
        machine = Machine(iid, self.folder / iid, session_id)
        machine.ec2 = ec2
        (machine.folder / "log").mkdir(parents=True)
        self._keys_folder(iid)
        machine.console.touch()
        self.machines[iid] = machine
        self.events.append(f"{iid}: booting")
        self._ssh_keys(machine, config)
        self._users(machine, config)
        self._write_files(machine, config)
        self._start_sshd(machine)
        for command in config.get("runcmd", []):
            self._runcmd(machine, command)

    @staticmethod
    def _keys_folder(iid: str) -> Path:
        """sshd reads authorized_keys as the user: a folder every user may enter (not tmp_path)."""
        folder = KEYS_ROOT / iid
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        for path in (KEYS_ROOT, folder):
            path.chmod(0o755)
        return folder

    def _ssh_keys(self, machine: Machine, config: dict) -> None:
        key = machine.folder / "ssh_host_ed25519_key"
        if self.tamper_host_key:  # someone else's machine at that address
            subprocess.run(
                ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True
            )
            return
        fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(config["ssh_keys"]["ed25519_private"])

    def _users(self, machine: Machine, config: dict) -> None:
        """The user data's logins in the machine's own passwd and group files, each with a group
        of its own named after it (as cloud-init's useradd makes on a real AMI), never a group
        another user of the machine has."""
        lines = Path("/etc/passwd").read_text().rstrip("\n").split("\n")
        groups = Path("/etc/group").read_text().rstrip("\n").split("\n")
        for number, user in enumerate(u for u in config.get("users", []) if isinstance(u, dict)):
            name, uid = user["name"], 64900 + number
            lines.append(
                f"{name}:x:{uid}:{uid}:{user.get('gecos', '')}:/nonexistent:{user.get('shell', '/bin/sh')}"
            )
            groups.append(f"{name}:x:{uid}:")
            keys = KEYS_ROOT / machine.instance_id / name
            keys.write_text("\n".join(user.get("ssh_authorized_keys", [])) + "\n")
            keys.chmod(0o644)
        for path, text in ((machine.passwd, lines), (machine.group, groups)):
            path.write_text("\n".join(text) + "\n")
            path.chmod(0o644)

    def _write_files(self, machine: Machine, config: dict) -> None:
        for item in config.get("write_files", []):
            path = Path(item["path"])
            if INSTANCE_ROOT not in path.parents:
                raise ValueError(f"{machine.instance_id}: refusing to write {path} on this machine")
            _folders(path.parent)
            path.write_bytes(_content(item))
            path.chmod(int(str(item.get("permissions", "0644")), 8))
            machine.files.append(path)

    def _start_sshd(self, machine: Machine) -> None:
        cfg = machine.folder / "sshd_config"
        cfg.write_text(
            f"ListenAddress {MACHINE_IP}\nPort 22\nHostKey {machine.folder / 'ssh_host_ed25519_key'}\n"
            f"PidFile {machine.folder / 'sshd.pid'}\nAuthorizedKeysFile {KEYS_ROOT / machine.instance_id}/%u\n"
            "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
            "PermitRootLogin no\nAllowTcpForwarding yes\nPrintMotd no\n"
        )
        self._spawn(
            machine,
            "sshd.log",
            f'{USERS_MOUNT} && exec /usr/sbin/sshd -D -e -f "$1"',
            [str(cfg)],
            dict(os.environ, FAKE_MACHINE_DIR=str(machine.folder)),
        )
        machine.sshd = machine.sessions[-1]

    def _runcmd(self, machine: Machine, command) -> None:
        argv = ["sh", "-c", command] if isinstance(command, str) else [str(c) for c in command]
        env = dict(
            os.environ,
            PATH=f"{self._shim}:{os.environ['PATH']}",
            DOCKER_HOST=NS_DOCKER,
            GPUSESSION_IMDS_URL=self.imds_url,
            FAKE_MACHINE_DIR=str(machine.folder),
            GPUSESSION_DISKS_DIR=str(machine.disks),
        )
        self._spawn(
            machine,
            "runcmd.log",
            f'{USERS_MOUNT} && mount --bind "$1" /dev/console && mount --bind "$2" /var/log '
            '&& shift 2 && exec "$@"',
            [str(machine.console), str(machine.folder / "log"), *argv],
            env,
        )

    @staticmethod
    def _spawn(machine: Machine, log_name: str, script: str, args: list[str], env: dict) -> None:
        """A process of the machine: in its network namespace, with a private mount namespace
        holding its own users (USERS_MOUNT), as its own session, logging to log/LOG_NAME, with
        the umask a machine's init gives (022), not this test process's."""
        with open(machine.folder / "log" / log_name, "ab") as log:
            machine.sessions.append(
                subprocess.Popen(
                    [
                        "nsenter",
                        f"--net=/run/netns/{NS}",
                        "unshare",
                        "--mount",
                        "--propagation",
                        "private",
                        "sh",
                        "-c",
                        f"umask 022 && {script}",
                        "sh",
                        *args,
                    ],
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
            )

    def _make_shims(self) -> Path:
        shim = self.folder / "shim"
        shim.mkdir(parents=True, exist_ok=True)
        for name in ("poweroff", "shutdown", "halt"):
            path = shim / name
            path.write_text('#!/bin/sh\necho "$0 $*" >"$FAKE_MACHINE_DIR/poweroff"\n')
            path.chmod(0o755)
        return shim

    # -- the end of a machine -----------------------------------------------------------------

    def _shut_down(self, machine: Machine) -> None:
        with self._lock:
            if self.machines.pop(machine.instance_id, None) is None:
                return
        for proc in machine.sessions:
            if proc is machine.sshd and proc.returncode is not None:
                continue  # ended with its instance (instances_ending): its pid may be another's now
            _kill_machine_processes(proc.pid)
            proc.wait(timeout=10)
        ids = subprocess.run(
            ["docker", "ps", "-aq", "--filter", f"label=gpusession.session={machine.session_id}"],
            env=dict(os.environ, DOCKER_HOST=NS_DOCKER),
            capture_output=True,
            text=True,
        ).stdout.split()
        if ids:
            subprocess.run(
                ["docker", "rm", "-f", *ids],
                env=dict(os.environ, DOCKER_HOST=NS_DOCKER),
                capture_output=True,
                timeout=60,
            )
        volumes = subprocess.run(
            [
                "docker",
                "volume",
                "ls",
                "-q",
                "--filter",
                f"label=gpusession.session={machine.session_id}",
            ],
            env=dict(os.environ, DOCKER_HOST=NS_DOCKER),
            capture_output=True,
            text=True,
        ).stdout.split()
        if volumes:  # the workspace's Docker volume names the loop device: gone with the machine
            subprocess.run(
                ["docker", "volume", "rm", "-f", *volumes],
                env=dict(os.environ, DOCKER_HOST=NS_DOCKER),
                capture_output=True,
                timeout=60,
            )
        for loop in machine.loops.values():
            subprocess.run(["losetup", "-d", loop], capture_output=True, timeout=30)
        shutil.rmtree(INSTANCE_ROOT / machine.session_id, ignore_errors=True)
        shutil.rmtree(KEYS_ROOT / machine.instance_id, ignore_errors=True)
        try:
            INSTANCE_ROOT.rmdir()
        except OSError:
            pass

    def console_text(self, instance_id: str) -> str:
        return (self.folder / instance_id / "console.log").read_text(errors="replace")

    def console_output(self, params: dict[str, str]) -> bytes | None:
        """EC2's GetConsoleOutput answer for a machine this platform ran (None: not one)."""
        iid = params.get("InstanceId", "")
        path = self.folder / iid / "console.log"
        if not iid or not path.exists():
            return None
        text = base64.b64encode(path.read_bytes()).decode()
        when = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime())
        return (
            '<?xml version="1.0" encoding="UTF-8"?>\n<GetConsoleOutputResponse '
            'xmlns="http://ec2.amazonaws.com/doc/2016-11-15/"><requestId>platform</requestId>'
            f"<instanceId>{iid}</instanceId><timestamp>{when}</timestamp>"
            f"<output>{text}</output></GetConsoleOutputResponse>"
        ).encode()

    def take_back(self, instance_id: str) -> None:
        """What AWS does at a spot notice's time: the instance is terminated."""
        self.events.append(f"{instance_id}: taken back (spot)")
        machine = self.machines.get(instance_id)
        (machine.ec2 if machine else self.ec2).terminate_instances(InstanceIds=[instance_id])

    # -- instance metadata --------------------------------------------------------------------

    def _start_imds(self) -> http.server.ThreadingHTTPServer:
        platform = self
        token = "fake-imds-token"

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _reply(self, status: int, body: bytes = b"") -> None:
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_PUT(self):
                ok = self.path == "/latest/api/token" and self.headers.get(
                    "X-aws-ec2-metadata-token-ttl-seconds"
                )
                self._reply(200, token.encode()) if ok else self._reply(400)

            def do_GET(self):
                if self.headers.get("X-aws-ec2-metadata-token") != token:
                    return self._reply(401)
                notice = platform._notice
                if self.path == "/latest/meta-data/spot/instance-action" and notice is not None:
                    return self._reply(200, json.dumps(notice).encode())
                rebalance = platform._rebalance
                if (
                    self.path == "/latest/meta-data/events/recommendations/rebalance"
                    and rebalance is not None
                ):
                    return self._reply(200, json.dumps(rebalance).encode())
                self._reply(404)

        server = http.server.ThreadingHTTPServer((HOST_IP, 0), Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return server
