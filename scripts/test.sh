#!/usr/bin/env bash
# One command: set up everything the tests need on a fresh Debian machine, then run them.
#   as root: Debian packages (docker.io, openssh-server, chromium, ...), a Docker engine with the
#            GPU-request stub, the base and product images (scripts/ci-host-setup.sh)
#   always:  a virtualenv in .venv with gpusession[test] (this builds the JupyterLab extension)
# Extra arguments go to pytest, e.g. scripts/test.sh -k docker
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
stage() { printf '[%5ss] %s\n' "$((SECONDS - start))" "$*"; }

if [ "$(id -u)" = 0 ]; then
  stage "host setup (Docker engine, sshd, chromium, images)"
  bash scripts/ci-host-setup.sh
else
  stage "not root: skipping host setup; Docker and browser tests skip unless already set up"
fi

stage "python environment (.venv)"
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[test]'

stage "tests"
exec .venv/bin/python -m pytest "$@"
