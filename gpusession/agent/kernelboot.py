"""`python -m gpusession.agent.kernelboot DEPS -f CONNECTION_FILE ...`: an IPython kernel from the
runtime bundle's ipykernel (folder DEPS), for an image without one.

DEPS goes first on sys.path while ipykernel starts, so that it loads the versions it was bundled
with, and last once the kernel is up, so that whatever the user imports later comes from the
image first (its numpy, its pandas...). Standard library only; Python 3.9 syntax.
"""

from __future__ import annotations

import sys


def main() -> None:
    deps = sys.argv.pop(1)
    if sys.path and sys.path[0] in ("", "."):
        del sys.path[0]  # as ipykernel_launcher does: the cwd must not shadow packages
    sys.path.insert(0, deps)
    from ipykernel.kernelapp import IPKernelApp

    app = IPKernelApp.instance()
    app.initialize()
    sys.path.remove(deps)
    sys.path.append(deps)
    app.start()


if __name__ == "__main__":
    main()
