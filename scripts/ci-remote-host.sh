#!/usr/bin/env bash
# A second "remote" Docker host for the ssh:// tests, on this machine:
# network namespace gpus-remote at 10.200.0.2 (this side 10.200.0.1), with its
# own dockerd and an sshd whose sessions talk to that dockerd.
#   scripts/ci-remote-host.sh up     start it (idempotent); needs ci-host-setup.sh first
#   scripts/ci-remote-host.sh down   stop both daemons, remove the namespace
# Client files, in $STATE (default /var/lib/gpusession-ci/remote):
#   id_ed25519 (key for root@10.200.0.2), known_hosts, ssh_config
set -euo pipefail

NS=gpus-remote
HOST_IF=gpus-veth0 NS_IF=gpus-veth1
HOST_IP=10.200.0.1 NS_IP=10.200.0.2
CI_STATE=${GPUSESSION_CI_STATE:-/var/lib/gpusession-ci}
STATE=$CI_STATE/remote            # kept by `down`: keys, image store
RUN=/run/gpus-remote              # sockets and pid files
SOCK=unix://$RUN/docker.sock
IMAGE=${GPUSESSION_TEST_IMAGE:-gpusession/cuda:ci}

alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
remote_docker() { DOCKER_HOST=$SOCK docker "$@"; }

wait_for() {  # wait_for WHAT LOG COMMAND...: retry COMMAND for 30 s
    local what=$1 log=$2; shift 2
    for _ in $(seq 60); do "$@" >/dev/null 2>&1 && return; sleep 0.5; done
    tail -n 20 "$log" >&2
    echo "ci-remote-host: $what did not come up (log: $log)" >&2
    return 1
}

network_up() {
    [ -e "/run/netns/$NS" ] || ip netns add "$NS"
    if ! ip link show "$HOST_IF" >/dev/null 2>&1; then
        ip link add "$HOST_IF" type veth peer name "$NS_IF" netns "$NS"
        ip addr add "$HOST_IP/24" dev "$HOST_IF"
        ip link set "$HOST_IF" up
        ip -n "$NS" addr add "$NS_IP/24" dev "$NS_IF"
        ip -n "$NS" link set "$NS_IF" up
        ip -n "$NS" link set lo up
    fi
}

dockerd_up() {
    alive "$RUN/dockerd.pid" && return
    local path=$PATH
    # The stub NVIDIA hook, as for the main engine (see ci-host-setup.sh).
    [ -x "$CI_STATE/bin/nvidia-container-runtime-hook" ] && path=$CI_STATE/bin:$PATH
    # Not `ip netns exec`: it remounts /sys, which hides /sys/fs/cgroup from
    # dockerd ("Devices cgroup isn't mounted"); entering only the network
    # namespace works. Own roots and containerd namespaces, so that neither
    # engine ever sees the other's containers, even via a system containerd.
    PATH=$path setsid -f nsenter --net="/run/netns/$NS" dockerd \
        --data-root "$STATE/docker" --exec-root "$RUN/exec" --pidfile "$RUN/dockerd.pid" \
        -H "$SOCK" --containerd-namespace "$NS" --containerd-plugins-namespace "$NS-plugins" \
        --cgroup-parent "/$NS" >>"$STATE/dockerd.log" 2>&1 </dev/null
    wait_for dockerd "$STATE/dockerd.log" remote_docker info
}

image_up() {
    local want
    want=$(docker image inspect -f '{{.Id}}' "$IMAGE")
    [ "$(remote_docker image inspect -f '{{.Id}}' "$IMAGE" 2>/dev/null)" = "$want" ] && return
    docker save "$IMAGE" | remote_docker load -q
    remote_docker image prune -f >/dev/null   # the replaced version, now untagged
}

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
    # ssh:// Docker clients use) talks to this namespace's dockerd.
    cat >"$STATE/sshd_config" <<EOF
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
SetEnv DOCKER_HOST=$SOCK
EOF
}

sshd_up() {
    alive "$RUN/sshd.pid" && return
    mkdir -p /run/sshd
    setsid -f nsenter --net="/run/netns/$NS" /usr/sbin/sshd -D -e -f "$STATE/sshd_config" \
        >>"$STATE/sshd.log" 2>&1 </dev/null
    wait_for sshd "$STATE/sshd.log" ssh -F "$STATE/ssh_config" -o BatchMode=yes \
        -o ConnectTimeout=2 "$NS_IP" docker version
}

stop_pidfile() {  # SIGTERM the daemon of a pid file, wait up to 30 s for it to exit
    alive "$1" || { rm -f "$1"; return 0; }
    local pid
    pid=$(cat "$1")
    kill "$pid"
    for _ in $(seq 60); do kill -0 "$pid" 2>/dev/null || { rm -f "$1"; return 0; }; sleep 0.5; done
    echo "ci-remote-host: pid $pid ($1) did not exit" >&2
    return 1
}

up() {
    mkdir -p "$STATE" "$RUN"
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
    if alive "$RUN/dockerd.pid"; then
        # Left-over test containers: remove them, or dockerd waits on each.
        remote_docker ps -aq | xargs -r env DOCKER_HOST="$SOCK" docker rm -f >/dev/null
        stop_pidfile "$RUN/dockerd.pid"
    fi
    # Deleting one end of a veth pair deletes the other.
    ! ip link show "$HOST_IF" >/dev/null 2>&1 || ip link del "$HOST_IF"
    [ ! -e "/run/netns/$NS" ] || ip netns del "$NS"
    echo "ci-remote-host: down"
}

case "${1:-}" in
    up) up ;;
    down) down ;;
    *) echo "usage: $0 up|down" >&2; exit 2 ;;
esac
