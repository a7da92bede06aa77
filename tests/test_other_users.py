"""Another user on the same machine (GPU boxes and login nodes are shared): as uid `nobody`, it
reads nothing of a session: not the data folder (store, keys, logs, checkpoints), not the
kernel's sockets, not the agent's answers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest


pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="switching to uid nobody needs root")

# run as nobody: which of the given paths it could list (folders) or read (files)
READ_PROBE = r"""
import json, os, sys
opened = []
for path in json.load(sys.stdin):
    try:
        if os.path.isdir(path):
            os.listdir(path)
        else:
            with open(path, "rb") as f:
                f.read(1)
        opened.append(path)
    except OSError:
        pass
print(json.dumps(opened))
"""


def nobody_python() -> str:
    """A Python of this version that uid nobody may run (ours may live under root's 0700 home)."""
    for candidate in (sys.executable, f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}"):
        try:
            done = subprocess.run([candidate, "-c", "import sys; print(tuple(sys.version_info[:2]))"], user="nobody",
                                  capture_output=True, text=True, cwd="/")
        except OSError:
            continue
        if done.returncode == 0 and done.stdout.strip() == str(tuple(sys.version_info[:2])):
            return candidate
    pytest.skip(f"no Python {sys.version_info[:2]} that uid nobody may run")


def as_nobody(script: str, stdin: str = "", timeout: float = 30, path: str = "") -> str:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": path}
    try:
        done = subprocess.run([nobody_python(), "-c", script], input=stdin, capture_output=True, text=True, env=env,
                              user="nobody", group="nogroup", extra_groups=[], timeout=timeout, cwd="/")
    except PermissionError as exc:
        pytest.skip(f"uid nobody cannot run Python here: {exc}")
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture
def open_parent(monkeypatch):
    """A folder every user may pass through (as a home's parent is), GPUSESSION_HOME in it not made yet."""
    parent = Path(tempfile.mkdtemp(prefix="gs-users-"))
    parent.chmod(0o711)
    monkeypatch.setenv("GPUSESSION_HOME", str(parent / "gshome"))
    monkeypatch.delenv("GPUSESSION_BACKEND", raising=False)
    yield parent
    import shutil

    shutil.rmtree(parent, ignore_errors=True)


def test_another_user_reads_nothing_under_the_data_folder(open_parent):
    from gpusession.session import SessionManager

    home = open_parent / "gshome"
    manager = SessionManager()
    try:
        session = manager.start(manager.make_spec("t4", backend="local", idle="off", name="u1"))
        assert session.kernel.execute("open('notes.txt', 'w').write('mine')\nsecret = 42")["status"] == "ok"
        assert manager.stop(session.id, save=True).resource["checkpoint"]["saved"] == 1
    finally:
        for r in manager.list(active_only=True):
            manager.stop(r.id)
        manager.close()
    everything = [str(home), *(os.path.join(root, name) for root, dirs, files in os.walk(home)
                                for name in dirs + files)]
    names = {Path(p).name for p in everything}
    assert {"sessions.sqlite3", "runtime.log", "kernel.json", "notes.txt"} <= names, names
    assert json.loads(as_nobody(READ_PROBE, json.dumps(everything))) == []
    # and not only because the top folder is closed: each folder 0700, each file 0600
    modes = {p: oct(os.lstat(p).st_mode & 0o777) for p in everything}
    opened = {p: m for p, m in modes.items() if m not in ("0o700", "0o600")}
    assert opened == {}, opened


def test_an_existing_open_data_folder_is_said_once(tmp_path, nb_env):
    home = tmp_path / "open-home"
    home.mkdir(mode=0o755)
    home.chmod(0o755)
    env = dict(nb_env, GPUSESSION_HOME=str(home))
    said = [subprocess.run([sys.executable, "-m", "gpusession", "list"], env=env, capture_output=True, text=True,
                           timeout=60) for _ in range(2)]
    for done in said:
        assert done.returncode == 0, done.stderr
        lines = [line for line in done.stderr.splitlines() if "open to other users" in line]
        assert lines == [f"gpusession: your data folder {home} is open to other users on this machine (mode 755): "
                         f"they may read your sessions' keys and tokens there. Close it with: chmod 700 {home}"], \
            done.stderr
        assert "Traceback" not in done.stderr
