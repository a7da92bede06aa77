#!/usr/bin/env bash
# One command: set up everything the tests need on a fresh Debian machine, then run them.
#   as root: Debian packages (docker.io, openssh-server, chromium, ...), a Docker engine with the
#            GPU-request stub, the base and product images (scripts/ci-host-setup.sh), Slurm, and
#            (with Go) the Kubernetes test cluster, built beside the suite; its tests run beside
#            the others once it is built, on two workers of their own, their output shown last
#   always:  a virtualenv in .venv with gpusession[test] (this builds the JupyterLab extension)
# The suite runs in parallel workers (pytest-xdist; GPUSESSION_TEST_WORKERS, default 4: most of a
# test is waiting on kernels, containers and timers, so more workers than cores pay off), each
# with hosts of its own (tests/support/slots.py). docs/testing.md has the tiers and the figures.
#
#   scripts/test.sh [PYTEST ARGS]          everything: setup, lint, the JS tests, every test
#   scripts/test.sh --fast [PYTEST ARGS]   the fast tier only (no root, no services, no setup
#                                          beyond the virtualenv): the inner loop, under a minute
# Extra arguments go to pytest, e.g. scripts/test.sh -k docker
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
stage() { printf '[%5ss] %s\n' "$((SECONDS - start))" "$*"; }

fast=
if [ "${1:-}" = --fast ]; then
    fast=1
    shift
fi
workers=${GPUSESSION_TEST_WORKERS:-4}
UV_VERSION=0.13.9 # the installer of the test environment (venv below), pinned
# The tests start about a thousand Python processes (the CLI, kernels, runtimes, servers): each
# reads gpusession's bytecode from __pycache__ (and each worker its rewritten test modules)
# instead of compiling them again, which an environment with PYTHONDONTWRITEBYTECODE set made
# every one of them do (docs/testing.md: what that cost).
unset PYTHONDONTWRITEBYTECODE

venv() {
    stage "python environment (.venv)"
    [ -x .venv/bin/python ] || python3 -m venv .venv
    # uv installs the ~170 packages in seconds where pip took 106 s of this stage on a 2-core
    # machine (most of it byte-compiling every module of every package: a process here compiles
    # what it imports, once, into __pycache__); pip stays in the environment for the tests that
    # build and install the wheel as a user would (tests/test_wheel_install.py)
    .venv/bin/python -m pip install -q --upgrade pip "uv==$UV_VERSION"
    # --system-certs: the system's CA store, as pip's (/etc/pip.conf here names it; uv's own
    # roots refuse a TLS-inspecting proxy's certificate, and only SSL_CERT_FILE set saved it)
    .venv/bin/uv pip install -q --system-certs --python .venv/bin/python -e '.[test]'
}

if [ -n "$fast" ]; then
    # the installed environment is reused as it is (pip install -e '.[test]' makes it)
    [ -x .venv/bin/pytest ] && .venv/bin/python -c 'import gpusession, xdist' 2>/dev/null || venv
    # no waiting in this tier: as many workers as cores (GPUSESSION_TEST_WORKERS to change it)
    workers=${GPUSESSION_TEST_WORKERS:-auto}
    stage "fast tier: pytest -m 'not integration' ($workers workers)"
    exec .venv/bin/python -m pytest -m "not integration" -n "$workers" -p no:cacheprovider "$@"
fi

if [ "$(id -u)" = 0 ]; then
    stage "host setup (Docker engine, sshd, chromium, images)"
    bash scripts/ci-host-setup.sh
    bash scripts/ci-slurm.sh up # a real Slurm: controller, login node, two compute nodes (docs/slurm.md)
else
    stage "not root: skipping host setup; Docker and browser tests skip unless already set up"
fi

venv

stage "lint and format (ruff)"
.venv/bin/ruff check gpusession tests bench scripts/gen_docs.py
.venv/bin/ruff format --check gpusession tests bench scripts/gen_docs.py # `ruff format` owns line breaks

stage "labextension: typecheck and JS unit tests"
# the editable install above ran `jlpm install` there, unless its build was up to date
[ -x labextension/node_modules/.bin/tsc ] && [ -d labextension/node_modules/@types/node ] \
    || (cd labextension && ../.venv/bin/jlpm install >/dev/null)
