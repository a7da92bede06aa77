"""A backend written from gpusession/backends/base.py alone: found through the discovery seam
(`backend_classes`), built by the session layer with its recorder, and driven through the
contract - nothing paid for, nothing started (its "machines" are files in a folder)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

import gpusession.configuration.registry as backends
from gpusession.backends.base import Backend, Link, Recorder, RemoteResource, stop_details_from_log
from gpusession.core.errors import BadInput
from gpusession.core.models import KernelEndpoint, LaunchSpec, SessionRecord, State
from gpusession.core.progress import Progress
from gpusession.core.protocol import Marker, StopDetails, StopKind, StopReason, marker_line
from gpusession.session.gc import collect


class FakeLink(Link):
    def __init__(self, machine: Path):
        self.machine = machine
        self.endpoint = KernelEndpoint(connection_info={"ip": "127.0.0.1"}, agent_url=None)

    def close(self) -> None:
        pass

    def healthy(self) -> bool:
        return self.machine.exists()


class FakeBackend(Backend):
    """A "machine" is a JSON file labelled with its session id, in the config's data folder."""

    name = "fake"

    def _folder(self) -> Path:
        folder = self.config.data_path / "fake-machines"
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    def provision(self, record: SessionRecord, progress: Progress) -> None:
        machine = self._folder() / f"{record.id}.json"
        progress.step("making a fake machine")
        machine.write_text(
            json.dumps({"session": record.id, "store": self.recorder.store_id, "running": True})
        )
        self.recorder.save(record.id, machine=str(machine))
        self.recorder.note(record.id, "fake machine made")

    def connect(self, record: SessionRecord, progress: Progress) -> Link:
        return FakeLink(Path(record.resource["machine"]))

    def is_alive(self, record: SessionRecord) -> bool:
        machine = record.resource.get("machine")
        return (
            bool(machine)
            and Path(machine).exists()
            and json.loads(Path(machine).read_text())["running"]
        )

    def stop_details(self, record: SessionRecord) -> StopDetails | None:
        machine = record.resource.get("machine")
        if not machine or not Path(machine).exists():
            return None
        data = json.loads(Path(machine).read_text())
        return StopDetails.from_dict(data["stopped"]) if "stopped" in data else None

    def stop(self, record: SessionRecord) -> None:
        (self._folder() / f"{record.id}.json").unlink(missing_ok=True)

    def list_resources(self) -> list[RemoteResource]:
        found = []
        for path in sorted(self._folder().glob("*.json")):
            data = json.loads(path.read_text())
            if data["store"] == self.recorder.store_id:
                found.append(
                    RemoteResource(
                        self.name,
                        data["session"],
                        path.name,
                        f"fake machine {path.stem[:8]}",
                        running=data["running"],
                        details={"path": str(path)},
                    )
                )
        return found

    def remove_resource(self, resource: RemoteResource) -> None:
        path = Path(resource.details["path"])
        if path.exists() and json.loads(path.read_text())["session"] == resource.session_id:
            path.unlink()


class MemoryRecorder:
    """A `Recorder` that keeps what it is told."""

    store_id = "test-store"

    def __init__(self):
        self.saved: dict[str, dict[str, Any]] = {}
        self.notes: list[tuple[str, str]] = []
        self.records: list[SessionRecord] = []
        self.failed: dict[tuple[str, str], str] = {}  # (backend, host) -> why

    def save(self, session_id: str, **values: Any) -> None:
        self.saved.setdefault(session_id, {}).update(values)

    def note(self, session_id: str, text: str) -> None:
        self.notes.append((session_id, text))

    def set_price(self, session_id: str, price_per_hour: float, detail: str) -> None:
        raise AssertionError("the fake backend never corrects a price")

    def sessions(self, backend_name: str) -> list[SessionRecord]:
        return [r for r in self.records if r.spec.backend == backend_name]

    def failed_hosts(self, backend_name: str) -> set[str]:
        return {h for b, h in self.failed if b == backend_name}

    def host_failed(self, backend_name: str, host: str, error: str) -> None:
        self.failed[(backend_name, host)] = error


