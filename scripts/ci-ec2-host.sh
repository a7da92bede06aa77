#!/usr/bin/env bash
# The network side of the aws backend's test instances, on this machine: network namespace
# gpus-ec2 (10.201.0.2 inside, 10.201.0.1 on this side) with its own dockerd. The tests'
# fake platform (tests/support/ec2_platform.py) plays each EC2 instance there: it reads the
# instance's user data from the local EC2 API, starts an sshd at 10.201.0.2 with the host key
# and logins the user data gives, and runs the user data's commands against this dockerd.
#   scripts/ci-ec2-host.sh up     start it (idempotent); needs scripts/ci-host-setup.sh first
#   scripts/ci-ec2-host.sh down   stop dockerd, remove the namespace
# GPUSESSION_TEST_SLOT=N (N > 0; a pytest-xdist worker's number, tests/support/slots.py) makes
# host N of its own: gpus-ec2-N at 10.201.N.2, its own state and engine.
set -euo pipefail

SLOT=${GPUSESSION_TEST_SLOT:-0}
CI_STATE=${GPUSESSION_CI_STATE:-/var/lib/gpusession-ci}
if [ "$SLOT" = 0 ]; then
    NS=gpus-ec2 HOST_IF=gpus-ec2-h NS_IF=gpus-ec2-n
    STATE=$CI_STATE/ec2           # kept by `down`: the image store
    RUN=/run/gpus-ec2             # socket and pid file
else
    NS=gpus-ec2-$SLOT HOST_IF=gpus-e$SLOT-h NS_IF=gpus-e$SLOT-n
    STATE=$CI_STATE/ec2-$SLOT RUN=/run/gpus-ec2-$SLOT
fi
HOST_IP=10.201.$SLOT.1 NS_IP=10.201.$SLOT.2
SOCK=unix://$RUN/docker.sock
IMAGE=${GPUSESSION_TEST_IMAGE:-gpusession/cuda:ci}

NAME=ci-ec2-host
# shellcheck source=lib/netns-docker-host.sh
source "$(dirname "$0")/lib/netns-docker-host.sh"

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
    dockerd_down
    network_down
    echo "ci-ec2-host: down"
}

case "${1:-}" in
    up) up ;;
    down) down ;;
    *) echo "usage: $0 up|down" >&2; exit 2 ;;
esac
