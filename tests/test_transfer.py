"""Data between the notebook and a session (gpusession/transport/kernel/transfer_client.py,
agent/transfer_handler.py): %gpu push/pull as binary frames, %gpu upload/download and
`gpusession upload|download`, the `--upload` start option (.git and .gitignore'd files stay here, a cap), progress bars, bad input
on every face, and the idle clock. Real parts: the local backend's processes, a notebook kernel,
the CLI as a subprocess, the local Docker engine and the ssh:// namespace engine."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support.hosts import docker_available, ensure_remote_host, product_image, ssh_home

ROOT = Path(__file__).resolve().parent.parent


def _project(root: Path) -> Path:
    """A notebook's folder: a module, a .git, ignored files (top-level and nested .gitignore)."""
    proj = root / "proj"
    (proj / ".git").mkdir(parents=True)
    (proj / ".git" / "config").write_text("[core]\n")
    (proj / "utils.py").write_text("X = 42\ndef twice(v):\n    return 2 * v\n")
    (proj / ".gitignore").write_text("secret.txt\nbuild/\n")
    (proj / "secret.txt").write_text("not for the session")
    (proj / "build").mkdir()
    (proj / "build" / "big.o").write_bytes(b"\0" * 1000)
    (proj / "sub").mkdir()
    (proj / "sub" / ".gitignore").write_text("*.log\n")
    (proj / "sub" / "run.log").write_text("log")
    (proj / "sub" / "keep.py").write_text("Y = 1\n")
    return proj


def _what_is_there() -> str:
    return (
        "import os\nprint(sorted(p for p in ['utils.py', 'sub/keep.py', '.gitignore', '.git', 'secret.txt', "
        "'build', 'sub/run.log'] if os.path.exists(p)))"
    )


@pytest.mark.integration
def test_notebook_upload_import_download_progress_and_bad_input(notebook, tmp_path):
    proj = _project(tmp_path)
    over = notebook.run(f"%gpu start --backend local --idle off --upload {proj} --upload-max 10B")
    assert over.error["ename"] == "UsageError"
    assert (
        "--upload" in over.error["evalue"]
        and "over the 10 B cap; raise it with --upload-max" in over.error["evalue"]
    )
    assert "\n" not in over.error["evalue"]

    r = notebook.run(f"%gpu start --backend local --idle off --upload {proj}")
    assert r.status == "ok", r.text
    assert "upload: 4 files" in r.text, r.text  # utils.py, .gitignore, sub/.gitignore, sub/keep.py
    r = notebook.run("%%gpu\nimport utils\nprint(utils.twice(utils.X))\n" + _what_is_there())
    assert r.status == "ok", r.text
    assert "84" in r.text
    assert "['.gitignore', 'sub/keep.py', 'utils.py']" in r.text, (
        r.text
    )  # no .git, secret, build, log

    (tmp_path / "data.bin").write_bytes(os.urandom(3_000_000))
    r = notebook.run("%gpu upload data.bin --to inbox")
    assert r.status == "ok", r.text
    assert "upload 100% |####################| 3 MB / 3 MB" in r.text and "MB/s" in r.text, r.text
    assert "uploaded data.bin (1 files, 3 MB) to " in r.text
    r = notebook.run(
        "%%gpu\nimport hashlib\nopen('result.txt', 'w').write('made in the session')\n"
        "print(hashlib.sha256(open('inbox/data.bin', 'rb').read()).hexdigest())"
    )
    assert (
        r.text.strip()
        == __import__("hashlib").sha256((tmp_path / "data.bin").read_bytes()).hexdigest()
    )
    r = notebook.run("%gpu download result.txt --to got")
    assert r.status == "ok", r.text
    assert (tmp_path / "got" / "result.txt").read_text() == "made in the session"

    r = notebook.run("blob = bytes(range(256)) * 8000\n%gpu push blob")
    assert "push 100% |" in r.text and "pushed blob to" in r.text, r.text
    r = notebook.run("%%gpu\nblob2 = blob[::-1]")
    r = notebook.run("%gpu pull blob2\nprint(blob2 == blob[::-1])")
    assert "pull 100% |" in r.text and "True" in r.text, r.text

    bad = {
        "%gpu upload nowhere.txt": "no such file or folder here: 'nowhere.txt'",
        "%gpu download ../../etc/passwd": "is outside the session's working directory",
        "%gpu download missing.txt": "no such file or folder in the session: 'missing.txt'",
        "%gpu pull undefined_here": "cannot pull undefined_here: not defined in the session kernel",
        "%gpu upload": "the following arguments are required: paths",
    }
    for line, words in bad.items():
        r = notebook.run(line)
        assert r.error is not None and r.error["ename"] == "UsageError", (line, r.text)
        assert words in r.error["evalue"] and "\n" not in r.error["evalue"], (
            line,
            r.error["evalue"],
        )
    r = notebook.run("%%gpu\nprint(utils.X)")  # the session is fine after all that
    assert r.text.strip() == "42"
    r = notebook.run("%gpu help upload")
    assert "%gpu upload [--to TO] [--all] paths" in r.text, r.text


