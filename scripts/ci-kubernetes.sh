#!/usr/bin/env bash
# A real Kubernetes cluster on this machine for the kubernetes backend's tests (issue 33), built
# from Go modules at pinned versions (no Kubernetes server is packaged for Debian 12):
#   control plane  etcd, kube-apiserver (https://10.220.0.1:16443), kube-controller-manager and
#                  kube-scheduler, on this machine, on bridge gpus-kube
#   n1, n2         two kubelets (node IPs 10.220.0.11 and .12), each over its own containerd
#                  (Debian's containerd and runc; its own socket, root and state, so dockerd's
#                  is untouched), its own cgroup root (/gpus-kube-NODE) and pod bridge (gk-NODE,
#                  pods in 10.221.N.0/24 through Debian's CNI plugins)
# Storage: the controller manager's hostPath provisioner and a default StorageClass (storage_up).
# GPUs without GPUs: each node advertises nvidia.com/gpu as an extended resource through its
# status (a PATCH of status.capacity, as the Kubernetes docs do it for resources without a
# device plugin) and carries NVIDIA GPU feature discovery's labels: n1 has 2 x Tesla-T4, n2 has
# 1 x NVIDIA-A100-SXM4-40GB. The scheduler places and queues pods by them for real.
# One binary (scripts/kubernetes/main.go, as the old hyperkube) holds etcd, the control plane,
# the kubelet and kubectl; it and the Go caches live in $STATE, so a second build only links.
#   scripts/ci-kubernetes.sh build    build the binaries (fresh: see docs/testing.md) unless built
#   scripts/ci-kubernetes.sh up       build, then start it all (idempotent; as root); prints times
#   scripts/ci-kubernetes.sh load IMAGE...  copy Docker images into every node that lacks them as
#                                      Docker has them now (docker save; nothing to do the second time)
#   scripts/ci-kubernetes.sh check    a pod of 1 A100 runs on n2; one of 3 GPUs stays Pending; a claim
#                                      binds and a pod mounts it (and all go)
#   scripts/ci-kubernetes.sh down     delete the pods, stop every daemon, remove bridges, cgroups
#   scripts/ci-kubernetes.sh status   exit 0 when it is up
# Client files, in $STATE (default /var/lib/gpusession-ci/kubernetes): admin.kubeconfig (cluster
# admin), bin/kubectl, pki/ca.crt.
# One verb at a time (status aside): the test workers each run `up` and `load` as they begin
# (tests/test_kubernetes.py), and two at once would start daemons or import an image twice.
set -euo pipefail

K8S_VERSION=v1.34.4   # kubelet 1.34 still runs on cgroup v1 (these machines) with failCgroupV1: false
STAGING_VERSION=v0.34.4   # k8s.io/api, k8s.io/apiserver...: the twins of K8S_VERSION
ETCD_VERSION=v3.6.4       # the etcd that K8S_VERSION's go.mod requires
CI_STATE=${GPUSESSION_CI_STATE:-/var/lib/gpusession-ci}
STATE=$CI_STATE/kubernetes
BIN=$STATE/bin
PKI=$STATE/pki
RUN=/run/gpus-kube
LOCK=/run/gpus-kube.lock
SRC=$(cd "$(dirname "$0")" && pwd)/kubernetes
BRIDGE=gpus-kube
CTL_IP=10.220.0.1
API_PORT=16443 ETCD_PORT=12379 ETCD_PEER_PORT=12380 CM_PORT=10357 SCHED_PORT=10359   # not the defaults
SERVICE_CIDR=10.222.0.0/24
PAUSE_IMAGE=docker.io/gpusession-ci/pause:1
NODES=(n1 n2)
declare -A NODE_IP=([n1]=10.220.0.11 [n2]=10.220.0.12)
declare -A NODE_POD_CIDR=([n1]=10.221.1.0/24 [n2]=10.221.2.0/24)
declare -A NODE_HEALTHZ=([n1]=10348 [n2]=10349)
declare -A NODE_GPUS=([n1]="Tesla-T4 2" [n2]="NVIDIA-A100-SXM4-40GB 1")
NAME=ci-kubernetes
export DEBIAN_FRONTEND=noninteractive
export KUBECONFIG=$STATE/admin.kubeconfig

log() { echo "$NAME: $*"; }
since() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f s", b - a }'; }
# shellcheck source=lib/netns.sh
source "$(dirname "$0")/lib/netns.sh"   # alive, wait_for, stop_pidfile

