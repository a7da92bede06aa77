# Sourced by ci-remote-host.sh and ci-ec2-host.sh: a host with its own address in a network
# namespace, running its own dockerd with the product image. The caller sets NS, HOST_IF, NS_IF,
# HOST_IP, NS_IP, CI_STATE, STATE, RUN, SOCK, IMAGE and NAME (for messages).

# shellcheck source=netns.sh
source "$(dirname "${BASH_SOURCE[0]}")/netns.sh"
ns_docker() { DOCKER_HOST=$SOCK docker "$@"; }
answers() { DOCKER_HOST=$SOCK timeout 5 docker version >/dev/null; }  # a stopped engine takes the connection and never answers

network_up() { netns_link_up "$NS" "$HOST_IF" "$NS_IF" "$NS_IP/24" "$HOST_IP/24"; }
network_down() { netns_link_down "$NS" "$HOST_IF"; }

dockerd_up() {
    # a dockerd starts in ~1 s, but in a CI run's first minutes (every worker's hosts starting and
    # loading images, the Kubernetes build beside) far slower: it is waited for, not started twice
    if alive "$RUN/dockerd.pid"; then  # running; answering, or soon (it may be starting)
        WAIT_FOR_S=90 wait_for dockerd "$STATE/dockerd.log" answers 2>/dev/null && return
        echo "$NAME: dockerd (pid $(cat "$RUN/dockerd.pid")) did not answer in 90 s: started again" >&2
        stop_pidfile "$RUN/dockerd.pid"
    fi
    rm -f "$RUN/dockerd.pid"   # dockerd refuses to start while its pid file names a live process
    # the containerd a killed dockerd started dies with it, but not at once, and a new dockerd
    # waiting on that one gave up ("timeout waiting for containerd to start")
    stop_pidfile "$RUN/exec/containerd/containerd.pid"
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
    WAIT_FOR_S=90 wait_for dockerd "$STATE/dockerd.log" answers
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

explain_failure() {  # on a failed `up`: what the engine said, so that a CI log tells the cause
    local pid
    pid=$(cat "$RUN/dockerd.pid" 2>/dev/null) || pid=
    echo "$NAME: failed; dockerd pid file: ${pid:-none}$( [ -n "$pid" ] && ps -o pid=,lstart=,args= -p "$pid" | sed 's/^/ (/;s/$/)/')" >&2
    echo "$NAME: the last lines of $STATE/dockerd.log:" >&2
    tail -n 15 "$STATE/dockerd.log" >&2 2>/dev/null || true
}
trap explain_failure ERR
set -E   # the ERR trap in functions too

dockerd_down() {
    if alive "$RUN/dockerd.pid"; then
        # Left-over test containers: remove them, or dockerd waits on each.
        ns_docker ps -aq | xargs -r env DOCKER_HOST="$SOCK" docker rm -f >/dev/null
        stop_pidfile "$RUN/dockerd.pid"
    fi
    rm -f "$RUN/dockerd.pid"
}
