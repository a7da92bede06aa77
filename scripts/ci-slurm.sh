#!/usr/bin/env bash
# A real Slurm cluster on this machine for the slurm backend's tests (docs/slurm.md):
#   controller  slurmctld + munged on this machine, at 10.210.0.1 on bridge gpus-slurm
#   login       network namespace gsl-login at 10.210.0.10: sshd (sbatch, squeue... work there)
#   n1, n2      network namespaces gsl-n1 (10.210.0.11) and gsl-n2 (10.210.0.12), each its own
#               slurmd (NodeName n1 / n2) and sshd, in a mount namespace whose /etc/ssh is the
#               node's own (so a job reads its node's host key where a real node keeps it)
# GPUs without GPUs: GRES from plain files (gres.conf AutoDetect=off): n1 has gpu:t4:2, n2 has
# gpu:a100_40g:1 (a cluster's own type name, mapped from the catalog's a100 by --gres-type) and
# two MIG slices of an A100 80GB, gpu:1g.10gb:2 (Slurm names a MIG type by its profile). A real
# node's slurmd finds slices with AutoDetect=nvml and gives a job its slice's MIG UUID in
# CUDA_VISIBLE_DEVICES; here a TaskProlog stands in for that: it turns a slice's index into the
# UUID of a slice of tests/data/nvml_a100_mig.json (the recording the MIG test's agent replays).
# Every node shares this machine's filesystem, as cluster nodes share home and software.
# Partitions: gpu (the default) and urgent, whose jobs preempt gpu's after a GraceTime in which
# Slurm sends the preempted job its --signal (preempt_send_user_signal; docs/slurm.md).
# Containers: Charliecloud (ch-run, ch-image) on every node, and the site's registry at
# https://10.210.0.1:5443 (Debian's docker-registry, TLS from the cluster's own CA, htpasswd
# user ci with the password in $STATE/registry/password); the cluster's logins trust that CA
# (REQUESTS_CA_BUNDLE, which ch-image reads), as a site's machines trust its registry.
#   scripts/ci-slurm.sh up      start it (idempotent, ~2 s when up; as root); prints the setup time
#   scripts/ci-slurm.sh down    stop every daemon, remove the namespaces and the bridge
#   scripts/ci-slurm.sh status  exit 0 when it is up
# Client files, in $STATE (default /var/lib/gpusession-ci/slurm):
#   id_ed25519 (key for root@10.210.0.10 and the nodes), known_hosts (the login node only),
#   ssh_config, slurm.conf (SLURM_CONF for scontrol/squeue run here)
set -euo pipefail

CI_STATE=${GPUSESSION_CI_STATE:-/var/lib/gpusession-ci}
STATE=$CI_STATE/slurm
RUN=/run/gpus-slurm
BRIDGE=gpus-slurm
CTL_IP=10.210.0.1
LOGIN_IP=10.210.0.10
NODES=(n1 n2)
declare -A NODE_IP=([n1]=10.210.0.11 [n2]=10.210.0.12)
declare -A NODE_GPUS=([n1]="t4 2" [n2]="a100_40g 1 1g.10gb 2")   # GRES type and count, in index order
declare -A NODE_MIG=([n2]="1=MIG-5f0e1d2c-3b4a-5968-7a8b-9c0d1e2f3a42 2=MIG-5f0e1d2c-3b4a-5968-7a8b-9c0d1e2f3a43")
PREEMPT_GRACE_S=10   # GraceTime of the gpu partition's jobs when an urgent job preempts them
CTL_PORT=6917 SLURMD_PORT=6918 REGISTRY_PORT=5443   # not the defaults: a system Slurm on this machine keeps its own
NAME=ci-slurm
export SLURM_CONF=$STATE/slurm.conf
export DEBIAN_FRONTEND=noninteractive

log() { echo "$NAME: $*"; }
# shellcheck source=lib/netns.sh
source "$(dirname "$0")/lib/netns.sh"   # alive, wait_for, stop_pidfile, netns_link_up/down

packages() {
    local missing=() p
    for p in slurm-wlm munge openssh-server openssh-client iproute2 charliecloud-runtime \
        charliecloud-builders docker-registry apache2-utils openssl curl; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return
    local apt=(apt-get -o DPkg::Lock::Timeout=600 -q)
    "${apt[@]}" install -y --no-install-recommends "${missing[@]}" >/dev/null 2>&1 \
        || { for _ in 1 2 3; do "${apt[@]}" update && break; sleep 10; done
             "${apt[@]}" install -y --no-install-recommends "${missing[@]}"; }
    # The packages' own services are not ours (no systemd here; elsewhere they would start
    # with the Debian defaults): this cluster runs its own daemons with its own files.
}