@pytest.fixture
def local_session(manager, gs_home):
    session = manager.start(manager.make_spec("t4", backend="local", idle="30m", name="data"))
    return (
        session,
        gs_home / "workspaces" / "data",
    )  # the local kernel works in its workspace folder


@pytest.mark.integration
def test_push_counts_as_activity_for_the_idle_watchdog(local_session):
    session, _ = local_session
    time.sleep(3.0)
    before = session.stats(limit=1)["idle"]["idle_for_s"]
    assert before >= 2.0
    session.push({"x": b"\0" * 5_000_000})  # no cell runs: only the transfer itself
    deadline = time.monotonic() + 5
    while (
        after := session.stats(limit=1)["idle"]["idle_for_s"]
    ) >= before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert after < 1.5 < before, (before, after)
    assert session.kernel.evaluate("len(x)") == "5000000"


@pytest.mark.integration
def test_a_kernel_without_transfers_is_named_not_waited_on(local_session):
    """A session whose runtime predates transfers ignores the request: one line, no hang."""
    from gpusession.core.errors import BadInput

    session, _ = local_session
    session.run("get_ipython().kernel.shell_handlers.pop('gpusession_transfer_request')")
    started = time.monotonic()
    with pytest.raises(BadInput, match="its gpusession runtime is older than this one"):
        session.push({"x": 1})
    assert time.monotonic() - started < 10
    assert session.kernel.evaluate("1 + 1") == "2"


@pytest.mark.integration
def test_a_transfer_given_up_leaves_no_thread_in_the_kernel(local_session):
    """Ctrl-C (or a crash) mid-transfer: the abort ends the session kernel's tar threads."""
    from gpusession.transport.kernel.channel import Channel
    from gpusession.transport.kernel.transfer_client import _open

    session, work = local_session
    (work / "big.bin").write_bytes(b"\0" * 40_000_000)  # more than the kernel's queue holds
    threads = "__import__('threading').active_count()"
    before = session.kernel.evaluate(threads)
    for content in ({"kind": "download", "paths": ["big.bin"]}, {"kind": "upload", "to": "half"}):
        channel = Channel(session.kernel, None)
        _open(channel, **content)
        channel.abort()
    deadline = time.monotonic() + 5
    while session.kernel.evaluate(threads) != before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert session.kernel.evaluate(threads) == before
    assert (
        session.download(["big.bin"], str(work / "back"))["bytes"] == 40_000_000
    )  # and the next one works


