"""Which test worker this is, and so which of the machine-wide test hosts are its own.

pytest-xdist runs the suite in worker processes gw0, gw1, ...; each worker is a *slot* (its
number; 0 without xdist). A resource that is one per machine (a network namespace, an address, a
daemon's socket) is made once per slot, so two workers never share one:

- the ssh:// Docker host: gpus-remote (slot 0) or gpus-remote-N, at 10.200.N.2
  (scripts/ci-remote-host.sh, tests/support/hosts.py);
- the aws instances' host: gpus-ec2 or gpus-ec2-N, at 10.201.N.2 (scripts/ci-ec2-host.sh,
  tests/support/ec2_platform.py);
- the aws tests' private registry on 10.201.N.1 (tests/support/ec2_registry.py).

What stays one per machine (the Slurm cluster, the ECR name in /etc/hosts) is shared by the tests
that need it through one xdist group (`pytest.mark.xdist_group`), so they run one after another on
one worker (docs/testing.md)."""

from __future__ import annotations

import os

MAX_SLOTS = 16  # addresses 10.200.N.x / 10.201.N.x: keep N small and interface names short


def slot() -> int:
    """This worker's number: 0 for gw0 or without xdist, 1 for gw1, ..."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    number = int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else 0
    if number >= MAX_SLOTS:
        raise RuntimeError(f"at most {MAX_SLOTS} test workers (-n) have hosts of their own")
    return number


def suffix() -> str:
    """'' for slot 0 (the names the docs use), '-N' for slot N."""
    n = slot()
    return f"-{n}" if n else ""


def script_env() -> dict[str, str]:
    """The environment for scripts/ci-*-host.sh: this worker's slot."""
    return dict(os.environ, GPUSESSION_TEST_SLOT=str(slot()))
