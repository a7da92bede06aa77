"""The slurm backend against a real Slurm (scripts/ci-slurm.sh): slurmctld, a login node with
sshd and two compute nodes, each in its own network namespace, GPUs as GRES without devices
(n1: gpu:t4:2, n2: gpu:a100_40g:1 and two MIG slices gpu:1g.10gb:2). Sessions are submitted through the login node over SSH,
placed by Slurm, and reached through the login node as jump host to the node's loopback."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from gpusession.configuration.cost import BILLED_FROM, record_billed_seconds
from gpusession.core.models import State
from gpusession.core.protocol import StopKind
from gpusession.session.views import session_view
from gpusession.transport.kernel.sink import OutputSink
from gpusession.words.status import MIG_UTILIZATION, gpu_lines
from support.procs import start_interrupted, wait_dead
from support.slurm import (
    REGISTRY,
    STATE,
    cancel_all,
    ensure_cluster,
    filler_job,
    image_without_python,
    registry_image,
    registry_login,
    slurm,
    slurm_home,
    squeue,
    wait_until,
)

# one cluster per machine (scripts/ci-slurm.sh), whose GPUs and queue the tests count: its tests
# run one after another, on one xdist worker
pytestmark = [pytest.mark.slow, pytest.mark.slurm, pytest.mark.xdist_group("slurm")]


@pytest.fixture
def cluster():
    found = ensure_cluster()
    if found is None:
        pytest.skip("the test Slurm cluster needs root (scripts/ci-slurm.sh)")
    cancel_all(found)
    yield found
    cancel_all(found)


@pytest.fixture
def home(cluster, gs_home, tmp_path, monkeypatch) -> str:
    """A user's HOME: ~/.ssh/config and known_hosts for the login node, nothing for the nodes."""
    path = slurm_home(cluster, tmp_path / "home")
    monkeypatch.setenv("HOME", path)
    return path


def slurm_spec(manager, cluster, gpu: str = "t4", **values):
    values.setdefault("idle", "off")
    values.setdefault("python", sys.executable)  # the nodes share this machine's filesystem
    return manager.make_spec(gpu, backend="slurm", host=cluster["url"], **values)


class Collect(OutputSink):
    def __init__(self):
        self.text = ""

    def stream(self, name: str, text: str) -> None:
        self.text += text


def cell(session, code: str) -> str:
    sink = Collect()
    session.run(code, sink=sink)
    return sink.text


def assert_summary(record) -> None:
    """The agent's summary (GPU-hours) reached the record - when the runtime wrote it: its main
    thread may end the process while the stop hook that writes it still runs (Runtime.wait
    returns as soon as the kernel is gone, even during a stop), so it is missing now and then."""
    summary = record.resource.get("agent_summary")
    if summary is not None:
        assert summary["gpu_hours"] > 0 and summary["gpu_count"] == record.spec.gpu_count


def node_of(cluster, job_id: str) -> str:
    return squeue(cluster, job_id)[0]["nodes"]


def run_and_interrupt_on(nk, code: str, needle: str, timeout: float = 120) -> str:
    """Run a cell; press the stop button once its output shows `needle`. Returns all it printed."""
    msg_id = nk.kc.execute(code)
    text, interrupted, deadline = "", False, time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            msg = nk.kc.get_iopub_msg(timeout=0.2)
        except Exception:  # noqa: BLE001 - queue.Empty: nothing yet
            continue
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "stream":
            text += msg["content"]["text"]
            if needle in text and not interrupted:
                nk.km.interrupt_kernel()
                interrupted = True
        elif msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            return text
    raise AssertionError(f"the cell did not end within {timeout}s: {text}")


def test_magic_runs_a_cell_on_a_compute_node(cluster, home, gs_home, tmp_path):
    """`%gpu start --backend slurm --host ssh://... --type t4:2`: a batch job asking
    --gres=gpu:t4:2, placed by Slurm on n1; the cell runs there; `%gpu stop` cancels the job.
    Before that, a start that waits in the queue is cancelled with the stop button (Ctrl-C)."""
    from gpusession.session.store import Store
    from support.notebook_kernel import NotebookKernel

    env = dict(os.environ, HOME=home, GPUSESSION_HOME=str(gs_home), PYTHONUNBUFFERED="1")
    nk = NotebookKernel(env, cwd=str(tmp_path))
    try:
        assert nk.run("%load_ext gpusession").status == "ok"
        filler = filler_job(cluster, "gpu:t4:2")
        text = run_and_interrupt_on(
            nk,
            f"%gpu start --backend slurm --host {cluster['url']} --type t4 "
            f"--python {sys.executable} --name waiting",
            "PENDING (Resources)",
        )
        assert "waits: PENDING (Resources), position 1 in the queue" in text, text
        assert "start of waiting interrupted (" in text and "); nothing is left running" in text, (
            text
        )
        waited = Store(gs_home / "sessions.sqlite3").get("waiting")
        assert waited.state == State.FAILED and squeue(cluster, waited.resource["job_id"]) == []
        slurm(cluster, "scancel", filler)
        wait_until(lambda: not squeue(cluster), 30, "the filler job to end")

        start = nk.run(
            f"%gpu start --backend slurm --host {cluster['url']} --type t4:2 --python {sys.executable} "
            "--idle off --name onnode --partition gpu",
            timeout=180,
        )
        assert start.status == "ok", start.text
        assert (
            "submitting: sbatch --gres=gpu:t4:2 --signal=B:USR1@120 --partition=gpu" in start.text
        )
        assert "running: session onnode is ready" in start.text
        record = Store(gs_home / "sessions.sqlite3").get("onnode")
        job_id = record.resource["job_id"]
        [job] = squeue(cluster, job_id)
        assert (job["state"], job["nodes"], job["name"]) == (
            "RUNNING",
            "n1",
            f"gpusession-onnode-{record.id[:8]}",
        )
        assert (
            job["comment"]
            == f"gpusession:{Store(gs_home / 'sessions.sqlite3').store_id}:{record.id}"
        )

        run = nk.run(
            "%%gpu\nimport os\nprint(os.environ['SLURMD_NODENAME'], os.environ['SLURM_JOB_ID'], 6 * 7)"
        )
        assert run.status == "ok", run.text
        assert run.text.split() == ["n1", job_id, "42"]

        # the kernel listens on the node's loopback only: not at the node's address from here
        info = json.loads(Path(record.resource["session_dir"], "state", "kernel.json").read_text())
        with pytest.raises(OSError):
            socket.create_connection(
                (cluster["nodes"]["n1"], info["shell_port"]), timeout=2
            ).close()
        # the node's host key came from the job and was pinned: no known_hosts entry for it
        assert record.resource["host_keys"][0].startswith("ssh-ed25519 ")
        assert cluster["nodes"]["n1"] not in Path(home, ".ssh", "known_hosts").read_text()

        stop = nk.run("%gpu stop")
        assert stop.status == "ok", stop.text
        assert squeue(cluster, job_id) == []
        assert Store(gs_home / "sessions.sqlite3").get("onnode").state == State.STOPPED
    finally:
        nk.close()


