"""`gpusession gc` and the runtime volumes of other gpusession builds (issue 11 item 4), on the
real engine: plain gc only says how many there are; `gc --volumes` removes a copy of another
build that no container uses, with its `-ok` twin; one a container still mounts, one of this
build, and one made moments ago stay; a dry run only says.

The engine is shared (other test workers, other builds): the test treats every runtime volume on
the engine as "of this build" but the ones it made as another build's, each time gc asks, so that
gc touches only the volumes it made, whatever another worker makes meanwhile."""

from __future__ import annotations

import re
import time

import pytest

from gpusession.backends.docker import runtime_volumes as docker_volumes
from gpusession.transport.bundle import code_archive
from gpusession.words.stops import gc_line
from support.hosts import docker_available
from support.images import FOREIGN

pytestmark = [
    pytest.mark.docker,
    pytest.mark.skipif(not docker_available(), reason="no Docker engine answers"),
]
LABEL = docker_volumes.VOLUME_LABEL


def _names(engine) -> set[str]:
    return {v.name for v in engine.volumes.list(filters={"label": LABEL})}


def test_gc_removes_unused_copies_of_other_builds_only(engine, manager, monkeypatch, gs_home):
    stamp = f"{time.time_ns() % 16**8:08x}"
    old, used, site = (
        f"gpusession-runtime-code-0dd0{stamp}-cp311",
        f"gpusession-runtime-code-05ed{stamp}-cp311",
        f"gpusession-runtime-cp311-manylinux_2_28_x86_64-0dc0{stamp}",
    )
    other_builds = {f"{prefix}{stamp}" for prefix in ("0dd0", "05ed", "0dc0", "0e00")}

    def current(cache) -> set[str]:
        """Every copy on the engine counts as this build's but the test's own "other builds":
        another test worker's copies, made at any moment, are never taken for leftovers."""
        on_engine = {
            m.group(1)
            for n in _names(engine)
            if (m := re.search(r"-([0-9a-f]{12})(?:-cp\d+)?(?:-ok)?$", n))
        }
        return (on_engine - other_builds) | {code_archive().digest[:12]}

    monkeypatch.setattr("gpusession.transport.bundle.current_digests", current)
    monkeypatch.setattr(docker_volumes, "STALE_AFTER_S", 2.0)
    ours = f"gpusession-runtime-code-{code_archive().digest[:12]}-cp399"  # this build's (for a Python of its own)
    made = [old, old + "-ok", used, used + "-ok", site, ours]
    for name in made:
        engine.volumes.create(name, labels={LABEL: "ok" if name.endswith("-ok") else "code"})
    holder = engine.containers.create(
        FOREIGN[0].image,
        command=["true"],
        volumes={used: {"bind": "/x", "mode": "ro"}},
        labels={"gpusession.test": "gc-volumes"},
    )
    try:
        time.sleep(2.5)  # older than the (shortened) grace
        young = f"gpusession-runtime-code-0e00{stamp}-cp311"
        engine.volumes.create(young, labels={LABEL: "code"})
        made.append(young)

        notes: list[str] = []
        plain = manager.gc(skipped=notes)
        assert not [a for a in plain if "runtime volume" in a.target] and _names(engine) >= set(
            made
        )
        assert (
            "2 runtime volume(s) of other gpusession builds are used by no container: "
            "`gpusession gc --volumes` removes them" in notes
        ), notes

        planned = manager.gc(dry_run=True, volumes=True)
        assert _names(engine) >= set(made), "a dry run removes nothing"
        lines = [gc_line(a) for a in planned if "runtime volume" in a.target]
        assert sorted(lines) == sorted(
            f"would remove runtime volume {n} on the local engine (another gpusession build's copy, used by no container)"
            for n in (old, site)
        ), lines

        done = manager.gc(volumes=True)
        left = _names(engine)
        assert {old, old + "-ok", site}.isdisjoint(left), (
            "the unused copies of another build are gone, twins too"
        )
        assert {used, used + "-ok", ours, young} <= left, "in use, this build's, or just made: kept"
        assert sorted(a.target for a in done if "runtime volume" in a.target) == sorted(
            f"runtime volume {n} on the local engine" for n in (old, site)
        )
    finally:
        holder.remove(force=True)
        for name in made:
            try:
                engine.volumes.get(name).remove(force=True)
            except Exception:  # noqa: BLE001 - gc removed it
                pass
