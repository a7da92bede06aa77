"""What a session asks of Slurm: its settings (from the option table's slurm options, with a
cluster's defaults from `slurm.json`), and the batch script and `sbatch` command line made from
them. Pure functions of data, so they are tested without a cluster.

The batch script prints the node's ssh host keys (`GPUSESSION_HOSTKEY <key>`, read from the
node's /etc/ssh, to pin them), loads the environment (modules, a conda environment), and runs
the session runtime (`python -m gpusession.agent run`) with gpusession's runtime on PYTHONPATH,
in a container when --image is given, in the workspace folder. When the runtime ends, so does
the job: an idle stop frees the allocation. The batch shell stays, as the runtime's parent: Slurm's
`--signal=B:USR1@GRACE` (before the time limit or a preemption) reaches only it, and it leaves a
notice for the agent, which saves the namespace into the workspace (gpusession.agent.notices).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import shlex
from pathlib import Path
from typing import Any

from ...configuration.agentargs import AgentArgs
from ...configuration.catalog import mig_profile
from ...configuration.options import StartOption
from ...core.durations import QUEUE_TIMEOUT, SIGNAL_GRACE, parse_money
from ...core.errors import BadInput
from ...core.protocol import (
    ENV_RUNTIME_BRINGS,
    ENV_RUNTIME_PYTHON,
    ENV_RUNTIME_ROOT,
    ENV_SESSION_ID,
    NOTICE_FILES,
    Marker,
    Notice,
    marker_line,
)
from .charliecloud import RUNTIME_MOUNT, SESSION_MOUNT

COMMENT_PREFIX = "gpusession"  # job comment: gpusession:<store id>:<session id>
HOST_KEYS_GLOB = "/etc/ssh/ssh_host_*_key.pub"
CONTAINERS = ("auto", "apptainer", "singularity", "pyxis", "charliecloud")
DEFAULT_SIGNAL_GRACE_S = 120.0  # the agent saves this long before the job's end (--signal-grace)
SIGNAL_NOTICE = next(name for name, kind in NOTICE_FILES.items() if kind is Notice.SCHEDULER_SIGNAL)
WORKSPACE_MOUNT = "/mnt/2"  # the session's workspace in a Charliecloud image
#: sbatch flags the backend sets itself (it reads the job's output and finds it by its comment)
RESERVED_FLAGS = (
    "--output",
    "-o",
    "--error",
    "-e",
    "--job-name",
    "-J",
    "--comment",
    "--parsable",
    "--wrap",
    "--array",
    "-a",
    "--chdir",
    "-D",
    "--gres",
    "--export",
)
_WORD = re.compile(r"^[A-Za-z0-9_.+/@:=,%-]+$")
_GRES_TYPE = re.compile(r"^[A-Za-z0-9_.-]+$")

#: the slurm options of the option table (gpusession/configuration/options.py), as spec.extra keys
START_OPTIONS = (  # the slurm backend's start options (SlurmBackend.start_options); read and checked here
    StartOption(
        "partition",
        ("--partition",),
        "text",
        "Partition",
        "slurm: the partition to submit to (default: the cluster's default)",
        "partition",
        max_len=200,
    ),
    StartOption(
        "account",
        ("--account",),
        "text",
        "Account",
        "slurm: the account to charge",
        "account",
        max_len=200,
    ),
    StartOption(
        "qos", ("--qos",), "text", "QOS", "slurm: the quality of service", "QOS", max_len=200
    ),
    StartOption(
        "sbatch_args",
        ("--sbatch-args",),
        "text",
        "sbatch flags",
        "slurm: more sbatch flags, shell-quoted, e.g. '--constraint=ib --mem=32G'",
        "sbatch flags",
        max_len=1000,
    ),
    StartOption(
        "python",
        ("--python",),
        "text",
        "Python",
        "slurm: the Python on the node that runs the kernel; it needs ipykernel (default python3)",
        "python",
        max_len=400,
    ),
    StartOption(
        "modules",
        ("--modules",),
        "text",
        "Modules",
        "slurm: environment modules to load first, e.g. 'cuda/12.4 python/3.11'",
        "modules",
        max_len=400,
    ),
    StartOption(
        "conda_env",
        ("--conda-env",),
        "text",
        "Conda env",
        "slurm: a conda environment to activate first (name or path)",
        "conda environment",
        max_len=400,
    ),
    StartOption(
        "gres_type",
        ("--gres-type",),
        "text",
        "GRES type",
        "slurm: the cluster's name for the GPU type: one "
        "name, a map such as 'a100=a100_40g,t4=tesla_t4', or none for an untyped --gres=gpu:N (default: "
        "the catalog's name)",
        "GRES type",
        max_len=400,
    ),
    StartOption(
        "container",
        ("--container",),
        "choice",
        "Container runtime",
        "slurm: what runs --image (default "
        "auto: apptainer, singularity, pyxis or charliecloud, the first the login node has)",
        "container runtime",
        default="auto",
        choices=CONTAINERS,
    ),
    StartOption(
        "price_per_gpu_hour",
        ("--price-per-gpu-hour",),
        "money",
        "Price per GPU-hour",
        "slurm: dollars (or "
        "your service units) per GPU-hour for the cost meter and --max-cost (default: none, GPU-hours only)",
        "price per GPU-hour",
    ),
    StartOption(
        "queue_timeout",
        ("--queue-timeout",),
        "duration",
        "Queue timeout",
        "slurm: cancel the job when it "
        "still waits in the queue after this long (default: off, it waits until it runs or Ctrl-C)",
        "queue timeout",
        rule=QUEUE_TIMEOUT,
    ),
    StartOption(
        "signal_grace",
        ("--signal-grace",),
        "duration",
        "Save before the job's end",
        "slurm: Slurm signals the job this long before its time limit or a preemption, and "
        "the agent saves the kernel's variables into the workspace (default 2m; off: no signal)",
        "signal grace",
        rule=SIGNAL_GRACE,
    ),
    StartOption(
        "workspace_dir",
        ("--workspace-dir",),
        "text",
        "Workspace folder",
        "slurm: the cluster folder that holds the workspaces, e.g. /scratch/me/ws "
        "(default: ~/.gpusession/workspaces of the login user)",
        "workspace folder",
        max_len=400,
    ),
)
OPTION_NAMES = tuple(option.name for option in START_OPTIONS)


@dataclasses.dataclass(frozen=True)
class JobSettings:
    """A session's Slurm settings, read and checked."""

    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    sbatch_args: tuple[str, ...] = ()  # extra sbatch flags, split like a shell
    python: str = "python3"  # the interpreter on the node (in the container with --image)
    modules: tuple[str, ...] = ()  # `module load` these first
    conda_env: str | None = None  # then `conda activate` this
    gres_types: dict[str, str] = dataclasses.field(
        default_factory=dict
    )  # catalog type -> cluster type ("" untyped)
    gres_default: str | None = None  # the cluster type for any catalog type not in gres_types
    container: str = "auto"  # with an image: one of CONTAINERS (auto: the first the cluster has)
    price_per_gpu_hour: float | None = None  # dollars (or service units) per GPU-hour
    queue_timeout_s: float | None = None  # give up (and cancel) when still queued after this long
    signal_grace_s: float | None = DEFAULT_SIGNAL_GRACE_S  # --signal=B:USR1@this; None: none
    workspace_dir: str | None = None  # the workspaces' folder (default: ~/.gpusession/workspaces)

    def gres_type(self, gpu_type: str) -> str:
        """The cluster's GRES type name for a catalog type; '' for an untyped request. A MIG
        slice's is its profile ('a100-1g.10gb' -> '1g.10gb'), as Slurm's MIG types are named
        (a substring of the profile NVML reports, e.g. nvidia_a100_1g.10gb)."""
        if gpu_type in self.gres_types:
            return self.gres_types[gpu_type]
        if self.gres_default is not None:
            return self.gres_default
        return mig_profile(gpu_type) or gpu_type


