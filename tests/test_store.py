import multiprocessing as mp

import pytest

from gpusession.core.errors import BadInput, UnknownSession
from gpusession.core.models import LaunchSpec, State
from gpusession.session.store import Store, owner_id


def test_transitions_are_recorded_with_times(tmp_path):
    store = Store(tmp_path / "s.sqlite3")
    rec = store.create(LaunchSpec(gpu_type="t4"), price_per_hour=0.5)
    assert rec.name == "t4-1" and rec.state == State.REQUESTED
    for state in (State.PROVISIONING, State.STARTING, State.RUNNING, State.STOPPING, State.STOPPED):
        store.transition(rec.id, state)
    rec = store.get(rec.id)
    assert [e.state for e in rec.events] == [
        State.REQUESTED,
        State.PROVISIONING,
        State.STARTING,
        State.RUNNING,
        State.STOPPING,
        State.STOPPED,
    ]
    assert all(a.at <= b.at for a, b in zip(rec.events, rec.events[1:]))
    # terminal stays terminal: a late writer cannot revive it
    store.transition(rec.id, State.RUNNING)
    assert store.get(rec.id).state == State.STOPPED


def test_a_name_stays_with_its_record(tmp_path):
    """A name is never reused while its record exists (a failed or stopped session's too), so
    every command that takes a name finds exactly one record."""
    store = Store(tmp_path / "s.sqlite3")
    a = store.create(LaunchSpec(gpu_type="t4", name="exp"), price_per_hour=0)
    with pytest.raises(
        BadInput, match="already active; stop it or pick another name .exp-2 is free"
    ):
        store.create(LaunchSpec(gpu_type="t4", name="exp"), price_per_hour=0)
    store.transition(a.id, State.STOPPED)
    with pytest.raises(BadInput) as refused:
        store.create(LaunchSpec(gpu_type="t4", name="exp"), price_per_hour=0)
    assert str(refused.value) == (
        "a session named 'exp' exists already (stopped; a name stays with its session so that "
        "every command finds one): pick another name, such as exp-2"
    )
    assert store.get("exp").id == a.id
    with pytest.raises(UnknownSession):
        store.get("nope")
    with pytest.raises(BadInput, match="bad session name"):
        store.create(LaunchSpec(gpu_type="t4", name="has space"), price_per_hour=0)


def test_names_are_unique_after_ten_failed_starts(tmp_path):
    store = Store(tmp_path / "s.sqlite3")
    for _ in range(10):
        rec = store.create(LaunchSpec(gpu_type="t4"), price_per_hour=0)
        store.transition(rec.id, State.FAILED, "no capacity", error="no capacity")
    names = [r.name for r in store.list()]
    assert sorted(names) == sorted(f"t4-{n}" for n in range(1, 11)), names
    assert all(store.get(name).name == name for name in names)


def test_a_name_that_older_records_share_is_refused_with_their_ids(tmp_path):
    """A store written before names were kept unique may hold several ended records of one name:
    a command taking that name is told their ids, never handed one of them at random."""
    store = Store(tmp_path / "s.sqlite3")
    first = store.create(LaunchSpec(gpu_type="t4", name="old"), price_per_hour=0)
    store.transition(first.id, State.FAILED, "x", error="x")
    second = store.create(LaunchSpec(gpu_type="t4", name="old-2"), price_per_hour=0)
    store.transition(second.id, State.FAILED, "x", error="x")
    with store._write() as db:  # as an earlier version left it
        db.execute("UPDATE sessions SET name='old' WHERE id=?", (second.id,))
    with pytest.raises(UnknownSession) as said:
        store.get("old")
    assert "2 ended sessions are named 'old'" in str(said.value)
    assert first.id[:8] in str(said.value) and second.id[:8] in str(said.value)
    assert store.get(second.id[:8]).id == second.id


def test_a_switch_hands_the_name_over(tmp_path):
    store = Store(tmp_path / "s.sqlite3")
    old = store.create(LaunchSpec(gpu_type="t4", name="mine"), price_per_hour=0)
    new = store.create(LaunchSpec(gpu_type="a100", extra={"resume": "mine"}), price_per_hour=0)
    assert new.name == "mine-2"
    store.transition(old.id, State.STOPPED)
    taken = store.hand_name_over(old.id, new.id)
    assert taken.name == "mine" and taken.spec.name == "mine" and taken.id == new.id
    assert store.get(old.id).name == "mine~1" and store.get("mine").id == new.id
    again = store.create(LaunchSpec(gpu_type="l4", extra={"resume": "mine"}), price_per_hour=0)
    assert store.hand_name_over(new.id, again.id).name == "mine"
    assert store.get(new.id).name == "mine~2"


def test_a_session_on_a_workspace_is_named_after_it(tmp_path):
    store = Store(tmp_path / "s.sqlite3")
    resumed = store.create(LaunchSpec(gpu_type="t4", extra={"resume": "ux-nb"}), price_per_hour=0)
    assert resumed.name == "ux-nb"
    taken = store.create(LaunchSpec(gpu_type="t4", extra={"workspace": "ux-nb"}), price_per_hour=0)
    assert taken.name == "ux-nb-2", "the name is taken while ux-nb runs"
    long = "w" * 63
    assert (
        store.create(LaunchSpec(gpu_type="t4", extra={"resume": long}), price_per_hour=0).name
        == long
    )
    assert (
        store.create(LaunchSpec(gpu_type="t4", extra={"resume": long}), price_per_hour=0).name
        == "w" * 61 + "-2"
    )
    store.transition(resumed.id, State.STOPPED)
    again = store.create(LaunchSpec(gpu_type="t4", extra={"resume": "ux-nb"}), price_per_hour=0)
    assert again.name == "ux-nb-3", "a name stays with its record, a stopped one's too"
    assert store.create(LaunchSpec(gpu_type="t4"), price_per_hour=0).name == "t4-1"


