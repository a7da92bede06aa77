#!/usr/bin/env bash
# Prepare this machine (Debian 12, as root) for the real-Docker tests:
# packages, a stub NVIDIA hook, a running dockerd, the local/debian:bookworm
# base image, gpusession/cuda:ci (Dockerfile.cuda's recipe, with ipykernel) and
# the foreign images of scripts/ci-images.sh. Safe to run again: every stage
# skips what is already done.
set -euo pipefail

cd "$(dirname "$0")/.."
STATE=${GPUSESSION_CI_STATE:-/var/lib/gpusession-ci}
HOOK_DIR=$STATE/bin               # prepended to dockerd's PATH (see install_hook)
BASE_IMAGE=local/debian:bookworm
PRODUCT_IMAGE=${GPUSESSION_TEST_IMAGE:-gpusession/cuda:ci}
PACKAGES=(docker.io openssh-server openssh-client debootstrap iproute2 iptables
          chromium psmisc procps ca-certificates)
export DEBIAN_FRONTEND=noninteractive

# shellcheck source=lib/debian-mirror.sh
source scripts/lib/debian-mirror.sh  # after the cd above: the repository root

STAGE=start
on_exit() {
    local rc=$?
    [ "$rc" -eq 0 ] || echo "ci-host-setup: FAILED in stage \"$STAGE\" (exit $rc)" >&2
}
trap on_exit EXIT

since() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f s", b - a }'; }

stage() {  # stage NAME FUNCTION: run it, print how long it took
    STAGE=$1
    local t0=$EPOCHREALTIME
    echo "== $1"
    "$2"
    echo "   $1: $(since "$t0")"
}

install_packages() {
    local missing=() p
    for p in "${PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing+=("$p")
    done
    if [ ${#missing[@]} -eq 0 ]; then echo "   all installed"; return; fi
    # Another apt (unattended-upgrades, cloud-init) may hold the lock: wait for it.
    local apt=(apt-get -o DPkg::Lock::Timeout=600 -q)
    for _ in 1 2 3; do "${apt[@]}" update && break; sleep 10; done
    "${apt[@]}" install -y --no-install-recommends "${missing[@]}"
}

# dockerd registers its "nvidia" device driver only if this hook is on its
# PATH when it starts. The stub lets `--gpus all` succeed on a machine without
# a GPU (the container gets NVIDIA_VISIBLE_DEVICES=all, but no device).
install_hook() {
    if command -v nvidia-container-runtime-hook >/dev/null; then
        echo "   real hook at $(command -v nvidia-container-runtime-hook): no stub"
        return
    fi
    mkdir -p "$HOOK_DIR"
    printf '#!/bin/sh\ncat >/dev/null; exit 0\n' >"$HOOK_DIR/nvidia-container-runtime-hook"
    chmod 755 "$HOOK_DIR/nvidia-container-runtime-hook"
}

# Does the running dockerd (given its pid) have an NVIDIA hook on its PATH?
dockerd_has_hook() {
    local dir d
    dir=$(tr '\0' '\n' <"/proc/$1/environ" | sed -n 's/^PATH=//p' | tr ':' '\n')
    for d in $dir; do [ -x "$d/nvidia-container-runtime-hook" ] && return 0; done
    return 1
}

start_dockerd() {
    if timeout 10 docker info >/dev/null 2>&1; then
        local pid
        pid=$(cat /var/run/docker.pid 2>/dev/null || pidof -s dockerd || true)
        if [ -n "$pid" ] && ! dockerd_has_hook "$pid"; then
            echo "   WARNING: the running dockerd (pid $pid) has no nvidia-container-runtime-hook" \
                 "on its PATH: GPU requests will fail. Stop it and rerun this script." >&2
        fi
        echo "   already running"
        return
    fi
    mkdir -p "$STATE/docker"
    PATH="$HOOK_DIR:$PATH" setsid -f dockerd --data-root "$STATE/docker" \
        >>"$STATE/dockerd.log" 2>&1 </dev/null
    for _ in $(seq 120); do
        timeout 5 docker info >/dev/null 2>&1 && return
        sleep 0.5
    done
    tail -n 20 "$STATE/dockerd.log" >&2
    echo "dockerd did not answer within 60 s (log: $STATE/dockerd.log)" >&2
    return 1
}

build_base_image() {
    if docker image inspect "$BASE_IMAGE" >/dev/null 2>&1; then echo "   present"; return; fi
    local mirror rootfs=$STATE/rootfs
    mirror=$(debian_mirror)
    [ -n "$mirror" ] || { echo "no Debian mirror found in /etc/apt/sources*" >&2; return 1; }
    echo "   mirror: $mirror"
    rm -rf "$rootfs"
    debootstrap --variant=minbase bookworm "$rootfs" "$mirror" >"$STATE/debootstrap.log" 2>&1 \
        || { tail -n 20 "$STATE/debootstrap.log" >&2; return 1; }
    rm -f "$rootfs"/var/cache/apt/archives/*.deb
    tar -C "$rootfs" -c . | docker import - "$BASE_IMAGE" >/dev/null
    rm -rf "$rootfs"
}

# HTTPS here goes through a re-signing proxy: pip in the build needs this
# machine's CA bundle. Dockerfile.cuda uses it in a throwaway stage only.
build_product_image() {
    local ca_args=()
    if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
        mkdir -p .ci-state
        cp /etc/ssl/certs/ca-certificates.crt .ci-state/ca.crt
        ca_args=(--build-arg PIP_CA_BUNDLE=.ci-state/ca.crt)
    fi
    # The classic builder: Debian's docker.io has no buildx plugin for BuildKit.
    # the recipe's venv with ipykernel only: the image that carries its own ipykernel
    DOCKER_BUILDKIT=0 docker build -f Dockerfile.cuda --build-arg "BASE_IMAGE=$BASE_IMAGE" \
        --build-arg PACKAGES=ipykernel "${ca_args[@]}" -t "$PRODUCT_IMAGE" . >"$STATE/docker-build.log" 2>&1 \
        || { tail -n 30 "$STATE/docker-build.log" >&2; return 1; }
    echo "   $PRODUCT_IMAGE: $(docker image inspect -f '{{.Id}}' "$PRODUCT_IMAGE")"
}

# Images with nothing of gpusession's in them (scripts/ci-images.sh): the sessions' foreign images.
foreign_images() { bash scripts/ci-images.sh build; }

[ "$(id -u)" -eq 0 ] || { echo "ci-host-setup: run as root" >&2; exit 1; }
mkdir -p "$STATE"
T0=$EPOCHREALTIME
stage packages install_packages
stage nvidia-hook install_hook
stage dockerd start_dockerd
stage base-image build_base_image
stage product-image build_product_image
stage foreign-images foreign_images
STAGE=finished
echo "ci-host-setup: ready in $(since "$T0")"