def test_a_request_for_more_gpus_than_are_free_waits_then_starts(cluster, home, manager):
    """n1's two T4s are taken: the next T4 session waits in the queue, the start shows
    PENDING (Resources) and its place, and it starts as soon as the first session stops."""
    first = manager.start(slurm_spec(manager, cluster, "t4:2", name="first"))
    lines: list[str] = []
    result: dict = {}

    def second() -> None:
        try:
            result["session"] = manager.start(
                slurm_spec(manager, cluster, "t4", name="second", price_per_gpu_hour="36"),
                report=lines.append,
            )
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            result["error"] = exc

    thread = threading.Thread(target=second, daemon=True)
    thread.start()
    waiting = wait_until(
        lambda: [line for line in lines if "PENDING (Resources)" in line], 30, "the queue state"
    )
    assert "position 1 in the queue" in waiting[0], waiting
    time.sleep(2)
    assert thread.is_alive() and "session" not in result, (lines, result)
    job_id = manager.get("second").resource["job_id"]
    assert squeue(cluster, job_id)[0]["state"] == "PENDING"
    # the wait in the queue is not billed: what the CLI, REST and the sidebar show is $0
    assert session_view(manager.get("second"))["cost_so_far"] == 0.0
    queued_for = time.time() - manager.get("second").created_at

    manager.stop(first.id)
    thread.join(90)
    assert "session" in result, (lines, result)
    session = result["session"]
    record = manager.get("second")
    assert (
        record_billed_seconds(record) < time.time() - record.created_at - queued_for + 1
    )  # from the job's start
    assert record_billed_seconds(record) == pytest.approx(
        time.time() - record.resource[BILLED_FROM], abs=1
    )
    assert cell(session, "import os; print(os.environ['SLURMD_NODENAME'])").strip() == "n1"
    assert any("job " + job_id + " is running on n1" in line for line in lines), lines
    manager.stop(session.id)
    assert squeue(cluster) == []


def test_a_fallback_list_passes_a_type_no_node_has_free_now(cluster, home, manager):
    """`--type a100,t4` on the cluster, one type after another (issue 34 §3): with n2's A100 held
    by another job, the a100 is passed over at once (no node has it free now, said with each
    node's count) and the session runs on a t4 of n1; the list's last type would queue."""
    filler = filler_job(cluster, "gpu:a100_40g:1")
    running = lambda: [j["state"] for j in squeue(cluster, filler)] == ["RUNNING"]  # noqa: E731
    wait_until(running, 30, "the filler job to run")
    lines: list[str] = []
    session = manager.start(
        slurm_spec(manager, cluster, "a100,t4", name="fb", gres_type="a100=a100_40g"),
        report=lines.append,
    )
    record = manager.store.get(session.record.id)
    assert record.spec.gpu_type == "t4" and node_of(cluster, record.resource["job_id"]) == "n1"
    (passed,) = record.spec.extra["passed_over"]
    assert passed == {
        "type": "a100:1",
        "why": "no node of the cluster has 1 free gpu:a100_40g now (n2: 0 of 1 free)",
    }, passed
    assert running() and len(squeue(cluster)) == 2  # the filler and the t4: no a100 job queued
    manager.stop(record.id)
    slurm(cluster, "scancel", filler)


def test_ctrl_c_while_queued_cancels_the_job(cluster, home, manager):
    """Interrupting a start that waits in the queue cancels its job; the record says so."""
    filler_job(cluster, "gpu:t4:2")

    def report(line: str) -> None:
        if "PENDING (Resources)" in line:
            raise KeyboardInterrupt  # what Ctrl-C in the notebook raises, at this point of the start

    with pytest.raises(KeyboardInterrupt):
        manager.start(slurm_spec(manager, cluster, "t4", name="impatient"), report=report)
    record = manager.get("impatient")
    assert record.state == State.FAILED and "interrupted" in record.error
    assert squeue(cluster, record.resource["job_id"]) == []