# Stages: each prints its time; a failure names its stage in one line (set -e ends the script).
STAGE=
STAGE_T0=
on_exit() {
    local rc=$?
    [ "$rc" -eq 0 ] || [ -z "$STAGE" ] || echo "$NAME: $STAGE failed after $(since "$STAGE_T0") (exit $rc; logs in $STATE/log)" >&2
}
trap on_exit EXIT
stage() {
    STAGE=$1 STAGE_T0=$EPOCHREALTIME
    "${@:2}"
    log "$STAGE: $(since "$STAGE_T0")"
    STAGE=
}
kubectl() { "$BIN/kube" kubectl "$@"; }

packages() {
    local missing=() p
    for p in containerd runc containernetworking-plugins iptables iproute2 openssl; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return
    local apt=(apt-get -o DPkg::Lock::Timeout=600 -q)
    "${apt[@]}" install -y --no-install-recommends "${missing[@]}" >/dev/null 2>&1 \
        || { for _ in 1 2 3; do "${apt[@]}" update && break; sleep 10; done
             "${apt[@]}" install -y --no-install-recommends "${missing[@]}"; }
}

go_env() {
    GO=$(command -v go || echo /usr/local/go/bin/go)
    [ -x "$GO" ] || { log "no Go toolchain (go on PATH or /usr/local/go/bin/go)" >&2; return 1; }
    # Modules and the build cache stay with the binaries; one compile at a time and niced: the
    # machine is shared. GOTOOLCHAIN=local: never fetch another toolchain.
    export GOMODCACHE=$STATE/gomod GOCACHE=$STATE/gocache GOTOOLCHAIN=local CGO_ENABLED=0
    export GOFLAGS="-p=${GPUSESSION_GO_PROCS:-1} -buildvcs=false"
}

build_stamp() {
    echo "$K8S_VERSION $STAGING_VERSION $ETCD_VERSION $("$GO" env GOVERSION)" \
        "$(cat "$SRC/main.go" "$SRC/pause/main.go" | sha256sum | cut -c1-16)"
}