def read_settings(
    extra: dict[str, Any], cluster: dict[str, Any] | None = None, *, catalog=None
) -> JobSettings:
    """JobSettings from a spec's extra options, a cluster's defaults filling what is not given.
    Raises BadInput naming the option."""
    given = {k: v for k, v in (cluster or {}).items() if k in OPTION_NAMES}
    given.update({k: v for k, v in extra.items() if k in OPTION_NAMES and v is not None})
    words: dict[str, Any] = {}
    for name in ("partition", "account", "qos", "conda_env"):
        value = given.get(name)
        if value is not None and str(value).strip():
            words[name] = _word(name, str(value).strip())
    python = str(given.get("python") or "python3").strip()
    if not python or any(c in python for c in "\n\r\0"):
        raise BadInput(
            f"python {python!r}: give an interpreter's name or path, e.g. python3 or /opt/py/bin/python"
        )
    modules = tuple(
        _word("modules", m)
        for m in re.split(r"[\s,]+", str(given.get("modules") or "").strip())
        if m
    )
    gres_types, gres_default = parse_gres_types(given.get("gres_type"), catalog)
    container = str(given.get("container") or "auto").strip().lower()
    if container not in CONTAINERS:
        raise BadInput(f"container {container!r}: use one of {', '.join(CONTAINERS)}")
    price = given.get("price_per_gpu_hour")
    queue_timeout = given.get("queue_timeout")
    grace = given.get("signal_grace", DEFAULT_SIGNAL_GRACE_S)
    folder = str(given.get("workspace_dir") or "").strip() or None
    if folder is not None and (
        not folder.startswith(("/", "~/")) or any(c in folder for c in "\n\r\0")
    ):
        raise BadInput(
            f"workspace dir {folder!r}: give an absolute path on the cluster (or ~/...), e.g. /scratch/$USER/ws"
        )
    return JobSettings(
        sbatch_args=parse_sbatch_args(given.get("sbatch_args")),
        python=python,
        modules=modules,
        gres_types=gres_types,
        gres_default=gres_default,
        container=container,
        price_per_gpu_hour=parse_money(price, what="price per GPU-hour")
        if isinstance(price, str)
        else price,
        queue_timeout_s=(
            QUEUE_TIMEOUT.parse(queue_timeout) if isinstance(queue_timeout, str) else queue_timeout
        ),
        signal_grace_s=SIGNAL_GRACE.parse(grace) if isinstance(grace, str) else grace,
        workspace_dir=folder,
        **words,
    )