@pytest.fixture
def only_fake(monkeypatch):
    """The discovery seam replaced: the fake is the one installed backend."""
    monkeypatch.setattr(backends, "backend_classes", lambda: {"fake": f"{__name__}:FakeBackend"})


def test_a_backend_from_base_alone_is_found_through_the_discovery_seam(only_fake):
    assert backends.backend_names() == ["fake"]
    assert backends.load_backend_class("fake") is FakeBackend
    assert backends.load_backend_class(" Fake ") is FakeBackend
    with pytest.raises(BadInput, match="unknown backend 'docker'; valid backends: fake"):
        backends.load_backend_class("docker")


def _record(spec: LaunchSpec) -> SessionRecord:
    return SessionRecord(
        id="f" * 32,
        name="fake-1",
        spec=spec,
        state=State.PROVISIONING,
        created_at=time.time(),
        updated_at=time.time(),
        owner="test",
    )


def test_the_contract_drives_a_minimal_backend(only_fake, gs_home):
    from gpusession.configuration.config import GpuSessionConfig

    recorder: Recorder = MemoryRecorder()  # a Protocol: any object with its methods will do
    backend = backends.load_backend_class("fake")(GpuSessionConfig(), recorder)
    assert FakeBackend.available() is False  # not named, never the default
    spec = LaunchSpec("t4", backend="fake")
    backend.check(spec)  # the default: nothing to check
    record = _record(spec)
    steps: list[str] = []
    backend.provision(record, Progress(steps.append))
    assert any("making a fake machine" in s for s in steps)
    saved = recorder.saved[record.id]
    assert Path(saved["machine"]).exists() and recorder.notes == [(record.id, "fake machine made")]

    record.resource.update(
        saved
    )  # what the session layer hands back: the record with its saved resource
    link = backend.connect(record, Progress())
    assert (
        link.healthy()
        and link.reconnects == 0
        and link.endpoint.connection_info["ip"] == "127.0.0.1"
    )
    assert backend.is_alive(record) and backend.stop_details(record) is None
    (resource,) = backend.list_resources()
    assert (resource.session_id, resource.running) == (record.id, True)

    backend.stop(record)
    backend.stop(record)  # idempotent
    assert not backend.is_alive(record) and not link.healthy() and backend.list_resources() == []


def test_the_session_layer_records_what_the_backend_returns(only_fake, manager):
    """The manager builds the backend with its recorder: what the backend saves lands in the
    store, and the typed stop details it returns are recorded when the session is found gone."""
    record = manager.create(LaunchSpec("t4", backend="fake", idle=None))
    backend = manager.backend("fake")
    assert isinstance(backend, FakeBackend) and backend.recorder.store_id == manager.store.store_id
    backend.provision(manager.get(record.id), Progress())
    record = manager.get(record.id)
    assert Path(record.resource["machine"]).exists()
    assert any(e.detail == "fake machine made" for e in record.events)

    # the remote side ends by itself and leaves its word, as a runtime's stopped.json would
    at = time.time()
    reason = StopReason(StopKind.IDLE, idle_for_s=5.0, idle_timeout_s=5.0)
    Path(record.resource["machine"]).write_text(
        json.dumps(
            {
                "session": record.id,
                "store": manager.store.store_id,
                "running": False,
                "stopped": {"reason": reason.to_dict(), "at": at, "summary": {"cost": 0.0}},
            }
        )
    )
    manager.store.transition(record.id, State.RUNNING)
    record = manager.reconcile(manager.get(record.id), backend)
    assert record.state == State.STOPPED
    assert StopReason.from_dict(record.resource["stop_reason"]) == reason
    assert record.resource["agent_summary"] == {"cost": 0.0}
    assert backend.list_resources() == []


def test_gc_removes_a_fake_machine_unknown_to_the_store(only_fake, manager):
    backend = manager.backend("fake")
    crashed = (
        MemoryRecorder()
    )  # a process of this store that made a machine and died before recording it
    crashed.store_id = manager.store.store_id
    FakeBackend(manager.config, crashed).provision(
        _record(LaunchSpec("t4", backend="fake")), Progress()
    )
    assert len(backend.list_resources()) == 1
    actions = manager.gc()
    assert [(a.verb, a.why) for a in actions] == [("remove", "unknown to the store")]
    assert backend.list_resources() == []