# The module: ours requires k8s.io/kubernetes, whose go.mod replaces its staging modules with
# folders of its own tree; here each becomes its published twin at STAGING_VERSION.
build_module() {
    local mod=$STATE/src
    mkdir -p "$mod/pause"
    cp "$SRC/main.go" "$mod/main.go"
    cp "$SRC/pause/main.go" "$mod/pause/main.go"
    [ -s "$mod/go.sum" ] && grep -q "k8s.io/kubernetes $K8S_VERSION\$" "$mod/go.mod" && return
    rm -f "$mod/go.mod" "$mod/go.sum"
    (cd "$mod" && "$GO" mod init gpusession-ci/kube >/dev/null 2>&1)
    local k8s_mod staging edits=()
    k8s_mod=$(cd "$mod" && "$GO" mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/^\s*"GoMod": "\(.*\)",$/\1/p')
    for staging in $(sed -n 's,^\s*\(k8s.io/[a-z0-9-]*\) => \./staging/.*,\1,p' "$k8s_mod" | sort -u); do
        edits+=("-replace=$staging=$staging@$STAGING_VERSION")
    done
    (cd "$mod" && "$GO" mod edit -go=1.24.0 -godebug=default=go1.24 \
        "-require=k8s.io/kubernetes@$K8S_VERSION" "-require=go.etcd.io/etcd/server/v3@$ETCD_VERSION" "${edits[@]}" \
        && nice -n 19 "$GO" mod tidy)
}

build() {
    mkdir -p "$BIN" "$STATE/log"
    go_env
    local stamp
    stamp=$(build_stamp)
    if [ -x "$BIN/kube" ] && [ "$(cat "$BIN/stamp" 2>/dev/null)" = "$stamp" ]; then return; fi
    build_module
    log "building kube $K8S_VERSION with etcd $ETCD_VERSION (fresh: about 45 min on 2 busy cores; log: $STATE/log/build.log)"
    local version="-X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/component-base/version.gitMajor=$(echo "$K8S_VERSION" | cut -d. -f1 | tr -d v) -X k8s.io/component-base/version.gitMinor=$(echo "$K8S_VERSION" | cut -d. -f2) -X k8s.io/component-base/version.gitTreeState=clean"
    (cd "$STATE/src" && nice -n 19 "$GO" build -trimpath -ldflags="$version" -o "$BIN/kube.new" . \
        && nice -n 19 "$GO" build -trimpath -ldflags=-s -o "$BIN/pause" ./pause) >"$STATE/log/build.log" 2>&1 \
        || { tail -n 20 "$STATE/log/build.log" >&2; return 1; }
    mv "$BIN/kube.new" "$BIN/kube"
    local cmd
    for cmd in etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl; do
        ln -sf kube "$BIN/$cmd"
    done
    echo "$stamp" >"$BIN/stamp"
}

# --- certificates and kubeconfigs: one CA of the cluster's own, EC keys -------------------------
cert() {  # cert NAME CN ORG USAGE [SAN]: $PKI/NAME.crt and .key signed by the cluster's CA
    local name=$1 cn=$2 org=$3 usage=$4 san=${5:-}
    [ -s "$PKI/$name.crt" ] && return
    local subj="/CN=$cn"
    [ -z "$org" ] || subj="/O=$org$subj"
    openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj "$subj" \
        -keyout "$PKI/$name.key" -out "$PKI/$name.csr" 2>/dev/null
    {
        echo "basicConstraints=CA:FALSE"
        echo "keyUsage=critical,digitalSignature,keyEncipherment"
        echo "extendedKeyUsage=$usage"
        [ -z "$san" ] || echo "subjectAltName=$san"
    } >"$PKI/$name.ext"
    openssl x509 -req -in "$PKI/$name.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" -CAcreateserial \
        -days 3650 -extfile "$PKI/$name.ext" -out "$PKI/$name.crt" 2>/dev/null
    rm -f "$PKI/$name.csr" "$PKI/$name.ext"
}

kubeconfig() {  # kubeconfig NAME: $STATE/NAME.kubeconfig with the client certificate NAME
    cat >"$STATE/$1.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: gpusession-ci
  cluster:
    server: https://$CTL_IP:$API_PORT
    certificate-authority-data: $(base64 -w0 "$PKI/ca.crt")
users:
- name: $1
  user:
    client-certificate-data: $(base64 -w0 "$PKI/$1.crt")
    client-key-data: $(base64 -w0 "$PKI/$1.key")
contexts:
- name: gpusession-ci
  context: {cluster: gpusession-ci, user: $1, namespace: default}
current-context: gpusession-ci
EOF
    chmod 0600 "$STATE/$1.kubeconfig"
}

pki() {
    mkdir -p "$PKI"
    chmod 0700 "$PKI"
    if [ ! -s "$PKI/ca.crt" ]; then
        openssl req -x509 -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 3650 \
            -subj "/CN=$NAME CA" -addext "basicConstraints=critical,CA:TRUE" \
            -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" \
            -keyout "$PKI/ca.key" -out "$PKI/ca.crt" 2>/dev/null
    fi
    [ -s "$PKI/sa.key" ] || openssl ecparam -name prime256v1 -genkey -noout -out "$PKI/sa.key" 2>/dev/null
    [ -s "$PKI/sa.pub" ] || openssl ec -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null
    local service_ip=${SERVICE_CIDR%.0/24}.1
    cert apiserver kube-apiserver "" serverAuth \
        "IP:$CTL_IP,IP:127.0.0.1,IP:$service_ip,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
    cert apiserver-kubelet-client kube-apiserver-kubelet-client system:masters clientAuth
    cert admin gpusession-ci-admin system:masters clientAuth
    cert controller-manager system:kube-controller-manager "" clientAuth
    cert scheduler system:kube-scheduler "" clientAuth
    local node
    for node in "${NODES[@]}"; do cert "kubelet-$node" "system:node:$node" system:nodes clientAuth; done
    for name in admin controller-manager scheduler "${NODES[@]/#/kubelet-}"; do kubeconfig "$name"; done
}

# --- network: the control plane's bridge with the nodes' addresses; pods may pass through -------
network_up() {
    if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
        ip link add "$BRIDGE" type bridge
        ip link set "$BRIDGE" up
    fi
    local ip addrs
    addrs=$(ip -o -4 addr show dev "$BRIDGE")
    for ip in "$CTL_IP" "${NODE_IP[@]}"; do
        [[ "$addrs" == *"inet $ip/"* ]] || ip addr add "$ip/24" dev "$BRIDGE"
    done
    # Docker sets FORWARD to DROP (and br_netfilter applies it to bridged frames): pods' traffic
    # among themselves passes, nothing else.
    local dir
    for dir in -s -d; do
        iptables -C FORWARD "$dir" 10.221.0.0/16 -j ACCEPT 2>/dev/null || iptables -I FORWARD 1 "$dir" 10.221.0.0/16 -j ACCEPT
    done
}

# The kubelets' own chains (KUBE-FIREWALL drops non-loopback packets to 127.0.0.0/8 in INPUT
# and OUTPUT; the others are markers): gone with the last kubelet.
kubelet_chains_down() {
    local cmd table chain rule
    for cmd in iptables ip6tables; do
        command -v "$cmd" >/dev/null || continue
        for table in filter nat mangle; do
            for chain in INPUT OUTPUT; do
                while rule=$("$cmd" -t "$table" -S "$chain" 2>/dev/null | grep -m1 -- '-j KUBE-FIREWALL$'); do
                    read -ra rule <<<"${rule/-A /-D }"
                    "$cmd" -t "$table" "${rule[@]}"
                done
            done
            for chain in KUBE-FIREWALL KUBE-KUBELET-CANARY KUBE-IPTABLES-HINT; do
                "$cmd" -t "$table" -F "$chain" 2>/dev/null && "$cmd" -t "$table" -X "$chain" 2>/dev/null || true
            done
        done
    done
}

network_down() {
    local link dir
    kubelet_chains_down
    for link in "$BRIDGE" "${NODES[@]/#/gk-}"; do ! ip link show "$link" >/dev/null 2>&1 || ip link del "$link"; done
    for dir in -s -d; do
        while iptables -C FORWARD "$dir" 10.221.0.0/16 -j ACCEPT 2>/dev/null; do iptables -D FORWARD "$dir" 10.221.0.0/16 -j ACCEPT; done
    done
}

changed() {  # changed FILE: FILE.new replaces FILE when it differs (exit 0), else goes (exit 1)
    if cmp -s "$1.new" "$1"; then rm -f "$1.new"; return 1; fi
    mv "$1.new" "$1"
}

start() {  # start NAME COMMAND...: a daemon of ours, its pid in $RUN/NAME.pid, its log in $STATE/log
    local name=$1; shift
    if alive "$RUN/$name.pid"; then   # running: started again only when its command line changed
        [ "$(cat "$RUN/$name.cmd" 2>/dev/null)" = "$*" ] && return
        stop_pidfile "$RUN/$name.pid"
    fi
    printf '%s' "$*" >"$RUN/$name.cmd"
    setsid "$@" </dev/null >>"$STATE/log/$name.log" 2>&1 9>&- &   # 9: the lock, not the daemon's
    echo $! >"$RUN/$name.pid"
}

etcd_up() {
    start etcd "$BIN/kube" etcd --name ci --data-dir "$STATE/etcd" \
        --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
        --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
        --initial-cluster "ci=http://127.0.0.1:$ETCD_PEER_PORT" --listen-metrics-urls "" \
        --unsafe-no-fsync --log-level warn
}

apiserver_up() {
    start kube-apiserver "$BIN/kube" kube-apiserver --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
        --bind-address "$CTL_IP" --secure-port "$API_PORT" --advertise-address "$CTL_IP" \
        --service-cluster-ip-range "$SERVICE_CIDR" \
        --tls-cert-file "$PKI/apiserver.crt" --tls-private-key-file "$PKI/apiserver.key" \
        --client-ca-file "$PKI/ca.crt" --authorization-mode Node,RBAC --enable-admission-plugins NodeRestriction \
        --service-account-issuer https://kubernetes.default.svc.cluster.local \
        --service-account-key-file "$PKI/sa.pub" --service-account-signing-key-file "$PKI/sa.key" \
        --kubelet-client-certificate "$PKI/apiserver-kubelet-client.crt" \
        --kubelet-client-key "$PKI/apiserver-kubelet-client.key" --kubelet-preferred-address-types InternalIP \
        --allow-privileged=true --v 1
    WAIT_FOR_S=120 wait_for kube-apiserver "$STATE/log/kube-apiserver.log" kubectl get --raw /readyz
}

controllers_up() {
    start kube-controller-manager "$BIN/kube" kube-controller-manager \
        --kubeconfig "$STATE/controller-manager.kubeconfig" \
        --authentication-kubeconfig "$STATE/controller-manager.kubeconfig" \
        --authorization-kubeconfig "$STATE/controller-manager.kubeconfig" \
        --bind-address 127.0.0.1 --secure-port "$CM_PORT" --leader-elect=false \
        --service-account-private-key-file "$PKI/sa.key" --root-ca-file "$PKI/ca.crt" \
        --use-service-account-credentials --cluster-name gpusession-ci \
        --enable-hostpath-provisioner --v 1
    start kube-scheduler "$BIN/kube" kube-scheduler --kubeconfig "$STATE/scheduler.kubeconfig" \
        --authentication-kubeconfig "$STATE/scheduler.kubeconfig" \
        --authorization-kubeconfig "$STATE/scheduler.kubeconfig" \
        --bind-address 127.0.0.1 --secure-port "$SCHED_PORT" --leader-elect=false --v 1
    # pods of the default namespace are admitted once its service account exists
    wait_for "kube-controller-manager" "$STATE/log/kube-controller-manager.log" kubectl get serviceaccount default
}

# A test stand-in for a cluster's dynamic provisioning: kube-controller-manager's built-in
# hostPath provisioner (--enable-hostpath-provisioner above) makes each claim's volume a folder
# /tmp/hostpath_pv/UID on this machine, the same folder from either node; the default
# StorageClass names it, so a claim without a class binds at once. A claim deleted deletes it.
storage_up() {
    kubectl apply -f - >/dev/null <<EOF
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: hostpath
  annotations: {storageclass.kubernetes.io/is-default-class: "true"}
provisioner: kubernetes.io/host-path
reclaimPolicy: Delete
volumeBindingMode: Immediate
EOF
}

# --- nodes ------------------------------------------------------------------------------------
containerd_up() {
    local node=$1 dir=$STATE/$1
    mkdir -p "$dir/cni" "$RUN/$node"
    # restrict_oom_score_adj: these machines' root lacks CAP_SYS_RESOURCE, so a pod's negative
    # oom_score_adj (the sandbox's -998) would fail in runc; it is kept at containerd's own.
    cat >"$dir/containerd.toml.new" <<EOF
version = 2
root = "$dir/containerd"
state = "$RUN/$node/containerd"
[grpc]
  address = "$RUN/$node/containerd.sock"
[metrics]
  address = ""
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  disable_apparmor = true
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "$(command -v runc)"
        Root = "$RUN/$node/runc"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$dir/cni"
EOF
    cat >"$dir/cni/10-gpus-kube.conflist.new" <<EOF
{"cniVersion": "1.0.0", "name": "gpus-kube", "plugins": [{"type": "bridge", "bridge": "gk-$node",
  "isGateway": true, "ipMasq": false, "hairpinMode": true, "ipam": {"type": "host-local",
  "ranges": [[{"subnet": "${NODE_POD_CIDR[$node]}"}]], "routes": [{"dst": "0.0.0.0/0"}],
  "dataDir": "$dir/ipam"}}]}
EOF
    changed "$dir/cni/10-gpus-kube.conflist" || true   # containerd watches the folder
    # a changed configuration starts containerd again; its containers run on (their shims stay)
    ! changed "$dir/containerd.toml" || stop_pidfile "$RUN/containerd-$node.pid"
    start "containerd-$node" containerd --config "$dir/containerd.toml"
    wait_for "containerd $node" "$STATE/log/containerd-$node.log" ctr -a "$RUN/$node/containerd.sock" version
}

# oci_archive REF DIR ENTRYPOINT_JSON OUT: an OCI image archive of the files under DIR
oci_archive() {
    local ref=$1 root=$2 entrypoint=$3 out=$4 tmp layer config manifest sha
    tmp=$(mktemp -d)
    mkdir -p "$tmp/blobs/sha256"
    tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$root" -cf "$tmp/layer" .
    layer=$(sha256sum <"$tmp/layer" | cut -d' ' -f1)
    config="{\"architecture\":\"amd64\",\"os\":\"linux\",\"config\":{\"Entrypoint\":$entrypoint},\"rootfs\":{\"type\":\"layers\",\"diff_ids\":[\"sha256:$layer\"]}}"
    manifest="{\"schemaVersion\":2,\"mediaType\":\"application/vnd.oci.image.manifest.v1+json\",\"config\":{\"mediaType\":\"application/vnd.oci.image.config.v1+json\",\"digest\":\"sha256:$(printf %s "$config" | sha256sum | cut -d' ' -f1)\",\"size\":${#config}},\"layers\":[{\"mediaType\":\"application/vnd.oci.image.layer.v1.tar\",\"digest\":\"sha256:$layer\",\"size\":$(stat -c %s "$tmp/layer")}]}"
    mv "$tmp/layer" "$tmp/blobs/sha256/$layer"
    for blob in "$config" "$manifest"; do
        sha=$(printf %s "$blob" | sha256sum | cut -d' ' -f1)
        printf %s "$blob" >"$tmp/blobs/sha256/$sha"
    done
    printf '{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%d,"annotations":{"io.containerd.image.name":"%s","org.opencontainers.image.ref.name":"%s"}}]}' \
        "$sha" "${#manifest}" "$ref" "${ref##*:}" >"$tmp/index.json"
    echo '{"imageLayoutVersion":"1.0.0"}' >"$tmp/oci-layout"
    tar -C "$tmp" -cf "$out" oci-layout index.json blobs
    rm -rf "$tmp"
}

pause_image() {  # the sandbox image, from our pause binary: nothing is pulled
    local node=$1 sock=$RUN/$1/containerd.sock
    ctr -a "$sock" -n k8s.io images check "name==$PAUSE_IMAGE" 2>/dev/null | grep -q complete && return
    if [ ! -s "$STATE/pause.tar" ] || [ "$BIN/pause" -nt "$STATE/pause.tar" ]; then
        local root
        root=$(mktemp -d)
        cp "$BIN/pause" "$root/pause"
        oci_archive "$PAUSE_IMAGE" "$root" '["/pause"]' "$STATE/pause.tar"
        rm -rf "$root"
    fi
    ctr -a "$sock" -n k8s.io images import "$STATE/pause.tar" >/dev/null
}

kubelet_up() {
    local node=$1 dir=$STATE/$1 c
    # its own cgroup root in every hierarchy, so that two kubelets do not share /kubepods
    for c in /sys/fs/cgroup/*/; do [ "$c" = /sys/fs/cgroup/unified/ ] || mkdir -p "$c/gpus-kube-$node"; done
    read -r product count <<<"${NODE_GPUS[$node]}"
    cat >"$dir/kubelet.yaml.new" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: ${NODE_IP[$node]}
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: ${NODE_HEALTHZ[$node]}
authentication: {anonymous: {enabled: false}, webhook: {enabled: true}, x509: {clientCAFile: $PKI/ca.crt}}
authorization: {mode: Webhook}
containerRuntimeEndpoint: unix://$RUN/$node/containerd.sock
cgroupDriver: cgroupfs
cgroupRoot: /gpus-kube-$node
failCgroupV1: false
failSwapOn: false
podCIDR: ${NODE_POD_CIDR[$node]}
podLogsDir: $dir/pod-logs
clusterDomain: cluster.local
resolvConf: /etc/resolv.conf
maxPods: 30
serializeImagePulls: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: 100Mi, nodefs.available: 1%, imagefs.available: 1%, nodefs.inodesFree: 1%}
EOF
    ! changed "$dir/kubelet.yaml" || stop_pidfile "$RUN/kubelet-$node.pid"
    start "kubelet-$node" "$BIN/kube" kubelet --config "$dir/kubelet.yaml" \
        --kubeconfig "$STATE/kubelet-$node.kubeconfig" --root-dir "$dir/kubelet" --cert-dir "$dir/pki" \
        --hostname-override "$node" --node-ip "${NODE_IP[$node]}" \
        --node-labels "nvidia.com/gpu.present=true,nvidia.com/gpu.product=$product,nvidia.com/gpu.count=$count" --v 1
}

node_ready() { [ "$(kubectl get node "$1" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ]; }
node_gpus() { kubectl get node "$1" -o jsonpath='{.status.allocatable.nvidia\.com/gpu}' 2>/dev/null; }
node_has_gpus() { [ "$(node_gpus "$1")" = "$2" ]; }

# The docs' way for a resource without a device plugin: PATCH status.capacity. A kubelet that
# starts over on a node it finds again may zero extended resources: so every `up` does it.
gpus_up() {
    local node product count
    for node in "${NODES[@]}"; do
        # after an API server's restart a kubelet reports Ready again only at its next status
        # round, past its backoff: up to a minute and more
        WAIT_FOR_S=150 wait_for "node $node" "$STATE/log/kubelet-$node.log" node_ready "$node"
        read -r product count <<<"${NODE_GPUS[$node]}"
        node_has_gpus "$node" "$count" && continue
        kubectl patch node "$node" --subresource=status --type=json \
            -p "[{\"op\": \"add\", \"path\": \"/status/capacity/nvidia.com~1gpu\", \"value\": \"$count\"}]" >/dev/null
        wait_for "nvidia.com/gpu on $node" "$STATE/log/kubelet-$node.log" node_has_gpus "$node" "$count"
    done
}

nodes_up() {
    local node
    for node in "${NODES[@]}"; do
        containerd_up "$node"
        pause_image "$node"
        kubelet_up "$node"
    done
}

# The name containerd keeps a Docker reference by: gpusession-ci/py-bookworm:latest is
# docker.io/gpusession-ci/py-bookworm:latest, ubuntu is docker.io/library/ubuntu:latest.
ctr_name() {
    local ref=$1 first=${1%%/*}
    if [[ $ref != */* ]]; then
        ref=docker.io/library/$ref
    elif [[ $first != *.* && $first != *:* && $first != localhost ]]; then
        ref=docker.io/$ref
    fi
    [[ ${ref##*/} == *[:@]* ]] || ref=$ref:latest
    echo "$ref"
}

ctr_target() {  # ctr_target NODE NAME: the manifest digest NAME points at in NODE's containerd
    ctr -a "$RUN/$1/containerd.sock" -n k8s.io images ls "name==$2" 2>/dev/null | awk 'NR == 2 { print $3 }'
}

# holds NODE IMAGE ID: NODE has IMAGE as Docker has it now, its name and its id (the CRI plugin
# keeps every image by its config digest too, which is Docker's image id) at one manifest.
holds() {
    local named
    named=$(ctr_target "$1" "$(ctr_name "$2")")
    [ -n "$named" ] && [ "$named" = "$(ctr_target "$1" "$3")" ]
}

load() {  # load IMAGE...: docker save | ctr import into each node that lacks it (pods use imagePullPolicy: Never or IfNotPresent)
    local image id node
    for image in "$@"; do
        id=$(docker image inspect -f '{{.Id}}' "$image")
        for node in "${NODES[@]}"; do
            if holds "$node" "$image" "$id"; then
                log "load: $node has $image"
                continue
            fi
            if [ -n "$(ctr_target "$node" "$id")" ]; then  # the same image under another name: one name more
                ctr -a "$RUN/$node/containerd.sock" -n k8s.io images tag --force "$id" "$(ctr_name "$image")" >/dev/null
            else
                docker save "$image" | ctr -a "$RUN/$node/containerd.sock" -n k8s.io images import - >/dev/null
            fi
            holds "$node" "$image" "$id" || { log "load: $image did not arrive in $node" >&2; return 1; }
        done
    done
}

# check: the scheduler places by GPU count and model for real. A pod asking 1 A100 runs on n2;
# a pod asking 3 GPUs (more than any node has) stays Pending with the scheduler's reason.
check_pod() {  # check_pod NAME GPUS [PRODUCT]
    local selector=
    [ -z "${3:-}" ] || selector="nodeSelector: {nvidia.com/gpu.product: $3}"
    cat <<EOF
apiVersion: v1
kind: Pod
metadata: {name: $1, labels: {app: ci-kubernetes-check}}
spec:
  terminationGracePeriodSeconds: 0
  $selector
  containers:
  - {name: main, image: $PAUSE_IMAGE, imagePullPolicy: Never, resources: {limits: {nvidia.com/gpu: $2}}}
---
EOF
}

check_claim() {  # a claim of the default StorageClass and a pod that mounts it
    cat <<EOF
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: check-claim, labels: {app: ci-kubernetes-check}}
spec: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 1Mi}}}
---
apiVersion: v1
kind: Pod
metadata: {name: check-claim, labels: {app: ci-kubernetes-check}}
spec:
  terminationGracePeriodSeconds: 0
  volumes: [{name: data, persistentVolumeClaim: {claimName: check-claim}}]
  containers:
  - {name: main, image: $PAUSE_IMAGE, imagePullPolicy: Never, volumeMounts: [{name: data, mountPath: /data}]}
