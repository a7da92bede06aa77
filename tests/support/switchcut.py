"""Kill the process driving a switch at each of its steps, then read the sessions as the next
face would, and count what was left (tests/test_switch_cut.py, issue 30).

The driver is `gpusession switch OLD ...` run as a process of its own (a notebook's kernel dies
the same way: SIGKILL, nothing runs after it). The kill is timed on the store, where the switch
keeps its step on the new record (session/orphans.py `SwitchStep`):

- "before-save": the new record exists and nothing else happened;
- "save": 0.15 s into the old session's save of a variable of 96 MB;
- "move": 0.2 s into the workspace's move between machines (a file of 64 MB in it);
- "start": the new session's resource is made and it waits for its kernel (starting);
- "launch": the new session's resource is being made (provisioning: an instance launching);
- "stop-old": the new one answered; the old one is about to be stopped.

After the kill, `gpusession list --all` (the CLI, a process of its own) is the next face. The
figures, per case: left in a transient state (requested, provisioning, starting, stopping),
billing without a word (an active session of a cut switch whose list line says nothing of it, or
a remote resource of this store whose record is not active), variables lost (the session the
line names as holding them lacks the variable or its digest differs).
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from typing import Callable

from gpusession.core.errors import GpuSessionError
from gpusession.core.models import State
from gpusession.session.store import DRIVEN_STATES, Store
from gpusession.words.status import rest_view

STEPS = ("before-save", "save", "move", "start", "stop-old")
VARIABLE = (
    "import os, hashlib\n"
    "cut_x = os.urandom(96 << 20)\n"  # a save of 96 MB takes a moment: the kill lands inside it
    "cut_digest = hashlib.sha256(cut_x).hexdigest()\n"
    "open('cut-file.bin', 'wb').write(os.urandom(64 << 20))\n"  # the workspace's files move too
)
CHECK = "import hashlib\nassert hashlib.sha256(cut_x).hexdigest() == cut_digest\nprint('kept')"


@dataclasses.dataclass
class Case:
    """One kill and what the next face found."""

    step: str  # where the kill was aimed
    landed: str  # the step the switch had reached when it died (from the store)
    old_state: str  # after the next face read them
    new_state: str
    line: str  # the list's line about the cut switch ("" when it said none)
    stuck: int = 0  # records left in a transient state
    silent: int = 0  # billing without a word
    lost: int = 0  # the variable gone from the session said to hold it
    finished: bool = False  # the switch ended on its own before the step came (not a cut)
    strays: list = dataclasses.field(default_factory=list)  # what bills for no active record


def cli(env: dict, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gpusession", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _reached(step: str, record) -> bool:
    switch = record.resource.get("switch") or {}
    if step == "before-save":
        return True  # the record exists: the switch has only just begun
    if step in ("save", "move", "stop-old"):
        return switch.get("step") == step
    if step == "start":  # its resource is made (a container, a job): it waits for the kernel
        return record.state == State.STARTING
    if step == "launch":  # its resource is being made (an instance launching)
        return record.state == State.PROVISIONING
    raise ValueError(step)


DELAY_S = {"save": 0.15, "move": 0.2}


def kill_at(env: dict, store: Store, old_id: str, args: list[str], step: str, timeout=240):
    """Start `gpusession switch` of session `old_id` with `args`, SIGKILL it once the switch
    reaches `step`; (the new record as stored after the kill or None, finished: True when the
    switch ended before `step` came)."""
    old = store.get(old_id)
    # the switches of `old` made before this one (an earlier kill_at's new session, maybe made
    # less than a second ago) are not this one's: "before-save" would take any record at once
    before = {r.id for r in store.list()}
    driver = subprocess.Popen(
        [sys.executable, "-m", "gpusession", "switch", old.name, *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if driver.poll() is not None:
                return _new_of(store, old_id, before), True
            new = _new_of(store, old_id, before)
            if new is not None and _reached(step, new):
                time.sleep(DELAY_S.get(step, 0.0))
                driver.kill()  # SIGKILL, the driver alone: what a dying notebook kernel gets
                driver.wait()
                return store.get(new.id), False
            time.sleep(0.01)
        raise AssertionError(f"the switch of {old.name} never reached {step} in {timeout:.0f}s")
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()


def _new_of(store: Store, old_id: str, before: set[str]):
    for record in store.list():
        if record.id in before:
            continue
        if (record.resource.get("switch") or {}).get("old") == old_id:
            return record
    return None


def judge(
    env: dict,
    store: Store,
    old_id: str,
    new,
    step: str,
    *,
    holds: Callable[[str], bool],
    resources: Callable[[], list[tuple[str, str]]],
) -> Case:
    """Read the sessions as the next face does (`gpusession list --all`), then count.
    holds(session id): does that running session still have the variable; resources(): this
    store's remote resources as (session id, description)."""
    listed = cli(env, "list", "--all")
    assert listed.returncode == 0, listed.stderr
    old = store.get(old_id)
    new = store.get(new.id) if new is not None else None
    lines = [line for line in listed.stdout.splitlines() if "was cut" in line]
    case = Case(
        step=step,
        landed=((new.resource.get("switch") or {}).get("step") if new else "") or "",
        old_state=old.state.value,
        new_state=new.state.value if new else "-",
        line=lines[0][2:] if lines else "",
    )
    records = store.list()
    case.stuck = sum(1 for r in records if r.state in DRIVEN_STATES)
    active = {r.id for r in records if r.state.active}
    # billing without a word: both run and nothing says so, or something remote of this store
    # runs for a record that is not active
    if new is not None and new.state == State.RUNNING and old.state == State.RUNNING:
        case.silent += 0 if (case.line and "both run" in case.line) else 1
    strays = [what for sid, what in resources() if sid not in active]
    case.silent += len(strays)
    case.strays = strays
    # the variables: in the old session while it runs, else in the new one, else (neither runs)
    # saved in the workspace, with the line saying how to resume them
    keeper = old if old.state == State.RUNNING else new
    if keeper is not None and keeper.state == State.RUNNING:
        case.lost = 0 if holds(keeper.id) else 1
    else:
        saved = (old.resource.get("checkpoint") or {}).get("committed")
        case.lost = 0 if saved and "--resume" in case.line else 1
    return case


