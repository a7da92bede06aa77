#!/usr/bin/env bash
# A second "remote" Docker host for the ssh:// tests, on this machine:
# network namespace gpus-remote at 10.200.0.2 (this side 10.200.0.1), with its
# own dockerd and an sshd whose sessions talk to that dockerd.
#   scripts/ci-remote-host.sh up     start it (idempotent); needs ci-host-setup.sh first
#   scripts/ci-remote-host.sh down   stop both daemons, remove the namespace
# Client files, in $STATE (default /var/lib/gpusession-ci/remote):
#   id_ed25519 (key for root@10.200.0.2), known_hosts, ssh_config
# GPUSESSION_TEST_SLOT=N (N > 0; a pytest-xdist worker's number, tests/support/slots.py) makes
# host N of its own: gpus-remote-N at 10.200.N.2, its own state, keys and engine.
set -euo pipefail

SLOT=${GPUSESSION_TEST_SLOT:-0}
CI_STATE=${GPUSESSION_CI_STATE:-/var/lib/gpusession-ci}
if [ "$SLOT" = 0 ]; then
    NS=gpus-remote HOST_IF=gpus-veth0 NS_IF=gpus-veth1
    STATE=$CI_STATE/remote        # kept by `down`: keys, image store
    RUN=/run/gpus-remote          # sockets and pid files
else
    NS=gpus-remote-$SLOT HOST_IF=gpus-r$SLOT-h NS_IF=gpus-r$SLOT-n
    STATE=$CI_STATE/remote-$SLOT RUN=/run/gpus-remote-$SLOT
fi
HOST_IP=10.200.$SLOT.1 NS_IP=10.200.$SLOT.2
SOCK=unix://$RUN/docker.sock
IMAGE=${GPUSESSION_TEST_IMAGE:-gpusession/cuda:ci}

NAME=ci-remote-host
# shellcheck source=lib/netns-docker-host.sh
source "$(dirname "$0")/lib/netns-docker-host.sh"

keys_up() {
    [ -f "$STATE/host_ed25519_key" ] || ssh-keygen -q -t ed25519 -N '' -C "$NS-host" -f "$STATE/host_ed25519_key"
    [ -f "$STATE/id_ed25519" ] || ssh-keygen -q -t ed25519 -N '' -C "$NS-client" -f "$STATE/id_ed25519"
    cp "$STATE/id_ed25519.pub" "$STATE/authorized_keys"
    echo "$NS_IP $(cut -d' ' -f1,2 "$STATE/host_ed25519_key.pub")" >"$STATE/known_hosts"
    # For an OpenSSH client (ssh -F) and for paramiko-based code such as
    # docker-py, which reads ~/.ssh/config (tests/support/hosts.py).
    cat >"$STATE/ssh_config" <<EOF
Host $NS_IP
    User root
    IdentityFile $STATE/id_ed25519
    UserKnownHostsFile $STATE/known_hosts
    StrictHostKeyChecking yes
    IdentitiesOnly yes
EOF
    # SetEnv: a `docker` run over this ssh (docker system dial-stdio, which
    # ssh:// Docker clients use) talks to this namespace's dockerd; and HOME is
    # a home of this host's own, as on a real GPU box: root's home here is this
    # machine's, whose .bashrc runs pyenv (0.2 s per login, and a lock that a
    # login killed mid-rehash leaves behind made every later login wait 2-60 s).
    mkdir -p "$STATE/home"
    cat >"$STATE/sshd_config.new" <<EOF
ListenAddress $NS_IP
Port 22
HostKey $STATE/host_ed25519_key
PidFile $RUN/sshd.pid
AuthorizedKeysFile $STATE/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
AllowTcpForwarding yes
PrintMotd no
SetEnv DOCKER_HOST=$SOCK HOME=$STATE/home
EOF
    install_config "$STATE/sshd_config" "$RUN/sshd.pid"
}

sshd_up() {
    # its pid alive is not enough: a pid file can outlive its sshd and name another process
    alive "$RUN/sshd.pid" && nsenter --net="/run/netns/$NS" ss -Hltn 'sport = :22' | grep -q . && return
    stop_pidfile "$RUN/sshd.pid"
    mkdir -p /run/sshd
    setsid -f nsenter --net="/run/netns/$NS" /usr/sbin/sshd -D -e -f "$STATE/sshd_config" \
        >>"$STATE/sshd.log" 2>&1 </dev/null
    wait_for sshd "$STATE/sshd.log" ssh -F "$STATE/ssh_config" -o BatchMode=yes \
        -o ConnectTimeout=2 "$NS_IP" docker version
}

up() {
    mkdir -p "$STATE" "$RUN"
    # a stand-in GPU reading (gpusession/backends/docker/gpus.py RECORDING) is a test's own, written
    # after this `up` and removed at its end: one a killed run left would give every later test
    # on this host an 8-GPU box (a notebook test read NVIDIA_VISIBLE_DEVICES=2, not "all")
    rm -f "$STATE/home/.gpusession/box-nvml.json"
    docker image inspect "$IMAGE" >/dev/null 2>&1 \
        || { echo "ci-remote-host: no $IMAGE here; run scripts/ci-host-setup.sh first" >&2; exit 1; }
    network_up
    dockerd_up
    image_up
    keys_up
    sshd_up
    echo "ci-remote-host: up: ssh://root@$NS_IP (ssh -F $STATE/ssh_config $NS_IP), DOCKER_HOST=$SOCK"
}

down() {
    stop_pidfile "$RUN/sshd.pid"
    dockerd_down
    network_down
    echo "ci-remote-host: down"
}

case "${1:-}" in
    up) up ;;
    down) down ;;
    *) echo "usage: $0 up|down" >&2; exit 2 ;;
esac