def test_a_runtime_log_says_why_it_ended():
    stopped = StopReason(StopKind.MAX_COST, spent=5.0, max_cost=5.0)
    log = "\n".join(
        [
            "some output",
            marker_line(Marker.READY),
            marker_line(Marker.STOPPED, stopped.to_dict()),
            marker_line(Marker.SUMMARY, {"cost": 5.0}),
        ]
    )
    assert stop_details_from_log(log) == StopDetails(reason=stopped, summary={"cost": 5.0})
    failed = marker_line(Marker.FAILED, {"stage": "kernel", "error": "no python3"})
    assert stop_details_from_log(failed) == StopDetails(
        reason=StopReason(StopKind.START_FAILED, detail="kernel: no python3")
    )
    assert (
        stop_details_from_log(failed + "\n" + log).reason == stopped
    )  # its stop wins over a failed start
    assert stop_details_from_log("GPUSESSION_READY\nplain output\n") is None


def test_a_gone_remote_side_found_while_a_stop_tears_it_down_is_the_stops_to_record(
    only_fake, manager
):
    """gc (another process) saw the session running, then found its machine gone: gone because
    the user's stop, begun meanwhile, removed it. The stop records how it ended (stopped, by the
    user), not gc's "ended by itself" (a loaded CI run found it: the record said failed)."""
    record = manager.create(LaunchSpec("t4", backend="fake", idle=None))
    backend = manager.backend("fake")
    backend.provision(manager.get(record.id), Progress())
    manager.store.transition(record.id, State.RUNNING)
    seen_by_gc = manager.get(record.id)  # RUNNING, as gc's listing read it

    manager.store.transition(record.id, State.STOPPING, "stop requested by user")  # the stop
    backend.stop(seen_by_gc)  # its teardown: the machine is gone
    assert not backend.is_alive(seen_by_gc)
    found = manager.reconcile(seen_by_gc, backend)  # gc's finding, late
    assert found.state == State.STOPPING and found.error is None
    assert manager.stop(record.id).state == State.STOPPED  # the stop ends as it began

    # and where the stop begins only after reconcile re-read the record, the transition itself
    # refuses to record a finding for a state the record has left
    later = manager.create(LaunchSpec("t4", backend="fake", idle=None))
    manager.store.transition(later.id, State.RUNNING)
    manager.store.transition(later.id, State.STOPPING, "stop requested by user")
    kept = manager.store.transition(
        later.id, State.FAILED, "found failed: gone", expect=State.RUNNING
    )
    assert kept.state == State.STOPPING


def test_gc_says_it_recorded_a_gone_session_only_when_it_did(only_fake, manager):
    """gc's listing of what it did names a session "recorded as stopped" only when its finding
    was recorded, not when it yielded to the user's stop begun meanwhile."""
    record = manager.create(LaunchSpec("t4", backend="fake", idle=None))
    backend = manager.backend("fake")
    backend.provision(manager.get(record.id), Progress())
    manager.store.transition(record.id, State.RUNNING)
    backend.stop(manager.get(record.id))  # its machine is gone

    def late_reconcile(rec, backend):  # the user's stop begins between gc's look and its finding
        manager.store.transition(rec.id, State.STOPPING, "stop requested by user")
        return manager.reconcile(rec, backend)

    actions = collect(
        manager.store,
        manager.backend,
        reconcile=late_reconcile,
        settle=manager.settle,
        stop=manager.stop,
    )
    assert [a for a in actions if a.verb == "record-stopped"] == []
    assert manager.get(record.id).state == State.STOPPING

    other = manager.create(LaunchSpec("t4", backend="fake", idle=None))
    backend.provision(manager.get(other.id), Progress())
    manager.store.transition(other.id, State.RUNNING)
    backend.stop(manager.get(other.id))
    actions = collect(
        manager.store,
        manager.backend,
        reconcile=manager.reconcile,
        settle=manager.settle,
        stop=manager.stop,
    )
    assert [(a.verb, a.target) for a in actions if a.verb == "record-stopped"] == [
        ("record-stopped", other.name)
    ]
    assert not manager.get(other.id).state.active