@pytest.mark.integration
def test_cli_upload_download_and_bad_input(local_session, tmp_path):
    session, work = local_session
    proj = _project(tmp_path)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    cli = [sys.executable, "-m", "gpusession"]
    r = subprocess.run(
        [*cli, "upload", "data", str(proj), "--to", "copy"], capture_output=True, text=True, env=env
    )
    assert r.returncode == 0, r.stderr
    assert "uploaded" in r.stdout and "(4 files," in r.stdout, r.stdout
    assert (work / "copy" / "proj" / "utils.py").exists() and not (
        work / "copy" / "proj" / ".git"
    ).exists()
    (tmp_path / "big.bin").write_bytes(b"\1" * 2_000_000)
    r = subprocess.run(
        [*cli, "upload", "data", str(tmp_path / "big.bin")], capture_output=True, text=True, env=env
    )
    assert r.returncode == 0 and "upload 100% |" in r.stderr and "MB/s" in r.stderr, r.stderr
    session.run("open('made.txt', 'w').write('from the session')")
    r = subprocess.run(
        [*cli, "download", "data", "made.txt", "copy", "--to", str(tmp_path / "back")],
        capture_output=True,
        text=True,
        env=env,
    )
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "back" / "made.txt").read_text() == "from the session"
    assert (tmp_path / "back" / "copy" / "proj" / "sub" / "keep.py").read_text() == "Y = 1\n"
    for argv, words in (
        (["upload", "data", str(tmp_path / "nope")], "no such file or folder here"),
        (["upload", "nosuch", str(tmp_path / "big.bin")], "nosuch"),
        (["download", "data", "/etc/passwd"], "outside the session's working directory"),
        (["download", "data", "gone.txt"], "no such file or folder in the session: 'gone.txt'"),
    ):
        r = subprocess.run([*cli, *argv], capture_output=True, text=True, env=env)
        assert r.returncode == 1 and words in r.stderr, (argv, r.stderr)
        assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr


def test_start_tree_over_its_cap_is_refused_before_anything_starts(manager, tmp_path):
    from gpusession.configuration import options
    from gpusession.core.errors import BadInput

    proj = _project(tmp_path)
    (proj / "weights.bin").write_bytes(b"\0" * 2_000_000)
    with pytest.raises(BadInput) as err:
        manager.make_spec(
            "t4", backend="local", upload=str(proj), upload_max="1MB", face=options.FLAGS
        )
    assert str(err.value).startswith(
        f"--upload: '{proj}' is 2 MB in 5 files (without .git and what .gitignore"
    )
    assert "over the 1 MB cap; raise it with --upload-max (e.g. 4MB)" in str(err.value)
    with pytest.raises(BadInput, match="no such folder here"):
        manager.make_spec("t4", backend="local", upload=str(tmp_path / "none"))
    assert manager.list() == []


async def test_rest_start_over_the_cap_is_a_400_naming_fields(jp_fetch, manager, tmp_path):
    import json

    proj = _project(tmp_path)
    body = json.dumps({"backend": "local", "upload": str(proj), "upload_max": "10B"})
    r = await jp_fetch("gpusession", "api", "sessions", method="POST", body=body, raise_error=False)
    message = json.loads(r.body)["message"]
    assert (
        r.code == 400
        and message.startswith("'upload': ")
        and "raise it with 'upload_max'" in message
    ), message
    assert "--" not in message and manager.list() == []


# -- the real Docker engine: this machine's, and the ssh:// namespace host ----------------------

docker_test = pytest.mark.skipif(
    not docker_available(), reason="no Docker engine answers (scripts/ci-host-setup.sh)"
)


def _round_trip(session, proj: Path, tmp_path: Path) -> None:
    blob = os.urandom(20_000_000)
    seen = []
    session.push({"blob": blob}, lambda done, total: seen.append((done, total)))
    assert seen[-1] == (seen[-1][1], seen[-1][1]) and seen[-1][1] > 20_000_000
    session.run("back = blob[::-1]")
    assert session.pull(["back"])["back"] == blob[::-1]
    r = session.kernel.evaluate("__import__('os').getcwd()")
    done = session.upload([str(proj / "utils.py"), str(proj / "sub")], to="lib")
    assert done["files"] == 3 and done["dest"].endswith("/lib"), (
        done,
        r,
    )  # utils, sub/.gitignore, sub/keep; not run.log
    session.run(
        "import sys; sys.path.insert(0, 'lib'); import utils; open('lib/out.txt', 'w').write(str(utils.X))"
    )
    got = session.download(["lib/out.txt", "lib/sub"], to=str(tmp_path / "got"))
    assert (tmp_path / "got" / "out.txt").read_text() == "42"
    assert (tmp_path / "got" / "sub" / "keep.py").exists() and not (
        tmp_path / "got" / "sub" / "run.log"
    ).exists()
    assert got["files"] == 3


