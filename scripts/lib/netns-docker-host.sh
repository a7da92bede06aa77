# Sourced by ci-remote-host.sh and ci-ec2-host.sh: a host with its own address in a network
# namespace, running its own dockerd with the product image. The caller sets NS, HOST_IF, NS_IF,
# HOST_IP, NS_IP, CI_STATE, STATE, RUN, SOCK, IMAGE and NAME (for messages).

alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
ns_docker() { DOCKER_HOST=$SOCK docker "$@"; }

wait_for() {  # wait_for WHAT LOG COMMAND...: retry COMMAND for 30 s
    local what=$1 log=$2; shift 2
    for _ in $(seq 60); do "$@" >/dev/null 2>&1 && return; sleep 0.5; done
    tail -n 20 "$log" >&2
    echo "$NAME: $what did not come up (log: $log)" >&2
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

network_down() {
    # Deleting one end of a veth pair deletes the other.
    ! ip link show "$HOST_IF" >/dev/null 2>&1 || ip link del "$HOST_IF"
    [ ! -e "/run/netns/$NS" ] || ip netns del "$NS"
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
    wait_for dockerd "$STATE/dockerd.log" ns_docker info
}

image_up() {  # the product image and the foreign ones (ci-images.sh), reloaded when the main engine's copy changed
    local image want stale=()
    for image in "$IMAGE" $(bash "$(dirname "${BASH_SOURCE[0]}")/../ci-images.sh" list); do
        want=$(docker image inspect -f '{{.Id}}' "$image" 2>/dev/null) || continue
        [ "$(ns_docker image inspect -f '{{.Id}}' "$image" 2>/dev/null)" = "$want" ] || stale+=("$image")
    done
    [ ${#stale[@]} -gt 0 ] || return 0
    docker save "${stale[@]}" | ns_docker load -q >/dev/null   # one stream: shared layers go once
    ns_docker image prune -f >/dev/null   # the replaced versions, now untagged
}

stop_pidfile() {  # SIGTERM the daemon of a pid file, wait up to 30 s for it to exit
    alive "$1" || { rm -f "$1"; return 0; }
    local pid
    pid=$(cat "$1")
    kill "$pid"
    for _ in $(seq 60); do kill -0 "$pid" 2>/dev/null || { rm -f "$1"; return 0; }; sleep 0.5; done
    echo "$NAME: pid $pid ($1) did not exit" >&2
    return 1
}

dockerd_down() {
    if alive "$RUN/dockerd.pid"; then
        # Left-over test containers: remove them, or dockerd waits on each.
        ns_docker ps -aq | xargs -r env DOCKER_HOST="$SOCK" docker rm -f >/dev/null
        stop_pidfile "$RUN/dockerd.pid"
    fi
    rm -f "$RUN/dockerd.pid"
}
