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
from pathlib import Path

from .waits import wait_until  # noqa: F401 - the slurm tests import it from here

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


REGISTRY = "10.210.0.1:5443"  # the cluster's own registry (TLS from its CA, htpasswd user ci)


def registry_login(home: str | os.PathLike) -> tuple[str, str]:
    """`docker login` to the cluster's registry as the user whose HOME this is (the auths entry
    docker writes in ~/.docker/config.json); (user, password)."""
    import base64
    import json

    password = (STATE / "registry" / "password").read_text().strip()
    folder = Path(home) / ".docker"
    folder.mkdir(parents=True, exist_ok=True)
    auth = base64.b64encode(f"ci:{password}".encode()).decode()
    (folder / "config.json").write_text(json.dumps({"auths": {REGISTRY: {"auth": auth}}}))
    return "ci", password


def registry_image(source: str, name: str, tmp: str | os.PathLike) -> str:
    """`source` (an image of this machine's engine) pushed to the cluster's registry as `name`
    (once: it is kept there); its reference."""
    import ssl
    import urllib.error
    import urllib.request

    ref = f"{REGISTRY}/{name}"
    repository, _, tag = name.partition(":")
    user, password = registry_login(tmp)
    request = urllib.request.Request(
        f"https://{REGISTRY}/v2/{repository}/manifests/{tag or 'latest'}",
        method="HEAD",
        headers={"Accept": "application/vnd.docker.distribution.manifest.v2+json"},
    )
    import base64

    request.add_header(
        "Authorization", "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
    )
    context = ssl.create_default_context(cafile=str(STATE / "registry" / "ca.crt"))
    try:
        urllib.request.urlopen(request, context=context, timeout=10).close()
        return ref
    except urllib.error.HTTPError as exc:
        if exc.code != 404:
            raise
    env = dict(os.environ, DOCKER_CONFIG=str(Path(tmp) / ".docker"))
    subprocess.run(["docker", "tag", source, ref], check=True, env=env, timeout=60)
    subprocess.run(
        ["docker", "push", "-q", ref], check=True, env=env, capture_output=True, timeout=600
    )
    return ref


def image_without_python(folder: str | os.PathLike) -> str:
    """An unpacked Charliecloud image directory with a shell and no Python: dash and its libraries,
    and the mount points ch-run needs."""
    root = Path(folder)
    for d in ("bin", "dev", "proc", "sys", "tmp", "home", "etc", "mnt/0", "mnt/1", "root"):
        (root / d).mkdir(parents=True, exist_ok=True)
    for f in ("etc/passwd", "etc/group", "etc/hosts", "etc/resolv.conf"):
        (root / f).touch()
    shutil.copy2("/bin/dash", root / "bin" / "sh")
    libs = subprocess.run(["ldd", "/bin/dash"], capture_output=True, text=True, check=True).stdout
    for line in libs.splitlines():
        path = line.split("=>")[-1].split("(")[0].strip()
        if path.startswith("/"):
            target = root / path.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)
    return str(root)