if ! js_log=$(cd labextension && ../.venv/bin/jlpm typecheck 2>&1 && ../.venv/bin/jlpm test 2>&1); then
    printf '%s\n' "$js_log" | tail -n 80
    echo "labextension: typecheck or JS tests failed (cd labextension && jlpm typecheck && jlpm test)" >&2
    exit 1
fi
printf '%s\n' "$js_log" | grep -E '^ℹ (tests|fail) ' | tr '\n' ' ' || true
echo

selected=
for arg in "$@"; do  # a selection of its own (-m, -k, a path): one run, as asked
    case $arg in -m | -k | -m* | -k* | tests/*) selected=1 ;; esac
done
kube_job=
KUBE_FILES=(tests/test_kubernetes.py tests/test_kubernetes_browser.py)  # support/kube.py: KUBE_FILES
kube_log=${GPUSESSION_CI_STATE:-/var/lib/gpusession-ci}/kubernetes-build.log
kube_tests=$(mktemp -d)/kubernetes-tests.log
if [ -z "$selected" ] && [ "$(id -u)" = 0 ] && command -v go >/dev/null 2>&1; then
    # The Kubernetes test cluster is built from Go modules (scripts/ci-kubernetes.sh): nothing to do
    # when the CI state folder kept the build, ~30-45 min on a fresh machine. It builds at the
    # lowest priority beside the rest of the suite; once built, its tests run beside the others,
    # with their output kept until the others are done: on two workers of their own, the two slots
    # after the others' (tests/support/slots.py), one lane of tests each (one cluster, its GPUs
    # shared by a rule: tests/support/kube.py).
    stage "kubernetes test cluster: build, then its tests, in the background (build log $kube_log)"
    mkdir -p "$(dirname "$kube_log")"
    (
        bash scripts/ci-kubernetes.sh build >"$kube_log" 2>&1 || { echo "build failed" >"$kube_tests"; exit 90; }
        # its tests bring the cluster up; once they are done it goes down again, unless it was
        # up before this run: idle, its daemons (two kubelets, containerd, the API server, etcd)
        # kept taking CPU from the other tests for their last ten minutes
        was_up=$(bash scripts/ci-kubernetes.sh status >/dev/null 2>&1 && echo 1 || true)
        r=0
        # its two files only (tests/support/kube.py: every kubernetes test is in one of them):
        # collecting the whole suite again costs these workers ~10 s of CPU each
        .venv/bin/python -m pytest --dist loadgroup -m kubernetes "$@" "${KUBE_FILES[@]}" \
            --tx "popen//id=gw$workers" --tx "popen//id=gw$((workers + 1))" >"$kube_tests" 2>&1 || r=$?
        [ "$r" = 5 ] && r=0  # none selected
        if [ -z "$was_up" ]; then
            t0=$SECONDS
            bash scripts/ci-kubernetes.sh down >>"$kube_log" 2>&1 || true
            echo "ci-kubernetes: down after its tests in $((SECONDS - t0)) s" >>"$kube_log"
        fi
        exit "$r"
    ) &
    kube_job=$!
fi

stage "tests ($workers workers; tests that share one machine-wide thing run in one xdist group)"
if [ -z "$kube_job" ]; then  # kubernetes tests skip, saying so, when its cluster is not built
    exec .venv/bin/python -m pytest -n "$workers" --dist loadgroup "$@"
fi
rc=0
.venv/bin/python -m pytest -n "$workers" --dist loadgroup -m "not kubernetes" "$@" || rc=$?

stage "kubernetes test cluster: waiting for its build and tests"
r=0
wait "$kube_job" || r=$?
if [ "$r" = 90 ]; then
    tail -n 40 "$kube_log"
    echo "scripts/ci-kubernetes.sh build failed (log: $kube_log)" >&2
    exit 1
fi
tail -n 2 "$kube_log"
stage "tests on the kubernetes cluster (run beside the others, two workers: its two lanes)"
cat "$kube_tests"
[ "$r" = 0 ] || rc=$r
exit "$rc"