network_up() {
    if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
        ip link add "$BRIDGE" type bridge
        ip addr add "$CTL_IP/24" dev "$BRIDGE"
        ip link set "$BRIDGE" up
    fi
    # Docker sets the FORWARD policy to DROP, and with br_netfilter that applies to bridged
    # frames too: let the cluster's own traffic (login -> node) through, nothing else.
    if command -v iptables >/dev/null && ! iptables -C FORWARD -i "$BRIDGE" -o "$BRIDGE" -j ACCEPT 2>/dev/null; then
        iptables -I FORWARD 1 -i "$BRIDGE" -o "$BRIDGE" -j ACCEPT
    fi
    local ns ip
    for ns in login "${NODES[@]}"; do
        if [ "$ns" = login ]; then ip=$LOGIN_IP; else ip=${NODE_IP[$ns]}; fi
        netns_link_up "gsl-$ns" "gsl-$ns" eth0 "$ip/24" "bridge:$BRIDGE"
    done
}

network_down() {
    local ns
    for ns in login "${NODES[@]}"; do netns_link_down "gsl-$ns" "gsl-$ns"; done
    ! ip link show "$BRIDGE" >/dev/null 2>&1 || ip link del "$BRIDGE"
    while command -v iptables >/dev/null && iptables -C FORWARD -i "$BRIDGE" -o "$BRIDGE" -j ACCEPT 2>/dev/null; do
        iptables -D FORWARD -i "$BRIDGE" -o "$BRIDGE" -j ACCEPT
    done
}

munge_up() {
    mkdir -p "$STATE/munge" "$RUN/munge"
    chown munge: "$STATE/munge" "$RUN/munge"
    chmod 0700 "$STATE/munge"
    if [ ! -s "$STATE/munge/munge.key" ]; then
        head -c 1024 /dev/urandom >"$STATE/munge/munge.key"
        chown munge: "$STATE/munge/munge.key"
        chmod 0400 "$STATE/munge/munge.key"
    fi
    alive "$RUN/munge/munged.pid" && return
    rm -f "$RUN/munge/munged.pid"   # a stale one: its pid may be another process's now
    runuser -u munge -- /usr/sbin/munged --key-file="$STATE/munge/munge.key" \
        --socket="$RUN/munge/munge.socket" --pid-file="$RUN/munge/munged.pid" \
        --log-file="$STATE/munge/munged.log" --seed-file="$STATE/munge/munged.seed"
    wait_for munged "$STATE/munge/munged.log" sh -c "munge -S '$RUN/munge/munge.socket' -n | unmunge -S '$RUN/munge/munge.socket'"
}

keys_up() {
    [ -f "$STATE/id_ed25519" ] || ssh-keygen -q -t ed25519 -N '' -C "$NAME-client" -f "$STATE/id_ed25519"
    cp "$STATE/id_ed25519.pub" "$STATE/authorized_keys"   # the "shared home" every node reads
    mkdir -p "$STATE/home"
    local ns
    for ns in login "${NODES[@]}"; do
        mkdir -p "$STATE/etc-ssh-$ns"
        [ -f "$STATE/etc-ssh-$ns/ssh_host_ed25519_key" ] \
            || ssh-keygen -q -t ed25519 -N '' -C "gsl-$ns" -f "$STATE/etc-ssh-$ns/ssh_host_ed25519_key"
        # HOME: the cluster's shared home (see ci-remote-host.sh: root's is this machine's)
        cat >"$STATE/etc-ssh-$ns/sshd_config.new" <<EOF
Port 22
HostKey /etc/ssh/ssh_host_ed25519_key
PidFile $RUN/sshd-$ns.pid
AuthorizedKeysFile $STATE/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
AllowTcpForwarding yes
PrintMotd no
SetEnv SLURM_CONF=$STATE/slurm.conf HOME=$STATE/home REQUESTS_CA_BUNDLE=$STATE/registry/ca-bundle.crt
EOF
        install_config "$STATE/etc-ssh-$ns/sshd_config" "$RUN/sshd-$ns.pid"
    done
    # Only the login node is known to the client: a node's key comes from its job (pinned).
    echo "$LOGIN_IP $(cut -d' ' -f1,2 "$STATE/etc-ssh-login/ssh_host_ed25519_key.pub")" >"$STATE/known_hosts"
    cat >"$STATE/ssh_config" <<EOF
Host $LOGIN_IP
    User root
    IdentityFile $STATE/id_ed25519
    UserKnownHostsFile $STATE/known_hosts
    StrictHostKeyChecking yes
    IdentitiesOnly yes
EOF
}