def test_idle_stop_ends_the_job_and_frees_the_node(cluster, home, manager):
    """The runtime's idle stop ends the job from inside: squeue is empty, the node idle again.
    The catalog's a100 is the cluster's a100_40g (--gres-type), which only n2 has."""
    session = manager.start(
        slurm_spec(manager, cluster, "a100", name="idler", idle="10s", gres_type="a100=a100_40g")
    )
    job_id = session.record.resource["job_id"]
    assert node_of(cluster, job_id) == "n2"
    assert "TresPerNode=gres:gpu:a100_40g:1" in slurm(
        cluster, "scontrol", "-o", "show", "job", job_id
    )
    assert cell(session, "import os; print(os.environ['SLURMD_NODENAME'])").strip() == "n2"

    wait_until(lambda: squeue(cluster, job_id) == [], 60, "the idle job to end")
    # the allocation is freed: nothing of n2 is allocated any more
    wait_until(
        lambda: "State=IDLE " in slurm(cluster, "scontrol", "-o", "show", "node", "n2"),
        20,
        "n2 to be idle",
        1.0,
    )
    assert "CPUAlloc=0 " in slurm(cluster, "scontrol", "-o", "show", "node", "n2")
    record = manager.refresh_state(session.id)
    assert record.state == State.STOPPED and record.stop_reason.kind is StopKind.IDLE
    assert_summary(record)


def test_gc_cancels_the_job_of_a_start_whose_process_died(cluster, home, gs_home, manager):
    """A start killed while its job waits leaves a job in the queue; `gpusession gc` finds the
    dead starter's record and cancels the job."""
    filler = filler_job(cluster, "gpu:t4:2")
    script = textwrap.dedent(f"""
        from gpusession.session import SessionManager
        m = SessionManager()
        m.start(m.make_spec("t4", backend="slurm", host={cluster["url"]!r}, python={sys.executable!r}, name="orphan"))
    """)
    log = gs_home / "starter.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-c", script],
            env=dict(os.environ),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        job_id = wait_until(
            lambda: _saved_job(manager, "orphan") or (proc.poll() is not None and log.read_text()),
            60,
            "the job to be submitted",
        )
        assert job_id.isdigit(), f"the starter ended: {job_id}"
        wait_until(lambda: squeue(cluster, job_id), 10, "the job in the queue")
    finally:
        proc.send_signal(signal.SIGKILL)
        assert wait_dead(proc.pid)
        proc.wait()
    assert squeue(cluster, job_id)[0]["state"] == "PENDING"

    actions = manager.gc()
    assert [(a.verb, a.target) for a in actions] == [("stop", "orphan")], actions
    assert squeue(cluster, job_id) == []
    assert manager.get("orphan").state == State.FAILED
    assert [j["id"] for j in squeue(cluster)] == [filler]


def _end_now(cluster, job_id: str, within: float = 90.0) -> None:
    """`scontrol update EndTime=now`, asked again while Slurm refuses it: it counts limits in
    whole minutes, and within a job's first minute an end of now is "Invalid time specified"
    (a loaded run's failure)."""
    env = dict(os.environ, SLURM_CONF=cluster["slurm_conf"])
    deadline = time.monotonic() + within
    while True:
        done = subprocess.run(
            ["scontrol", "update", f"jobid={job_id}", "EndTime=now"],
            capture_output=True, text=True, env=env, timeout=60,
        )  # fmt: skip
        if done.returncode == 0:
            return
        if "Invalid time" not in done.stderr or time.monotonic() > deadline:
            raise RuntimeError(f"scontrol update EndTime=now: {done.stderr.strip()}")
        time.sleep(5)


def _saved_job(manager, name: str) -> str | None:
    try:
        return manager.get(name).resource.get("job_id")
    except Exception:  # noqa: BLE001 - not recorded yet
        return None


def test_slurm_signals_before_the_time_limit_the_agent_saves_and_resume_brings_it_back(
    cluster, home, manager, tmp_path
):
    """--max-runtime 3m asks Slurm for --time=4 (a minute more: the agent stops first when it
    can) and --signal=B:USR1@120 (--signal-grace). The job's time limit moved to within the grace:
    Slurm signals the batch shell, which leaves a notice, and the agent saves the namespace into
    the workspace (a folder in --workspace-dir on the shared storage) while the job runs on. When Slurm ends the
    job at its time limit, the session is recorded as ended by it, with its state saved, and
    `--resume` on a new job brings the variables back."""
    from gpusession.agent.checkpoint_read import read_manifest
    from gpusession.words.status import session_table
    from gpusession.words.stops import describe_stop

    folder = str(tmp_path / "ws")  # the nodes share this machine's filesystem
    spec = slurm_spec(
        manager, cluster, "t4", name="limited", max_runtime="3m", workspace_dir=folder
    )
    session = manager.start(spec)
    job_id = session.record.resource["job_id"]
    shown = slurm(cluster, "scontrol", "-o", "show", "job", job_id)
    assert "TimeLimit=00:04:00" in shown
    workspace = session.record.resource["workspace_dir"]
    assert workspace == f"{folder}/limited", workspace
    assert cell(session, "import os; kept = {'k': 41}; print(os.getcwd())").strip() == workspace

    # the end within the grace: Slurm's time-limit check (every 30 s) signals the batch shell
    slurm(cluster, "scontrol", "update", f"jobid={job_id}", "TimeLimit=2")
    manifest = wait_until(
        lambda: (m := read_manifest(workspace)) and m.get("for") == "scheduler-signal" and m,
        60,
        "the agent's save on Slurm's signal",
        0.5,
    )
    assert [v["name"] for v in manifest["variables"]] == ["kept"], manifest
    assert cell(session, "print(kept['k'])").strip() == "41"  # the job runs on

    # the time limit, reached now: Slurm's own time-limit check ends the job (within ~30 s)
    _end_now(cluster, job_id)
    wait_until(lambda: squeue(cluster, job_id) == [], 60, "Slurm to end the job at its time limit")
    ended = slurm(cluster, "scontrol", "-o", "show", "job", job_id)
    assert "JobState=TIMEOUT Reason=TimeLimit" in ended
    # Slurm moved the limit to the end it set (rounded up to minutes)
    minutes = int(ended.split("TimeLimit=")[1].split()[0].split(":")[1])

    record = manager.refresh_state(session.id)
    assert record.state == State.STOPPED
    assert record.stop_reason.kind is StopKind.TIME_LIMIT, record.stop_reason
    assert record.stop_reason.max_runtime_s == 60 * minutes
    assert describe_stop("limited", record.stop_reason) == (
        f"session limited ended: the cluster ended its job at the job's time limit ({minutes}m00s)"
    )
    assert_summary(record)
    (row,) = [
        line
        for line in session_table([manager.view(record)]).splitlines()
        if line.split()[:1] == ["limited"]
    ]
    assert "interrupted, state saved" in row, row

    again = manager.start(
        slurm_spec(manager, cluster, "t4", name="back", resume="limited", workspace_dir=folder)
    )
    assert again.record.resource["restored"]["restored"] == ["kept"], again.record.resource
    assert cell(again, "print(kept['k'] + 1)").strip() == "42"
    manager.stop(again.id)


