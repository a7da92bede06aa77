"""gpusession.core.wholefiles.write_whole: the caches, settings and snapshots written whole."""

from __future__ import annotations

import os
import stat
import threading

import pytest

from gpusession.core.wholefiles import write_whole


def test_readers_and_a_second_writer_see_whole_versions_only(tmp_path):
    path = tmp_path / "cache.json"
    versions = [bytes([65 + i]) * 200_000 for i in range(8)]
    seen, stop = set(), threading.Event()

    def read():
        while not stop.is_set():
            try:
                seen.add(path.read_bytes())
            except FileNotFoundError:
                pass

    def write(which):
        for _ in range(20):
            for v in which:
                write_whole(path, v)

    readers = [threading.Thread(target=read) for _ in range(2)]
    writers = [threading.Thread(target=write, args=(versions[i::2],)) for i in range(2)]
    for t in readers + writers:
        t.start()
    for t in writers:
        t.join()
    stop.set()
    for t in readers:
        t.join()
    assert seen and seen <= set(versions), "a reader saw a part of a version"
    assert path.read_bytes() in versions
    assert stat.S_IMODE(path.stat().st_mode) == 0o600  # the owner's alone
    assert os.listdir(tmp_path) == ["cache.json"]  # no part left


def test_a_failed_write_leaves_the_old_version_and_no_part(tmp_path):
    path = tmp_path / "settings.json"
    write_whole(path, "old")
    with pytest.raises(TypeError):
        write_whole(path, 42)  # type: ignore[arg-type]
    assert path.read_text() == "old"
    assert os.listdir(tmp_path) == ["settings.json"]
