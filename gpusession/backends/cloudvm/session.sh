# The body of an instance's session script (gpusession/backends/cloudvm/cloudinit.py writes the
# header: DIR, NAME, IMAGE, SESSION_ID, SPOT, VOLUME_ID, PULL_LOGIN, WORKSPACE, VOLUME_WAIT_S, RUNTIME_WAIT_S, STATE_DIR, SOCKETS, LOGIN,
# NOTICES, SPOT_FILE, REBALANCE_FILE, AGENT_PORT, RESERVED_PORTS, the marker
# words M_*, the agent's options as "$@", and GPUSESSION_KERNEL_KEY in the environment).
# Run once by cloud-init as root: get the image, look for its Python, wait for the runtime bundle
# that the client sends over SSH (access.sh put), run the session container with it on the
# host's network, and power the instance off when the container ends, for whatever reason.
# Everything the client reads (access.sh status) goes to $DIR/status; the markers also go to the
# serial console, which EC2's console output keeps after the instance is gone.
umask 022   # cloud-init's own, said here: the login (access.sh) reads the status and the pull's log
mkdir -p "$DIR/notices" "$DIR/state" "$DIR/upload" "$DIR/runtime"
chmod 1777 "$DIR/state"     # the runtime writes there as the image's USER, whoever that is
chmod 1733 "$DIR/upload"    # access.sh (the tunnel's login) drops the bundle there
touch "$DIR/status" && chmod 644 "$DIR/status"
# the agent's fixed loopback port out of this machine's ephemeral range (32768-60999 on Linux):
# until the agent listens, the tunnel's connects to it are refused, several a second, each from
# the next ephemeral port; one that gets the agent's port itself connects to itself (TCP's
# simultaneous open), and that socket, then its TIME_WAIT (60 s), holds the port: the agent's
# one bind fails and the client waits out its deadline (a loaded CI run). Best effort.
reserved=$(cat "$RESERVED_PORTS" 2>/dev/null) || reserved=""
case ",$reserved," in
    *",$AGENT_PORT,"*) ;;
    *) printf '%s\n' "${reserved:+$reserved,}$AGENT_PORT" >"$RESERVED_PORTS" 2>/dev/null || true ;;
esac
ROOT=/opt/gpusession-runtime

say() {  # printf, as sh's echo would turn a JSON payload's backslash escapes into characters
    printf '%s\n' "$*"
    printf '%s\n' "$*" >>"$DIR/status"
    if [ -w /dev/console ]; then printf '%s\n' "$*" >>/dev/console 2>/dev/null || true; fi
}

fail() {  # fail STAGE TEXT: the one line the client shows, then the end of this instance
    rm -f "$DIR/upload/.status-read"
    say "$M_FAILED {\"stage\":\"$1\",\"error\":\"$2\"}"
    # a little while for the client to read it (access.sh status leaves .status-read): the
    # console output that keeps it too may come minutes later
    for _ in $(seq 20); do [ -e "$DIR/upload/.status-read" ] && break; sleep 1; done
    say "$M_POWEROFF"
    poweroff
    exit 1
}

