"""The slurm backend's pieces without a cluster: its settings, the batch script and sbatch line
it makes, and how it reads squeue, scontrol and sacct (recorded from Slurm 22.05)."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile

import pytest

from gpusession.backends.slurm import jobs, states
from gpusession.backends.slurm.login import runtime_bundle
from gpusession.configuration.catalog import load_catalog
from gpusession.core.errors import BadInput
from gpusession.core.models import LaunchSpec, SessionRecord, State
from gpusession.core.protocol import StopDetails, StopKind, StopReason

PATHS = jobs.JobPaths(
    session_dir="/home/me/.gpusession/slurm/abc123", runtime_dir="/home/me/.gpusession/runtime/v1"
)


def record(gpu="t4", count=2, image=None, extra=None, **spec_values) -> SessionRecord:
    extra = {"host": "ssh://me@login", **(extra or {}), **({"image": image} if image else {})}
    spec = LaunchSpec(gpu_type=gpu, gpu_count=count, backend="slurm", extra=extra, **spec_values)
    return SessionRecord(
        id="abc123" + "0" * 26,
        name="t4-1",
        spec=spec,
        state=State.PROVISIONING,
        created_at=0.0,
        updated_at=0.0,
        owner="me@here:1",
    )


def settings(**extra) -> jobs.JobSettings:
    return jobs.read_settings(extra, catalog=load_catalog())


# -- settings ------------------------------------------------------------------------------------


def test_a_mig_type_asks_for_the_gres_type_named_by_its_profile():
    """Slurm names MIG types by their profile (its MIG docs: gpu:1g.10gb); a map still wins."""
    assert settings().gres_type("a100-1g.10gb") == "1g.10gb"
    assert settings().gres_type("h100-3g.40gb") == "3g.40gb"
    mapped = settings(gres_type="a100-1g.10gb=nvidia_a100_1g.10gb")
    assert mapped.gres_type("a100-1g.10gb") == "nvidia_a100_1g.10gb"
    assert settings(gres_type="none").gres_type("a100-1g.10gb") == ""


def test_gres_types_map_the_catalog_to_the_cluster():
    assert settings().gres_type("a100") == "a100"
    assert settings(gres_type="tesla_t4").gres_type("t4") == "tesla_t4"
    mapped = settings(gres_type="a100=a100_40g, t4=tesla_t4")
    assert (mapped.gres_type("a100"), mapped.gres_type("t4"), mapped.gres_type("h100")) == (
        "a100_40g",
        "tesla_t4",
        "h100",
    )
    assert (
        settings(gres_type="a100-40gb=a100_40g").gres_type("a100") == "a100_40g"
    )  # catalog aliases resolve
    assert settings(gres_type="none").gres_type("t4") == ""
    with pytest.raises(BadInput, match="unknown GPU type 'k80'"):
        settings(gres_type="k80=tesla_k80")
    with pytest.raises(BadInput, match="GRES type"):
        settings(gres_type="a100=a100;rm")


@pytest.mark.parametrize(
    "flags, problem",
    [
        ("--output=/tmp/x", "sets that one itself"),
        ("-J other", "sets that one itself"),
        ("--comment hi", "sets that one itself"),
        ("hostname", "flags only"),
        ("--constraint='ib", "No closing quotation"),
    ],
)
def test_sbatch_flags_that_would_break_the_session_are_refused(flags, problem):
    with pytest.raises(BadInput, match=problem):
        settings(sbatch_args=flags)


def test_words_are_checked():
    with pytest.raises(BadInput, match="partition"):
        settings(partition="gpu; rm -rf ~")
    assert settings(partition="gpu", account="proj-1", qos="normal").partition == "gpu"
    assert settings(modules="cuda/12.4, python/3.11").modules == ("cuda/12.4", "python/3.11")


def test_a_clusters_defaults_fill_what_is_not_given(tmp_path):
    path = tmp_path / "slurm.json"
    path.write_text(
        '{"login.example.org": {"partition": "gpu", "gres_type": "a100=a100_40g", "price_per_gpu_hour": "$1.50"}}'
    )
    cluster = jobs.load_cluster_defaults(path, "ssh://me@login.example.org:2222")
    s = jobs.read_settings({"partition": "debug"}, cluster, catalog=load_catalog())
    assert (s.partition, s.gres_type("a100"), s.price_per_gpu_hour) == ("debug", "a100_40g", 1.5)
    assert jobs.load_cluster_defaults(path, "ssh://other") == {}
    assert jobs.load_cluster_defaults(tmp_path / "none.json", "ssh://other") == {}
    path.write_text('{"login.example.org": {"colour": "red"}}')
    with pytest.raises(BadInput, match="unknown setting"):
        jobs.load_cluster_defaults(path, "ssh://login.example.org")


# -- the job ---------------------------------------------------------------------------------------


def test_the_sbatch_line():
    rec = record("a100", 2, max_runtime=3600.0)
    cmd = jobs.sbatch_command(
        rec,
        settings(
            gres_type="a100=a100_40g",
            partition="gpu",
            account="proj",
            sbatch_args="--mem=32G --constraint=ib",
        ),
        PATHS,
        "store1",
    )
    assert cmd == [
        "sbatch",
        "--parsable",
        "--job-name=gpusession-t4-1-abc12300",
        f"--comment=gpusession:store1:{rec.id}",
        f"--output={PATHS.output}",
        "--no-requeue",
        "--gres=gpu:a100_40g:2",
        "--time=61",
        "--signal=B:USR1@120",
        "--partition=gpu",
        "--account=proj",
        "--mem=32G",
        "--constraint=ib",
    ]
    assert "--gres=gpu:1" in jobs.sbatch_command(
        record("t4", 1), settings(gres_type="none"), PATHS, "s"
    )
    assert "--signal=B:USR1@45" in jobs.sbatch_command(
        record("t4", 1), settings(signal_grace="45s"), PATHS, "s"
    )
    assert not any(
        c.startswith("--signal")
        for c in jobs.sbatch_command(record("t4", 1), settings(signal_grace="off"), PATHS, "s")
    )
    assert jobs.time_limit_minutes(None) is None and jobs.time_limit_minutes(90) == 3
    assert jobs.comment_session(f"gpusession:store1:{rec.id}", "store1") == rec.id
    assert jobs.comment_session(f"gpusession:store2:{rec.id}", "store1") is None


@pytest.mark.parametrize(
    "image, container",
    [
        (None, "auto"),
        ("nvcr.io/nvidia/pytorch:24.01-py3", "auto"),
        ("img:1", "apptainer"),
        ("img:1", "pyxis"),
    ],
)
def test_the_batch_script_is_valid_shell(image, container, tmp_path):
    rec = record(image=image)
    text = jobs.batch_script(
        rec, settings(container=container, modules="cuda/12", conda_env="torch"), PATHS
    )
    path = tmp_path / "job.sh"
    path.write_text(text)
    assert subprocess.run(["bash", "-n", str(path)], capture_output=True).returncode == 0, text
    assert (
        "GPUSESSION_HOSTKEY" in text
        and "module load cuda/12" in text
        and "conda activate torch" in text
    )
    assert f"export GPUSESSION_SESSION_ID={rec.id}" in text
    # the kernel on unix sockets in the job's 0700 state folder, no loopback port another user reaches
    assert (
        "--kernel-ip /home/me/.gpusession/slurm/abc123/state/k --kernel-ports 0 --agent-port 0 --idle 1800s"
        in text
    )
    if image is None:
        assert "supervise python3 -m gpusession.agent run" in text
    if container == "pyxis":
        assert "srun --overlap --ntasks=1 --container-image=img:1" in text
    if image and container == "auto":
        assert (
            "apptainer exec --nv --bind" in text
            and "docker://nvcr.io/nvidia/pytorch:24.01-py3" in text
        )
        assert "--container-image='nvcr.io#nvidia/pytorch:24.01-py3'" in text


def test_image_references_as_each_runtime_writes_them():
    assert jobs.apptainer_image("ubuntu:22.04") == "docker://ubuntu:22.04"
    assert jobs.apptainer_image("/shared/img.sif") == "/shared/img.sif"
    assert jobs.apptainer_image("oras://reg/img:1") == "oras://reg/img:1"
    assert (
        jobs.pyxis_image("nvcr.io/nvidia/pytorch:24.01-py3") == "nvcr.io#nvidia/pytorch:24.01-py3"
    )
    assert (
        jobs.pyxis_image("nvidia/cuda:12.4.1-base-ubuntu22.04")
        == "nvidia/cuda:12.4.1-base-ubuntu22.04"
    )
    assert jobs.pyxis_image("registry:5000/me/img") == "registry:5000#me/img"


def test_the_batch_script_reports_a_python_without_ipykernel(tmp_path):
    """Run as Slurm would (bash, on a 'node' that is this machine): a Python that cannot import
    ipykernel gives a FAILED marker saying what to install, and the job ends."""
    paths = jobs.JobPaths(
        session_dir=str(tmp_path / "session"), runtime_dir=str(tmp_path / "runtime")
    )
    text = jobs.batch_script(record(), settings(python=str(tmp_path / "no-such-python")), paths)
    result = subprocess.run(["bash", "-c", text], capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 1
    assert "GPUSESSION_FAILED" in result.stdout and "cannot import ipykernel" in result.stdout


@pytest.mark.integration
def test_the_runtime_bundle_runs_on_its_own(tmp_path):
    """What is uploaded to the cluster is enough for `python -m gpusession.agent` there."""
    version, tarball = runtime_bundle()
    assert len(version) == 16 and runtime_bundle()[0] == version
    with tarfile.open(fileobj=io.BytesIO(tarball)) as tar:
        names = tar.getnames()
        tar.extractall(tmp_path)
    assert "gpusession/agent/kernel_runtime.py" in names and not any(
        "labextension" in n for n in names
    )
    env = {"PYTHONPATH": str(tmp_path), "PATH": os.environ["PATH"]}
    result = subprocess.run(
        [
            sys.executable,
            "-I",
            "-c",
            "import sys; sys.path.insert(0, sys.argv[1]); "
            "from gpusession.agent.kernel_runtime import build_parser; build_parser()",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        env=env,
    )
    assert result.returncode == 0, result.stderr


# -- what Slurm says ----------------------------------------------------------------------------------


def test_queue_states():
    pending = states.parse_queue("PENDING|Resources|2027-11-30T21:44:45||gpu\n")
    assert (pending.waiting, pending.running, pending.ended, pending.reason) == (
        True,
        False,
        False,
        "Resources",
    )
    running = states.parse_queue("RUNNING|None|2026-11-30T21:44:45|n1|gpu")
    assert running.running and running.reason == "" and running.nodes == "n1"
    assert states.parse_queue("TIMEOUT|TimeLimit|2026-11-30T21:44:45|n1|gpu").ended
    assert not states.parse_queue("COMPLETING|None|N/A|n1|gpu").ended
    assert states.parse_queue("") is None
    queue = "7|gpu\n3|debug\n9|gpu,long\n12|gpu\n"
    assert states.queue_position(queue, "12") == 3  # 7 and 9 are ahead in gpu; 3 waits elsewhere
    assert states.queue_position(queue, "42") is None
    assert states.first_node("gpu[03-05,07]") == "gpu03" and states.first_node("n1") == "n1"
    assert (
        states.node_address("NodeName=n1 Arch=x86_64 NodeAddr=10.210.0.11 NodeHostName=n1", "n1")
        == "10.210.0.11"
    )


SCONTROL_TIMEOUT = (
    "JobId=3 JobName=tl UserId=root(0) JobState=TIMEOUT Reason=TimeLimit Dependency=(null) "
    "ExitCode=0:0 RunTime=00:01:13 TimeLimit=00:01:00 StartTime=2026-11-30T21:44:53 "
    "EndTime=2026-11-30T21:46:06 Comment=gpusession:s:abc"
)


def test_scontrol_and_sacct_say_how_a_job_ended():
    job = states.parse_scontrol_job(SCONTROL_TIMEOUT)
    assert (job.state, job.reason, job.elapsed_s, job.time_limit_s) == (
        "TIMEOUT",
        "TimeLimit",
        73.0,
        60.0,
    )
    assert states.parse_scontrol_job("JobId=3 JobState=RUNNING Reason=None") is None
    assert states.parse_scontrol_job("") is None
    cancelled = states.parse_sacct("4242|CANCELLED by 1000|0:15|95|60|2026-11-30T21:46:06\n")
    assert (cancelled.state, cancelled.reason, cancelled.time_limit_s) == (
        "CANCELLED",
        "by 1000",
        3600.0,
    )
    assert states.parse_sacct("4242|RUNNING|0:0|95|60|Unknown") is None
    assert states.slurm_seconds("1-02:03:04") == 93784 and states.slurm_seconds("UNLIMITED") is None


def test_the_scheduler_s_reason_wins_over_the_signal_the_runtime_saw():
    signal = StopDetails(
        reason=StopReason(StopKind.SIGNAL, signal=15), at=5.0, summary={"gpu_hours": 0.1}
    )
    timeout = states.combine(states.parse_scontrol_job(SCONTROL_TIMEOUT), signal)
    assert timeout.reason == StopReason(StopKind.TIME_LIMIT, elapsed_s=73.0, max_runtime_s=60.0)
    assert (timeout.at, timeout.summary) == (5.0, {"gpu_hours": 0.1})
    preempted = states.combine(states.JobEnd("PREEMPTED"), signal)
    assert preempted.reason.kind is StopKind.PREEMPTED
    node_fail = states.combine(states.JobEnd("NODE_FAIL", reason="NodeDown"), None)
    assert node_fail.reason == StopReason(StopKind.JOB_ENDED, detail="NODE_FAIL (NodeDown)")
    cancelled = states.combine(states.JobEnd("CANCELLED", reason="by 1000"), signal)
    assert cancelled.reason == StopReason(StopKind.JOB_ENDED, detail="CANCELLED by 1000")
    idle = StopDetails(reason=StopReason(StopKind.IDLE, idle_for_s=60, idle_timeout_s=60))
    assert states.combine(states.JobEnd("COMPLETED"), idle).reason.kind is StopKind.IDLE
    assert states.combine(None, None) is None


def test_the_words_for_the_scheduler_s_reasons():
    from gpusession.words.stops import stop_reason_text

    assert stop_reason_text(StopReason(StopKind.TIME_LIMIT, max_runtime_s=3600)) == (
        "the cluster ended its job at the job's time limit (1h00m)"
    )
    assert stop_reason_text(StopReason(StopKind.PREEMPTED)) == "the cluster preempted its job"
    assert stop_reason_text(StopReason(StopKind.JOB_ENDED, detail="NODE_FAIL (NodeDown)")) == (
        "the cluster ended its job: NODE_FAIL (NodeDown)"
    )


def test_check_refuses_what_cannot_be_submitted(gs_home):
    from gpusession.session import SessionManager

    m = SessionManager()
    with pytest.raises(BadInput, match="login node"):
        m.create(m.make_spec("t4", backend="slurm"))
    with pytest.raises(BadInput, match="sets that one itself"):
        m.create(
            m.make_spec("t4", backend="slurm", host="ssh://me@login", sbatch_args="--output=x")
        )
    rec = m.create(
        m.make_spec("a100:4", backend="slurm", host="ssh://me@login", price_per_gpu_hour="2.5")
    )
    assert rec.price_per_hour == 10.0
    assert m.create(m.make_spec("t4", backend="slurm", host="ssh://me@login")).price_per_hour == 0.0


def test_the_charliecloud_job_runs_the_bundle_in_the_image_with_ch_run(tmp_path):
    """--container charliecloud: the job binds the runtime bundle at /mnt/0 and the session's
    folder at /mnt/1, and runs the bundle's boot.sh with the image's Python (found at start)."""
    import dataclasses

    from gpusession.backends.slurm.charliecloud import Prepared

    prepared = Prepared(
        "/shared/img/py", "/home/me/.gpusession/bundle/abc", "/usr/bin/python3", "ipykernel"
    )
    paths = dataclasses.replace(PATHS, charliecloud=prepared)
    text = jobs.batch_script(
        record(image="/shared/img/py"), settings(container="charliecloud"), paths
    )
    (tmp_path / "job.sh").write_text(text)
    assert subprocess.run(["bash", "-n", str(tmp_path / "job.sh")]).returncode == 0, text
    assert (
        "supervise ch-run -b /home/me/.gpusession/bundle/abc:/mnt/0 -b /home/me/.gpusession/slurm/abc123:/mnt/1 "
        "/shared/img/py -- sh /mnt/0/code/boot.sh run " in text
    ), text
    assert "--state-dir /mnt/1/state --kernel-ip /mnt/1/state/k" in text
    assert "GPUSESSION_RUNTIME_ROOT=/mnt/0 GPUSESSION_RUNTIME_BRINGS=ipykernel" in text
    assert 'export USER="${USER:-$(id -un)}"' in text and "apptainer" not in text


def test_charliecloud_names_and_what_a_pull_downloaded():
    from gpusession.backends.slurm.charliecloud import pull_summary, storage_name

    assert storage_name("10.210.0.1:5443/ci/py") == "10.210.0.1+5443%ci%py+latest"
    assert storage_name("nvcr.io/nvidia/pytorch:24.01-py3") == "nvcr.io%nvidia%pytorch+24.01-py3"
    out = (
        "layer 1/2: 8db3709: downloading: 0.0/60.9 MiB (0%)\n"
        "layer 1/2: 8db3709: downloading: 60.9/60.9 MiB (100%)\n"
        "layer 2/2: 1a2b3c4: using existing file\n"
    )
    assert (
        pull_summary(out)
        == "1 layer(s) downloaded (64 MB), 1 layer(s) from ch-image's download cache"
    )


def test_the_users_docker_login_for_a_registry(tmp_path, monkeypatch):
    import base64
    import json

    from gpusession.transport.pulls import docker_login, registry_of

    assert registry_of("nvcr.io/nvidia/pytorch:24.01-py3") == "nvcr.io"
    assert registry_of("pytorch/pytorch:2.7.1") == "docker.io" == registry_of("ubuntu")
    assert registry_of("localhost:5000/x") == "localhost:5000"
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))
    assert docker_login("nvcr.io") is None  # no config at all
    auth = base64.b64encode(b"$oauthtoken:s3cret:with:colons").decode()
    hub = base64.b64encode(b"me:hubpass").decode()
    (tmp_path / "config.json").write_text(
        json.dumps(
            {"auths": {"nvcr.io": {"auth": auth}, "https://index.docker.io/v1/": {"auth": hub}}}
        )
    )
    assert docker_login("nvcr.io") == ("$oauthtoken", "s3cret:with:colons")
    assert docker_login("docker.io") == ("me", "hubpass")
    assert docker_login("other.example.com") is None


def test_a_charliecloud_pull_is_said_while_it_runs():
    from gpusession.backends.slurm.charliecloud import PullWatch

    said: list[str] = []
    watch = PullWatch("reg/img:1", said.append, every_s=0)
    watch(
        b"manifest: downloading: 100%\nlayer 1/2: 8db3709: downloading: 0.0/60.9 MiB (0%)\nlayer 1/2: 8db"
    )
    watch(
        b"3709: downloading: 60.9/60.9 MiB (100%)\nlayer 2/2: 1a2b3c4: downloading: 0.0/1.2 GiB (0%)\n"
    )
    assert said == [
        "pulling reg/img:1: layer 1/2, 0.0/60.9 MiB",
        "pulling reg/img:1: layer 2/2, 0.0/1.2 GiB",
    ]


@pytest.mark.parametrize(
    "kind, recover, wanted",
    [
        (StopKind.PREEMPTED, None, True),  # auto: another job took the allocation
        (StopKind.TIME_LIMIT, None, False),  # auto: a limit is not gone around unasked
        (StopKind.TIME_LIMIT, "on", True),
        (StopKind.PREEMPTED, "off", False),
        (StopKind.IDLE, "on", False),  # not an interruption
    ],
)
def test_which_ended_jobs_a_notebook_resubmits(kind, recover, wanted):
    """--recover on a Slurm session: auto resubmits a preempted job, not one that reached its
    time limit; only a session whose state was saved; the replacement resumes the workspace."""
    import dataclasses

    from gpusession.session.recovery import replacement_values

    rec = record("a100", 1, extra={"recover": recover} if recover else {})
    ended = dataclasses.replace(
        rec,
        state=State.STOPPED,
        resource={
            "workspace": "t4-1",
            "checkpoint": {"committed": True},
            "stop_reason": StopReason(kind).to_dict(),
        },
    )
    body = replacement_values(ended)
    assert (body is not None) is wanted, body
    if wanted:
        assert (body["resume"], body["backend"]) == ("t4-1", "slurm")
        assert "name" not in body  # handed over once the replacement runs (a name, one record)
    unsaved = dataclasses.replace(ended, resource={**ended.resource, "checkpoint": None})
    assert replacement_values(unsaved) is None
    # an asked save cut by the end (stop --save as the capacity went) does not hide the agent's
    # own save on the notice, which committed: the workspace holds that one
    cut = dataclasses.replace(
        ended,
        resource={
            **ended.resource,
            "checkpoint": {"committed": False, "error": "the agent stopped answering"},
            "agent_summary": {"checkpoint": {"committed": True, "for": "scheduler-signal"}},
        },
    )
    assert (replacement_values(cut) is not None) is wanted


def test_what_is_free_now_per_node_from_sinfo():
    """A fallback list's turn on Slurm (SlurmBackend.place): each node's GPUs free now, per gres
    type; a node listed under two partitions counts once; one drained or down offers nothing."""
    from gpusession.backends.slurm import states

    sinfo = (
        "n1   gpu:t4:2(S:0-1)          gpu:t4:1(IDX:0)            mix\n"
        "n1   gpu:t4:2(S:0-1)          gpu:t4:1(IDX:0)            mix\n"
        "n2   gpu:a100_40g:1,shard:4   gpu:a100_40g:1(IDX:0)      alloc\n"
        "n3   gpu:a100_40g:4           gpu:a100_40g:0(IDX:N/A)    drain\n"
        "n4   gpu:2                    gpu:0                      idle*\n"
        "n5   gpu:2                    gpu:0                      idle\n"
    )
    nodes = states.free_gpus(sinfo)
    assert nodes == {"n1": {"t4": (1, 2)}, "n2": {"a100_40g": (0, 1)}, "n5": {"": (2, 2)}}
    assert states.free_words(nodes, "a100_40g") == "n2: 0 of 1 free"
    assert states.free_words(nodes, "h100") == "no node has it"


def test_a_type_before_the_last_of_a_fallback_list_is_taken_only_when_free():
    """Which types a queueing backend (Slurm, Kubernetes) asks for free capacity first: those of
    a fallback list before its last; the last one, and a single type, queue."""
    from gpusession.backends.base import before_the_last
    from gpusession.core.models import LaunchSpec

    listed = {"types": ["a100:1", "t4:2"]}
    assert before_the_last(LaunchSpec("a100", 1, extra=listed))
    assert not before_the_last(LaunchSpec("t4", 2, extra=listed))
    assert not before_the_last(LaunchSpec("t4", 1))
    assert not before_the_last(LaunchSpec("t4", 1, extra={"types": ["t4:1"]}))
