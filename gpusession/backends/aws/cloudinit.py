"""What an instance is told at boot: cloud-init user data and the session's boot script.

Host keys are made here, so nothing is ever accepted on first sight: the instance's sshd gets a
host key through cloud-init's `ssh_keys`, and the session container's sshd gets one through a
file the container mounts (its entrypoint keeps an existing key); only the public halves are kept
locally, and both are pinned. The tunnel logs in as user `gpusession`, whose key may do nothing
but forward to the container's sshd on the instance's 127.0.0.1:2222 (`restrict,port-forwarding,
permitopen`). The boot script runs the container with every GPU and powers the instance off when
the container ends, for whatever reason (idle watchdog, cost cap, crash, failed pull);
with InstanceInitiatedShutdownBehavior=terminate, EC2 then terminates it.

Standard library plus `cryptography` (a paramiko dependency) for the keys.
"""

from __future__ import annotations

import dataclasses
import json
import shlex

from ...protocol import ENV_AGENT_ARGS, ENV_AUTHORIZED_KEY, ENV_SESSION_ID, Marker, marker_line

SSH_USER = "gpusession"  # the tunnel's login on the instance (created by cloud-init)
CONTAINER_SSH_PORT = 2222  # the container's sshd, published on the instance's 127.0.0.1
INSTANCE_ROOT = "/var/lib/gpusession"  # one folder per session below it
NOTICES_IN_CONTAINER = "/run/gpusession-notices"  # the instance's notices, read-only in the container
SPOT_NOTICE_FILE = "spot-instance-action.json"
USER_DATA_LIMIT = 16 * 1024  # EC2 refuses more (before base64)


@dataclasses.dataclass(frozen=True)
class HostKey:
    private: str  # OpenSSH private key (PEM text)
    public: str  # "ssh-ed25519 AAAA... comment"


def new_host_key(comment: str) -> HostKey:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    ).decode()
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    return HostKey(private=private, public=f"{public.decode()} {comment}")


@dataclasses.dataclass(frozen=True)
class BootPlan:
    """Everything the instance needs to run one session."""

    session_id: str
    image: str  # pulled by the instance's Docker
    session_key: str  # public key line of the session's own key
    instance_host_key: HostKey  # for the instance's sshd
    container_host_key: HostKey  # for the container's sshd
    agent_args: list[str]  # options of `python -m gpusession.agent run`
    spot: bool  # watch instance metadata for an interruption notice

    @property
    def folder(self) -> str:
        return f"{INSTANCE_ROOT}/{self.session_id}"

    @property
    def container_name(self) -> str:
        return f"gpusession-{self.session_id[:12]}"


def authorized_key_line(plan: BootPlan) -> str:
    """The session key on the instance: only a tunnel to the container's sshd, nothing else."""
    return f'restrict,port-forwarding,permitopen="127.0.0.1:{CONTAINER_SSH_PORT}" {plan.session_key}'


def boot_script(plan: BootPlan) -> str:
    q = shlex.quote
    docker_run = " \\\n    ".join([
        "docker run -d --name \"$NAME\" --init --gpus all",
        f"-p 127.0.0.1:{CONTAINER_SSH_PORT}:22",
        f"--label gpusession.session={q(plan.session_id)}",
        "-v \"$DIR/container-ssh:/etc/gpusession/ssh\"",
        f"-v \"$DIR/notices:{NOTICES_IN_CONTAINER}:ro\"",
        f"-e {ENV_SESSION_ID}={q(plan.session_id)}",
        f"-e {ENV_AUTHORIZED_KEY}={q(plan.session_key)}",
        f"-e {ENV_AGENT_ARGS}={q(shlex.join(plan.agent_args))}",
        f"{q(plan.image)} >/dev/null",
    ])
    spot = "watch_spot &\n    " if plan.spot else ""
    # the container's last words, copied to the console for `stop_details`
    last_words = "|".join(m.value for m in (Marker.STOPPED, Marker.SUMMARY, Marker.FAILED))
    run_failed = marker_line(Marker.FAILED, {"stage": "container", "error": f"docker run {plan.image} failed"})
    return f"""#!/bin/sh
# gpusession session {plan.session_id}: run its container, then power this instance off.
# Written by gpusession's user data and started once by cloud-init.
set -u
DIR={q(plan.folder)}
NAME={q(plan.container_name)}
IMAGE={q(plan.image)}
mkdir -p "$DIR/notices"

say() {{  # to the log and to the serial console (EC2's console output keeps it); printf, as
    # sh's echo would turn a JSON payload's backslash escapes into characters
    printf '%s\\n' "$*"
    if [ -w /dev/console ]; then printf '%s\\n' "$*" >>/dev/console 2>/dev/null || true; fi
}}

watch_spot() {{  # an interruption notice from instance metadata (IMDSv2) goes to $DIR/notices
    imds=${{GPUSESSION_IMDS_URL:-http://169.254.169.254}}
    while :; do
        token=$(curl -fsS -m 2 -X PUT -H 'X-aws-ec2-metadata-token-ttl-seconds: 300' "$imds/latest/api/token" 2>/dev/null) \\
          && curl -fsS -m 2 -H "X-aws-ec2-metadata-token: $token" -o "$DIR/notices/.spot" \\
               "$imds/latest/meta-data/spot/instance-action" 2>/dev/null \\
          && mv "$DIR/notices/.spot" "$DIR/notices/{SPOT_NOTICE_FILE}" \\
          && {{ say "{Marker.SPOT_NOTICE.value} $(cat "$DIR/notices/{SPOT_NOTICE_FILE}")"; return; }}
        sleep 5
    done
}}

for _ in $(seq 90); do docker info >/dev/null 2>&1 && break; sleep 2; done  # dockerd may start after us
docker rm -f "$NAME" >/dev/null 2>&1 || true
say "{Marker.BOOT.value} starting $IMAGE"
if {docker_run}; then
    {spot}say "{Marker.BOOT.value} container started"
    docker wait "$NAME" >/dev/null
    docker logs "$NAME" 2>&1 | grep -E '^({last_words})( |$)' | while read -r line; do say "$line"; done
else
    say {q(run_failed)}
fi
say "{Marker.POWEROFF.value}"
poweroff
"""


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
            {"path": f"{plan.folder}/container-ssh/ssh_host_ed25519_key", "permissions": "0600",
             "content": plan.container_host_key.private},
            {"path": f"{plan.folder}/container-ssh/ssh_host_ed25519_key.pub", "permissions": "0644",
             "content": plan.container_host_key.public + "\n"},
            {"path": script, "permissions": "0700", "content": boot_script(plan)},
        ],
        # in the background: cloud-init's final stage must not wait for the whole session
        "runcmd": [["sh", "-c", f"nohup sh {script} >>/var/log/gpusession-session.log 2>&1 &"]],
    }
    text = "#cloud-config\n" + json.dumps(config, indent=1) + "\n"
    if len(text.encode()) > USER_DATA_LIMIT:
        raise ValueError(f"user data is {len(text.encode())} bytes; EC2 allows {USER_DATA_LIMIT}")
    return text
