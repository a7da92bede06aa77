"""Variables moved from a notebook's own kernel into the GPU session its kernel becomes ("Run this
notebook on a GPU…", as Colab's "Change runtime type" but keeping what was computed).

1. `stage(manager)`: a private folder in the store's data folder (mode 0700) and the code that
   the notebook's current kernel runs to save its variables there, with the checkpoint's own
   format (gpusession.agent.checkpoint: one pickle a variable, modules as imports, what cannot
   move listed with why), printing one `CARRY_MARK` line with what it saved.
2. The notebook's kernel changes to the GPU kernel (a session of its own).
3. `carry_into(session, folder)`: the folder goes into the session with an upload over the
   session's own connection, its kernel restores it as a `--resume` does
   (gpusession.agent.checkpoint_read.restore) and removes it; the folder here is removed too.
   Answers what came back, what failed and what was left behind, for the notebook's notice.

Needs gpusession importable by the notebook's kernel (it is, in the Python JupyterLab runs);
where it is not, the save's answer says so and nothing moves.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

from ..core.errors import BadInput, GpuSessionError
from ..transport.kernel.sink import NullSink
from .handle import Session

CARRY_MARK = "GPUSESSION_CARRY"  # the line each side prints its JSON answer on
REMOTE_DIR = ".gpusession-carry"  # below the session kernel's working directory, removed after
SAVE_BOUND_S = 600  # how long the notebook's kernel may take to save (GBs of arrays)
STALE_S = 86400.0  # a staging folder older than this was never moved: removed at the next stage

_SAVE = """
def _gpusession_carry(folder):
    import json, time
    try:
        from gpusession.agent.checkpoint import save, user_variables
        result = save(user_variables(get_ipython()), folder, deadline=time.time() + {bound},
                      cap_bytes=None)
        said = {{k: result.get(k) for k in ("saved", "bytes", "skipped", "committed", "error")}}
    except Exception as exc:
        said = {{"error": "%s: %s" % (type(exc).__name__, exc)}}
    print("{mark} " + json.dumps(said))
_gpusession_carry({folder!r})
del _gpusession_carry
"""

_RESTORE = """
def _gpusession_carry(folder):
    import json, shutil
    try:
        from gpusession.agent.checkpoint_read import restore
        said = restore(get_ipython().user_ns, folder)
    except Exception as exc:
        said = {{"error": "%s: %s" % (type(exc).__name__, exc)}}
    shutil.rmtree(folder, ignore_errors=True)
    print("{mark} " + json.dumps(said, default=str))
_gpusession_carry({folder!r})
del _gpusession_carry
"""


def carry_root(data_path: Path) -> Path:
    """Where staged folders live: the store's data folder (the owner's alone)."""
    return data_path / "carry"


def stage(data_path: Path) -> dict[str, str]:
    """A new private staging folder and the code the notebook's kernel runs to save into it."""
    root = carry_root(data_path)
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(root, 0o700)
    for old in root.iterdir():  # left by a kernel change that never came back for them
        if time.time() - old.stat().st_mtime > STALE_S:
            shutil.rmtree(old, ignore_errors=True)
    folder = root / uuid.uuid4().hex
    folder.mkdir(mode=0o700)
    return {
        "folder": str(folder),
        "code": _SAVE.format(bound=SAVE_BOUND_S, mark=CARRY_MARK, folder=str(folder)).strip(),
    }


def staged_folder(data_path: Path, folder: Any) -> Path:
    """`folder` as given back by a face: one that `stage` made here, else BadInput."""
    root = carry_root(data_path).resolve()
    if not isinstance(folder, str) or not folder:
        raise BadInput("'folder': the staging folder that POST carry answered, as text")
    path = Path(folder).resolve()
    if path.parent != root or not path.is_dir():
        raise BadInput(f"{folder!r} is not a staging folder of this server (POST carry makes one)")
    return path


class _Said(NullSink):
    """The marked line a kernel prints, and nothing shown anywhere."""

    def __init__(self) -> None:
        self.text = ""

    def stream(self, name: str, text: str) -> None:
        if name == "stdout":
            self.text += text


def marked(text: str) -> dict | None:
    """The JSON on a CARRY_MARK line of `text`, or None."""
    for line in text.splitlines():
        if line.startswith(CARRY_MARK + " "):
            return json.loads(line[len(CARRY_MARK) + 1 :])
    return None


def carry_into(session: Session, folder: Path) -> dict:
    """Move the staged variables into `session`'s kernel; the staging folder is removed either
    way. Answers {"restored", "imports", "failed", "skipped"} (checkpoint_read.restore's words),
    or raises GpuSessionError naming what did not work."""
    try:
        sent = session.upload([str(folder)], to=REMOTE_DIR, everything=True)
        remote = f"{(sent.get('dest') or REMOTE_DIR).rstrip('/')}/{folder.name}"
        said = _Said()
        session.run(_RESTORE.format(mark=CARRY_MARK, folder=remote).strip(), sink=said)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    answer = marked(said.text)
    if answer is None or answer.get("error") or not answer.get("found", False):
        why = (answer or {}).get("error") or "the session's kernel found no saved variables"
        raise GpuSessionError(f"the variables could not be restored in {session.name}: {why}")
    return {k: answer.get(k) or [] for k in ("restored", "imports", "failed", "skipped")}