def _worker(path: str, tag: str, n: int, out) -> None:
    store = Store(path)
    ids = []
    for i in range(n):
        rec = store.create(LaunchSpec(gpu_type="t4", name=f"{tag}-{i}"), price_per_hour=1.0)
        store.transition(rec.id, State.PROVISIONING)
        store.transition(rec.id, State.RUNNING)
        store.update_resource(rec.id, pid=i, tag=tag)
        if i % 2:
            store.transition(rec.id, State.STOPPING)
            store.transition(rec.id, State.STOPPED)
        ids.append(rec.id)
    # auto-named sessions race for t4-N names across processes
    for _ in range(n // 2):
        ids.append(store.create(LaunchSpec(gpu_type="l4"), price_per_hour=1.0).id)
    out.put(ids)


def test_two_processes_share_one_store_without_losing_records(tmp_path):
    path = str(tmp_path / "shared.sqlite3")
    Store(path)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(path, tag, 40, out)) for tag in ("a", "b")]
    for p in procs:
        p.start()
    ids = out.get(timeout=120) + out.get(timeout=120)
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    store = Store(path)
    records = store.list()
    assert len(records) == len(ids) == 120
    assert {r.id for r in records} == set(ids)
    named = [r for r in records if r.spec.gpu_type == "t4"]
    for r in named:
        i = int(r.name.rsplit("-", 1)[1])
        expected = [State.REQUESTED, State.PROVISIONING, State.RUNNING]
        if i % 2:
            expected += [State.STOPPING, State.STOPPED]
        assert [e.state for e in r.events] == expected, r.name
        # and its driver: the process that moved it last into a driven state (orphans.py)
        assert r.resource.pop("driver", "").startswith(owner_id().rsplit(":", 2)[0])
        assert r.resource == {"pid": i, "tag": r.name.split("-")[0]}
    auto = sorted(r.name for r in records if r.spec.gpu_type == "l4")
    assert auto == sorted(f"l4-{i}" for i in range(1, 41)), (
        "auto names must be unique across processes"
    )


def test_a_hold_keeps_the_wal_between_uses_and_its_end_checkpoints_it(tmp_path):
    """Store.held (a start's run of uses): its idle connection keeps every other close from
    being the last one, so none checkpoints the WAL and deletes it (half of each use's time);
    each read and write still sees the others, and the hold's end checkpoints it once."""
    path = tmp_path / "s.sqlite3"
    store = Store(path)
    wal = tmp_path / "s.sqlite3-wal"
    with store.held():
        rec = store.create(LaunchSpec(gpu_type="t4", name="kept"), price_per_hour=1.0)
        with store.held():  # nested: one hold
            store.transition(rec.id, State.PROVISIONING)
        assert wal.exists(), "a write's close checkpointed and deleted the WAL"
        assert Store(path).get("kept").state == State.PROVISIONING  # another Store reads it
        store.transition(rec.id, State.RUNNING)
        assert wal.exists()
    store.checkpointed()  # the hold's close, in a thread of its own
    assert not wal.exists(), "the hold's end checkpoints the WAL into the database"
    assert Store(path).get("kept").state == State.RUNNING
    store.create(LaunchSpec(gpu_type="t4", name="after"), price_per_hour=1.0)
    assert not wal.exists(), "without a hold, each use's close is the last, as before"


_FORK_IN_A_HOLD = """
import os, sys
from gpusession.core.models import LaunchSpec
from gpusession.session.store import Store

path, wal = sys.argv[1], sys.argv[1] + "-wal"
store = Store(path)
to_child, to_parent = os.pipe(), os.pipe()
with store.held():  # a start in this process, and a fork meanwhile (a user's multiprocessing)
    for i in range(10):
        store.create(LaunchSpec(gpu_type="t4", name=f"before-{i}"), price_per_hour=1.0)
    pid = os.fork()
    if pid == 0:  # a Store of its own: writes on after its parent's hold has ended
        mine = Store(path)
        mine.create(LaunchSpec(gpu_type="t4", name="child-0"), price_per_hour=1.0)
        os.write(to_parent[1], b"x")
        os.read(to_child[0], 1)
        for i in range(1, 20):
            mine.create(LaunchSpec(gpu_type="t4", name=f"child-{i}"), price_per_hour=1.0)
        raise SystemExit(0)  # Python's full shutdown: what the child inherited is freed here
    os.read(to_parent[0], 1)
    for i in range(20):
        store.create(LaunchSpec(gpu_type="t4", name=f"during-{i}"), price_per_hour=1.0)
    assert os.path.exists(wal), "the hold was not opened again in the parent after the fork"
os.write(to_child[1], b"x")  # the parent's hold has ended (its close checkpointed the WAL)
_, status = os.waitpid(pid, 0)
assert os.waitstatus_to_exitcode(status) == 0
"""


@pytest.mark.integration
def test_a_fork_during_a_hold_loses_no_record_of_parent_or_child(tmp_path):
    """A process that forks without exec while a start holds its store's idle connection must
    not hand that connection to the child (SQLite: never across a fork): the hold is closed
    before the fork and opened again in the parent only. Every record of both stays, the
    database is whole, and a fresh process reads them all."""
    import sqlite3
    import subprocess
    import sys

    path = tmp_path / "forked.sqlite3"
    run = subprocess.run(
        [sys.executable, "-c", _FORK_IN_A_HOLD, str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    names = {r.name for r in Store(path).list()}
    lost = {f"child-{i}" for i in range(20)} - names
    assert not lost, sorted(lost)
    assert len(names) == 50, sorted(names)
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