---
EOF
}

check() {
    kubectl delete pod,pvc -l app=ci-kubernetes-check --grace-period=0 --force >/dev/null 2>&1 || true
    { check_pod check-a100 1 NVIDIA-A100-SXM4-40GB; check_pod check-too-many 3; check_claim; } | kubectl apply -f - >/dev/null
    kubectl wait --for=jsonpath='{.status.phase}'=Running pod/check-a100 --timeout=60s >/dev/null
    local node reason
    node=$(kubectl get pod check-a100 -o jsonpath='{.spec.nodeName}')
    [ "$node" = n2 ] || { log "check-a100 runs on $node, not n2" >&2; return 1; }
    kubectl wait --for=condition=PodScheduled=false pod/check-too-many --timeout=30s >/dev/null
    reason=$(kubectl get pod check-too-many -o jsonpath='{.status.conditions[?(@.type=="PodScheduled")].message}')
    case "$reason" in *"Insufficient nvidia.com/gpu"*) ;; *) log "check-too-many: unexpected reason: $reason" >&2; return 1 ;; esac
    log "1 x A100 runs on $node; 3 GPUs pending: $reason"
    # the default StorageClass binds a claim to a folder of this machine, which its pod mounts
    kubectl wait --for=jsonpath='{.status.phase}'=Bound pvc/check-claim --timeout=60s >/dev/null
    kubectl wait --for=jsonpath='{.status.phase}'=Running pod/check-claim --timeout=60s >/dev/null
    local volume folder
    volume=$(kubectl get pvc check-claim -o jsonpath='{.spec.volumeName}')
    folder=$(kubectl get pv "$volume" -o jsonpath='{.spec.hostPath.path}')
    [ -d "$folder" ] || { log "claim check-claim: its volume's folder $folder is missing" >&2; return 1; }
    kubectl delete pod,pvc -l app=ci-kubernetes-check --grace-period=0 --force >/dev/null 2>&1
    # reclaimPolicy Delete: the volume and its folder go with the claim
    for _ in $(seq 100); do [ -d "$folder" ] || break; sleep 0.3; done
    [ ! -d "$folder" ] || { log "claim check-claim: $folder outlived the claim" >&2; return 1; }
    log "a claim of the default StorageClass binds to $folder, mounted by a pod, deleted with it"
}