def test_a_python_without_ipykernel_fails_the_start_saying_what_to_install(cluster, home, manager):
    from gpusession.core.errors import StageError

    with pytest.raises(StageError) as failed:
        manager.start(
            slurm_spec(manager, cluster, "t4", name="nokernel", python="/nonexistent/python3")
        )
    assert (
        "could not start the session: environment: /nonexistent/python3 cannot import ipykernel"
        in str(failed.value)
    )
    record = manager.get("nokernel")
    assert record.state == State.FAILED
    assert squeue(cluster, record.resource["job_id"]) == []


def test_an_image_runs_in_charliecloud_from_the_registry_and_from_a_path(
    cluster, home, manager, tmp_path, monkeypatch
):
    """--image on a cluster with Charliecloud (and none of apptainer, singularity, pyxis): a
    reference to the cluster's registry (htpasswd auth) is pulled with ch-image on the cluster,
    as the user's `docker login` for it, into the user's storage; the kernel runs in the image's
    own Python (Debian 13's 3.13, not this machine's), with the job's GPUs. Its idle stop saves
    the namespace into the workspace (bound at /mnt/2). The directory the pull unpacked is then
    started again as a path image, resuming that workspace: the variables come back. The start
    says which runtime and why."""
    from gpusession.agent.checkpoint_read import read_manifest

    ref = registry_image("gpusession-ci/py-trixie", "ci/py-trixie:latest", tmp_path / "pusher")
    registry_login(home)  # the user's docker login for the cluster's registry
    # ipykernel for the image's Python 3.13: downloaded once per machine, not per test
    monkeypatch.setenv("GPUSESSION_CACHE", str(STATE / "runtime-cache"))
    unpacked = STATE / "home/.gpusession/charliecloud/img/10.210.0.1+5443%ci%py-trixie+latest"
    shutil.rmtree(unpacked, ignore_errors=True)  # pulled by this start, not by an earlier run
    steps: list[str] = []
    session = manager.start(
        slurm_spec(manager, cluster, "t4", name="ch-pulled", image=ref, idle="10s"),
        report=steps.append,
    )
    said = "\n".join(steps)
    assert (
        "container runtime: charliecloud (--container auto: the first of apptainer, singularity, "
        "pyxis, charliecloud on the login node)" in said
    ), said
    assert re.search(
        f"pulled {re.escape(ref)}: 1 layer\\(s\\) (downloaded|from ch-image's download cache)", said
    ), said
    assert (
        f"pulling {ref} on the cluster with ch-image" in said
        and "(as ci, your docker login for 10.210.0.1:5443)" in said
    ), said
    shown = cell(
        session,
        "import sys, os; print(sys.version_info[:2], os.environ.get('CUDA_VISIBLE_DEVICES'))",
    )
    assert shown.split("\n")[0] == "(3, 13) 0", shown
    assert cell(session, "import os; kept = {'k': 41}; print(os.getcwd())").strip() == "/mnt/2"
    # the idle stop saves the namespace into the workspace (mounted at /mnt/2) and ends the job
    job_id = session.record.resource["job_id"]
    wait_until(lambda: squeue(cluster, job_id) == [], 60, "the idle job to end")
    record = manager.refresh_state(session.id)
    assert record.stop_reason.kind is StopKind.IDLE, record.stop_reason
    workspace = record.resource["workspace_dir"]
    manifest = read_manifest(workspace)
    assert [v["name"] for v in manifest["variables"]] == ["kept"], manifest

    # the unpacked image as a path image, resuming that workspace: the variables come back
    session = manager.start(
        slurm_spec(
            manager,
            cluster,
            "t4",
            name="ch-path",
            image=str(unpacked),
            container="charliecloud",
            resume="ch-pulled",
        ),
        report=steps.append,
    )
    assert session.record.resource["restored"]["restored"] == ["kept"], session.record.resource
    assert cell(session, "import sys; print(sys.executable)").strip() == "/usr/bin/python3"
    assert cell(session, "import sys; print(sys.version_info[:2], kept['k'] + 1)").strip() == (
        "(3, 13) 42"
    )
    manager.stop(session.id)


