"""IPython extension loaded into the session kernel: records when cells run, and when the kernel
is asked to restart.

The agent reads the file it writes (no ZMQ needed on the agent side) to tell a busy kernel from
an idle one. Writes are atomic renames, so a reader never sees half a file.

A shutdown_request with `restart: true` (JupyterLab's restart, through the kernel provisioner)
leaves RESTART_FILE next to it before the kernel exits: the runtime then starts a fresh kernel in
the same session rather than ending the session. Only the kernel sees that request's content.
"""

from __future__ import annotations

import json
import os
import threading
import time

from ..core.envnames import ENV_STATE_DIR, RESTART_FILE
from ..core.kernelwire import TRANSFER_REQUEST, is_out_of_memory
from .cellog import install as install_cell_log

# reached: a client's first kernel_info came (the start reached this kernel); till then the
# agent's idle clock waits (gpusession.agent.idle: a slow boot or connect is not idleness)
_state = {
    "busy": False,
    "last_activity": time.time(),
    "cells": 0,
    "reached": False,
    "oom_errors": 0,  # cells that failed for want of GPU memory (right-sizing advice)
}
_written = [0.0]  # when activity.json was last written
_writing = threading.Lock()  # a download's raw stream touches from its own thread


def _path() -> str | None:
    d = os.environ.get(ENV_STATE_DIR)
    return os.path.join(d, "activity.json") if d else None


def _write() -> None:
    _written[0] = time.time()
    path = _path()
    if not path:
        return
    tmp = path + ".tmp"
    with _writing:
        with open(tmp, "w") as f:
            json.dump(_state, f)
        os.replace(tmp, path)


def _pre_run_cell(info=None) -> None:
    _state["busy"] = True
    _state["last_activity"] = time.time()
    _state["cells"] += 1
    _write()


def touch(force: bool = False) -> None:
    """Something used the kernel without running a cell (a push, pull, upload or download): the
    idle clock starts again. Written at most once a second (a transfer sends many requests)
    unless `force`."""
    now = time.time()
    _state["last_activity"] = now
    if force or now - _written[0] >= 1.0:
        _write()


def _post_run_cell(result=None) -> None:
    _state["busy"] = False
    error = getattr(result, "error_in_exec", None)
    if error is not None and is_out_of_memory(f"{type(error).__name__}: {error}"):
        _state["oom_errors"] += 1
    _state["last_activity"] = time.time()
    _write()


def _mark_restart() -> None:
    d = os.environ.get(ENV_STATE_DIR)
    if d:
        with open(os.path.join(d, RESTART_FILE), "w") as f:
            f.write(str(time.time()))


def _hook_restart(kernel) -> None:
    """Wrap the kernel's do_shutdown (sync or async, by ipykernel version) to mark a restart."""
    original = getattr(kernel, "do_shutdown", None)
    if original is None:
        return

    def do_shutdown(restart, *args, **kwargs):
        if restart:
            _mark_restart()
        return original(restart, *args, **kwargs)

    kernel.do_shutdown = do_shutdown


def _hook_kernel_info(kernel) -> None:
    """The first kernel_info a client asks is the starting client reaching the kernel: the idle
    clock starts again then, so a slow connect is not counted as idleness. Later ones (a panel
    or another process attaching to look) are not activity."""
    original = kernel.shell_handlers.get("kernel_info_request")
    if original is None:
        return

    def kernel_info_request(
        *args, **kwargs
    ):  # the original's awaitable (ipykernel >= 6) is returned
        kernel.shell_handlers["kernel_info_request"] = original
        _state["reached"] = True
        touch(force=True)
        return original(*args, **kwargs)

    kernel.shell_handlers["kernel_info_request"] = kernel_info_request


def load_ipython_extension(ip) -> None:
    ip.events.register("pre_run_cell", _pre_run_cell)
    ip.events.register("post_run_cell", _post_run_cell)
    if getattr(ip, "kernel", None) is not None:
        _hook_restart(ip.kernel)
        _hook_kernel_info(ip.kernel)
        # every output numbered and kept a while: a tunnel cut loses none
        install_cell_log(ip.kernel)
        _install_transfers(ip.kernel)  # %gpu push/pull/upload/download on the shell channel
    _write()


def _install_transfers(kernel) -> None:
    """The transfer handler (gpusession.agent.transfer_handler) loaded at the first transfer
    request, not at the kernel's start: its modules (tar, the raw stream, the kinds of transfer)
    are ~8 ms of imports on the way to the kernel's first answer, which most sessions' kernels
    never need."""
    loaded: list = []

    def handle(*args, **kwargs):
        if not loaded:
            # lazy: docs/architecture.md#imports-kept-inside-functions
            from .transfer_handler import install

            loaded.append(install(kernel, touch).handle)
        return loaded[0](*args, **kwargs)

    kernel.shell_handlers[TRANSFER_REQUEST] = handle


def read_activity(state_dir: str) -> dict:
    """What the agent calls: {'busy': bool, 'last_activity': unix s, 'cells': n, 'reached': bool}
    (no file yet: the kernel has not loaded this extension, nobody reached it)."""
    try:
        with open(os.path.join(state_dir, "activity.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {"busy": False, "last_activity": None, "cells": 0, "reached": False}