# The site's registry: a CA of the cluster's own signs its certificate (for 10.210.0.1); the
# cluster's CA bundle is the machine's plus that CA.
registry_up() {
    local dir=$STATE/registry
    mkdir -p "$dir/data" "$STATE/log"
    if [ ! -s "$dir/server.crt" ]; then
        openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=$NAME registry CA" \
            -keyout "$dir/ca.key" -out "$dir/ca.crt" 2>/dev/null
        openssl req -newkey rsa:2048 -nodes -subj "/CN=$CTL_IP" -keyout "$dir/server.key" \
            -out "$dir/server.csr" 2>/dev/null
        printf 'subjectAltName=IP:%s\n' "$CTL_IP" >"$dir/san.ext"
        openssl x509 -req -in "$dir/server.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" \
            -CAcreateserial -days 3650 -extfile "$dir/san.ext" -out "$dir/server.crt" 2>/dev/null
    fi
    cat /etc/ssl/certs/ca-certificates.crt "$dir/ca.crt" >"$dir/ca-bundle.crt"
    [ -s "$dir/password" ] || head -c 18 /dev/urandom | base64 | tr -d '/+=' >"$dir/password"
    [ -s "$dir/htpasswd" ] || htpasswd -Bbn ci "$(cat "$dir/password")" >"$dir/htpasswd" 2>/dev/null
    cat >"$dir/config.yml" <<EOF
version: 0.1
log: {level: warn}
storage: {filesystem: {rootdirectory: $dir/data}, delete: {enabled: true}}
http: {addr: "$CTL_IP:$REGISTRY_PORT", tls: {certificate: $dir/server.crt, key: $dir/server.key}}
auth: {htpasswd: {realm: $NAME, path: $dir/htpasswd}}
EOF
    # docker (here) pushes the tests' images to it: it trusts the CA for that registry only
    mkdir -p "/etc/docker/certs.d/$CTL_IP:$REGISTRY_PORT"
    cp "$dir/ca.crt" "/etc/docker/certs.d/$CTL_IP:$REGISTRY_PORT/ca.crt"
    alive "$RUN/registry.pid" && return
    setsid docker-registry serve "$dir/config.yml" </dev/null >>"$STATE/log/registry.log" 2>&1 &
    echo $! >"$RUN/registry.pid"
    wait_for registry "$STATE/log/registry.log" sh -c \
        "curl -s -o /dev/null -w '%{http_code}' --cacert '$dir/ca.crt' https://$CTL_IP:$REGISTRY_PORT/v2/ | grep -q 401"
}

