"""What an instance is told at boot: cloud-init user data and the session's boot script.

The instance's host key is made here, so nothing is ever accepted on first sight: its sshd gets it
through cloud-init's `ssh_keys`, and only the public half is kept locally and pinned. The session
container has no sshd: the tunnel logs in to the instance's own sshd as user `gpusession`, whose
key may do two things only (`restrict,port-forwarding,permitopen=...,command=...`): forward to
the kernel's unix sockets (in a folder of that login's own group, `BootPlan.sockets`: no other
user of the instance reaches them) and to the agent's fixed port on the instance's 127.0.0.1, and
run `access.sh`, which reads the boot's status, takes the runtime bundle and reads a spot notice.

The boot script (session.sh, after a header made here) gets the image, probes its Python, waits
for the runtime bundle the client sends, runs the session container with it on the host's
network with every GPU, and powers the instance off when the container ends, for whatever reason
(idle watchdog, cost cap, crash, failed pull, no bundle); with InstanceInitiatedShutdownBehavior=
terminate, EC2 then terminates it.

Standard library plus `cryptography` (a paramiko dependency) for the keys.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
from pathlib import Path

from ...configuration.agentargs import WORKSPACE_MOUNT
from ...core.protocol import Marker
from ...transport.bundle import boot_script as bundle_boot_script
from ...transport.tunnel import CONTAINER_AGENT_PORT

SSH_USER = "gpusession"  # the tunnel's login on the instance (created by cloud-init)
INSTANCE_ROOT = "/var/lib/gpusession"  # one folder per session below it
(
    SPOT_NOTICE_FILE,
    REBALANCE_FILE,
) = (  # what instance metadata said, for the agent (its NOTICE_FILES)
    "spot-instance-action.json",
    "rebalance-recommendation.json",
)
CONTAINER_NOTICES = "/run/gpusession-notices"  # the instance's notices folder in the container
USER_DATA_LIMIT = 16 * 1024  # EC2 refuses more (before base64)
VOLUME_WAIT_S = 300  # the workspace's volume is attached once the instance runs
RUNTIME_WAIT_S = 600  # the instance powers off when no runtime bundle came by then
CONTAINER_STATE_DIR = (
    "/run/gpusession"  # the session container's --state-dir (a folder of the instance's DIR)
)
ACCESS_COMMANDS = ("status", "put", "login", "notice", "export", "import", "import-end")
LOGIN_PIPE = "login.pipe"  # in the session's folder: the registry login passes through, never stored  # what access.sh does for the tunnel's login


@dataclasses.dataclass(frozen=True)
class HostKey:
    private: str  # OpenSSH private key (PEM text)
    public: str  # "ssh-ed25519 AAAA... comment"


def new_host_key(comment: str) -> HostKey:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    ).decode()
    public = key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    return HostKey(private=private, public=f"{public.decode()} {comment}")


def instance_sockets(session_id: str) -> str:
    """The folder of a session kernel's unix sockets on its instance (the runtime's --kernel-ip is
    this folder + '/k'), in the session's own folder: known before the instance boots."""
    return f"{INSTANCE_ROOT}/{session_id}/kernel"


@dataclasses.dataclass(frozen=True)
class BootPlan:
    """Everything the instance needs to run one session."""

    session_id: str
    image: str  # pulled by the instance's Docker
    session_key: str  # public key line of the session's own key
    instance_host_key: HostKey  # for the instance's sshd
    kernel_key: (
        str  # the kernel's connection key, made locally (the client cannot read kernel.json)
    )
    agent_args: list[
        str
    ]  # options of `python -m gpusession.agent run` (AgentArgs.argv(): placement too)
    spot: bool  # watch instance metadata for an interruption notice
    volume_id: str = ""  # the workspace's EBS volume, attached after launch: mounted at /workspace
    # the image's registry wants a login: the boot waits for the client to send it over the SSH
    # login (access.sh login) before it pulls; user data says only that, never the login
    pull_login: bool = False
    # a switch to this instance: the boot waits for the workspace's files, which the client sends
    # over the SSH login (access.sh import, then import-end) once the fresh volume is ready
    import_files: bool = False

    @property
    def folder(self) -> str:
        return f"{INSTANCE_ROOT}/{self.session_id}"

    @property
    def sockets(self) -> str:
        """The kernel's unix sockets' folder on the instance (bind-mounted at the same path)."""
        return instance_sockets(self.session_id)

    @property
    def container_name(self) -> str:
        return f"gpusession-{self.session_id[:12]}"


