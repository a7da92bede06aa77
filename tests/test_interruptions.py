"""Sessions survive their capacity going away: a notice (a spot interruption, a rebalance
recommendation: files in the agent's notice folder, as an instance's boot script writes them from
instance metadata, and a Slurm job's batch shell when --signal=B:USR1 reaches it) makes the agent
save the namespace at once; a spot notice then ends the session, recorded as interrupted with its
state saved, and `--resume` picks the checkpoint up. The cell running at the notice is said to be
cut, never re-run.

Real kernels on the local backend, a real notebook kernel for the magic's words, the CLI as a
subprocess. The AWS path (the boot script polling instance metadata) is in test_aws_e2e.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from gpusession.agent.checkpoint_read import read_manifest
from gpusession.core.models import State
from gpusession.core.protocol import Marker, StopKind, find_markers
from gpusession.session.store import Store
from gpusession.transport.tarsafe import PART
from support.waits import wait_until

# integration: starts kernels, the agent or servers (tests/conftest.py: the fast tier starts none)
pytestmark = pytest.mark.integration

NOTICE = {"action": "terminate", "time": "2026-12-01T20:00:00Z"}


def _busy(state_dir: Path) -> bool:
    try:
        return bool(json.loads((state_dir / "activity.json").read_text()).get("busy"))
    except (OSError, ValueError):
        return False


def _notify(state_dir: Path, name: str, doc: dict) -> None:
    """What an instance's boot script does when instance metadata says so."""
    folder = state_dir / "notices"
    folder.mkdir(exist_ok=True)
    (folder / (name + ".tmp")).write_text(json.dumps(doc))
    os.replace(folder / (name + ".tmp"), folder / name)


def _started(notebook, nb_env, name_and_options: str, cell: str) -> tuple[Store, Path]:
    """A local session started from the notebook (`--name NAME [options]`) that ran `cell`:
    the store the notebook writes, and the session's state folder (its agent's notices)."""
    start = notebook.run(
        f"%gpu start --type t4 --backend local --idle off --name {name_and_options}"
    )
    assert start.status == "ok", start.text
    assert notebook.run(f"%%gpu\n{cell}").status == "ok"
    store = Store(Path(nb_env["GPUSESSION_HOME"]) / "sessions.sqlite3")
    return store, Path(store.get(name_and_options.split()[0]).resource["state_dir"])


