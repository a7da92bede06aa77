#!/usr/bin/env bash
# The foreign images the tests start sessions from, built locally from Debian's package registry
# (no registry pull): none has sshd, ipykernel or gpusession.
#   gpusession-ci/py-bookworm      Debian 12 with python3 (3.11) only, root
#   gpusession-ci/py-trixie        Debian 13 with python3 (3.13) only, root (its own debootstrap)
#   gpusession-ci/py-opt           Python only under /opt/conda/bin, not on PATH (a conda-like layout)
#   gpusession-ci/py-nonroot       py-bookworm with USER jovyan (uid 1000), as jupyter/docker-stacks
#   gpusession-ci/no-python        Debian without any Python
#   gpusession-ci/py-numpy         py-nonroot with Debian's python3-numpy and python3-pandas (saved arrays)
#   gpusession-ci/pytorch-standin  the default image's shape (pytorch/pytorch): /opt/conda/bin first on
#                                  PATH, a `torch` module with torch.cuda.get_device_name(), /workspace
# Each carries a label with the hash of its recipe: an image whose recipe changed is built again,
# one that is up to date is skipped (~0.1 s).
#   scripts/ci-images.sh build     build what is missing or stale (needs local/debian:bookworm)
#   scripts/ci-images.sh list      the image names, one a line (for copying them to other engines)
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=lib/debian-mirror.sh
source scripts/lib/debian-mirror.sh

STATE=${GPUSESSION_CI_STATE:-/var/lib/gpusession-ci}
BASE=local/debian:bookworm
PREFIX=gpusession-ci
IMAGES=(py-bookworm py-trixie py-opt py-nonroot no-python pytorch-standin py-numpy)
LABEL=gpusession.ci-recipe

recipe_py_bookworm() {
    cat <<EOF
FROM $BASE
RUN apt-get update && apt-get install -y --no-install-recommends python3 \\
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb
CMD ["python3"]
EOF
}

# Debian's python3.11, moved: python finds its standard library next to its binary
recipe_py_opt() {
    cat <<EOF
FROM $PREFIX/py-bookworm
RUN mkdir -p /opt/conda/bin /opt/conda/lib \\
 && cp -a /usr/lib/python3.11 /opt/conda/lib/ \\
 && cp /usr/bin/python3.11 /opt/conda/bin/python3.11 && ln -s python3.11 /opt/conda/bin/python3 \\
 && rm -rf /usr/bin/python3* /usr/lib/python3 /usr/lib/python3.11 \\
 && /opt/conda/bin/python3 -c 'import json, ssl, sqlite3' && ! command -v python3
CMD ["/opt/conda/bin/python3"]
EOF
}

recipe_py_nonroot() {
    cat <<EOF
FROM $PREFIX/py-bookworm
RUN useradd -m -u 1000 -s /bin/sh jovyan
USER jovyan
WORKDIR /home/jovyan
EOF
}

recipe_py_numpy() {
    cat <<EOF
FROM $PREFIX/py-nonroot
USER root
RUN apt-get update && apt-get install -y --no-install-recommends python3-numpy python3-pandas \\
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb
USER jovyan
EOF
}

recipe_pytorch_standin() {
    cat <<'EOF'
FROM gpusession-ci/py-opt
ENV PATH=/opt/conda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    NVIDIA_VISIBLE_DEVICES=all NVIDIA_DRIVER_CAPABILITIES=compute,utility
RUN mkdir -p /opt/conda/lib/python3.11/torch /workspace \
 && printf '%s\n' \
    '"""A stand-in for torch in tests: the shape of pytorch/pytorch, no CUDA."""' \
    '__version__ = "0.0+gpusession.standin"' \
    'from . import cuda' >/opt/conda/lib/python3.11/torch/__init__.py \
 && printf '%s\n' \
    'def is_available():' \
    '    return False' \
    'def get_device_name(device=None):' \
    '    try:' \
    '        import pynvml' \
    '        pynvml.nvmlInit()' \
    '        return pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(device or 0))' \
    '    except Exception:' \
    '        return "stand-in GPU (no NVIDIA driver here)"' >/opt/conda/lib/python3.11/torch/cuda.py
WORKDIR /workspace
EOF
}

digest() { sha256sum | cut -c1-16; }

current() {  # current NAME HASH: is the image there, built from this recipe?
    [ "$(docker image inspect -f "{{ index .Config.Labels \"$LABEL\" }}" "$1" 2>/dev/null)" = "$2" ]
}

build_from_recipe() {  # build_from_recipe NAME FUNCTION
    local name=$PREFIX/$1 hash
    hash=$("$2" | digest)
    if current "$name" "$hash"; then echo "   $name: up to date"; return; fi
    { "$2"; echo "LABEL $LABEL=$hash"; } | DOCKER_BUILDKIT=0 docker build -q -t "$name" - >"$STATE/image-$1.log" 2>&1 \
        || { tail -n 20 "$STATE/image-$1.log" >&2; return 1; }
    echo "   $name: built"
}

build_trixie() {  # its own debootstrap: no image of Debian 13 to start from
    local name=$PREFIX/py-trixie mirror hash rootfs=$STATE/rootfs-trixie
    hash=$(echo "debootstrap minbase trixie python3 v1" | digest)
    if current "$name" "$hash"; then echo "   $name: up to date"; return; fi
    mirror=$(debian_mirror)
    [ -n "$mirror" ] || { echo "no Debian mirror found in /etc/apt/sources*" >&2; return 1; }
    rm -rf "$rootfs"
    debootstrap --variant=minbase --include=python3 trixie "$rootfs" "$mirror" >"$STATE/debootstrap-trixie.log" 2>&1 \
        || { tail -n 20 "$STATE/debootstrap-trixie.log" >&2; return 1; }
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
    tar -C "$rootfs" -c . | docker import --change "LABEL $LABEL=$hash" --change 'CMD ["python3"]' - "$name" >/dev/null
    rm -rf "$rootfs"
    echo "   $name: built ($(docker run --rm "$name" python3 -V))"
}

build() {
    docker image inspect "$BASE" >/dev/null 2>&1 || { echo "ci-images: no $BASE; run scripts/ci-host-setup.sh" >&2; exit 1; }
    mkdir -p "$STATE"
    build_from_recipe py-bookworm recipe_py_bookworm
    build_trixie
    build_from_recipe py-opt recipe_py_opt
    build_from_recipe py-nonroot recipe_py_nonroot
    build_from_recipe pytorch-standin recipe_pytorch_standin
    build_from_recipe py-numpy recipe_py_numpy
    docker tag "$BASE" "$PREFIX/no-python"
    echo "   $PREFIX/no-python: $BASE"
}

case "${1:-}" in
    build) build ;;
    list) printf "$PREFIX/%s\n" "${IMAGES[@]}" ;;
    *) echo "usage: $0 build|list" >&2; exit 2 ;;
esac
