"""IPython extension loaded into the session kernel: records when cells run.

The agent reads the file it writes (no ZMQ needed on the agent side) to tell a busy kernel from
an idle one. Writes are atomic renames, so a reader never sees half a file.
"""

from __future__ import annotations

import json
import os
import time

from ..protocol import ENV_STATE_DIR

_state = {"busy": False, "last_activity": time.time(), "cells": 0}


def _path() -> str | None:
    d = os.environ.get(ENV_STATE_DIR)
    return os.path.join(d, "activity.json") if d else None


def _write() -> None:
    path = _path()
    if not path:
        return
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(_state, f)
    os.replace(tmp, path)


def _pre_run_cell(info=None) -> None:
    _state["busy"] = True
    _state["last_activity"] = time.time()
    _state["cells"] += 1
    _write()


def _post_run_cell(result=None) -> None:
    _state["busy"] = False
    _state["last_activity"] = time.time()
    _write()


def load_ipython_extension(ip) -> None:
    ip.events.register("pre_run_cell", _pre_run_cell)
    ip.events.register("post_run_cell", _post_run_cell)
    _write()


def read_activity(state_dir: str) -> dict:
    """What the agent calls: {'busy': bool, 'last_activity': unix s, 'cells': n}."""
    try:
        with open(os.path.join(state_dir, "activity.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {"busy": False, "last_activity": None, "cells": 0}