@docker_test
@pytest.mark.docker
def test_docker_session_starts_with_the_folder_and_moves_data(manager, tmp_path, monkeypatch):
    monkeypatch.setenv("GPUSESSION_IMAGE", product_image())
    proj = _project(tmp_path)
    lines: list[str] = []
    session = manager.start(
        manager.make_spec("t4", backend="docker", idle="off", upload=str(proj)), report=lines.append
    )
    assert any("upload: 4 files" in line for line in lines), lines
    assert session.kernel.evaluate("__import__('utils').X") == "42"
    assert (
        session.kernel.evaluate(
            "[__import__('os').path.exists(p) for p in ('.git', 'secret.txt', 'build')]"
        )
        == "[False, False, False]"
    )
    _round_trip(session, proj, tmp_path)


@pytest.mark.docker
def test_ssh_engine_push_pull_20mb_and_files(manager, tmp_path, monkeypatch):
    remote = ensure_remote_host()
    if remote is None:
        pytest.skip(
            "the namespace Docker host cannot run here (needs root; scripts/ci-remote-host.sh)"
        )
    monkeypatch.setenv("HOME", ssh_home(remote, tmp_path / "home"))
    monkeypatch.setenv("GPUSESSION_IMAGE", product_image())
    session = manager.start(
        manager.make_spec("t4", backend="docker", idle="off", host=remote["url"])
    )
    _round_trip(session, _project(tmp_path), tmp_path)


def test_upload_options_are_read_alike_on_every_face():
    from gpusession.configuration import options
    from gpusession.configuration.catalog import load_catalog

    problems = options.check_body({"upload_max": "lots", "upload": 7}, catalog=load_catalog())
    assert problems == {
        "upload": "wrong type (number): expected a string",
        "upload_max": "'lots' is no size; write e.g. 500MB, 2GB or 300MiB (a bare number means MB)",
    }
    parsed = options.parse_values({"upload_max": "1.5GB", "upload": "~/x"}, catalog=load_catalog())
    assert parsed == {"upload_max": 1_500_000_000, "upload": os.path.expanduser("~/x")}


def test_a_long_transfer_keeps_writing_its_activity(tmp_path, monkeypatch):
    """Requests closer than a second apart (a big transfer) still reach activity.json once a
    second, so a transfer longer than the idle timeout is never taken for idleness."""
    import json

    from gpusession.agent import activity
    from gpusession.core.protocol import ENV_STATE_DIR

    monkeypatch.setenv(ENV_STATE_DIR, str(tmp_path))
    seen = set()
    started = time.time()
    while time.time() - started < 2.6:
        activity.touch()
        seen.add(json.loads((tmp_path / "activity.json").read_text())["last_activity"])
        time.sleep(0.2)
    assert len(seen) >= 3 and max(seen) > started + 1.5, sorted(seen)


@pytest.mark.integration
def test_upload_never_writes_through_a_link_leading_outside(local_session, tmp_path):
    """Issue 19 item 6: `w/sub` in the session is a link to a folder outside; uploading a folder
    `sub` into `w` must not write into that outside folder (on every Python: this one is 3.11,
    without tarfile.data_filter)."""
    session, work = local_session
    outside = tmp_path / "outside"
    outside.mkdir()
    (work / "w").mkdir()
    (work / "w" / "sub").symlink_to(outside)
    src = tmp_path / "src" / "sub"
    src.mkdir(parents=True)
    (src / "a.txt").write_text("not for outside")
    (tmp_path / "src" / "top.txt").write_text("fine")
    done = session.upload([str(src), str(tmp_path / "src" / "top.txt")], to="w")
    assert list(outside.iterdir()) == []
    assert done["files"] == 1 and (work / "w" / "top.txt").read_text() == "fine"
    assert done["refused"] == [
        f"sub/a.txt (it would be written through a link: sub is a link leading outside "
        f"{work / 'w'})"
    ], done