def authorized_key_line(plan: BootPlan) -> str:
    """The session key on the instance: the kernel's five unix sockets and its raw stream's
    (`k-r`, gpusession.agent.transfer_raw), the agent's loopback port, and access.sh. OpenSSH's
    permitopen limits its streamlocal forwarding too, and names a socket as a host in brackets
    with any port (`[/path]:*`)."""
    sockets = [f"[{plan.sockets}/k-{i}]:*" for i in (1, 2, 3, 4, 5, "r")]
    opens = ",".join(
        f'permitopen="{where}"' for where in (*sockets, f"127.0.0.1:{CONTAINER_AGENT_PORT}")
    )
    return (
        f'restrict,port-forwarding,{opens},command="sh {plan.folder}/access.sh" {plan.session_key}'
    )


def boot_script(plan: BootPlan) -> str:
    q = shlex.quote
    markers = "\n".join(
        f"M_{m.name}={m.value}"
        for m in (
            Marker.BOOT,
            Marker.CHECKPOINT,
            Marker.FAILED,
            Marker.POWEROFF,
            Marker.PYTHON,
            Marker.SPOT_NOTICE,
            Marker.STOPPED,
            Marker.SUMMARY,
        )
    )
    header = f"""#!/bin/sh
# gpusession session {plan.session_id}: run its container, then power this instance off.
# Written by gpusession's user data and started once by cloud-init.
set -u
DIR={q(plan.folder)}
NAME={q(plan.container_name)}
IMAGE={q(plan.image)}
SESSION_ID={q(plan.session_id)}
SPOT={1 if plan.spot else 0}
VOLUME_ID={q(plan.volume_id)}
PULL_LOGIN={1 if plan.pull_login else 0}
IMPORT={1 if plan.import_files else 0}
WORKSPACE={q(WORKSPACE_MOUNT)}
VOLUME_WAIT_S={VOLUME_WAIT_S}
RUNTIME_WAIT_S={RUNTIME_WAIT_S}
STATE_DIR={q(CONTAINER_STATE_DIR)}
SOCKETS={q(plan.sockets)}
LOGIN={q(SSH_USER)}
NOTICES={q(CONTAINER_NOTICES)}
SPOT_FILE={q(SPOT_NOTICE_FILE)}
REBALANCE_FILE={q(REBALANCE_FILE)}
AGENT_PORT={CONTAINER_AGENT_PORT}
RESERVED_PORTS=/proc/sys/net/ipv4/ip_local_reserved_ports
GPUSESSION_KERNEL_KEY={q(plan.kernel_key)}
export GPUSESSION_KERNEL_KEY
{markers}
set -- {shlex.join(plan.agent_args)}
"""
    return header + (Path(__file__).parent / "session.sh").read_text()