def _word(name: str, value: str) -> str:
    if not _WORD.match(value):
        raise BadInput(f"{name.replace('_', ' ')} {value!r}: letters, digits and _.+/@:=,%- only")
    return value


def parse_gres_types(value: Any, catalog=None) -> tuple[dict[str, str], str | None]:
    """--gres-type: '' (the catalog's names), 'none' (untyped gpu:N), one cluster type for every
    request ('tesla_t4'), or a map 'a100=a100_40g,t4=tesla_t4' (others keep the catalog's name)."""
    text = str(value or "").strip()
    if not text:
        return {}, None
    if "=" not in text:
        return {}, _gres_name(text)
    mapping: dict[str, str] = {}
    for item in re.split(r"[\s,]+", text):
        if not item:
            continue
        ours, sep, theirs = item.partition("=")
        if not sep or not ours.strip():
            raise BadInput(
                f"GRES type map item {item!r}: write CATALOG_TYPE=CLUSTER_TYPE, e.g. a100=a100_40g"
            )
        key = ours.strip().lower()
        if catalog is not None:
            key = catalog.get(key).name  # BadInput names the valid types
        mapping[key] = _gres_name(theirs.strip())
    return mapping, None


def _gres_name(text: str) -> str:
    if text.lower() == "none":
        return ""
    if not _GRES_TYPE.match(text):
        raise BadInput(
            f"GRES type {text!r}: letters, digits and _.- only (or none for an untyped request)"
        )
    return text


def parse_sbatch_args(value: Any) -> tuple[str, ...]:
    text = str(value or "").strip()
    if not text:
        return ()
    try:
        args = tuple(shlex.split(text))
    except ValueError as exc:
        raise BadInput(f"sbatch flags {text!r}: {exc}") from None
    if not args[0].startswith("-"):
        raise BadInput(f"sbatch flags {text!r}: give flags only, e.g. '--constraint=ib --mem=32G'")
    for arg in args:
        flag = arg.split("=", 1)[0]
        if flag in RESERVED_FLAGS or (
            flag[:2] in ("-o", "-e", "-J", "-a", "-D") and not flag.startswith("--")
        ):
            raise BadInput(f"sbatch flag {arg!r}: gpusession sets that one itself")
    return args