watch_spot() {  # interruption notices from instance metadata (IMDSv2) go to $DIR/notices, which
    # the agent watches (its --notice-dir): a rebalance recommendation (the agent saves), then the
    # interruption itself (the agent saves and ends the session), polled every 2 s (AWS: 5 s or less)
    imds=${GPUSESSION_IMDS_URL:-http://169.254.169.254}
    while :; do
        token=$(curl -fsS -m 2 -X PUT -H 'X-aws-ec2-metadata-token-ttl-seconds: 300' "$imds/latest/api/token" 2>/dev/null) \
          || { sleep 2; continue; }
        if [ ! -e "$DIR/notices/$REBALANCE_FILE" ] \
          && curl -fsS -m 2 -H "X-aws-ec2-metadata-token: $token" -o "$DIR/notices/.rebalance" \
               "$imds/latest/meta-data/events/recommendations/rebalance" 2>/dev/null; then
            chmod 644 "$DIR/notices/.rebalance" && mv "$DIR/notices/.rebalance" "$DIR/notices/$REBALANCE_FILE"
        fi
        curl -fsS -m 2 -H "X-aws-ec2-metadata-token: $token" -o "$DIR/notices/.spot" \
               "$imds/latest/meta-data/spot/instance-action" 2>/dev/null \
          && chmod 644 "$DIR/notices/.spot" && mv "$DIR/notices/.spot" "$DIR/notices/$SPOT_FILE" \
          && { say "$M_SPOT_NOTICE $(cat "$DIR/notices/$SPOT_FILE")"; return; }
        sleep 2
    done
}

login_wait() {  # the registry login (the Engine API's X-Registry-Auth value), which the client
    # sends over its SSH login (access.sh login) into a FIFO: read into this shell's memory, never
    # written to a disk, a log, the environment or a command line here
    AUTH=""
    [ "$PULL_LOGIN" = 1 ] || return 0
    pipe="$DIR/login.pipe"
    rm -f "$pipe"
    { mkfifo -m 0620 "$pipe" && chgrp "$(id -g "$LOGIN")" "$pipe"; } || fail login "cannot make $pipe"
    say "$M_BOOT waiting for the registry login"
    AUTH=$(timeout "$RUNTIME_WAIT_S" cat "$pipe")
    rm -f "$pipe"
    [ -n "$AUTH" ] || fail login "no registry login arrived within ${RUNTIME_WAIT_S}s"
}

pull() {  # through the Engine API, whose JSON lines (bytes and layers) access.sh passes on; the
    # login goes on curl's standard input (printf is the shell's own: no process shows it); the
    # CLI as a fallback, for registries that need its credential helpers, when no login came
    sock=${DOCKER_HOST:-unix:///var/run/docker.sock}
    if [ -n "$AUTH" ]; then
        printf 'X-Registry-Auth: %s\n' "$AUTH" | curl -sS -X POST -H @- --unix-socket "${sock#unix://}" \
            -o "$DIR/pull.log" "http://localhost/images/create?fromImage=$IMAGE" 2>/dev/null
        AUTH=""
        return
    fi
    curl -sS -X POST --unix-socket "${sock#unix://}" -o "$DIR/pull.log" \
        "http://localhost/images/create?fromImage=$IMAGE" 2>/dev/null
    docker image inspect "$IMAGE" >/dev/null 2>&1 || docker pull -q "$IMAGE" >>"$DIR/pull.log" 2>&1
}

workspace() {  # the attached EBS volume (NVMe on Nitro: by-id has its id), ext4 made only when blank,
    # as the Docker volume $WSVOL for $WORKSPACE, owned by the image's USER
    WSVOL=""
    [ -n "$VOLUME_ID" ] || return 0
    by_id=${GPUSESSION_DISKS_DIR:-/dev/disk/by-id}/nvme-Amazon_Elastic_Block_Store_$(printf '%s' "$VOLUME_ID" | tr -d -)
    say "$M_BOOT waiting for the workspace volume $VOLUME_ID"
    waited=0 dev=""
    until [ -n "$dev" ]; do
        for d in "$by_id" /dev/xvdf /dev/sdf; do [ -b "$d" ] && dev=$(readlink -f "$d") && break; done
        [ -z "$dev" ] && [ "$waited" -ge "$VOLUME_WAIT_S" ] && fail workspace "volume $VOLUME_ID was not attached within ${VOLUME_WAIT_S}s"
        [ -z "$dev" ] && sleep 1 && waited=$((waited + 1))
    done
    fs=$(blkid -o value -s TYPE "$dev")
    if [ -z "$fs" ]; then
        say "$M_BOOT new workspace volume: making its filesystem"
        mkfs.ext4 -q "$dev" || fail workspace "cannot make a filesystem on $VOLUME_ID"
        fs=ext4
    fi
    WSVOL="gpusession-ws-$SESSION_ID"
    docker volume create --opt "type=$fs" --opt "device=$dev" --label "gpusession.session=$SESSION_ID" "$WSVOL" >/dev/null \
        || fail workspace "cannot use $VOLUME_ID ($dev)"
    u=$(docker image inspect -f '{{.Config.User}}' "$IMAGE")
    u=${u%%:*}
    case "$u" in ""|0|root) ;; *) docker run --rm --network none --user 0:0 -v "$WSVOL:$WORKSPACE" --entrypoint /bin/sh \
        "$IMAGE" -c "chown \$(id -u $u):\$(id -g $u) $WORKSPACE" >/dev/null 2>&1 || fail workspace "cannot give the workspace to $u" ;; esac
    say "$M_BOOT workspace volume $VOLUME_ID ready"
}