def access_script(plan: BootPlan) -> str:
    """The tunnel login's only command (authorized_keys `command=`), run as user gpusession:
    `status` prints the boot's status (and the image pull's latest JSON line per layer), `put
    NAME SHA256` stores the bundle part NAME (code, site) from stdin when its hash matches,
    `login` passes the registry login on stdin to the boot script through a FIFO (nothing is
    stored; exit 3 when the boot waits for none), `notice` prints the spot interruption notice,
    when there is one, `import` passes a tar stream of the workspace's files on stdin to the boot
    script (a FIFO; IMPORT=1 only) and `import-end SHA256` says what was sent (the stream's
    hash) and waits for the boot's answer: "placed", or why not (session.sh import_files),
    `export` prints the workspace's size (one line) and then its files as a
    tar stream, read by the boot script out of the running container (session.sh export_one).
    The boot's answer files (docker's status, the import's result) are read once they hold their
    line: a shell's `>` makes the file before it writes it."""
    q = shlex.quote
    return f"""#!/bin/sh
DIR={q(plan.folder)}
set -- ${{SSH_ORIGINAL_COMMAND:-}}
case "${{1:-}}" in
    status)
        cat "$DIR/status"
        : >"$DIR/upload/.status-read" 2>/dev/null
        [ -f "$DIR/pull.log" ] && awk 'match($0, /"id":"[^"]*"/) {{ last[substr($0, RSTART, RLENGTH)] = $0 }}
            END {{ for (k in last) print last[k] }}' "$DIR/pull.log"
        exit 0 ;;
    put)
        case "${{2:-}}:${{3:-}}" in code:*|site:*) ;; *) echo "put code|site SHA256" >&2; exit 2 ;; esac
        part="$DIR/upload/.$2.$$"
        cat >"$part" || {{ rm -f "$part"; exit 1; }}
        if [ "$(sha256sum "$part" | cut -d' ' -f1)" != "$3" ]; then rm -f "$part"; echo "bundle damaged" >&2; exit 1; fi
        mv "$part" "$DIR/upload/$2.tgz" ;;
    login)
        [ -p "$DIR/{LOGIN_PIPE}" ] || {{ echo "no registry login is wanted now" >&2; exit 3; }}
        exec timeout 30 sh -c 'cat >"$1"' sh "$DIR/{LOGIN_PIPE}" ;;
    notice)
        exec cat "$DIR/notices/{SPOT_NOTICE_FILE}" ;;
    import)
        [ -p "$DIR/import.pipe" ] || {{ echo "the instance waits for no workspace files now" >&2; exit 3; }}
        exec cat >"$DIR/import.pipe" ;;
    import-end)
        case "${{2:-}}" in ""|*[!0-9a-f]*) echo "import-end SHA256" >&2; exit 2 ;; esac
        printf '%s\n' "$2" >"$DIR/upload/.import-end.$$" && mv -f "$DIR/upload/.import-end.$$" "$DIR/upload/import-end" || exit 1
        for _ in $(seq 1200); do [ -s "$DIR/import.result" ] && break; sleep 0.1; done
        result=$(cat "$DIR/import.result" 2>/dev/null)
        [ "$result" = placed ] || {{ echo "${{result:-the instance did not say whether the files were placed}}" >&2; exit 1; }} ;;
    export)
        out="$DIR/export-$$"
        : >"$DIR/upload/export-$$" || exit 1
        for _ in $(seq 1200); do [ -p "$out.pipe" ] && [ -s "$out.size" ] && break; [ -s "$out.rc" ] && break; sleep 0.1; done
        [ -p "$out.pipe" ] || {{ echo "the instance did not read its workspace out (its session container is not running)" >&2; exit 3; }}
        cat "$out.size" "$out.pipe" || exit 1
        for _ in $(seq 100); do [ -s "$out.rc" ] && break; sleep 0.1; done
        rc=$(cat "$out.rc" 2>/dev/null)
        [ "$rc" = 0 ] || {{ echo "docker cp exited ${{rc:-?}}: $(tail -c 300 "$out.err" 2>/dev/null)" >&2; exit 1; }} ;;
    *)
        echo "gpusession: this key runs only {" | ".join(ACCESS_COMMANDS)}" >&2
        exit 2 ;;
esac
"""


def packed(text: str) -> str:
    """write_files content with `encoding: gz+b64` (mtime 0: the same script packs the same)."""
    import base64
    import gzip

    return base64.b64encode(gzip.compress(text.encode(), mtime=0)).decode()


def user_data(plan: BootPlan) -> str:
    """#cloud-config (as JSON, which YAML reads too): host key, login, files, the boot script."""
    script = f"{plan.folder}/session.sh"
    config = {
        "ssh_deletekeys": True,
        "ssh_genkeytypes": [],
        "ssh_keys": {
            "ed25519_private": plan.instance_host_key.private,
            "ed25519_public": plan.instance_host_key.public,
        },
        "users": [
            "default",
            {
                "name": SSH_USER,
                "gecos": "gpusession tunnel",
                "shell": "/bin/sh",
                "lock_passwd": True,
                "ssh_authorized_keys": [authorized_key_line(plan)],
            },
        ],
        "write_files": [
            # gzip: the boot script is most of the 16 KiB EC2 allows (cloud-init unpacks gz+b64)
            {
                "path": script,
                "permissions": "0700",
                "encoding": "gz+b64",
                "content": packed(boot_script(plan)),
            },
            {
                "path": f"{plan.folder}/access.sh",
                "permissions": "0755",
                "encoding": "gz+b64",
                "content": packed(access_script(plan)),
            },
            {
                "path": f"{plan.folder}/boot.sh",
                "permissions": "0644",
                "content": bundle_boot_script().decode(),
            },
        ],
        # in the background: cloud-init's final stage must not wait for the whole session
        "runcmd": [["sh", "-c", f"nohup sh {script} >>/var/log/gpusession-session.log 2>&1 &"]],
    }
    text = "#cloud-config\n" + json.dumps(config, indent=1) + "\n"
    if len(text.encode()) > USER_DATA_LIMIT:
        raise ValueError(f"user data is {len(text.encode())} bytes; EC2 allows {USER_DATA_LIMIT}")
    return text
