#!/usr/bin/env bash
# Every foreign image of scripts/ci-images.sh on every engine: this machine's, ssh:// (the namespace
# host) and the EC2 test path (moto + the gpus-ec2 namespace host). CI runs all of it on the local
# engine and a slice on ssh:// and EC2 (tests/test_foreign_images.py, tests/test_aws_e2e.py
# EC2_SLICE); this runs the rest too.
# About 6-8 minutes on 2 cores. Needs what scripts/test.sh sets up (ci-host-setup.sh, ci-images.sh).
#   scripts/foreign-matrix.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
GPUSESSION_FOREIGN_MATRIX=full PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} exec "$PY" -m pytest -q -p no:cacheprovider -rs \
    tests/test_foreign_images.py "tests/test_aws_e2e.py::test_a_foreign_image_gets_the_runtime_and_runs_with_its_own_python" \
    tests/test_aws_e2e.py::test_an_image_without_python_fails_in_one_line_and_leaves_nothing "$@"