def _ch_image_pulling(ref: str) -> list[str]:
    """The login node's `ch-image pull` processes for `ref` (the nodes share this machine's pids)."""
    found = subprocess.run(
        ["pgrep", "-af", f"ch-image.* pull {ref}"], capture_output=True, text=True
    )
    return found.stdout.splitlines()


def test_ctrl_c_during_a_charliecloud_pull_leaves_nothing_and_the_next_start_pulls_again(
    cluster, home, gs_home, manager, tmp_path, monkeypatch
):
    """SIGINT to `gpusession start` while ch-image unpacks the registry image on the login node
    (its folder half made): one line, no traceback, the session recorded failed, no job, the
    remote ch-image gone, its half-made folder removed; the next start pulls again (a folder with
    bin/ and usr/ but no mark of a finished pull is not taken as pulled) and runs a cell."""
    from gpusession.session.store import Store

    ref = registry_image("gpusession-ci/py-trixie", "ci/py-trixie-cut:latest", tmp_path / "pusher")
    registry_login(home)
    monkeypatch.setenv("GPUSESSION_CACHE", str(STATE / "runtime-cache"))
    folder = STATE / "home/.gpusession/charliecloud/img/10.210.0.1+5443%ci%py-trixie-cut+latest"
    shutil.rmtree(folder, ignore_errors=True)
    cut: dict = {}

    def interrupt(running, press) -> None:  # once ch-image unpacks: its folder half made
        wait_until(
            lambda: (folder.is_dir() and any(folder.iterdir())) or not running(), 120, "the unpack"
        )
        assert running(), "the start ended before the unpack"
        cut["files"] = sum(1 for _ in folder.rglob("*"))
        press()

    args = ["--backend", "slurm", "--host", cluster["url"], "--type", "t4", "--image", ref]
    text = start_interrupted(
        [*args, "--idle", "off", "--name", "cut"], dict(os.environ, PYTHONUNBUFFERED="1"), interrupt
    )
    assert "Traceback" not in text, text
    (record,) = Store(gs_home / "sessions.sqlite3").list()
    assert record.state.value == "failed" and "interrupted" in (record.error or ""), record
    assert not record.resource.get("job_id"), record.resource
    assert record_billed_seconds(record) == 0.0
    store_id = Store(gs_home / "sessions.sqlite3").store_id
    jobs = slurm(cluster, "squeue", "-h", "-o", "%k", "--states=all")
    assert f"gpusession:{store_id}:" not in jobs, jobs  # no job of this store, in any state
    assert _ch_image_pulling(ref) == []
    assert not folder.exists()
    print(f"Ctrl-C with {cut['files']} files unpacked")

    # a folder cut short the same way (here: left by a client killed mid-unpack) is pulled again
    (folder / "usr").mkdir(parents=True)
    (folder / "bin").mkdir()
    steps: list[str] = []
    session = manager.start(
        slurm_spec(manager, cluster, "t4", name="after-cut", image=ref), report=steps.append
    )
    assert f"pulling {ref} on the cluster with ch-image" in "\n".join(steps), steps
    assert cell(session, "import sys; print(sys.version_info[:2])").strip() == "(3, 13)"
    manager.stop(session.id)


def test_an_image_without_python_or_a_wrong_login_fails_in_one_line_with_nothing_queued(
    cluster, home, manager, tmp_path
):
    """An image directory with a shell and no Python; a registry image with a wrong password in
    the user's Docker config: each fails the start in one line saying what to do, before sbatch."""
    import base64
    import json

    from gpusession.core.errors import StageError

    before = slurm(cluster, "squeue", "-h", "-o", "%i", "--states=all")
    docker = Path(home) / ".docker"
    docker.mkdir(exist_ok=True)
    wrong = base64.b64encode(b"ci:wrong-password").decode()
    (docker / "config.json").write_text(json.dumps({"auths": {REGISTRY: {"auth": wrong}}}))
    with pytest.raises(StageError) as failed:
        manager.start(
            slurm_spec(manager, cluster, "t4", name="badlogin", image=f"{REGISTRY}/ci/other:1")
        )
    (line,) = str(failed.value).splitlines()
    assert (
        f"cannot pull {REGISTRY}/ci/other:1 on the cluster: {REGISTRY} refused the login of ci "
        f"from your Docker config: run `docker login {REGISTRY}` again" in line
    ), line

    folder = image_without_python(tmp_path / "nopython")
    with pytest.raises(StageError) as failed:
        manager.start(slurm_spec(manager, cluster, "t4", name="nopy", image=folder))
    (line,) = str(failed.value).splitlines()
    assert f"image {folder} has no Python to run the session kernel in" in line, line
    assert "use an image with python3 3.9 or newer" in line
    assert manager.get("nopy").state == State.FAILED
    assert slurm(cluster, "squeue", "-h", "-o", "%i", "--states=all") == before


def test_the_agent_reads_only_the_gpus_slurm_gave_the_job(cluster, home, manager):
    """n1's GPU files are character devices (scripts/ci-slurm.sh), so Slurm gives a job its GPUs
    in CUDA_VISIBLE_DEVICES and SLURM_JOB_GPUS. A filler job takes GPU 0, the session gets GPU 1;
    its agent replays a recorded 4-GPU node whose GPUs 0 and 3 are busy (another job): the stats
    hold GPU 1 alone, idle."""
    filler_job(cluster, "gpu:t4:1")
    recording = Path(__file__).parent / "data" / "nvml_four_a100.json"
    session = manager.start(
        slurm_spec(manager, cluster, "t4", name="visible", nvml_replay=str(recording))
    )
    shown = cell(
        session,
        "import os; print(os.environ.get('CUDA_VISIBLE_DEVICES'), os.environ.get('SLURM_JOB_GPUS'))",
    )
    assert shown.split() == ["1", "1"], shown  # the kernel's environment is the agent's
    samples = wait_until(lambda: session.stats().get("samples"), 20, "the agent's samples")
    gpus = samples[-1]["gpus"]
    assert [g["index"] for g in gpus] == [1] and gpus[0]["utilization"] == 0.0, gpus
    manager.stop(session.id)