export_one() {  # export_one ID: the workspace of the running container read out through the
    # engine's archive API (entries workspace/..., owners and modes kept): first its size (the
    # stream's bytes) in $DIR/export-ID.size, then the stream into the FIFO $DIR/export-ID.pipe,
    # which only the login's group reads (access.sh export passes it on), then docker's exit
    # status in $DIR/export-ID.rc; nothing is written to a disk on the way
    out="$DIR/export-$1"
    size=$(docker cp "$NAME:$WORKSPACE" - 2>/dev/null | wc -c)
    { mkfifo -m 0640 "$out.pipe" && chgrp "$gid" "$out.pipe"; } || { echo 1 >"$out.rc"; return; }
    printf '%s\n' "$size" >"$out.size"
    docker cp "$NAME:$WORKSPACE" - 2>"$out.err" >"$out.pipe"
    echo "$?" >"$out.rc"
    rm -f "$out.pipe" "$out.size"
}

serve_exports() {  # while the container runs: each request access.sh export drops (upload/export-ID)
    while sleep 0.5; do
        for request in "$DIR"/upload/export-*; do
            [ -f "$request" ] || continue
            id=${request##*/export-}
            rm -f "$request"
            case "$id" in ""|*[!0-9]*) continue ;; esac
            export_one "$id" &
        done
    done
}

import_files() {  # IMPORT=1 (a switch to this instance): the workspace's files from the client, a
    # tar stream of entries workspace/... through the FIFO $DIR/import.pipe (access.sh import),
    # unpacked by the engine's archive API into the volume's $STAGE folder (nothing else on a
    # disk) and put in place, replacing what the volume held, only when the stream's hash is what
    # the client says it sent (access.sh import-end): a cut stream leaves the volume as it was
    [ "$IMPORT" = 1 ] && [ -n "$WSVOL" ] || return 0
    pipe="$DIR/import.pipe" sum="$DIR/import.sum" stage=/ws/.gpusession-import
    rm -f "$pipe" "$sum" "$sum.pipe" "$DIR/import.result" "$DIR/upload/import-end"
    docker run --rm --network none --user 0:0 -v "$WSVOL:/ws" --entrypoint /bin/sh "$IMAGE" \
        -c "rm -rf $stage && mkdir $stage" >/dev/null 2>&1 || fail workspace "cannot prepare the workspace volume for its files"
    { mkfifo -m 0620 "$pipe" && chgrp "$gid" "$pipe" && mkfifo -m 0600 "$sum.pipe"; } || fail workspace "cannot make $pipe"
    owner=""
    case "${u:-}" in ""|0|root) ;; *) owner="chown -R \$(id -u $u):\$(id -g $u) /ws" ;; esac
    place="cd /ws && for f in * .[!.]* ..?*; do if [ \"\$f\" != .gpusession-import ] && { [ -e \"\$f\" ] || [ -L \"\$f\" ]; }; then rm -rf \"\$f\" || exit 1; fi; done
        cd $stage/workspace && for f in * .[!.]* ..?*; do if [ -e \"\$f\" ] || [ -L \"\$f\" ]; then mv \"\$f\" /ws/ || exit 1; fi; done
        cd / && rm -rf $stage ${owner:+&& $owner}"
    helper=$(docker create --network none --user 0:0 -v "$WSVOL:/ws" --label "gpusession.session=$SESSION_ID" \
        --entrypoint /bin/sh "$IMAGE" -c "$place") || fail workspace "cannot make a helper container for the workspace's files"
    say "$M_BOOT waiting for the workspace's files"
    sha256sum <"$sum.pipe" >"$sum" &
    hasher=$!
    timeout "$RUNTIME_WAIT_S" cat "$pipe" | tee "$sum.pipe" | docker cp - "$helper:$stage" 2>"$DIR/import.err"
    copied=$?
    wait "$hasher"
    got=$(cut -d' ' -f1 "$sum" 2>/dev/null)
    for _ in $(seq 300); do [ -f "$DIR/upload/import-end" ] && break; sleep 0.2; done
    want=$(cat "$DIR/upload/import-end" 2>/dev/null)
    if [ "$copied" = 0 ] && [ -n "$want" ] && [ "$want" = "$got" ]; then
        if docker start -a "$helper" >>"$DIR/import.err" 2>&1; then
            docker rm -f "$helper" >/dev/null 2>&1
            echo placed >"$DIR/import.result"
            say "$M_BOOT workspace files in place"
            return 0
        fi
        why="the workspace's files could not be put in place: $(tail -c 200 "$DIR/import.err" | tr -d '"\\\n')"
    elif [ -z "$want" ]; then
        why="the workspace's files arrived cut (their end was never said); nothing of them was kept"
    elif [ "$want" = 0 ]; then
        why="the client stopped sending the workspace's files; nothing of them was kept"
    elif [ "$copied" != 0 ]; then
        why="the workspace's files could not be unpacked: $(tail -c 200 "$DIR/import.err" | tr -d '"\\\n')"
    else
        why="the workspace's files arrived cut (not what was sent); nothing of them was kept"
    fi
    docker rm -f "$helper" >/dev/null 2>&1
    docker run --rm --network none --user 0:0 -v "$WSVOL:/ws" --entrypoint /bin/sh "$IMAGE" -c "rm -rf $stage" >/dev/null 2>&1
    printf '%s\n' "$why" >"$DIR/import.result"
    fail workspace "$why"
}