def test_a_spot_notice_during_a_cell_saves_ends_and_resumes_without_rerunning_it(notebook, nb_env):
    store, state_dir = _started(notebook, nb_env, "sp", "kept = {'k': 41}")

    def notice_while_busy():
        wait_until(lambda: _busy(state_dir), 30, "the cell to run", 0.1)
        _notify(state_dir, "spot-instance-action.json", NOTICE)

    threading.Thread(target=notice_while_busy, daemon=True).start()
    t0 = time.monotonic()
    cut = notebook.run(
        "%%gpu\nimport time\nopen('ran.txt', 'a').write('x')\n"
        "for i in range(600):\n    time.sleep(0.1)\nafter = 1"
    )
    assert time.monotonic() - t0 < 30, "the cell ran on after the notice"
    assert cut.status == "error", cut.text
    said = cut.text
    assert (
        "session sp ended: its cloud took the spot capacity back (notice: terminate at" in said
    ), said
    # the namespace as the notice found it, mid-cell: `i` of the running loop too
    assert "saved 2 variables and 1 import" in said, said
    assert "resume with `%gpu start --resume sp`" in said, said
    assert "this cell was interrupted when session sp ended: it is not re-run" in said, said

    record = store.get("sp")
    assert record.state == State.STOPPED and record.stop_reason.kind is StopKind.SPOT_INTERRUPTION
    assert record.resource["agent_summary"]["checkpoint"]["for"] == "spot-interruption"
    log = (state_dir / "runtime.log").read_text()
    (marker,) = find_markers(log, Marker.CHECKPOINT)
    assert (
        marker["committed"] and marker["notice"] == NOTICE and marker["for"] == "spot-interruption"
    )

    def listed() -> str:  # without --all: what an interruption saved is still to be resumed
        return subprocess.run(
            [sys.executable, "-m", "gpusession", "list"],
            env=nb_env,
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout

    table = listed()
    (row,) = [line for line in table.splitlines() if line.split()[:1] == ["sp"]]
    assert "interrupted, state saved" in row, table

    again = notebook.run("%gpu start --type t4 --backend local --idle off --name sp2 --resume sp")
    assert again.status == "ok", again.text
    assert "workspace sp: restored 3 name(s)" in again.text and "kept" in again.text, again.text
    back = notebook.run("%%gpu\nprint(kept['k'] + 1, open('ran.txt').read(), 'after' in dir())")
    assert back.text.strip().endswith("42 x False"), back.text  # restored; the cut cell not re-run
    notebook.run("%gpu stop")
    table = listed()  # resumed: its workspace went on in sp2, nothing is left to resume
    assert not [line for line in table.splitlines() if line.split()[:1] == ["sp"]], table


def test_a_rebalance_notice_and_slurms_signal_save_and_the_session_goes_on(manager):
    session = manager.start(
        manager.make_spec("t4", backend="local", idle="off", name="rb", save_timeout="off")
    )
    assert session.run("x = list(range(10))")["status"] == "ok"
    state_dir = Path(session.record.resource["state_dir"])
    workspace = manager.backend("local").workspace_dir("rb")

    _notify(state_dir, "rebalance-recommendation.json", {"noticeTime": "2026-12-01T19:59:00Z"})
    manifest = wait_until(lambda: read_manifest(str(workspace)), 20, "the rebalance save", 0.1)
    assert manifest["for"] == "rebalance" and [v["name"] for v in manifest["variables"]] == ["x"]

    assert session.run("y = 2")["status"] == "ok"
    # what a Slurm job's batch shell writes when sbatch --signal=B:USR1@GRACE signals it
    _notify(state_dir, "scheduler-signal.json", {"signal": "USR1"})
    manifest = wait_until(
        lambda: (m := read_manifest(str(workspace))) and m.get("for") == "scheduler-signal" and m,
        20,
        "the save on the scheduler's signal",
        0.1,
    )
    assert [v["name"] for v in manifest["variables"]] == ["x", "y"]
    # neither ends the session: the capacity is still there
    assert session.run("print(len(x) + y)")["status"] == "ok"
    assert manager.refresh_state("rb").state == State.RUNNING
    marks = wait_until(  # the marker comes once the agent has the kernel's answer
        lambda: (
            (m := find_markers((state_dir / "runtime.log").read_text(), Marker.CHECKPOINT))
            and len(m) == 2
            and m
        ),
        10,
        "both saves' markers",
        0.1,
    )
    assert [(m["for"], m["committed"]) for m in marks] == [
        ("rebalance", True),
        ("scheduler-signal", True),
    ], marks
    manager.stop("rb")


def test_with_recover_the_notebook_continues_on_a_replacement(notebook, nb_env):
    """--recover on (auto: on for --spot): the cell cut by the notice says so, a replacement of
    the same name restores the saved state, becomes the notebook's session, and the next cell
    runs there."""
    store, state_dir = _started(
        notebook, nb_env, "rc --recover on", "kept = {'k': 41}\nimport os; print(os.getpid())"
    )
    first = store.get("rc")

    def notice_while_busy():
        wait_until(lambda: _busy(state_dir), 30, "the cell to run", 0.1)
        _notify(state_dir, "spot-instance-action.json", NOTICE)

    threading.Thread(target=notice_while_busy, daemon=True).start()
    cut = notebook.run("%%gpu\nimport time\nfor i in range(600):\n    time.sleep(0.1)")
    said = cut.text
    assert cut.status == "error", said
    assert "this cell was interrupted when session rc ended: it is not re-run" in said, said
    assert "recovering session rc: a replacement restores its saved state" in said, said
    assert "workspace rc: restored" in said and "kept" in said, said
    assert "session rc is back: 1 x T4 on local" in said and "the next cell runs there" in said, (
        said
    )

    nxt = notebook.run("%%gpu\nprint(kept['k'] + 1)")
    assert nxt.status == "ok" and nxt.text.strip().endswith("42"), nxt.text
    second = store.get("rc")
    assert second.id != first.id and second.state == State.RUNNING
    assert store.get(first.id).stop_reason.kind is StopKind.SPOT_INTERRUPTION
    notebook.run("%gpu stop")


def test_a_spot_notice_during_an_upload_says_what_did_not_land(notebook, nb_env, tmp_path):
    """`%gpu upload` of a big file is running when the notice comes: the agent saves and ends
    the session; the cell says the session ended and that the upload did not complete, never
    'uploaded'; no partial file is left in the workspace under the file's name."""
    store, state_dir = _started(notebook, nb_env, "tr", "kept = 1")
    with open(tmp_path / "big.bin", "wb") as f:
        for _ in range(64):
            f.write(os.urandom(2**20) * 8)  # 512 MB

    workspace = Path(nb_env["GPUSESSION_HOME"]) / "workspaces" / "tr"

    def notice_while_writing():  # once the session writes the file (its temporary name shows)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if any(PART in p.name for p in workspace.iterdir()):
                break
            time.sleep(0.005)
        _notify(state_dir, "spot-instance-action.json", NOTICE)

    threading.Thread(target=notice_while_writing, daemon=True).start()
    cut = notebook.run("%gpu upload big.bin")
    said = cut.text
    assert cut.status == "error", said
    assert "uploaded big.bin" not in said, said
    assert "the upload stopped at" in said and "nothing of it was written in the session" in said
    assert "session tr ended: its cloud took the spot capacity back" in said, said
    assert "resume with `%gpu start --resume tr`" in said, said
    assert workspace.is_dir()
    assert not (workspace / "big.bin").exists(), sorted(p.name for p in workspace.iterdir())
