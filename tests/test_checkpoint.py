"""The saved namespace holds users' real work: numpy arrays of every size (protocol-5 buffers
written as buffers), containers of them, pandas frames and torch tensors; a variable whose
pickling raises KeyboardInterrupt or SystemExit is one skipped line, not a lost save; two saves
into one workspace at once both land or say they did not; a damaged checkpoint is said, kept
aside and read as far as it reads; a manifest cannot lead a restore out of its folder; IPython's
own names are never saved nor restored; two live sessions never share a workspace.

The checkpoint code itself (it runs in the kernel) on real files, real processes for the
concurrent saves, the local backend's real kernels for the sessions."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from gpusession.agent import checkpoint
from gpusession.words.workspaces import checkpoint_line, restore_lines

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from bench_concurrent_saves import concurrent_saves  # noqa: E402

try:
    import numpy as np
except ImportError:  # the numpy tests skip; the others need none
    np = None
needs_numpy = pytest.mark.skipif(
    np is None, reason="numpy is not installed (the test extra has it)"
)

SIZES = {"1KB": 1 << 10, "64KB": 1 << 16, "80KB": 80_000, "1MB": 1 << 20, "100MB": 100 << 20}


def _save(ns: dict, ws: Path, bound: float = 60) -> dict:
    """A save, and what comes after its answer (the manifest written, the old folders gone)."""
    result = checkpoint.save(ns, str(ws), deadline=time.time() + bound, cap_bytes=None)
    checkpoint.tidied(timeout=30)
    return result


def _restore(ws: Path) -> tuple[dict, dict]:
    ns: dict = {}
    return ns, checkpoint.restore(ns, str(ws))


@needs_numpy
@pytest.mark.parametrize("size", list(SIZES))
def test_numpy_arrays_of_every_size_round_trip(tmp_path, size):
    n = SIZES[size]
    value = np.frombuffer(os.urandom(n), dtype=np.uint8).copy()
    result = _save(
        {
            "a": value,
            "strided": value[::2],
            "f": np.arange(n // 8, dtype=np.float64).reshape(-1, 1),
        },
        tmp_path,
    )
    assert result["committed"] and result["saved"] == 3 and not result["skipped"], checkpoint_line(
        result, "w"
    )
    assert result["bytes"] >= n + n // 2
    ns, report = _restore(tmp_path)
    assert report["restored"] == ["a", "f", "strided"] and not report["failed"], restore_lines(
        report, "w"
    )
    assert np.array_equal(ns["a"], value) and np.array_equal(ns["strided"], value[::2])
    assert ns["f"].shape == (n // 8, 1) and ns["f"][-1, 0] == n // 8 - 1


@needs_numpy
def test_a_dict_of_arrays_a_dataframe_and_a_tensor_round_trip(tmp_path):
    pd = pytest.importorskip("pandas")
    arrays = {f"k{i}": np.full(50_000, i, dtype=np.float32) for i in range(5)}
    frame = pd.DataFrame(
        {"x": np.arange(200_000), "y": np.linspace(0, 1, 200_000), "s": ["a", "b"] * 100_000}
    )
    ns = {
        "arrays": arrays,
        "frame": frame,
        "mixed": [np.ones(30_000), {"deep": np.zeros((300, 300))}],
    }
    result = _save(ns, tmp_path)
    assert result["committed"] and result["saved"] == 3 and not result["skipped"], checkpoint_line(
        result, "w"
    )
    back, report = _restore(tmp_path)
    assert sorted(report["restored"]) == ["arrays", "frame", "mixed"], report
    assert all(np.array_equal(back["arrays"][k], v) for k, v in arrays.items())
    pd.testing.assert_frame_equal(back["frame"], frame)
    assert back["mixed"][1]["deep"].shape == (300, 300)


def test_a_torch_tensor_round_trips(tmp_path):
    torch = pytest.importorskip("torch")
    t = torch.arange(1_000_000, dtype=torch.float32).reshape(1000, 1000)
    result = _save({"t": t, "model": torch.nn.Linear(64, 8)}, tmp_path)
    assert result["committed"] and result["saved"] == 2 and not result["skipped"], checkpoint_line(
        result, "w"
    )
    back, report = _restore(tmp_path)
    assert torch.equal(back["t"], t) and back["model"].weight.shape == (8, 64), report


class _Raises:
    def __init__(self, exc: type):
        self.exc = exc

    def __reduce__(self):
        raise self.exc()


@pytest.mark.parametrize("exc", [KeyboardInterrupt, SystemExit])
def test_a_variable_raising_keyboardinterrupt_or_systemexit_is_skipped_and_the_rest_saved(
    tmp_path, exc
):
    t0 = time.monotonic()
    answers: list = []  # in a thread, as in the kernel (its save thread)
    saver = threading.Thread(
        target=lambda: answers.append(
            _save({"a": 1, "bad": _Raises(exc), "z": bytearray(b"z" * 100_000)}, tmp_path)
        )
    )
    saver.start()
    saver.join(30)
    assert answers and time.monotonic() - t0 < 10, "the save died with the variable's exception"
    result = answers[0]
    line = checkpoint_line(result, "w")
    assert result["committed"] and result["saved"] == 2, line
    assert f"skipped: bad (does not pickle: {exc.__name__}" in line, line
    ns, _ = _restore(tmp_path)
    assert ns["a"] == 1 and ns["z"] == b"z" * 100_000


def test_ipythons_own_names_are_never_saved_nor_restored(tmp_path):
    result = _save(
        {"get_ipython": lambda: None, "In": [], "exit": 1, "_hidden": 2, "kept": 3}, tmp_path
    )
    line = checkpoint_line(result, "w")
    assert result["saved"] == 1 and "get_ipython (IPython's own name: never saved" in line, line
    # a checkpoint that names one anyway (an older one, or made by hand): not restored over IPython's
    manifest = checkpoint.read_manifest(str(tmp_path))
    folder = tmp_path / ".gpusession" / "checkpoints" / manifest["folder"]
    (folder / "x.pkl").write_bytes(__import__("pickle").dumps("not ipython's"))
    manifest["variables"].append(
        {"name": "get_ipython", "file": "x.pkl", "bytes": (folder / "x.pkl").stat().st_size}
    )
    manifest["imports"]["_"] = "os"
    (tmp_path / ".gpusession" / "checkpoint.json").write_text(json.dumps(manifest))
    ns, report = _restore(tmp_path)
    assert "get_ipython" not in ns and "_" not in ns and ns["kept"] == 3
    assert "  not restored: get_ipython: IPython's own name" in restore_lines(report, "w"), report


def test_a_manifest_entry_cannot_lead_out_of_its_folder(tmp_path):
    ws = tmp_path / "ws"
    _save({"a": 1}, ws)
    outside = tmp_path / "evil.pkl"
    outside.write_bytes(b"cos\nsystem\n(S'touch " + str(tmp_path / "PWNED").encode() + b"'\ntR.")
    manifest = checkpoint.read_manifest(str(ws))
    for i, path in enumerate(["../../../evil.pkl", str(outside), "sub/../../../../evil.pkl", ".."]):
        manifest["variables"].append(
            {"name": f"v{i}", "file": path, "bytes": outside.stat().st_size}
        )
    (ws / ".gpusession" / "checkpoint.json").write_text(json.dumps(manifest))
    ns, report = _restore(ws)
    assert not (tmp_path / "PWNED").exists(), "a file out of the checkpoint folder was unpickled"
    assert ns == {"a": 1}
    assert [f["name"] for f in report["failed"]] == ["v0", "v1", "v2", "v3"]
    assert all(
        "leaves the checkpoint folder; not opened" in f["error"] for f in report["failed"]
    ), report


def _damage_manifest(ws: Path, how: str) -> None:
    path = ws / ".gpusession" / "checkpoint.json"
    if how == "empty":
        path.write_bytes(b"")
    elif how == "truncated":
        path.write_bytes(path.read_bytes()[:40])
    elif how == "garbage":
        path.write_bytes(b"\x89G" + os.urandom(298))
    elif how == "directory":
        path.unlink()
        path.mkdir()


@pytest.mark.parametrize("how", ["empty", "truncated", "garbage", "directory"])
def test_a_damaged_manifest_is_said_kept_aside_and_the_checkpoint_still_read(tmp_path, how):
    _save({"a": 1, "arr": list(range(50_000))}, tmp_path)
    _damage_manifest(tmp_path, how)
    ns, report = _restore(tmp_path)
    lines = restore_lines(report, "w")
    text = "\n".join(lines)
    assert "no saved variables" not in text
    assert (
        "its checkpoint is damaged (its manifest:" in text
        and "kept aside in the workspace as .gpusession/checkpoint.damaged-" in text
    ), text
    assert ns["a"] == 1 and ns["arr"][-1] == 49_999, text  # the folder's own index still reads
    aside = [p.name for p in (tmp_path / ".gpusession").iterdir() if ".damaged-" in p.name]
    assert len(aside) == 1 and not (tmp_path / ".gpusession" / "checkpoint.json").exists()
    again = _save({"b": 2}, tmp_path)  # a later save lands beside what was kept
    assert again["committed"] and _restore(tmp_path)[0] == {"b": 2}


def test_a_damaged_manifest_without_anything_readable_says_damaged_not_empty(tmp_path):
    (tmp_path / ".gpusession").mkdir()
    (tmp_path / ".gpusession" / "checkpoint.json").write_bytes(b'{"format": 1, "fol')
    ns, report = _restore(tmp_path)
    (line, damage) = restore_lines(report, "w")
    assert (
        line == "workspace w: nothing restored (its checkpoint is damaged); its files are there"
    ), line
    assert "kept aside in the workspace as .gpusession/checkpoint.damaged-" in damage, damage


@pytest.mark.parametrize("how", ["truncated", "garbage", "directory", "missing"])
def test_a_damaged_variable_file_is_said_and_the_others_restored(tmp_path, how):
    _save({"a": 1, "b": bytearray(100_000), "c": "three"}, tmp_path)
    manifest = checkpoint.read_manifest(str(tmp_path))
    folder = tmp_path / ".gpusession" / "checkpoints" / manifest["folder"]
    (entry,) = [e for e in manifest["variables"] if e["name"] == "b"]
    file = folder / entry["file"]
    if how == "truncated":
        file.write_bytes(file.read_bytes()[:1000])
    elif how == "garbage":
        file.write_bytes(b"G" + os.urandom(entry["bytes"] - 1))
    elif how == "directory":
        file.unlink()
        file.mkdir()
    else:
        file.unlink()
    ns, report = _restore(tmp_path)
    assert ns == {"a": 1, "c": "three"}
    text = "\n".join(restore_lines(report, "w"))
    assert (
        "not restored: b: damaged: " in text
        and "its checkpoint is damaged (1 of its variable file(s))" in text
    ), text
    assert not folder.exists() and any(".damaged-" in p.name for p in folder.parent.iterdir()), (
        "kept aside"
    )


@needs_numpy
def test_small_variables_live_in_the_index_and_large_ones_in_files_of_their_own(tmp_path):
    """A pickle of at most INLINE_BYTES goes into the index (one file to write and fsync for a
    small save, issue 35); a larger one, or an array's buffer, into its own file; a cap below
    INLINE_BYTES still leaves out what is over it."""
    edge = "x" * (checkpoint.INLINE_BYTES - 20)  # its pickle: a few bytes under the bound
    values = {"a": 1, "edge": edge, "big": bytearray(100_000), "arr": np.zeros(20_000)}
    result = _save(values, tmp_path)
    folder = tmp_path / ".gpusession" / "checkpoints" / result["folder"]
    entries = {e["name"]: e for e in checkpoint.read_manifest(str(tmp_path))["variables"]}
    assert {n for n, e in entries.items() if "inline" in e} == {"a", "edge"}, entries.keys()
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        ["index.json", entries["arr"]["file"], entries["big"]["file"]]
    )
    ns, report = _restore(tmp_path)
    assert ns.keys() == values.keys() and not report["failed"], report
    assert ns["edge"] == edge and np.array_equal(ns["arr"], values["arr"])
    capped = checkpoint.save(
        {"small": "y" * 100, "over": "z" * 5000},
        str(tmp_path / "c"),
        deadline=time.time() + 60,
        cap_bytes=1000,
    )
    assert [s["name"] for s in capped["skipped"] if s["why"] == "over cap"] == ["over"], capped
    # the index stays small: what one save keeps in it is bounded (INLINE_TOTAL)
    many = {f"v{i}": os.urandom(60_000) for i in range(6)}
    result = _save(many, tmp_path / "m")
    entries = checkpoint.read_manifest(str(tmp_path / "m"))["variables"]
    assert ["inline" in e for e in entries] == [True] * 4 + [False] * 2, entries
    assert _restore(tmp_path / "m")[0] == many


@pytest.mark.parametrize("how", ["not base64", "short", "not a pickle"])
def test_a_damaged_variable_in_the_index_is_said_and_the_others_restored(tmp_path, how):
    result = _save({"a": 1, "b": bytearray(100_000), "c": "three"}, tmp_path)
    meta = tmp_path / ".gpusession"
    for doc_path in (
        meta / "checkpoint.json",
        meta / "checkpoints" / result["folder"] / "index.json",
    ):
        doc = json.loads(doc_path.read_text())
        (entry,) = [e for e in doc["variables"] if e["name"] == "c"]
        data = base64.b64decode(entry["inline"])
        entry["inline"] = {
            "not base64": "!!" + entry["inline"][2:],
            "short": base64.b64encode(data[:-3]).decode(),
            "not a pickle": base64.b64encode(b"G" * len(data)).decode(),
        }[how]
        doc_path.write_text(json.dumps(doc))
    ns, report = _restore(tmp_path)
    assert ns == {"a": 1, "b": bytearray(100_000)}, report
    text = "\n".join(restore_lines(report, "w"))
    assert "not restored: c: damaged: " in text and "its checkpoint is damaged" in text, text


@pytest.mark.integration
def test_two_saves_into_one_workspace_at_once_never_lose_what_they_said_they_saved(tmp_path):
    """A bounded slice of bench/bench_concurrent_saves.py (the loop): 6 rounds."""
    figures = concurrent_saves(tmp_path, 6)
    figures.pop("seconds")
    assert figures == {"rounds": 6, "landed": 6, "said_saved_but_lost": 0, "said_not_saved": 0}, (
        figures
    )
    left = [p.name for p in (tmp_path / ".gpusession" / "checkpoints").iterdir()]
    assert len(left) == 1, left


def test_a_save_never_removes_a_folder_another_save_is_writing(tmp_path):
    """Deterministic: a save that commits while another is still writing its files."""
    started, go = threading.Event(), threading.Event()

    class Waits:
        def __reduce__(self):
            started.set()
            go.wait(30)
            return (str, ("waited",))

    results = {}
    slow = threading.Thread(
        target=lambda: results.update(slow=_save({"a": 1, "w": Waits()}, tmp_path))
    )
    slow.start()
    assert started.wait(30)
    results["fast"] = _save({"b": 2}, tmp_path)
    go.set()
    slow.join(30)
    assert results["fast"]["committed"] and results["slow"]["committed"], results
    ns, report = _restore(tmp_path)
    assert ns == {"a": 1, "w": "waited"} and not report["failed"], report


def test_the_commit_names_the_new_checkpoint_only_once_all_it_holds_is_on_disk(
    tmp_path, monkeypatch
):
    """The commit's order (one journal commit, issue 35): every variable file and the index,
    then the new folder and the folder holding it (their entries came in the files' commit) are
    fsync'ed before the save answers; after the answer
    the tidy writes the manifest naming it (fsync'ed, then replaced, then the workspace's folder
    fsync'ed) before any old checkpoint goes. Seen in the real calls the save makes (their paths
    read back from /proc)."""
    events, lock = [], threading.Lock()
    real_fsync, real_replace, real_rmtree = os.fsync, os.replace, checkpoint.shutil.rmtree

    def fsync(fd):
        real_fsync(fd)
        with lock:
            events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))

    def replace(src, dst, **kw):
        real_replace(src, dst, **kw)
        with lock:
            events.append(("replace", os.fspath(src), os.fspath(dst)))

    def rmtree(path, **kw):
        with lock:
            events.append(("rmtree", os.fspath(path)))
        real_rmtree(path, **kw)

    first = _save({"a": 1}, tmp_path)
    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(checkpoint.shutil, "rmtree", rmtree)
    result = checkpoint.save(
        {"b": list(range(1000)), "c": "x" * 100_000, "d": {"k": 2}},  # c: over INLINE_BYTES
        str(tmp_path),
        deadline=time.time() + 60,
        cap_bytes=None,
    )
    with lock:
        events.append(("returned",))
    checkpoint.tidied(timeout=30)
    assert result["committed"] and result["saved"] == 3, result
    root = os.path.realpath(tmp_path / ".gpusession")
    folder = os.path.join(root, "checkpoints", result["folder"])
    manifest = os.path.join(root, "checkpoint.json")
    answer = events.index(("returned",))
    before = {e[1] for e in events[:answer] if e[0] == "fsync"}
    entries = json.loads(Path(folder, "index.json").read_text())["variables"]
    assert [("file" in e, "inline" in e) for e in entries] == [(0, 1), (1, 0), (0, 1)], entries
    needed = {os.path.join(folder, f) for f in ("1.pkl", "index.json")}
    needed |= {folder, os.path.dirname(folder)}
    assert needed <= before, sorted(needed - before)
    synced = [e[1] for e in events[:answer] if e[0] == "fsync"]
    files_last = max(synced.index(os.path.join(folder, f)) for f in ("1.pkl", "index.json"))
    assert files_last < synced.index(folder) < synced.index(os.path.dirname(folder)), synced
    commit = next(i for i, e in enumerate(events) if e[0] == "replace" and e[2] == manifest)
    staged = events[commit][1]
    gone = events.index(("rmtree", os.path.join(root, "checkpoints", first["folder"])))
    assert ("fsync", staged) in events[:commit] and commit < gone, events
    assert ("fsync", root) in events[commit + 1 : gone], events[commit:]
    assert json.loads(Path(manifest).read_text())["folder"] == result["folder"]
    assert sorted(os.listdir(root)) == ["checkpoint.json", "checkpoint.lock", "checkpoints"]
    ns, report = _restore(tmp_path)
    assert ns == {"b": list(range(1000)), "c": "x" * 100_000, "d": {"k": 2}}, report


def test_a_save_said_saved_comes_back_when_a_crash_lost_the_manifests_rename(tmp_path):
    """The save's one journal commit holds its folder whole; the manifest's rename reaches the
    disk after the answer. A crash in between leaves the manifest naming the checkpoint before
    (here: put back as it was, that folder too): the restore still brings what was said saved,
    and passes over a later folder of a save cut short (a file short, no index)."""
    _save({"a": 1}, tmp_path)
    _tidied()
    meta = tmp_path / ".gpusession"
    before = (meta / "checkpoint.json").read_bytes()
    old = meta / "checkpoints" / json.loads(before)["folder"]
    kept = {p.name: p.read_bytes() for p in old.iterdir()}
    result = _save({"a": 2, "big": bytearray(50_000)}, tmp_path)
    _tidied()
    assert result["committed"] and not old.exists()
    old.mkdir()  # the crash: neither the rename nor the old folder's removal reached the disk
    for name, data in kept.items():
        (old / name).write_bytes(data)
    (meta / "checkpoint.json").write_bytes(before)
    ns, report = _restore(tmp_path)
    assert ns == {"a": 2, "big": bytearray(50_000)} and not report["failed"], report
    # a save cut short after its index, before its files were whole: never taken over a whole one
    cut = meta / "checkpoints" / "20991231-235959-deadbeef"
    cut.mkdir()
    (cut / "0.pkl").write_bytes(b"\x80\x05K\x03.")
    doc = {**json.loads((meta / "checkpoints" / result["folder"] / "index.json").read_text())}
    doc.update(folder=cut.name, seq=doc["seq"] + 10**12)
    doc["variables"] = [{"name": "a", "file": "0.pkl", "bytes": 99, "type": "int"}]
    (cut / "index.json").write_text(json.dumps(doc))
    ns, report = _restore(tmp_path)
    assert ns == {"a": 2, "big": bytearray(50_000)} and not report["failed"], report
    # at its size but not readable (a crash during its fsyncs left zeros): kept aside, passed over
    (cut / "0.pkl").write_bytes(bytes(99))
    ns, report = _restore(tmp_path)
    assert ns == {"a": 2, "big": bytearray(50_000)} and not report["failed"], report
    assert "damaged" not in report and report["passed_over"][0].startswith(
        ".gpusession/checkpoints/20991231-235959-deadbeef.damaged-"
    ), report
    assert (meta / "checkpoint.json").exists() and not cut.exists()
    # and one that reads whole is taken over the manifest's
    cut.mkdir()
    (cut / "0.pkl").write_bytes(b"\x80\x05K\x03" + b"." * 95)
    (cut / "index.json").write_text(json.dumps(doc))
    assert _restore(tmp_path)[0] == {"a": 3}, "the newer whole one is taken"


def test_a_commit_whose_fsync_fails_is_no_checkpoint(tmp_path, monkeypatch):
    """The disk refuses the save's fsyncs (EIO, a full disk): the save fails, its folder keeps
    no index, and the checkpoint before is still the one a restore takes."""
    _save({"a": 1}, tmp_path)

    def refused(files, folders):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(checkpoint, "_sync_all", refused)
    with pytest.raises(OSError):
        checkpoint.save({"a": 2}, str(tmp_path), deadline=time.time() + 60, cap_bytes=None)
    monkeypatch.undo()
    folders = list((tmp_path / ".gpusession" / "checkpoints").iterdir())
    assert sum((f / "index.json").exists() for f in folders) == 1, folders
    assert _restore(tmp_path)[0] == {"a": 1}


def _tidied() -> None:
    """The old checkpoints go after a save answers (on a thread of their own): wait for that."""
    checkpoint.tidied(timeout=30)


def test_old_checkpoints_go_after_the_answer_but_never_a_folder_a_save_just_made(tmp_path):
    """The race the removal after the answer opened (issue 35): a save's folder exists a moment
    before its save locks it; a removal then must leave it. One left long ago goes."""
    _save({"a": 1}, tmp_path)
    base = tmp_path / ".gpusession" / "checkpoints"
    just_made, long_ago = base / "20990101-000000-aaaaaaaa", base / "20000101-000000-bbbbbbbb"
    just_made.mkdir()
    long_ago.mkdir()
    os.utime(long_ago, (time.time() - 3600, time.time() - 3600))
    # one whose save made it and has not locked it yet (a loaded run caught a
    # removal in between: the save's variables and index then had no folder to go to)
    about_to_lock = base / "20990101-000000-cccccccc"
    about_to_lock.mkdir()
    result = _save({"b": 2}, tmp_path)
    _tidied()
    assert sorted(p.name for p in base.iterdir()) == sorted(
        [result["folder"], just_made.name, about_to_lock.name]
    )
    ns, _ = _restore(tmp_path)
    assert ns == {"b": 2}


@pytest.mark.integration
def test_a_second_live_session_on_a_workspace_is_refused(gs_home, manager):
    first = manager.start(
        manager.make_spec("t4", backend="local", idle="off", name="s1", workspace="shared")
    )
    try:
        for values in ({"workspace": "shared"}, {"resume": "shared"}):
            with pytest.raises(Exception) as refused:
                manager.start(
                    manager.make_spec("t4", backend="local", idle="off", name="s2", **values)
                )
            assert str(refused.value) == (
                "workspace shared is in use by session s1 (running); stop it first "
                "(`gpusession stop s1 --save` keeps its variables for `--resume shared`), "
                "or give this session another --workspace"
            ), refused.value
        with pytest.raises(
            Exception, match="workspace shared is in use by session s1"
        ):  # its default workspace
            manager.start(manager.make_spec("t4", backend="local", idle="off", name="shared"))
        other = manager.start(manager.make_spec("t4", backend="local", idle="off", name="s3"))
        manager.stop(other.id)
    finally:
        manager.stop(first.id, save=True)
    again = manager.start(
        manager.make_spec("t4", backend="local", idle="off", name="s4", resume="shared")
    )
    manager.stop(again.id)


CLAIM = """
import sys, time
from gpusession.session import SessionManager
m = SessionManager()
spec = m.make_spec("t4", backend="local", idle="off", name=sys.argv[1], workspace="race")
at = float(sys.argv[2])
while time.time() < at:
    time.sleep(0.001)
try:
    m.create(spec)
    print("GOT")
except Exception as exc:
    print("REFUSED", exc)
"""


@pytest.mark.integration
def test_two_starts_at_once_on_one_workspace_one_gets_it(gs_home, nb_env):
    for round_ in range(3):
        at = time.time() + 1.5
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", textwrap.dedent(CLAIM), f"c{round_}{i}", str(at)],
                env=nb_env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for i in range(3)
        ]
        outs = [p.communicate(timeout=60)[0] for p in procs]
        assert sum(o.startswith("GOT") for o in outs) == 1, outs
        assert sum("REFUSED workspace race is in use by session" in o for o in outs) == 2, outs
        from gpusession.session.store import Store

        store = Store(Path(nb_env["GPUSESSION_HOME"]) / "sessions.sqlite3")
        for r in store.list():
            if r.state.active:
                store.transition(
                    r.id,
                    __import__("gpusession.core.models", fromlist=["State"]).State.FAILED,
                    "test",
                )


# torch as it behaves where no GPU is visible, reduced to what a checkpoint meets: a tensor's
# storage pickles as torch.storage._load_from_bytes(bytes), and torch.load of bytes saved on a GPU
# raises unless given map_location. (scripts/device_gpu_checks.py runs the same with real CUDA
# tensors on a GPU machine, restored by a process that sees none.)
_TORCH_WITHOUT_GPU = {
    "torch/__init__.py": (
        "from . import storage\n"
        "def load(f, map_location=None, weights_only=None):\n"
        "    data = f.read()\n"
        "    if map_location is None:\n"
        "        raise RuntimeError('Attempting to deserialize object on a CUDA device but '\n"
        "                           'torch.cuda.is_available() is False.')\n"
        "    return ('tensor', len(data), str(map_location))\n"
    ),
    "torch/storage.py": (
        "import io\n"
        "def _load_from_bytes(b):\n"
        "    import torch\n"
        "    return torch.load(io.BytesIO(b), weights_only=False)\n"
    ),
}


@pytest.mark.integration
def test_tensors_saved_on_a_gpu_come_back_on_the_cpu_where_none_is_visible(tmp_path):
    for rel, text in _TORCH_WITHOUT_GPU.items():
        (tmp_path / "lib" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "lib" / rel).write_text(text)
    code = textwrap.dedent(
        """
        import json, sys, time
        from gpusession.agent import checkpoint
        from gpusession.words.workspaces import restore_lines
        import torch.storage

        class OnGpu:  # pickles as a CUDA tensor's storage does
            def __init__(self, n):
                self.n = n
            def __reduce__(self):
                return (torch.storage._load_from_bytes, (b"x" * self.n,))

        ws = sys.argv[1]
        done = checkpoint.save(
            {"small": OnGpu(100), "big": OnGpu(200_000), "plain": [1, 2]}, ws,
            deadline=time.time() + 60, cap_bytes=None,
        )
        checkpoint.tidied(timeout=30)
        ns = {}
        report = checkpoint.restore(ns, ws)
        print(json.dumps({"ns": ns, "report": report, "lines": restore_lines(report, "w")}))
        """
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path / "lib"), os.getcwd()]))
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "ws")],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["ns"] == {
        "small": ["tensor", 100, "cpu"],
        "big": ["tensor", 200_000, "cpu"],
        "plain": [1, 2],
    }, doc
    assert (
        sorted(doc["report"]["restored"]) == ["big", "plain", "small"]
        and not doc["report"]["failed"]
    ), doc["report"]
    assert sorted(doc["report"]["on_cpu"]) == ["big", "small"], doc["report"]
    (line,) = [ln for ln in doc["lines"] if "on the CPU" in ln]
    assert "saved on a GPU, and no GPU is visible here" in line and ".to('cuda')" in line, line