for _ in $(seq 90); do docker info >/dev/null 2>&1 && break; sleep 2; done  # dockerd may start after us
docker rm -f "$NAME" >/dev/null 2>&1 || true
[ "$SPOT" = 1 ] && watch_spot &
say "$M_BOOT starting $IMAGE"
if ! docker image inspect "$IMAGE" >/dev/null 2>&1; then
    login_wait
    say "$M_BOOT pulling $IMAGE"
    pull
    detail=$(tail -c 300 "$DIR/pull.log" 2>/dev/null | tr -d '"\\\n')
    docker image inspect "$IMAGE" >/dev/null 2>&1 || fail image "cannot pull $IMAGE${detail:+: $detail}"
fi

# what Python the image has (the bundle's boot.sh, run without the bundle)
probe=$(docker run --rm --network none --entrypoint /bin/sh "$IMAGE" -c "$(cat "$DIR/boot.sh")" boot.sh probe 2>&1)
python=$(printf '%s\n' "$probe" | grep "^$M_PYTHON " | head -n 1)
if [ -z "$python" ]; then
    why=$(printf '%s\n' "$probe" | sed -n "s/^$M_FAILED .*\"error\":\"\([^\"]*\)\".*/\1/p" | head -n 1)
    fail python "image $IMAGE has no Python to run the session kernel in (${why:-no python3}): use an image with python3 3.9 or newer"
fi
say "$python"

# the runtime bundle from the client: site.tgz (when the image lacks ipykernel or pip), then code.tgz
say "$M_BOOT waiting for the runtime"
waited=0
until [ -f "$DIR/upload/code.tgz" ]; do
    [ "$waited" -ge "$RUNTIME_WAIT_S" ] && fail runtime "no runtime bundle arrived within ${RUNTIME_WAIT_S}s"
    sleep 1
    waited=$((waited + 1))
