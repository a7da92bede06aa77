#!/usr/bin/env bash
# The network side of the aws backend's test instances, on this machine: network namespace
# gpus-ec2 (10.201.0.2 inside, 10.201.0.1 on this side) with its own dockerd. The tests'
# fake platform (tests/support/ec2_platform.py) plays each EC2 instance there: it reads the
# instance's user data from the local EC2 API, starts an sshd at 10.201.0.2 with the host key
# and logins the user data gives, and runs the user data's commands against this dockerd.
#   scripts/ci-ec2-host.sh up     start it (idempotent); needs scripts/ci-host-setup.sh first
#   scripts/ci-ec2-host.sh down   stop dockerd, remove the namespace
set -euo pipefail

NS=gpus-ec2
HOST_IF=gpus-ec2-h NS_IF=gpus-ec2-n
HOST_IP=10.201.0.1 NS_IP=10.201.0.2
CI_STATE=${GPUSESSION_CI_STATE:-/var/lib/gpusession-ci}
STATE=$CI_STATE/ec2               # kept by `down`: the image store
RUN=/run/gpus-ec2                 # socket and pid file
SOCK=unix://$RUN/docker.sock
IMAGE=${GPUSESSION_TEST_IMAGE:-gpusession/cuda:ci}

alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
ns_docker() { DOCKER_HOST=$SOCK docker "$@"; }

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
    # the stub NVIDIA hook (ci-host-setup.sh), so that `docker run --gpus all` works without a GPU
    [ -x "$CI_STATE/bin/nvidia-container-runtime-hook" ] && path=$CI_STATE/bin:$PATH
    # Only the network namespace (`ip netns exec` would remount /sys and hide the cgroups).
    PATH=$path setsid -f nsenter --net="/run/netns/$NS" dockerd \
        --data-root "$STATE/docker" --exec-root "$RUN/exec" --pidfile "$RUN/dockerd.pid" \
        -H "$SOCK" --containerd-namespace "$NS" --containerd-plugins-namespace "$NS-plugins" \
        --cgroup-parent "/$NS" >>"$STATE/dockerd.log" 2>&1 </dev/null
    for _ in $(seq 60); do ns_docker info >/dev/null 2>&1 && return; sleep 0.5; done
    tail -n 20 "$STATE/dockerd.log" >&2
    echo "ci-ec2-host: dockerd did not come up (log: $STATE/dockerd.log)" >&2
    return 1
}

image_up() {
    local want
    want=$(docker image inspect -f '{{.Id}}' "$IMAGE")
    [ "$(ns_docker image inspect -f '{{.Id}}' "$IMAGE" 2>/dev/null)" = "$want" ] && return
    docker save "$IMAGE" | ns_docker load -q
    ns_docker image prune -f >/dev/null
}

up() {
    mkdir -p "$STATE" "$RUN" /run/sshd
    # the boot script's spot-notice poller uses curl, as on the real images
    command -v curl >/dev/null \
        || apt-get -o DPkg::Lock::Timeout=600 -q install -y --no-install-recommends curl >/dev/null \
        || { echo "ci-ec2-host: needs curl (apt-get install curl)" >&2; exit 1; }
    docker image inspect "$IMAGE" >/dev/null 2>&1 \
        || { echo "ci-ec2-host: no $IMAGE here; run scripts/ci-host-setup.sh first" >&2; exit 1; }
    network_up
    dockerd_up
    image_up
    echo "ci-ec2-host: up: instances at $NS_IP (this side $HOST_IP), DOCKER_HOST=$SOCK"
}

down() {
    if alive "$RUN/dockerd.pid"; then
        ns_docker ps -aq | xargs -r env DOCKER_HOST="$SOCK" docker rm -f >/dev/null
        local pid
        pid=$(cat "$RUN/dockerd.pid")
        kill "$pid"
        for _ in $(seq 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    fi
    rm -f "$RUN/dockerd.pid"
    ! ip link show "$HOST_IF" >/dev/null 2>&1 || ip link del "$HOST_IF"
    [ ! -e "/run/netns/$NS" ] || ip netns del "$NS"
    echo "ci-ec2-host: down"
}

case "${1:-}" in
    up) up ;;
    down) down ;;
    *) echo "usage: $0 up|down" >&2; exit 2 ;;
esac
