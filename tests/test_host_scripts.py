"""The test hosts' scripts (scripts/lib/netns.sh, scripts/lib/netns-docker-host.sh): a pid file
names its daemon only while that daemon lives, and `up` brings back an engine that died or stopped
answering, never trusting or killing a process that merely got the dead daemon's pid.

A CI run lost one worker's ssh:// host so: its engine gone, its pid file naming a live process,
`up` said "running" and every later test of that worker failed its setup."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NETNS = ROOT / "scripts" / "lib" / "netns.sh"


def _alive(pid_file: Path) -> bool:
    """The scripts' own answer, from bash."""
    result = subprocess.run(
        ["bash", "-c", f'NAME=test; source "{NETNS}"; alive "$1"', "bash", str(pid_file)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode in (0, 1), result.stderr
    return result.returncode == 0


def test_a_pid_file_names_its_daemon_only_while_that_daemon_lives(tmp_path):
    pid_file = tmp_path / "daemon.pid"
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        pid_file.write_text(f"{sleeper.pid}\n")  # written after the start, as a daemon writes it
        assert _alive(pid_file)

        # the same pid in a file written a minute before that process started: the daemon of the
        # file died and its pid went to this process, which is not ours
        old = time.time() - 60
        os.utime(pid_file, (old, old))
        assert not _alive(pid_file)

        pid_file.write_text(f"{sleeper.pid}\n")
        sleeper.kill()  # dead, and not reaped yet: a zombie, which still answers kill -0
        stat = Path(f"/proc/{sleeper.pid}/stat")
        for _ in range(100):
            if stat.read_text().rsplit(")", 1)[1].split()[0] == "Z":
                break
            time.sleep(0.05)
        assert not _alive(pid_file)
    finally:
        sleeper.kill()
        sleeper.wait()
    assert not _alive(pid_file)  # gone

    for garbage in ("", "abc", "-1", "12 34"):
        pid_file.write_text(garbage)
        assert not _alive(pid_file), garbage
    assert not _alive(tmp_path / "missing.pid")


@pytest.mark.docker
@pytest.mark.root
def test_up_starts_an_engine_whose_pid_went_to_another_process_and_leaves_that_process_be():
    from support.ec2_platform import NS_DOCKER, SCRIPT, ensure_ec2_host
    from support.slots import script_env

    if why := ensure_ec2_host():
        pytest.skip(why)
    run = Path(NS_DOCKER[len("unix://") :]).parent
    pid_file = run / "dockerd.pid"
    engine = int(pid_file.read_text())
    written = pid_file.stat().st_mtime
    os.kill(engine, 9)  # the engine dies without removing its pid file
    for _ in range(100):
        if not Path(f"/proc/{engine}").exists():
            break
        time.sleep(0.1)
    # the pid file's time and a process's start compare with 2 s of slack: a pid taken within
    # them is one `up` cannot tell from its daemon's. A reused pid comes later; so does this one,
    # also when the engine had just started (this test run alone: CI stop 48). In whole seconds,
    # as they once were, 3.5 s could pass for the daemon's (CI stop 51): `alive` reads hundredths
    time.sleep(max(0.0, written + 3.5 - time.time()))
    stranger = subprocess.Popen(["sleep", "300"])  # ... and its pid is another process's now
    try:
        pid_file.write_text(f"{stranger.pid}\n")
        os.utime(pid_file, (written, written))
        result = subprocess.run(
            ["bash", str(SCRIPT), "up"],
            capture_output=True,
            text=True,
            timeout=180,
            env=script_env(),
        )
        assert result.returncode == 0, result.stdout + result.stderr
        assert stranger.poll() is None, "up killed a process that only got the engine's pid"
        assert int(pid_file.read_text()) not in (stranger.pid, engine)
        version = subprocess.run(
            ["docker", "version", "--format", "{{.Server.Version}}"],
            env=dict(os.environ, DOCKER_HOST=NS_DOCKER),
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert version.returncode == 0 and version.stdout.strip(), version.stderr
    finally:
        stranger.kill()
        stranger.wait()