def load_cluster_defaults(path: Path, host: str | None) -> dict[str, Any]:
    """The defaults for a login host from `slurm.json` ({"login.cluster": {"partition": "gpu",
    "gres_type": "a100=a100_40g", ...}}), keyed by the --host as given or by its host name."""
    if not host:
        return {}
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise BadInput(f"{path}: not readable as JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise BadInput(f"{path}: expected an object of login hosts")
    import urllib.parse

    name = urllib.parse.urlparse(host).hostname or ""
    for key in (host, host.rstrip("/"), name):
        found = doc.get(key)
        if isinstance(found, dict):
            unknown = sorted(set(found) - set(OPTION_NAMES))
            if unknown:
                raise BadInput(
                    f"{path}: {key}: unknown setting(s) {', '.join(unknown)}; allowed: {', '.join(OPTION_NAMES)}"
                )
            return found
    return {}


# -- the job ----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class JobPaths:
    """Where a session's files live on the cluster's shared storage."""

    session_dir: str  # <home>/.gpusession/slurm/<session id>
    runtime_dir: str  # the uploaded runtime: <runtime_dir>/gpusession
    workspace: str = ""  # the session's workspace folder (kept after it ends); "" for none
    charliecloud: Any = None  # with --container charliecloud: charliecloud.Prepared

    @property
    def output(self) -> str:
        return f"{self.session_dir}/job.out"

    @property
    def state_dir(self) -> str:
        return f"{self.session_dir}/state"


def job_name(record) -> str:
    return f"gpusession-{record.name}-{record.id[:8]}"


def job_comment(store_id: str, session_id: str) -> str:
    return f"{COMMENT_PREFIX}:{store_id}:{session_id}"


def comment_session(comment: str, store_id: str) -> str | None:
    """The session id in one of this store's job comments, else None."""
    prefix = f"{COMMENT_PREFIX}:{store_id}:"
    return comment[len(prefix) :] or None if comment.startswith(prefix) else None


def time_limit_minutes(max_runtime_s: float | None) -> int | None:
    """--time from --max-runtime: one minute more, so that the agent's own stop (with its summary)
    comes first and Slurm's limit is the backstop."""
    if not max_runtime_s:
        return None
    return math.ceil(max_runtime_s / 60.0) + 1


def sbatch_command(record, settings: JobSettings, paths: JobPaths, store_id: str) -> list[str]:
    spec = record.spec
    gres_type = settings.gres_type(spec.gpu_type)
    gres = f"gpu:{gres_type}:{spec.gpu_count}" if gres_type else f"gpu:{spec.gpu_count}"
    cmd = [
        "sbatch",
        "--parsable",
        f"--job-name={job_name(record)}",
        f"--comment={job_comment(store_id, record.id)}",
        f"--output={paths.output}",
        # a preempted job is not run again under the same id (its batch script would start a
        # fresh kernel nobody attached to): it ends, PREEMPTED, and --recover submits a new one
        "--no-requeue",
        f"--gres={gres}",
    ]
    minutes = time_limit_minutes(spec.max_runtime)
    if minutes:
        cmd.append(f"--time={minutes}")
    if settings.signal_grace_s:  # to the batch shell only (B:): it tells the agent, who saves
        cmd.append(f"--signal=B:USR1@{math.ceil(settings.signal_grace_s)}")
    for name in ("partition", "account", "qos"):
        value = getattr(settings, name)
        if value:
            cmd.append(f"--{name}={value}")
    return cmd + list(settings.sbatch_args)


def batch_script(record, settings: JobSettings, paths: JobPaths) -> str:
    """The job: host keys, environment, then the runtime in the foreground (exec)."""
    lines = _environment_lines(record, settings, paths)
    lines.append(_supervise(f"{paths.state_dir}/notices"))
    image = record.spec.extra.get("image")
    if image and settings.container == "charliecloud":
        return "\n".join(lines + charliecloud_lines(record, paths)) + "\n"
    runtime = _runtime_command(record, settings, paths)
    if not image:
        lines += _host_python_lines(settings, runtime)
    else:
        lines += _container_lines(settings, paths, image, runtime)
    return "\n".join(lines) + "\n"


def _failed(stage: str, error: str) -> str:
    """A FAILED marker line, quoted for the shell's echo."""
    return shlex.quote(marker_line(Marker.FAILED, {"stage": stage, "error": error}))


def _environment_lines(record, settings: JobSettings, paths: JobPaths) -> list[str]:
    """The script's start: the node's host keys said, modules loaded, a conda environment
    activated, the runtime's environment, the session's state folder."""
    q = shlex.quote
    lines = [
        "#!/bin/bash",
        f"# gpusession session {record.name} ({record.id}): the session runtime on this job's node",
        f'for key in {HOST_KEYS_GLOB}; do [ -r "$key" ] && echo {q(Marker.HOSTKEY.value)} "$(cat "$key")"; done',
    ]
    if settings.modules:
        lines.append(
            f"module load {' '.join(q(m) for m in settings.modules)} "
            f"|| {{ echo {_failed('environment', 'module load failed')}; exit 1; }}"
        )
    if settings.conda_env:
        lines.append(
            f'eval "$(conda shell.bash hook)" && conda activate {q(settings.conda_env)} '
            f"|| {{ echo {_failed('environment', 'conda activate failed')}; exit 1; }}"
        )
    lines += [
        f"export {ENV_SESSION_ID}={q(record.id)}",
        f"export PYTHONPATH={q(paths.runtime_dir)}${{PYTHONPATH:+:$PYTHONPATH}}",
        "export PYTHONUNBUFFERED=1",
        f"mkdir -p -m 700 {q(paths.state_dir)}",
    ]
    return lines


def _runtime_command(record, settings: JobSettings, paths: JobPaths) -> list[str]:
    """`python -m gpusession.agent run` with the session's options (the node's python, or the
    image's)."""
    # the kernel on unix sockets in the 0700 state folder (the tunnel forwards to them): a login
    # node's or compute node's other users cannot reach it, as they could a loopback port; a path
    # too long for a unix socket's (107 bytes) keeps loopback ports
    sockets = f"{paths.state_dir}/k"
    kernel_ip = sockets if sockets.startswith("/") and len(sockets) + 2 <= 100 else "127.0.0.1"
    # billing starts when the job does, not when it was queued: the agent counts from its own start
    workspace = {"workspace": paths.workspace, "cwd": paths.workspace} if paths.workspace else {}
    agent = AgentArgs.for_record(
        record,
        session_id=record.id,
        state_dir=paths.state_dir,
        kernel_ip=kernel_ip,
        billed_since=None,
        **workspace,
    )
    return [settings.python, "-m", "gpusession.agent", "run", *agent.argv()]


def _host_python_lines(settings: JobSettings, runtime: list[str]) -> list[str]:
    """No --image: the runtime in the node's Python, which must have ipykernel."""
    missing = f"{settings.python} cannot import ipykernel: install it in that environment (pip install ipykernel)"
    return [
        f"{shlex.quote(settings.python)} -c 'import ipykernel' 2>/dev/null "
        f"|| {{ echo {_failed('environment', missing)}; exit 1; }}",
        "supervise " + shlex.join(runtime),
    ]


def _container_lines(
    settings: JobSettings, paths: JobPaths, image: str, runtime: list[str]
) -> list[str]:
    """--image: the runtime in a container of it, by --container, or the first of apptainer,
    singularity and pyxis the node has."""
    q = shlex.quote
    mounted = [paths.runtime_dir, paths.session_dir] + (
        [paths.workspace] if paths.workspace else []
    )
    binds = ",".join(mounted)
    apptainer = f"--nv --bind {q(binds)} {q(apptainer_image(image))} " + shlex.join(runtime)
    pyxis = (
        f"srun --overlap --ntasks=1 --container-image={q(pyxis_image(image))} "
        f"--container-mounts={q(binds)} " + shlex.join(runtime)
    )
    choice = {
        "apptainer": f"supervise apptainer exec {apptainer}",
        "singularity": f"supervise singularity exec {apptainer}",
        "pyxis": f"supervise {pyxis}",
    }
    if settings.container != "auto":
        return [choice[settings.container]]
    none = _failed(
        "environment",
        "--image needs apptainer, singularity or pyxis (srun --container-image) on the node",
    )
    return [
        f"if command -v apptainer >/dev/null; then {choice['apptainer']}",
        f"elif command -v singularity >/dev/null; then {choice['singularity']}",
        f"elif srun --help 2>/dev/null | grep -q -- --container-image; then {choice['pyxis']}",
        f"else echo {none}; exit 1; fi",
    ]


def _supervise(notices: str) -> str:
    """Shell functions that run the runtime as this shell's child and wait for it: Slurm's
    --signal=B:USR1 reaches only the batch shell, which then leaves a notice in the agent's notice
    folder (the agent saves the namespace); a TERM is passed on. Its status is the runtime's."""
    q = shlex.quote
    notice = f"{notices}/{SIGNAL_NOTICE}"
    return f"""notice() {{
    mkdir -p -m 700 {q(notices)} && date +'{{"signal":"USR1","at":%s}}' >{q(notice + ".tmp")} && mv {q(notice + ".tmp")} {q(notice)}
}}
supervise() {{
    "$@" &
    child=$!
    trap notice USR1
    trap 'kill -TERM "$child" 2>/dev/null' TERM
    while kill -0 "$child" 2>/dev/null; do wait "$child"; done
    wait "$child"
}}"""


def charliecloud_lines(record, paths: JobPaths) -> list[str]:
    """The runtime in the image with ch-run: the bundle at /mnt/0, the session's folder at /mnt/1
    (the agent writes its state and the kernel's sockets there); the host's /dev, so the job's
    GPUs (Slurm's cgroup and CUDA_VISIBLE_DEVICES limit them) and nothing else; NVIDIA's
    libraries injected with ch-fromhost --nvidia, as Charliecloud documents, into an image the
    user owns (a pulled one) when the node has them; the workspace, when the session has one, at
    /mnt/2."""
    q = shlex.quote
    ch = paths.charliecloud
    inside = f"{SESSION_MOUNT}/state"
    workspace = {"workspace": WORKSPACE_MOUNT, "cwd": WORKSPACE_MOUNT} if paths.workspace else {}
    agent = AgentArgs.for_record(
        record,
        session_id=record.id,
        state_dir=inside,
        kernel_ip=f"{inside}/k",
        billed_since=None,
        **workspace,
    )
    binds = f"-b {q(ch.bundle)}:{RUNTIME_MOUNT} -b {q(paths.session_dir)}:{SESSION_MOUNT}"
    if paths.workspace:
        binds += f" -b {q(paths.workspace)}:{WORKSPACE_MOUNT}"
    return [
        'export USER="${USER:-$(id -un)}"',  # ch-run refuses to start without it
        f"export {ENV_RUNTIME_ROOT}={RUNTIME_MOUNT} {ENV_RUNTIME_BRINGS}={q(ch.brings)} "
        f"{ENV_RUNTIME_PYTHON}={q(ch.python)}",
        f"if [ -d {q(ch.image)} ] && [ -w {q(ch.image)} ] && command -v nvidia-container-cli >/dev/null; then "
        f"ch-fromhost --nvidia {q(ch.image)} >/dev/null 2>&1 || echo 'gpusession: ch-fromhost --nvidia failed' >&2; fi",
        # supervised as the other runtimes are: Slurm's USR1 before the time limit becomes a notice
        f"supervise ch-run {binds} {q(ch.image)} -- sh {RUNTIME_MOUNT}/code/boot.sh run "
        + shlex.join(agent.argv()),
    ]


CONTAINER_CHECKS = {
    "apptainer": "command -v apptainer",
    "singularity": "command -v singularity",
    "pyxis": "srun --help 2>/dev/null | grep -q -- --container-image",
    "charliecloud": "command -v ch-run && command -v ch-image",
}


def container_probe() -> str:
    """A shell line (for the login node) printing the names of the container runtimes it has."""
    return (
        "; ".join(
            f"{{ {check}; }} >/dev/null 2>&1 && echo {name}"
            for name, check in CONTAINER_CHECKS.items()
        )
        + "; true"
    )


def apptainer_image(image: str) -> str:
    """A registry reference as apptainer pulls it (docker://...); a path or URI as it is."""
    return (
        image
        if "://" in image or image.startswith("/") or image.endswith((".sif", ".simg"))
        else f"docker://{image}"
    )


def pyxis_image(image: str) -> str:
    """A registry reference as pyxis (enroot) writes it: nvcr.io/nvidia/pytorch:24.01 ->
    nvcr.io#nvidia/pytorch:24.01; Docker Hub names and paths as they are."""
    first, sep, rest = image.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost") and not image.startswith("/"):
        return f"{first}#{rest}"
    return image