def test_a_mig_type_runs_on_its_slice_and_its_stats_say_n_a_mig(cluster, home, manager):
    """`--type a100-1g.10gb` asks Slurm for gpu:1g.10gb:1 (a MIG type is named by its profile),
    which only n2 has; the job's CUDA_VISIBLE_DEVICES names its slice by UUID (on the test
    cluster a TaskProlog stands in for AutoDetect=nvml: scripts/ci-slurm.sh); the agent, replaying
    an A100 80GB split into 7 slices, reads that slice alone: its memory, and 'n/a (MIG)' for its
    utilization in the lines the faces print. A slice costs its share of the GPU-hour price."""
    recording = Path(__file__).parent / "data" / "nvml_a100_mig.json"
    lines: list[str] = []
    spec = slurm_spec(
        manager,
        cluster,
        "a100-1g.10gb",
        name="slice",
        nvml_replay=str(recording),
        price_per_gpu_hour="$7",
    )
    session = manager.start(spec, report=lines.append)
    record = manager.store.get(session.record.id)
    assert any("submitting: sbatch --gres=gpu:1g.10gb:1 " in line for line in lines), lines
    assert node_of(cluster, record.resource["job_id"]) == "n2"
    assert record.price_per_hour == pytest.approx(1.0)  # $7 per GPU-hour, 1/7 of the card
    shown = cell(session, "import os; print(os.environ['CUDA_VISIBLE_DEVICES'])").strip()
    assert shown == "MIG-5f0e1d2c-3b4a-5968-7a8b-9c0d1e2f3a42", shown
    samples = wait_until(lambda: session.stats().get("samples"), 20, "the agent's samples")
    (gpu,) = samples[-1]["gpus"]
    assert gpu["mig"] == "1g.10gb" and gpu["utilization"] is None, gpu
    assert gpu["memory_used"] == 13 * 1024 * 1024, gpu
    (line,) = gpu_lines(samples[-1])
    assert f"Util {MIG_UTILIZATION}" in line and "13 MiB" in line, line
    manager.stop(session.id)
    assert squeue(cluster) == []


def test_gc_cancels_a_job_whose_session_is_gone(cluster, home, manager):
    """A job carrying this store's comment whose session is recorded as ended (its stop never
    reached Slurm) is found by gc through squeue and cancelled; other users' jobs are not ours."""
    session = manager.start(slurm_spec(manager, cluster, "t4", name="leftover"))
    job_id = session.record.resource["job_id"]
    manager.close()  # this process lets go; the job runs on
    manager.store.transition(
        session.id, State.STOPPED, "recorded stopped, but the job was never cancelled"
    )
    foreign = filler_job(cluster, "gpu:a100_40g:1")  # no comment of ours

    assert [(a.verb, a.why) for a in manager.gc(dry_run=True)] == [
        ("remove", "session leftover is stopped")
    ]
    assert squeue(cluster, job_id)[0]["state"] == "RUNNING"
    actions = manager.gc()
    assert [a.verb for a in actions] == [
        "remove"
    ] and f"Slurm job {job_id} (gpusession-leftover-" in actions[0].target
    assert squeue(cluster, job_id) == []
    assert [j["id"] for j in squeue(cluster)] == [foreign]


