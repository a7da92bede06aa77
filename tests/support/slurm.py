"""The real Slurm cluster the slurm backend's tests use, made by scripts/ci-slurm.sh: slurmctld
here, a login node (sshd) at 10.210.0.10 and compute nodes n1 (gpu:t4:2) and n2
(gpu:a100_40g:1), each in its own network namespace (docs/slurm.md).

    from support.slurm import ensure_cluster, slurm_home, squeue

    cluster = ensure_cluster()                   # None when it cannot run here (not root)
    monkeypatch.setenv("HOME", slurm_home(cluster, tmp_path / "home"))
    manager.make_spec("t4", backend="slurm", host=cluster["url"], python=sys.executable)

`squeue`, `scontrol` and `sbatch` here talk to the same controller (SLURM_CONF), for checks
and for filler jobs that take GPUs away from the tests' sessions.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "ci-slurm.sh"
CI_STATE = Path(os.environ.get("GPUSESSION_CI_STATE", "/var/lib/gpusession-ci"))
STATE = CI_STATE / "slurm"
LOGIN = "10.210.0.10"
NODES = {"n1": "10.210.0.11", "n2": "10.210.0.12"}


def ensure_cluster() -> dict | None:
    """Bring the cluster up (idempotent; under a second when up, ~1-2 s from nothing once the
    packages are installed) and describe it; None when it cannot run here."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        return None
    result = subprocess.run(
        ["bash", str(SCRIPT), "up"], capture_output=True, text=True, timeout=600
    )
    if result.returncode != 0:
        raise RuntimeError(f"{SCRIPT} up failed:\n{result.stdout}{result.stderr}")
    return {
        "url": f"ssh://root@{LOGIN}",
        "login": LOGIN,
        "nodes": dict(NODES),
        "ssh_config": str(STATE / "ssh_config"),
        "known_hosts": str(STATE / "known_hosts"),
        "slurm_conf": str(STATE / "slurm.conf"),
    }


def slurm_home(cluster: dict, directory: str | os.PathLike) -> str:
    """A HOME whose ~/.ssh/config and known_hosts log in to the login node (as a user's would);
    the compute nodes are in no known_hosts: their keys come from the jobs."""
    ssh_dir = Path(directory) / ".ssh"
    ssh_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    shutil.copyfile(cluster["ssh_config"], ssh_dir / "config")
    shutil.copyfile(cluster["known_hosts"], ssh_dir / "known_hosts")
    return str(directory)


def slurm(cluster: dict, *args: str, check: bool = True) -> str:
    """Run a Slurm command here against the test cluster; its stdout."""
    env = dict(os.environ, SLURM_CONF=cluster["slurm_conf"])
    result = subprocess.run(list(args), capture_output=True, text=True, env=env, timeout=60)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {result.stderr.strip() or result.stdout.strip()}")
    return result.stdout


def squeue(cluster: dict, job_id: str | None = None) -> list[dict]:
    """Jobs that are pending, running or ending (one job's when job_id is given)."""
    args = ["squeue", "-h", "-o", "%i|%T|%r|%N|%j|%k"]
    if job_id:
        args += ["--states=all", "-j", job_id]
    rows = [
        line.split("|") for line in slurm(cluster, *args, check=False).splitlines() if line.strip()
    ]
    jobs = [dict(zip(("id", "state", "reason", "nodes", "name", "comment"), row)) for row in rows]
    return [j for j in jobs if j["state"] in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING")]


def wait_until(predicate, timeout: float, what: str, interval: float = 0.3):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:.0f}s")
        time.sleep(interval)


def cancel_all(cluster: dict) -> None:
    """Every job of the test cluster (it is the tests' own): a clean slate between tests."""
    slurm(cluster, "scancel", "-u", "root", check=False)
    wait_until(lambda: not squeue(cluster), 40, "the test cluster's jobs to end")


def filler_job(cluster: dict, gres: str) -> str:
    """A plain batch job holding `gres` (e.g. gpu:t4:2), so that a session has to wait."""
    out = slurm(
        cluster,
        "sbatch",
        "--parsable",
        f"--gres={gres}",
        "-J",
        "filler",
        "-o",
        "/dev/null",
        "--wrap",
        "sleep 600",
    )
    job = out.strip().split(";")[0]
    wait_until(
        lambda: any(j["state"] == "RUNNING" for j in squeue(cluster, job)),
        20,
        f"filler job {job} to run",
    )
    return job
