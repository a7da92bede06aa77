#!/bin/sh
# Entrypoint of the gpusession container (Dockerfile.cuda). Run under
# docker-init (init=True), which reaps sshd's children.
#   GPUSESSION_AUTHORIZED_KEY  the client's ssh public key line (required)
#   GPUSESSION_SESSION_ID      the session this container belongs to (required)
#   GPUSESSION_AGENT_ARGS      extra arguments for `python -m gpusession.agent run`
# Prints one line `GPUSESSION_HOSTKEY <public host key>` once sshd is started,
# for the client's known_hosts; the kernel and the agent then run in the
# foreground, and the container stops when they exit.
set -eu

: "${GPUSESSION_AUTHORIZED_KEY:?must hold the ssh public key allowed to log in}"
: "${GPUSESSION_SESSION_ID:?must name the session}"
SSH_DIR=/etc/gpusession/ssh

umask 077   # for the keys; reset below
mkdir -p /root/.ssh "$SSH_DIR" /run/sshd
printf '%s\n' "$GPUSESSION_AUTHORIZED_KEY" >/root/.ssh/authorized_keys

# Made per container (the image has none), kept across a restart.
[ -f "$SSH_DIR/ssh_host_ed25519_key" ] \
    || ssh-keygen -q -t ed25519 -N '' -C gpusession -f "$SSH_DIR/ssh_host_ed25519_key"

cat >"$SSH_DIR/sshd_config" <<EOF
Port 22
HostKey $SSH_DIR/ssh_host_ed25519_key
PidFile /run/sshd.pid
AuthorizedKeysFile .ssh/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
AllowTcpForwarding local
AllowAgentForwarding no
AllowStreamLocalForwarding no
X11Forwarding no
PermitTunnel no
PermitUserEnvironment no
PrintMotd no
ClientAliveInterval 15
EOF
/usr/sbin/sshd -f "$SSH_DIR/sshd_config"   # forks into the background
umask 022
echo "GPUSESSION_HOSTKEY $(cat "$SSH_DIR/ssh_host_ed25519_key.pub")"

# GPUSESSION_AGENT_ARGS is shell-quoted by the backend (shlex.join): unquote it the same way.
eval "set -- ${GPUSESSION_AGENT_ARGS:-}"
exec /opt/gpusession/venv/bin/python -m gpusession.agent run \
    --session-id "$GPUSESSION_SESSION_ID" --state-dir /run/gpusession \
    --kernel-ip 127.0.0.1 --kernel-ports 50001 --agent-port 50010 \
    "$@"
