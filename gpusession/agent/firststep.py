"""`python -m gpusession.agent.firststep run ARGS...` (what the runtime bundle's boot.sh runs):
the session kernel's process first (gpusession.agent.kernelspawn.early_kernel: a fork of this
process, whose Python has started, runs the kernel where a fresh start would be the same); the
KERNEL and READY lines said here as soon as it runs and listens (announce_early: the agent's
port bound first); then the runtime (`gpusession.agent.kernel_runtime`: argparse, the
protocol's types, the agent's HTTP side) loads, and takes that kernel over. A bare `docker run`
of a kernel has the kernel as its first process; before ours come only Python's start and a few
cheap modules, and the runtime's imports no longer take CPU from the kernel's boot.
Python 3.9 syntax.
"""

from __future__ import annotations

import os
import sys

from .kernelspawn import (
    Early,
    announce_early,
    drop_zygote,
    early_kernel,
    settled,
    take_zygote,
)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    early = None
    zygote = take_zygote()  # a kernel begun before the runtime (the Kubernetes pod's command)
    if argv[:1] == ["run"]:
        try:
            early = Early(*early_kernel(argv[1:], zygote))
        except Exception:  # noqa: BLE001 - the runtime starts it the usual way and reports what fails, with the stage
            early = None
    if early is None or early.kernel.pid != zygote:
        drop_zygote(zygote)
    if early is not None:
        try:
            announce_early(early, argv[1:])
        except Exception:  # noqa: BLE001 - the runtime says what was not said
            pass
        if early.ready_said:
            settled(early.kernel.pid)
    try:
        # lazy: docs/architecture.md#imports-kept-inside-functions
        from .kernel_runtime import main as run

        return run(argv, early=early)
    except BaseException:
        if (
            early is not None and early.kernel.poll() is None
        ):  # the runtime never took it: not left behind
            try:
                os.killpg(early.kernel.pid, 9)
            except ProcessLookupError:
                pass
        raise


if __name__ == "__main__":
    raise SystemExit(main())