# a node's GPU count (all its GRES types) and its slurm.conf Gres= value
gpu_count() {
    local n=0
    set -- ${NODE_GPUS[$1]}
    while [ $# -ge 2 ]; do n=$((n + $2)); shift 2; done
    echo "$n"
}
node_gres() {
    local out=()
    set -- ${NODE_GPUS[$1]}
    while [ $# -ge 2 ]; do out+=("gpu:$1:$2"); shift 2; done
    (IFS=,; echo "${out[*]}")
}

# The stand-in for AutoDetect=nvml's MIG UUIDs (see the header): a job given a slice's index in
# CUDA_VISIBLE_DEVICES gets the slice's UUID there instead, as on a node with real slices.
task_prolog() {
    local node pair
    {
        echo '#!/bin/sh'
        echo '# written by scripts/ci-slurm.sh: a slice index in CUDA_VISIBLE_DEVICES -> its MIG UUID'
        echo '[ -n "$CUDA_VISIBLE_DEVICES" ] || exit 0'
        echo 'case "$SLURMD_NODENAME" in'
        for node in "${!NODE_MIG[@]}"; do
            printf '%s) map="%s" ;;\n' "$node" "${NODE_MIG[$node]}"
        done
        echo '*) exit 0 ;;'
        echo 'esac'
        echo 'out= ; changed='
        echo 'for i in $(echo "$CUDA_VISIBLE_DEVICES" | tr , " "); do'
        echo '    id=$i'
        echo '    for pair in $map; do [ "${pair%%=*}" = "$i" ] && id=${pair#*=} && changed=1; done'
        echo '    out="$out${out:+,}$id"'
        echo 'done'
        echo '[ -z "$changed" ] || echo "export CUDA_VISIBLE_DEVICES=$out"'
    } >"$STATE/task-prolog.new"
    chmod 0755 "$STATE/task-prolog.new"
    if cmp -s "$STATE/task-prolog.new" "$STATE/task-prolog"; then rm "$STATE/task-prolog.new"; else mv "$STATE/task-prolog.new" "$STATE/task-prolog"; fi
}

slurm_conf() {
    mkdir -p "$STATE/ctld" "$STATE/dev" "$STATE/log"
    local node i
    for node in "${NODES[@]}"; do
        mkdir -p "$STATE/spool-$node"
        for i in $(seq 0 $(($(gpu_count "$node") - 1))); do
            # a character device (1,3: as /dev/null), so that slurmd takes it for a GPU and sets
            # CUDA_VISIBLE_DEVICES and SLURM_JOB_GPUS for the jobs given it (not for plain files)
            [ -c "$STATE/dev/$node-gpu$i" ] && continue
            rm -f "$STATE/dev/$node-gpu$i"
            mknod -m 0666 "$STATE/dev/$node-gpu$i" c 1 3
            stop_pidfile "$RUN/slurmd-$node.pid"   # a running slurmd read the old files: node_up starts it again
        done
    done
    {
        cat <<EOF
ClusterName=gpusession-ci
SlurmctldHost=$(hostname)($CTL_IP)
SlurmctldPort=$CTL_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CryptoType=crypto/munge
AuthInfo=socket=$RUN/munge/munge.socket
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/spool-%n
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd-%n.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=2
GresTypes=gpu
TaskProlog=$STATE/task-prolog
ReturnToService=2
SlurmdParameters=config_overrides
MpiDefault=none
KillWait=5
MinJobAge=600
SlurmdTimeout=60
InactiveLimit=0
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
SlurmctldParameters=preempt_send_user_signal
EOF
        for node in "${NODES[@]}"; do
            echo "NodeName=$node NodeAddr=${NODE_IP[$node]} CPUs=2 RealMemory=1000 Gres=$(node_gres "$node") State=UNKNOWN"
        done
        # preemption: a job in "urgent" (a higher PriorityTier) takes a "gpu" job's allocation;
        # the "gpu" job has GraceTime to save (Slurm sends its --signal at once: send_user_signal)
        # and is then requeued, or cancelled (PREEMPTED) when it may not be requeued (--no-requeue)
        echo "PartitionName=gpu Nodes=$(IFS=,; echo "${NODES[*]}") Default=YES MaxTime=INFINITE State=UP PriorityTier=1 PreemptMode=REQUEUE GraceTime=$PREEMPT_GRACE_S"
        echo "PartitionName=urgent Nodes=$(IFS=,; echo "${NODES[*]}") MaxTime=INFINITE State=UP PriorityTier=10 PreemptMode=OFF"
    } >"$STATE/slurm.conf.new"
    {
        echo "AutoDetect=off"
        local node first gpu_type count
        for node in "${NODES[@]}"; do
            first=0
            set -- ${NODE_GPUS[$node]}
            while [ $# -ge 2 ]; do
                gpu_type=$1 count=$2
                shift 2
                echo "NodeName=$node Name=gpu Type=$gpu_type File=$STATE/dev/$node-gpu[$first-$((first + count - 1))]"
                first=$((first + count))
            done
        done
    } >"$STATE/gres.conf.new"
    task_prolog
    # A changed layout (nodes, GPUs) starts the daemons over; any other change (partitions,
    # preemption) is read by the running cluster (scontrol reconfigure): jobs run on meanwhile.
    local layout=0 settings=0
    if ! cmp -s "$STATE/gres.conf.new" "$STATE/gres.conf" \
        || ! cmp -s <(grep '^NodeName=' "$STATE/slurm.conf.new") <(grep '^NodeName=' "$STATE/slurm.conf" 2>/dev/null); then
        layout=1
    elif ! cmp -s "$STATE/slurm.conf.new" "$STATE/slurm.conf"; then
        settings=1
    fi
    local f
    for f in slurm.conf gres.conf; do
        if ! cmp -s "$STATE/$f.new" "$STATE/$f"; then mv "$STATE/$f.new" "$STATE/$f"; else rm "$STATE/$f.new"; fi
    done
    alive "$RUN/slurmctld.pid" || return 0
    if [ "$layout" = 1 ]; then
        slurm_down
    elif [ "$settings" = 1 ]; then
        scontrol reconfigure
        log "reconfigured: $(scontrol show config | grep -E '^Preempt(Type|Mode) ' | tr -s ' ' | paste -sd' ')"
    fi
}

slurmctld_up() {
    alive "$RUN/slurmctld.pid" && return
    setsid -f /usr/sbin/slurmctld -f "$SLURM_CONF" </dev/null >>"$STATE/log/slurmctld.out" 2>&1
    wait_for slurmctld "$STATE/log/slurmctld.log" scontrol ping
}

# A node: its own network namespace, and its own mount namespace in which /etc/ssh is the
# node's, for both its sshd and its slurmd (whose jobs inherit it).
node_up() {
    local ns=$1
    alive "$RUN/sshd-$ns.pid" && { [ "$ns" = login ] || alive "$RUN/slurmd-$ns.pid"; } && return
    stop_pidfile "$RUN/sshd-$ns.pid"
    [ "$ns" = login ] || stop_pidfile "$RUN/slurmd-$ns.pid"
    mkdir -p /run/sshd
    local start="mount --bind '$STATE/etc-ssh-$ns' /etc/ssh && /usr/sbin/sshd -f /etc/ssh/sshd_config -E '$STATE/log/sshd-$ns.log'"
    if [ "$ns" != login ]; then
        start="$start && exec /usr/sbin/slurmd -f '$SLURM_CONF' -N $ns -D"
    fi
    setsid -f nsenter --net="/run/netns/gsl-$ns" unshare --mount --propagation private \
        sh -c "$start" </dev/null >>"$STATE/log/node-$ns.out" 2>&1
}

nodes_up() {
    local ns
    for ns in login "${NODES[@]}"; do node_up "$ns"; done
    wait_for "login sshd" "$STATE/log/sshd-login.log" \
        ssh -F "$STATE/ssh_config" -o BatchMode=yes -o ConnectTimeout=2 "$LOGIN_IP" sinfo
    local node
    for _ in $(seq 150); do
        local ready=1
        for node in "${NODES[@]}"; do
            case "$(sinfo -h -n "$node" -o %t 2>/dev/null)" in
                idle|mix|alloc) ;;
                drain*|down*|inval*|fail*) scontrol update nodename="$node" state=resume >/dev/null 2>&1 || true; ready=0 ;;
                *) ready=0 ;;
            esac
        done
        [ "$ready" = 1 ] && return
        sleep 0.2
    done
    sinfo -N -l >&2 || true
    tail -n 20 "$STATE/log/slurmd-n1.log" >&2 || true
    log "compute nodes did not come up" >&2
    return 1
}