is_up() {
    local daemon
    for daemon in etcd kube-apiserver kube-controller-manager kube-scheduler "${NODES[@]/#/containerd-}" "${NODES[@]/#/kubelet-}"; do
        alive "$RUN/$daemon.pid" || return 1
    done
    kubectl get --raw /readyz >/dev/null 2>&1
}

up() {
    [ "$(id -u)" -eq 0 ] || { log "run as root" >&2; exit 1; }
    local t0=$EPOCHREALTIME
    mkdir -p "$STATE/log" "$RUN"
    stage packages packages
    stage build build
    stage pki pki
    stage network network_up
    stage etcd etcd_up
    stage kube-apiserver apiserver_up
    stage controllers controllers_up
    stage storage storage_up
    stage nodes nodes_up
    stage gpus gpus_up
    log "up in $(since "$t0"): KUBECONFIG=$KUBECONFIG $BIN/kubectl get nodes"
}

# Pods first, while the kubelets can still end them (their sandboxes, networks and cgroups);
# what is left after that is killed through containerd.
pods_down() {
    if alive "$RUN/kube-apiserver.pid" && kubectl get --raw /readyz >/dev/null 2>&1; then
        kubectl delete pods --all --all-namespaces --grace-period=0 --force --wait=false >/dev/null 2>&1 || true
        # a session's pod is kept by gpusession's finalizer until its record has read its end:
        # the test cluster's teardown lets go of them all (else they stay Terminating in etcd)
        local ns name
        kubectl get pods -A -l gpusession.session -o jsonpath='{range .items[*]}{.metadata.namespace} {.metadata.name}{"\n"}{end}' 2>/dev/null |
            while read -r ns name; do
                [ -n "$name" ] && kubectl -n "$ns" patch pod "$name" --type=merge -p '{"metadata":{"finalizers":null}}' >/dev/null 2>&1 || true
            done
    fi
    local node sock task
    for node in "${NODES[@]}"; do
        sock=$RUN/$node/containerd.sock
        alive "$RUN/containerd-$node.pid" || continue
        if alive "$RUN/kubelet-$node.pid"; then
            for _ in $(seq 100); do [ -z "$(ctr -a "$sock" -n k8s.io tasks ls -q 2>/dev/null)" ] && break; sleep 0.3; done
        fi
        for task in $(ctr -a "$sock" -n k8s.io tasks ls -q 2>/dev/null); do
            ctr -a "$sock" -n k8s.io tasks kill -s SIGKILL "$task" >/dev/null 2>&1 || true
            ctr -a "$sock" -n k8s.io tasks delete -f "$task" >/dev/null 2>&1 || true
        done
    done
}