done
for part in site code; do
    [ -f "$DIR/upload/$part.tgz" ] || continue
    mkdir -p "$DIR/runtime/$part"
    tar -xzf "$DIR/upload/$part.tgz" -C "$DIR/runtime/$part" --no-same-owner || fail runtime "cannot unpack $part.tgz"
    : >"$DIR/runtime/$part/.complete"   # what boot.sh looks for: the copy is whole
    rm -f "$DIR/upload/$part.tgz"
done
say "$M_BOOT runtime received"
mounts="-v $DIR/runtime/code:$ROOT/code:ro"
if [ -d "$DIR/runtime/site" ]; then
    mounts="$mounts -v $DIR/runtime/site:$ROOT/site:ro"
    executable=$(printf '%s\n' "$python" | sed -n 's/.*"executable":"\([^"]*\)".*/\1/p')
    tag=$(printf '%s\n' "$python" | sed -n 's/.*"version": *[[] *\([0-9]*\), *\([0-9]*\).*/cp\1\2/p')
    # bytecode by the image's own Python, unless the client compiled it ahead for this version:
    # best effort, the session works without
    if [ -z "$tag" ] || [ "$(cat "$DIR/runtime/site/.bytecode" 2>/dev/null)" != "$tag" ]; then
        docker run --rm --network none --user 0:0 -v "$DIR/runtime/site:$ROOT/site" --entrypoint "$executable" "$IMAGE" \
            -m compileall -q -j 0 "$ROOT/site" >/dev/null 2>&1 || true
    fi
fi

workspace   # the workspace's volume, as the Docker volume $WSVOL (none without VOLUME_ID)
gid=$(id -g "$LOGIN") || fail container "no user $LOGIN on this instance"
import_files   # a switch to this instance: the workspace's files from the client
[ -n "$WSVOL" ] && mounts="$mounts -v $WSVOL:$WORKSPACE"

command=$(printf '%s\n' "$python" | sed -n 's/.*"command":"\([^"]*\)".*/\1/p')
# the kernel on unix sockets in a folder of the tunnel login's own group (setgid 2770), which the
# container's user gets too, whoever the image's USER is: no other user of the instance reaches
# them, as any would a loopback port
gid=$(id -g "$LOGIN") || fail container "no user $LOGIN on this instance"
{ mkdir -p "$SOCKETS" && chgrp "$gid" "$SOCKETS" && chmod 2770 "$SOCKETS"; } || fail container "cannot make $SOCKETS"
# $mounts is split on purpose: paths under $DIR hold no spaces
# shellcheck disable=SC2086
if docker run -d --name "$NAME" --init --gpus all --network host --label "gpusession.session=$SESSION_ID" \
        $mounts -v "$DIR/state:$STATE_DIR" -v "$DIR/notices:$NOTICES:ro" \
        -v "$SOCKETS:$SOCKETS" --group-add "$gid" \
        -e "GPUSESSION_SESSION_ID=$SESSION_ID" -e GPUSESSION_KERNEL_KEY -e "GPUSESSION_RUNTIME_PYTHON=$command" \
        --entrypoint /bin/sh "$IMAGE" "$ROOT/code/boot.sh" run "$@" >/dev/null; then
    say "$M_BOOT container started"
    serve_exports &
    exports=$!
    docker wait "$NAME" >/dev/null
    kill "$exports" 2>/dev/null
    rm -f "$DIR/upload/.status-read"
    # the container's last words, copied to the console for `stop_details`
    docker logs "$NAME" 2>&1 | grep -E "^($M_CHECKPOINT|$M_STOPPED|$M_SUMMARY|$M_FAILED)( |\$)" | while read -r line; do say "$line"; done
    # after a spot notice the session's client asks for them as soon as it sees the kernel gone
    # (last_words): until it has read them, within the notice's two minutes, the instance stays
    if [ -e "$DIR/notices/$SPOT_FILE" ]; then
        for _ in $(seq 100); do [ -e "$DIR/upload/.status-read" ] && break; sleep 1; done
    fi
else
    say "$M_FAILED {\"stage\":\"container\",\"error\":\"docker run $IMAGE failed\"}"
fi
say "$M_POWEROFF"
poweroff
