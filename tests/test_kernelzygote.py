"""A kernel begun before the runtime (gpusession.agent.kernelzygote, what a Kubernetes pod starts
as its container starts): the first step hands it the kernel's plan, and the kernel it becomes
is the kernel a plain start gives: the same sys.path, environment, folder, umask, signals,
argv, session. Where its start differs from the plan's (here: a variable only it had), it execs
the plan instead. Real processes, a real ipykernel, driven as the pod's command drives them."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from jupyter_client import BlockingKernelClient

from gpusession.backends.base import marker_lines
from support import kernelstate

ROOT = Path(__file__).resolve().parents[1]
SOURCE = (ROOT / "gpusession" / "agent" / "kernelzygote.py").read_text()

pytestmark = pytest.mark.integration


def _env() -> dict:
    """No locale, as in most images: Python's start then sets LC_CTYPE for its children (PEP 538),
    which a kernel spawned by the runtime gets and a zygote started by sh did not."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("GPUSESSION_", "LC_")) and k not in ("LANG", "LANGUAGE")
    }
    return {**env, "PYTHONPATH": str(ROOT), "GPUSESSION_KERNEL_KEY": "cd" * 32}


def _start(
    tmp: Path,
    name: str,
    zygote: str | None,
    shell: str = "",
    *,
    spawn: bool = True,
    env: dict[str, str] | None = None,
) -> dict:
    """A session's first step run as the pod's command runs it; `zygote`: None for a plain
    start, else what comes before the zygote's Python on its command line (variables of its
    own); `shell`: the command's first words; `spawn`: the first kernel a fresh process (else
    the first step's fork); `env`: variables beside. The kernel's state as a cell sees it, with
    the run's pids and folders."""
    state, work = tmp / name / "state", tmp / name / "work"
    work.mkdir(parents=True)
    py = shlex.quote(sys.executable)
    first = (
        f"exec {py} -m gpusession.agent.firststep run --session-id z1 --state-dir {state} "
        f"--agent-port -1 --cwd {work} --workspace {work}/ws"
    )
    begun = ""
    if zygote is not None:
        begun = (
            f"{zygote} {py} -c {shlex.quote(SOURCE)} {state} 60 & "
            "GPUSESSION_ZYGOTE=$!; export GPUSESSION_ZYGOTE; echo ZYGOTE $GPUSESSION_ZYGOTE; "
        )
    proc = subprocess.Popen(
        ["/bin/sh", "-c", shell + begun + first],
        env={**_env(), **(env or {}), **({"GPUSESSION_SPAWN_FIRST_KERNEL": "1"} if spawn else {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=tmp,
    )
    try:
        lines = []
        for line in proc.stdout:  # the kernel's lines share it: a marker may start mid-line
            lines += marker_lines(line)
            if lines and lines[-1].startswith(("GPUSESSION_READY", "GPUSESSION_FAILED")):
                break
        assert lines and lines[-1].startswith("GPUSESSION_READY"), "".join(lines)
        ready = json.loads(lines[-1].split(" ", 1)[1])
        assert json.loads((state / "ready.json").read_text()) == ready  # READY_FILE, as said
        client = BlockingKernelClient(connection_file=str(state / "kernel.json"))
        client.load_connection_file()
        client.start_channels()
        try:
            client.wait_for_ready(timeout=60)
            out: list[str] = []
            reply = client.execute_interactive(
                kernelstate.CELL,
                timeout=60,
                output_hook=lambda m: out.append(m["content"].get("text", "")),
            )
            assert reply["content"]["status"] == "ok", reply["content"]
        finally:
            client.stop_channels()
        found = kernelstate.parse("".join(out))
        runtime = json.loads((state / "runtime.json").read_text())
        zygote_said = [x.split()[1] for x in lines if x.startswith("ZYGOTE ")]
        return {
            "state": found,
            "kernel_pid": runtime["kernel_pid"],
            "first_step": proc.pid,
            "zygote": int(zygote_said[0]) if zygote_said else None,
            "folders": {str(state): "STATE", str(work): "WORK"},
        }
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        proc.stdout.close()
        runtime = state / "runtime.json"
        if runtime.exists():
            try:
                os.killpg(json.loads(runtime.read_text())["kernel_pid"], signal.SIGKILL)
            except (ProcessLookupError, TypeError):
                pass


def _comparable(run: dict) -> dict:
    state = dict(run["state"], env=dict(run["state"]["env"]))
    assert state["env"].pop("JPY_PARENT_PID") == str(run["first_step"]), "its parent: the runtime"
    return kernelstate.comparable(state, replace=run["folders"])


@pytest.mark.parametrize("shell", ["", "trap '' QUIT; "], ids=["signals-default", "quit-ignored"])
def test_a_kernel_begun_before_the_runtime_is_the_kernel_a_plain_start_gives(tmp_path, shell):
    """Also where the pod's first process ignores a signal (its kernel inherits that; a shell's
    `&` ignores SIGINT and SIGQUIT in the zygote whatever its parent had)."""
    plain = _start(tmp_path, "plain", None, shell)
    begun = _start(tmp_path, "begun", "", shell)
    assert plain["state"]["cmdline"][1:3] == ["-m", "ipykernel_launcher"]
    assert begun["state"]["cmdline"][1] == "-c", "the zygote's own process ran the kernel"
    assert begun["state"]["pid"] == begun["kernel_pid"] == begun["zygote"]
    assert plain["state"]["session_leader"] and begun["state"]["session_leader"]
    assert "gpusession.agent.activity" in begun["state"]["modules"]
    assert _comparable(begun) == _comparable(plain), _diff(_comparable(begun), _comparable(plain))


def test_a_zygote_begun_otherwise_than_the_plan_execs_the_plain_start(tmp_path):
    """A variable the zygote started with and the kernel's plan does not have (anything but our
    own): its imports may have read it, so it execs the plan: the kernel a plain start gives."""
    plain = _start(tmp_path, "plain", None)
    other = _start(tmp_path, "other", "ONLY_THE_ZYGOTE_HAD_THIS=1")
    assert other["state"]["cmdline"][1:3] == ["-m", "ipykernel_launcher"], "exec'd"
    assert other["state"]["pid"] == other["kernel_pid"] == other["zygote"], "in its own process"
    assert "ONLY_THE_ZYGOTE_HAD_THIS" not in other["state"]["env"]
    assert _comparable(other) == _comparable(plain)


# what the first step imported before its fork, which a kernel it spawns loads later or never
FIRST_STEPS_OWN = {"__main__", "runpy"}
# what boot.sh says where an image has no locale (as Python's start would, for its children)
BOOT_LOCALE = {"LC_CTYPE": "C.UTF-8"}


def _forked_comparable(run: dict) -> dict:
    state = _comparable(run)
    state["modules"] = sorted(
        m
        for m in state["modules"]
        if not m.startswith("gpusession.agent.") and m not in FIRST_STEPS_OWN
    )
    return state


@pytest.mark.parametrize("shell", ["", "trap '' QUIT; "], ids=["signals-default", "quit-ignored"])
def test_the_first_kernel_forked_from_the_first_step_is_the_kernel_a_spawn_gives(tmp_path, shell):
    """The first step's fork runs the first kernel (its Python's start spared: the docker warm
    start of issue 35); it is the kernel a spawn of the same plan gives: sys.path, environment,
    folder, umask, signals, argv, flags, standard streams, a session of its own, the first step
    its parent. Only modules of the runtime it imported before the fork are more."""
    spawned = _start(tmp_path, "spawned", None, shell, env=BOOT_LOCALE)
    forked = _start(tmp_path, "forked", None, shell, spawn=False, env=BOOT_LOCALE)
    assert spawned["state"]["cmdline"][1:3] == ["-m", "ipykernel_launcher"]
    assert forked["state"]["cmdline"][2] == "gpusession.agent.firststep", "its fork ran it"
    assert forked["state"]["pid"] == forked["kernel_pid"] != forked["first_step"]
    assert forked["state"]["session_leader"]
    assert "gpusession.agent.activity" in forked["state"]["modules"]
    assert _forked_comparable(forked) == _forked_comparable(spawned), _diff(
        _forked_comparable(forked), _forked_comparable(spawned)
    )


def test_a_forked_first_kernel_takes_the_folders_its_plan_adds_to_the_path(tmp_path):
    """The bundle's pip for an image without one: the kernel's PYTHONPATH is the first step's
    with a folder added, which the fork puts where a fresh start's sys.path has it."""
    root = tmp_path / "runtime"
    (root / "site" / "pip").mkdir(parents=True)
    env = {"GPUSESSION_RUNTIME_ROOT": str(root), "GPUSESSION_RUNTIME_BRINGS": "pip", **BOOT_LOCALE}
    spawned = _start(tmp_path, "spawned", None, env=env)
    forked = _start(tmp_path, "forked", None, spawn=False, env=env)
    assert forked["state"]["cmdline"][2] == "gpusession.agent.firststep", "not exec'd"
    assert str(root / "site" / "pip") in forked["state"]["path"]
    assert _forked_comparable(forked) == _forked_comparable(spawned), _diff(
        _forked_comparable(forked), _forked_comparable(spawned)
    )


def test_a_first_step_whose_start_coerced_the_locale_execs_its_first_kernel(tmp_path):
    """No locale and started otherwise than by boot.sh: the first step's Python made its locale
    C.UTF-8 and runs in UTF-8 mode, which a kernel started with that locale does not: the fork
    execs the plan, and the kernel is the one a spawn gives."""
    spawned = _start(tmp_path, "spawned", None)
    forked = _start(tmp_path, "forked", None, spawn=False)
    assert forked["state"]["cmdline"][1:3] == ["-m", "ipykernel_launcher"], "exec'd"
    assert forked["state"]["env"]["LC_CTYPE"] == "C.UTF-8"
    assert _comparable(forked) == _comparable(spawned), _diff(
        _comparable(forked), _comparable(spawned)
    )


def test_a_zygote_never_given_its_plan_ends_by_itself(tmp_path):
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", SOURCE, str(tmp_path / "state"), "0.5"],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - started < 30


def _diff(a: dict, b: dict) -> dict:
    out = {}
    for k in set(a) | set(b):
        if isinstance(a.get(k), dict) and isinstance(b.get(k), dict):
            d = _diff(a[k], b[k])
            if d:
                out[k] = d
        elif a.get(k) != b.get(k):
            out[k] = (a.get(k), b.get(k))
    return out