def table(backend: str, cases: list[Case]) -> str:
    """The figures as the docs show them."""
    rows = [f"{backend}: kill at -> landed at | old, new after the next face | stuck silent lost"]
    for c in cases:
        rows.append(
            f"  {c.step:11s} -> {c.landed or '-':9s} | {c.old_state}, {c.new_state} | "
            f"{c.stuck} {c.silent} {c.lost}" + (" (finished before the kill)" if c.finished else "")
        )
        rows.append(f"      said: {c.line or '(nothing: the switch finished)'}")
    return "\n".join(rows)


def _holds(manager):
    def holds(session_id: str) -> bool:
        try:
            session = manager.connected(session_id) or manager.attach(session_id)
            return session.run(CHECK)["status"] == "ok"
        except GpuSessionError:
            return False

    return holds


def _resources(manager, store: Store):
    """This store's remote resources on every backend its sessions used."""

    def listed() -> list[tuple[str, str]]:
        return [
            (r.session_id, r.description)
            for name in sorted({r.backend for r in store.list()})
            for r in manager.backend(name).list_resources()
        ]

    return listed


def cut_every_step(
    manager,
    start_old,
    same_place: list[str],
    move: list[str] | None,
    backend: str,
    plan: list[tuple[str, list[str]]] | None = None,
):
    """Start the old session, then cut a switch at each step of `plan` ((step, the switch's
    arguments); by default before the save, during it, during the move, during the start and
    before the old one stops): the old one survives each cut but the last and is used again.
    Returns the cases."""
    env = dict(os.environ)
    store = Store(manager.config.data_path / "sessions.sqlite3")
    holds, resources = _holds(manager), _resources(manager, store)
    old = start_old()
    assert old.run(VARIABLE)["status"] == "ok"
    cases = []
    if plan is None:
        plan = [("before-save", same_place), ("save", same_place)]
        plan += [("move", move)] if move else []
        plan += [("start", same_place), ("stop-old", same_place)]
    for step, args in plan:
        new, finished = kill_at(env, store, old.id, args, step)
        case = judge(env, store, old.id, new, step, holds=holds, resources=resources)
        case.finished = finished
        cases.append(case)
        if new is not None and case.new_state == "running" and case.old_state == "running":
            # every face says the same line: the sidebar's card (REST) and the CLI's list
            for record in (store.get(old.id), store.get(new.id)):
                view = rest_view(manager.view(record))
                assert view["cut_switch_text"] and "both run" in view["cut_switch_text"], view
            if step != "stop-old":
                manager.stop(new.id)  # the user's answer: `gpusession stop NEW` keeps the old
        if step != "stop-old" and store.get(old.id).state != State.RUNNING:
            break  # the old session is gone: nothing to cut further (counted as lost above)
    print(table(backend, cases))
    return cases


def assert_figures(cases) -> None:
    assert all(not c.finished for c in cases), [c for c in cases if c.finished]
    figures = {k: sum(getattr(c, k) for c in cases) for k in ("stuck", "silent", "lost")}
    assert figures == {"stuck": 0, "silent": 0, "lost": 0}, cases
    both = [c for c in cases if c.old_state == c.new_state == "running"]
    assert all("both run" in c.line for c in both), both
    never = [c for c in cases if c.new_state == "failed" and c.old_state == "running"]
    assert all(
        ("never started (billed nothing)" in c.line or "did not answer and was removed" in c.line)
        and "runs on with your variables" in c.line
        for c in never
    ), never