down() {
    local node c
    pods_down
    for node in "${NODES[@]}"; do stop_pidfile "$RUN/kubelet-$node.pid"; done
    # and the nodes: the next `up` waits for them to register again, not for a stale Ready
    if alive "$RUN/kube-apiserver.pid"; then kubectl delete nodes --all --wait=false >/dev/null 2>&1 || true; fi
    for node in "${NODES[@]}"; do stop_pidfile "$RUN/containerd-$node.pid"; done
    stop_pidfile "$RUN/kube-scheduler.pid"
    stop_pidfile "$RUN/kube-controller-manager.pid"
    stop_pidfile "$RUN/kube-apiserver.pid"
    stop_pidfile "$RUN/etcd.pid"
    # the kubelet's own mounts: its root (bound onto itself, rshared) and what pods left in it
    local mnt
    for mnt in $(awk -v state="$STATE/" 'index($2, state) == 1 { print $2 }' /proc/mounts | sort -r); do
        umount -l "$mnt" || true
    done
    for node in "${NODES[@]}"; do
        for c in /sys/fs/cgroup/*/gpus-kube-"$node"; do
            [ -d "$c" ] && find "$c" -depth -type d -exec rmdir {} + 2>/dev/null || true
        done
    done
    network_down
    log "down"
}

if [ "${1:-}" != status ]; then
    exec 9>"$LOCK"
    flock 9
fi
case "${1:-}" in
    build) t0=$EPOCHREALTIME; stage build build; log "built in $(since "$t0"): $BIN/kube" ;;
    up) up ;;
    load) shift; stage load load "$@" ;;
    check) stage check check ;;
    down) down ;;
    status) is_up ;;
    *) echo "usage: $0 build|up|load IMAGE...|check|down|status" >&2; exit 2 ;;
esac
