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


def test_names_unique_among_active_sessions(tmp_path):
    store = Store(tmp_path / "s.sqlite3")
    a = store.create(LaunchSpec(gpu_type="t4", name="exp"), price_per_hour=0)
    with pytest.raises(BadInput, match="already active"):
        store.create(LaunchSpec(gpu_type="t4", name="exp"), price_per_hour=0)
    store.transition(a.id, State.STOPPED)
    b = store.create(LaunchSpec(gpu_type="t4", name="exp"), price_per_hour=0)
    assert store.get("exp").id == b.id
    with pytest.raises(UnknownSession):
        store.get("nope")
    with pytest.raises(BadInput, match="bad session name"):
        store.create(LaunchSpec(gpu_type="t4", name="has space"), price_per_hour=0)


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
    assert again.name == "ux-nb", "free again once it stopped"
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
