#!/usr/bin/env bash
# One command: install gpusession in .venv and run the quickstart notebook headless on the
# embedded default backend (local: a separate kernel process; no Docker, GPU or cloud needed).
# Its GPU values are a replay of a real driver's, labelled "recorded" (docs/panel.md); set
# GPUSESSION_NVML_REPLAY= (empty) for this machine's own GPUs.
set -euo pipefail
cd "$(dirname "$0")/.."
export GPUSESSION_NVML_REPLAY="${GPUSESSION_NVML_REPLAY-$PWD/tests/data/nvml_two_t4.json}"
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q .
exec .venv/bin/gpusession demo "$@"
