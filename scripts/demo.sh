#!/usr/bin/env bash
# One command: install gpusession in .venv and run the quickstart notebook headless on the
# embedded default backend (local: a separate kernel process; no Docker, GPU or cloud needed).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q .
exec .venv/bin/gpusession demo "$@"
