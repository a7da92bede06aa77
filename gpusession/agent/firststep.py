"""`python -m gpusession.agent.firststep run ARGS...` (what the runtime bundle's boot.sh runs):
the session kernel's process first (gpusession.agent.kernelspawn.early_kernel), then the runtime
(`gpusession.agent.kernel_runtime`: argparse, the protocol's types, the agent's HTTP side) loads
while the kernel boots, and takes that kernel over. A bare `docker run` of a kernel has the kernel as
its first process; before ours come only Python's start and a few cheap modules.
Python 3.9 syntax.
"""

from __future__ import annotations

import os
import sys

from .kernelspawn import early_kernel


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    early = None
    if argv[:1] == ["run"]:
        try:
            early = early_kernel(argv[1:])
        except Exception:  # noqa: BLE001 - the runtime starts it the usual way and reports what fails, with the stage
            early = None
    try:
        # lazy: docs/architecture.md#imports-kept-inside-functions
        from .kernel_runtime import main as run

        return run(argv, early=early)
    except BaseException:
        if (
            early is not None and early[0].poll() is None
        ):  # the runtime never took it: not left behind
            try:
                os.killpg(early[0].pid, 9)
            except ProcessLookupError:
                pass
        raise


if __name__ == "__main__":
    raise SystemExit(main())