@pytest.mark.integration
def test_download_keeps_links_inside_and_refuses_those_leading_outside_by_name(
    local_session, tmp_path
):
    session, work = local_session
    d = work / "d"
    (d / "deep").mkdir(parents=True)
    (d / "f.txt").write_text("data")
    (d / "deep" / "g.txt").write_text("more")
    (d / "in_link").symlink_to("f.txt")
    (d / "deep" / "up_link").symlink_to("../f.txt")
    (d / "out_link").symlink_to("/etc/passwd")
    (d / "out_dir").symlink_to("../..")
    done = session.download(["d"], str(tmp_path / "got"))
    got = tmp_path / "got" / "d"
    assert (got / "f.txt").read_text() == "data" and (got / "deep" / "g.txt").read_text() == "more"
    assert os.readlink(got / "in_link") == "f.txt" and (got / "in_link").read_text() == "data"
    assert os.readlink(got / "deep" / "up_link") == "../f.txt"
    assert not os.path.lexists(got / "out_link") and not os.path.lexists(got / "out_dir")
    assert sorted(done["refused"]) == [
        "d/out_dir (a link to ../.., outside the folder)",
        "d/out_link (a link to /etc/passwd, outside the folder)",
    ], done
    assert done["files"] == 2
    assert sorted(p.name for p in got.rglob("*")) == [
        "deep",
        "f.txt",
        "g.txt",
        "in_link",
        "up_link",
    ]


def test_a_link_opens_a_stream_only_beside_the_kernels_own_sockets(tmp_path):
    """The raw stream's connection goes only to a socket in the kernel's folder, whatever path
    a reply names; a kernel on TCP ports gets none (its download comes as ZMQ frames)."""
    import socket

    from gpusession.backends.base import DirectLink

    folder = tmp_path / "k"
    folder.mkdir()
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(folder / "k-rabc"))
    listener.listen(1)
    elsewhere = socket.socket(socket.AF_UNIX)
    elsewhere.bind(str(tmp_path / "other"))
    elsewhere.listen(1)
    ipc = {"transport": "ipc", "ip": str(folder / "k"), "shell_port": 1}
    link = DirectLink(ipc, None)
    assert link.streams
    conn = link.open_stream(str(folder / "k-rabc"))
    assert conn is not None
    conn.close()
    assert link.open_stream(str(tmp_path / "other")) is None
    assert link.open_stream(str(folder / "k-gone")) is None  # nothing listens: None, no raise
    tcp = DirectLink({"transport": "tcp", "ip": "127.0.0.1", "shell_port": 5}, None)
    assert not tcp.streams and tcp.open_stream(str(folder / "k-rabc")) is None
    listener.close()
    elsewhere.close()


def test_a_raw_stream_socket_is_shared_as_the_kernels_own_are(tmp_path):
    """In a 2770 folder (a container's kernel, reached by another uid's login) the kernel's socket
    for raw streams is its group's too, as its own sockets are; in a 0700 folder, the owner's
    alone. A connection without a stream's token gets nothing."""
    import socket

    from gpusession.agent.transfer_kinds import _Source
    from gpusession.agent.transfer_raw import Listener, RawStream

    for mode, want in ((0o2770, 0o660), (0o700, 0o700)):
        folder = tmp_path / oct(mode)
        folder.mkdir()
        folder.chmod(mode)
        listener = Listener(str(folder / "k-r"))
        raw = RawStream(_Source(1 << 20, blob=b"x" * 10), listener, lambda: None)
        try:
            assert (folder / "k-r").stat().st_mode & 0o777 == want
            stranger = socket.socket(socket.AF_UNIX)
            stranger.connect(str(folder / "k-r"))
            stranger.sendall(bytes(24))  # a wrong token, offset 0
            stranger.settimeout(10)
            assert stranger.recv(100) == b""  # closed, nothing sent
            stranger.close()
        finally:
            raw.close()
            listener.close()
        assert not (folder / "k-r").exists()