def test_a_preempted_session_saves_in_its_grace_and_recover_resubmits_it(
    cluster, home, gs_home, tmp_path
):
    """A job of the "urgent" partition (higher PriorityTier, scripts/ci-slurm.sh) preempts the
    session's job on n2: Slurm signals it at once (preempt_send_user_signal) and ends it after the
    gpu partition's GraceTime (10 s; Slurm ends the job at its next periodic check after it). The agent saves the namespace within the grace, mid-cell;
    the job ends PREEMPTED (submitted --no-requeue: never re-run under its id); the cell says it
    was cut and is not re-run; --recover (auto: on for a preemption) submits a new job that waits
    in the queue behind the urgent job, shown as a start shows it, restores, and the next cell
    runs there with the variables. The replacement keeps the name; `gpusession list` says the first
    job's session, retired as pre~1, was interrupted with its state saved."""
    from gpusession.agent.checkpoint_read import read_manifest
    from gpusession.session.store import Store
    from gpusession.words.stops import describe_stop
    from support.notebook_kernel import NotebookKernel

    env = dict(os.environ, HOME=home, GPUSESSION_HOME=str(gs_home), PYTHONUNBUFFERED="1")
    folder = tmp_path / "ws"
    nk = NotebookKernel(env, cwd=str(tmp_path))
    try:
        assert nk.run("%load_ext gpusession").status == "ok"
        start = nk.run(
            f"%gpu start --backend slurm --host {cluster['url']} --type a100 "
            f"--gres-type a100=a100_40g --python {sys.executable} --idle off --name pre "
            f"--workspace-dir {folder}",
            timeout=180,
        )
        assert start.status == "ok", start.text
        assert nk.run("%%gpu\nkept = {'k': 41}").status == "ok"
        store = Store(gs_home / "sessions.sqlite3")
        first = store.get("pre")
        job_id = first.resource["job_id"]
        assert "Requeue=0 " in slurm(cluster, "scontrol", "-o", "show", "job", job_id)
        state_dir = Path(first.resource["session_dir"], "state")
        urgent: dict = {}

        def preempt_while_busy() -> None:
            def busy() -> bool:
                try:
                    return bool(json.loads((state_dir / "activity.json").read_text())["busy"])
                except (OSError, ValueError, KeyError):
                    return False

            wait_until(busy, 60, "the cell to run", 0.2)
            urgent["id"] = slurm(
                cluster, "sbatch", "--parsable", "--partition=urgent", "--gres=gpu:a100_40g:1",
                "-J", "urgent", "-o", "/dev/null", "--wrap", "sleep 10",
            ).strip().split(";")[0]  # fmt: skip

        threading.Thread(target=preempt_while_busy, daemon=True).start()
        cut = nk.run("%%gpu\nimport time\nfor i in range(1800):\n    time.sleep(0.1)", timeout=240)
        said = cut.text
        assert cut.status == "error", said
        assert "this cell was interrupted when session pre ended: it is not re-run" in said, said
        assert "recovering session pre: a replacement restores its saved state" in said, said
        # the replacement's queue wait, as a start shows it: the urgent job holds n2's A100
        assert "waits: PENDING (Resources), position 1 in the queue" in said, said
        assert "workspace pre: restored" in said and "kept" in said, said
        assert "session pre is back: 1 x A100 on slurm" in said, said
        assert "the next cell runs there" in said, said

        # saved on Slurm's signal, within the grace: nothing could write it after the job ended
        manifest = read_manifest(str(folder / "pre"))
        assert manifest["for"] == "scheduler-signal", manifest
        assert "kept" in [v["name"] for v in manifest["variables"]], manifest
        ended = slurm(cluster, "scontrol", "-o", "show", "job", job_id)
        assert "JobState=PREEMPTED " in ended, ended
        old = store.get(first.id)
        assert old.stop_reason.kind is StopKind.PREEMPTED, old.stop_reason
        assert describe_stop("pre", old.stop_reason) == (
            "session pre ended: the cluster preempted its job"
        )
        listed = subprocess.run(
            [sys.executable, "-m", "gpusession", "list", "--all"],
            env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        # the replacement took the name over; the interrupted record is retired as pre~1 (issue 32 §3)
        rows = {row.split()[0]: row for row in listed.stdout.splitlines() if row.split()}
        assert "interrupted, state saved" in rows.get("pre~1", ""), listed.stdout
        assert "interrupted" not in rows.get("pre", "interrupted"), listed.stdout
        assert old.name == "pre~1", old.name

        nxt = nk.run("%%gpu\nimport os\nprint(kept['k'] + 1, os.environ['SLURM_JOB_ID'])")
        assert nxt.status == "ok", nxt.text
        second = store.get("pre")
        assert second.id != first.id and second.state == State.RUNNING
        assert nxt.text.split() == ["42", second.resource["job_id"]], nxt.text
        assert second.resource["job_id"] not in (job_id, urgent["id"])
        assert nk.run("%gpu stop").status == "ok"
    finally:
        nk.close()


@pytest.mark.docker
def test_a_switch_moves_a_slurm_session_to_another_gpu_type_then_to_docker(
    cluster, home, manager, engine, tmp_path
):
    """`%gpu switch` from a Slurm job, keeping a variable and a file: to another GPU type on the
    cluster (the same --workspace-dir folder, no move: the new job starts, restores and answers,
    then the old job is cancelled), then to docker on this machine (the folder read by tar on
    the login node and streamed through this machine over the login's SSH, its size said first).
    The other direction (tar written on the login node) is the next test's."""
    from support.images import image_ready

    image = "gpusession-ci/py-bookworm"
    if not image_ready(image):
        pytest.skip(f"no Docker engine with {image}")
    folder = str(tmp_path / "ws")  # the nodes share this machine's filesystem
    first = manager.start(
        slurm_spec(
            manager, cluster, "t4", name="mv", workspace_dir=folder, gres_type="a100=a100_40g"
        )
    )
    made = (
        "kept = {'k': 41}\nimport os\nos.makedirs('out')\nopen('out/notes.txt', 'w').write('kept')"
    )
    assert cell(first, made) == ""
    t4_job = first.record.resource["job_id"]
    assert node_of(cluster, t4_job) == "n1"

    # another GPU type on the cluster: the same folder, no move; the old job ends after
    lines: list[str] = []
    on_a100, report = manager.switch(
        first, manager.switch_spec(first.id, {"type": "a100"}), lines.append
    )
    said = "\n".join(lines)
    assert report.moved_bytes is None and "move:" not in said, said
    assert "stop: stopping mv's former capacity (the new one answered)" in said, said
    assert on_a100.name == "mv", "a switched session keeps its name"
    assert report.restored["restored"] == ["kept"], report.restored
    assert node_of(cluster, on_a100.record.resource["job_id"]) == "n2"
    assert squeue(cluster, t4_job) == [] and manager.get(first.id).state == State.STOPPED
    workspace = f"{folder}/mv"
    assert on_a100.record.resource["workspace_dir"] == workspace
    changed = (
        "kept['k'] += 1\nopen('out/notes.txt', 'a').write(' there')\n"
        "print(kept['k'], open('out/notes.txt').read(), os.getcwd())"
    )
    assert cell(on_a100, changed).strip() == f"42 kept there {workspace}"

    # to docker: tar on the login node, through this machine, into a volume
    lines.clear()
    there, report = manager.switch(
        on_a100,
        manager.switch_spec(on_a100.id, {"backend": "docker", "host": "", "image": image}),
        lines.append,
    )
    said = "\n".join(lines)
    assert f"move: workspace from slurm {cluster['url']} to docker (this machine's engine)" in said
    assert re.search(r"move: [\d.]+ k?B to move, through this machine", said), said
    assert report.moved_bytes > 0 and report.restored["restored"] == ["kept"], report.restored
    check = "assert kept == {'k': 42} and open('out/notes.txt').read() == 'kept there'"
    assert there.run(check)["status"] == "ok"
    assert squeue(cluster) == [] and manager.get(on_a100.id).state == State.STOPPED
    manager.stop(there.id)


def test_gpusession_workspaces_lists_and_removes_the_workspace_folders_on_the_cluster(
    cluster, home, manager, tmp_path
):
    """`gpusession workspaces` lists the folders of workspaces on the clusters this store's
    sessions used (size, where, which live session uses one); `rm` removes an unused one and
    refuses one in use."""
    from gpusession.core.errors import WorkspaceInUse
    from gpusession.session import workspace_ops as workspaces

    folder = tmp_path / "wss"
    (folder / "kept" / "sub").mkdir(parents=True)
    (folder / "kept" / "sub" / "a.bin").write_bytes(b"x" * 1000)
    (folder / "kept" / "b.txt").write_bytes(b"yy")
    (folder / "live").mkdir()
    records = {}
    for name in ("kept", "live"):
        spec = slurm_spec(manager, cluster, name=f"{name}-1", workspace_dir=str(folder))
        record = manager.store.create(spec, price_per_hour=0.0)
        manager.store.transition(record.id, State.PROVISIONING)
        manager.store.update_resource(record.id, workspace=name, workspace_dir=f"{folder}/{name}")
        records[name] = record
    manager.store.transition(records["kept"].id, State.STOPPED, "ended")

    views = {
        v.workspace.name: v
        for v in workspaces.list_all(manager.store, manager.backend)
        if v.workspace.backend == "slurm"
    }
    assert sorted(views) == ["kept", "live"], views
    kept, live = views["kept"].workspace, views["live"].workspace
    assert kept.size_bytes == 1002 and kept.where == f"{folder}/kept on {cluster['url']}", kept
    assert kept.in_use_by == [] and live.in_use_by == [records["live"].id], (kept, live)

    with pytest.raises(WorkspaceInUse, match="workspace live is in use by session live-1"):
        workspaces.remove(manager.store, manager.backend, "live")
    workspaces.remove(manager.store, manager.backend, "kept")
    assert sorted(p.name for p in folder.iterdir()) == ["live"]


def test_a_workspace_stream_cut_short_lands_nowhere_and_a_whole_one_replaces_the_older_copy(
    cluster, home, manager, tmp_path
):
    """What `%gpu switch` to or from Slurm asks of the backend, without a job: a tar stream
    whose source fails midway raises the source's error (not the login node's), and nothing is
    put in place or left beside it, the older copy there untouched; a whole stream replaces that
    copy (said); a workspace folder that is gone is one line before anything moves."""

    from gpusession.core.errors import StageError
    from gpusession.core.progress import Progress
    from support.streams import workspace_chunks

    folder = tmp_path / "ws"
    (folder / "cut").mkdir(parents=True)
    (folder / "cut" / "old.txt").write_text("older copy")
    chunks = workspace_chunks()

    spec = slurm_spec(manager, cluster, name="cut-2", resume="cut", workspace_dir=str(folder))
    record = manager.store.create(spec, price_per_hour=0.0)
    backend, lines = manager.backend("slurm"), []
    with pytest.raises(OSError, match="cannot read big: Input/output error"):
        backend.import_workspace(record, chunks(fail_at=2 << 20), Progress(lines.append))
    assert [p.name for p in folder.iterdir()] == ["cut"]
    assert [p.name for p in (folder / "cut").iterdir()] == ["old.txt"]

    backend.import_workspace(record, chunks(), Progress(lines.append))
    assert sorted(p.name for p in (folder / "cut").iterdir()) == ["big", "new.txt"]
    assert [p.name for p in folder.iterdir()] == ["cut"]
    assert f"replaced the older copy of workspace cut at {folder}/cut" in "\n".join(lines), lines

    gone = manager.store.update_resource(record.id, workspace_dir=str(tmp_path / "gone"))
    with pytest.raises(StageError, match=f"cannot read workspace cut at {tmp_path}/gone on ssh://"):
        backend.export_workspace(gone, Progress(lines.append))


@pytest.mark.docker
def test_a_switch_cut_at_every_step_on_the_cluster_leaves_one_truth(
    cluster, home, manager, engine, tmp_path
):
    """Issue 30 on Slurm: the driver of a switch killed before the save, during it, during the
    move to docker, while the new job starts and before the old job is cancelled; the next
    `gpusession list` settles what it left (tests/support/switchcut.py): nothing stuck, nothing
    billing without a word, no variable lost."""
    from support.images import image_ready
    from support.switchcut import assert_figures, cut_every_step

    image = "gpusession-ci/py-bookworm"
    if not image_ready(image):
        pytest.skip(f"no Docker engine with {image}")
    folder = str(tmp_path / "ws")  # the nodes share this machine's filesystem
    cases = cut_every_step(
        manager,
        lambda: manager.start(
            slurm_spec(
                manager, cluster, "t4", name="cuts", workspace_dir=folder, gres_type="a100=a100_40g"
            )
        ),
        ["--type", "a100"],
        ["--backend", "docker", "--image", image],
        "slurm",
    )
    assert_figures(cases)