slurm_down() {
    local node
    for node in "${NODES[@]}"; do stop_pidfile "$RUN/slurmd-$node.pid"; done
    stop_pidfile "$RUN/slurmctld.pid"
}

is_up() {
    alive "$RUN/slurmctld.pid" && alive "$RUN/munge/munged.pid" || return 1
    local ns
    for ns in login "${NODES[@]}"; do alive "$RUN/sshd-$ns.pid" || return 1; done
    for ns in "${NODES[@]}"; do alive "$RUN/slurmd-$ns.pid" || return 1; done
    alive "$RUN/registry.pid"
}

up() {
    [ "$(id -u)" -eq 0 ] || { log "run as root" >&2; exit 1; }
    local t0=$EPOCHREALTIME
    mkdir -p "$STATE" "$RUN"
    packages
    network_up
    munge_up
    keys_up
    slurm_conf
    registry_up
    slurmctld_up
    nodes_up
    log "up in $(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f s", b - a }'):" \
        "ssh -F $STATE/ssh_config $LOGIN_IP squeue; SLURM_CONF=$SLURM_CONF here"
}

down() {
    local ns
    if alive "$RUN/slurmctld.pid"; then scancel --state=PENDING,RUNNING -u root >/dev/null 2>&1 || true; fi
    slurm_down
    for ns in login "${NODES[@]}"; do stop_pidfile "$RUN/sshd-$ns.pid"; done
    stop_pidfile "$RUN/munge/munged.pid"
    stop_pidfile "$RUN/registry.pid"
    network_down
    log "down"
}

# One at a time: each pytest worker brings the cluster up from its first slurm test, and two
# `up`s at once wrote and moved the same slurm.conf.new (one failed, or restarted the cluster
# under the other's jobs). flock -o: the daemons started do not hold the lock after we end.
serialized() {
    mkdir -p "$STATE"
    exec flock -o "$STATE/.ci-slurm.lock" bash "$0" "$1-locked"
}

case "${1:-}" in
    up | down) serialized "$1" ;;
    up-locked) up ;;
    down-locked) down ;;
    status) is_up ;;
    *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac
