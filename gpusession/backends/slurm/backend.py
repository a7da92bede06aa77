"""`slurm`: the session kernel runs in a batch job on a Slurm cluster, placed by the cluster.

provision  ssh to the login node (--host ssh://[user@]login[:port], the user's ~/.ssh/config,
           keys and known_hosts), bring gpusession's runtime to the shared home once per
           version, `sbatch` the job (GPUs as --gres=gpu:TYPE:N, --time from --max-runtime,
           partition/account/qos/flags), then show its place in the queue until it runs
connect    wait for the runtime's READY in the job's output, read the node's host keys from it
           (printed by the job from the node's /etc/ssh, pinned), and tunnel to the kernel's
           ports on the node's loopback through the login node as jump host
stop       scancel; an idle stop ends the job from inside (the runtime exits, so does the job)
gc         our jobs carry `--comment=gpusession:<store>:<session>`; squeue finds them

Files on the cluster, under ~/.gpusession of the login user: runtime/<version>/gpusession (the
runtime's sources), slurm/<session id>/job.out (the job's output: markers) and state/ (the
runtime's kernel.json, runtime.json, stopped.json), workspaces/<name> (the session's working
folder, kept: the agent saves the namespace there before an idle stop and when Slurm signals the
job's end, `--resume NAME` restores it; `--workspace-dir` puts them elsewhere, on scratch).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shlex
import shutil
import threading
import time
from typing import Any

from ...configuration.agentargs import workspace_name
from ...configuration.catalog import load_catalog
from ...configuration.cost import BILLED_FROM, CONFIGURED
from ...core.durations import format_duration
from ...core.errors import BackendUnavailable, BadInput, NoCapacity, StageError
from ...core.models import LaunchSpec, SessionRecord
from ...core.progress import Progress
from ...core.protocol import Marker, StopDetails, parse_marker
from ..base import (
    Backend,
    Link,
    Place,
    RemoteResource,
    TunnelLink,
    Workspace,
    WorkspaceExport,
    before_the_last,
    failure_detail,
    log_tail,
    marker_lines,
    run_probe,
    stop_details_from_log,
)
from . import charliecloud, states
from .jobs import (
    CONTAINER_CHECKS,
    START_OPTIONS,
    JobPaths,
    batch_script,
    comment_session,
    container_probe,
    load_cluster_defaults,
    read_settings,
    sbatch_command,
)
from .login import LoginShell, ensure_runtime

START_TIMEOUT = 300.0  # from the job running to the runtime's READY (module loads, a shared FS)
STOP_WAIT_S = (
    45.0  # after scancel, until the job has freed its allocation (KillWait is 30 s by default)
)
SEP = "@@gpusession@@"
q = shlex.quote
log = logging.getLogger(__name__)


class SlurmBackend(Backend):
    name = "slurm"
    takes_host = True  # the cluster's login node
    host_help = "the cluster's login node, ssh://user@login[:port]"
    place_option = "host"  # each cluster keeps its own folders
    takes_image = True  # run by apptainer, singularity, pyxis or charliecloud
    image_help = (
        "run by apptainer, singularity, pyxis or charliecloud (default: none, the node's Python)"
    )
    keeps_workspaces = True  # a folder on the cluster's shared storage per workspace
    order = 40
    price_source = "--price-per-gpu-hour x GPUs, else GpuSessionConfig.price_per_hour, else none (GPU-hours only)"
    start_options = START_OPTIONS  # declared and read in jobs.py; docs/slurm.md

    @classmethod
    def discover(cls, timeout: float = 4.0) -> list[Place]:
        """This machine as a Slurm login (sinfo answers: the cluster's GPUs as its gres). Login
        nodes elsewhere are found among the SSH hosts (gpusession setup's SSH probe)."""
        conf = os.environ.get("SLURM_CONF") or "/etc/slurm/slurm.conf"
        if shutil.which("sinfo") is None:
            if not os.path.isfile(conf):
                return []
            return [Place("slurm", conf, "unknown", cls.name, False, "a slurm.conf, no sinfo")]
        rc, out = run_probe(["sinfo", "-h", "-o", "%G"], timeout)
        if rc != 0:
            return [Place("slurm", "this machine (sinfo)", "unknown", cls.name, False, out[:100])]
        gres = ", ".join(sorted({g for g in out.replace(",", " ").split() if g.startswith("gpu")}))
        note = "reached over SSH: --host ssh://USER@this machine's name"
        return [Place("slurm", "this machine (sinfo)", gres or "none", cls.name, bool(gres), note)]

    def __init__(self, config, recorder):
        super().__init__(config, recorder)
        self._shells: dict[str, LoginShell] = {}
        self._lock = threading.Lock()

    def shell(self, host: str) -> LoginShell:
        with self._lock:
            if host not in self._shells:
                self._shells[host] = LoginShell(host)
            return self._shells[host]

    def job_settings(self, spec: LaunchSpec):
        cluster = load_cluster_defaults(
            self.config.data_path / "slurm.json", spec.extra.get("host")
        )
        return read_settings(spec.extra, cluster, catalog=load_catalog())

    def check(self, spec: LaunchSpec) -> None:
        if not spec.extra.get("host") or not spec.extra.get("host").startswith("ssh://"):
            raise BadInput(
                "--host: give the cluster's login node as ssh://[user@]login.cluster[:port]"
            )
        self.job_settings(spec)

    def price_per_hour(self, spec: LaunchSpec, catalog) -> float:
        """--price-per-gpu-hour (dollars or service units) x GPUs; else GPUSESSION_PRICE_PER_HOUR;
        else free: a cluster's GPU-hours are counted, not priced, unless you say so. A MIG
        slice costs its share of a GPU-hour (1g.10gb: 1/7)."""
        price = self.job_settings(spec).price_per_gpu_hour
        if price is not None:
            return price * spec.gpu_count * (catalog.get(spec.gpu_type).share or 1.0)
        return self.config.price_per_hour if self.config.price_per_hour >= 0 else 0.0

    def price_basis(self, spec: LaunchSpec) -> str | None:
        """A configured price, or none (GPU-hours only): never the catalog's rate."""
        priced = (
            self.job_settings(spec).price_per_gpu_hour is not None
            or self.config.price_per_hour >= 0
        )
        return CONFIGURED if priced else None

    # -- start ----------------------------------------------------------------------------

    def place(self, record: SessionRecord, progress: Progress) -> dict[str, Any] | None:
        """A fallback list (`--type a100,t4`) is tried one type after another: a type that is not
        the list's last is taken only when a node has its GPUs free now (sinfo: configured
        GRES less those in use), else NoCapacity moves the list on; the last type queues as any
        start does (--queue-timeout bounds its wait)."""
        spec = record.spec
        if not before_the_last(spec):
            return None
        settings = self.job_settings(spec)
        gres = settings.gres_type(spec.gpu_type)
        where = f" -p {q(settings.partition)}" if settings.partition else ""
        shell = self.shell(spec.extra["host"])
        progress.step(f"asking the cluster for {spec.gpu_count} free gpu:{gres} now")
        nodes = states.free_gpus(shell.run(f"sinfo -N -h{where} -O {states.FREE_FORMAT}").out)
        best = max((kinds.get(gres, (0, 0))[0] for kinds in nodes.values()), default=0)
        if best >= spec.gpu_count:
            return None
        raise NoCapacity(
            f"no node of the cluster has {spec.gpu_count} free gpu:{gres} now "
            f"({states.free_words(nodes, gres)})",
            where=spec.extra["host"],
        )

    def provision(self, record: SessionRecord, progress: Progress) -> None:
        spec = record.spec
        settings = self.job_settings(spec)
        shell = self.shell(spec.extra.get("host"))
        progress.step(f"logging in to {spec.extra.get('host')}")
        base = shell.base_dir()
        prepared = None
        if spec.extra.get("image"):
            settings = dataclasses.replace(
                settings, container=self._container_runtime(shell, spec, settings, progress)
            )
            self.recorder.save(record.id, container=settings.container)
            if settings.container == "charliecloud":
                prepared = charliecloud.prepare(shell, spec.extra.get("image"), base, progress)
        progress.step("bringing the session runtime to the cluster")
        paths = JobPaths(
            session_dir=f"{base}/slurm/{record.id}",
            runtime_dir=ensure_runtime(shell),
            workspace=self._workspace(shell, record, settings, base),
            charliecloud=prepared,
        )
        script = batch_script(record, settings, paths)
        command = sbatch_command(record, settings, paths, self.recorder.store_id)
        # billed from the job's start, as the agent counts: nothing while it waits in the queue
        self.recorder.save(
            record.id, session_dir=paths.session_dir, submitting=True, **{BILLED_FROM: None}
        )
        shown = [
            c
            for c in command
            if not c.startswith(
                ("--parsable", "--job-name=", "--comment=", "--output=", "--no-requeue")
            )
        ]
        progress.step("submitting: " + shlex.join(shown))
        result = shell.run(
            f"mkdir -p -m 700 {q(paths.session_dir)} && {shlex.join(command)}",
            stdin=script.encode(),
        )
        # the last line: a login shell's startup files may print before it
        job_id = (result.out.strip().splitlines() or [""])[-1].split(";")[0].strip()
        if not result.ok or not job_id.isdigit():
            raise StageError("provision", f"sbatch refused the job: {result.text()}")
        self.recorder.save(record.id, job_id=job_id)
        node = self._wait_in_queue(shell, job_id, paths, settings.queue_timeout_s, progress)
        self.recorder.save(record.id, node=node, **{BILLED_FROM: time.time()})

    def _workspace(self, shell: LoginShell, record: SessionRecord, settings, base: str) -> str:
        """The session's workspace folder on the cluster, made (0700) unless --resume names one
        that is not there."""
        name = workspace_name(record)
        folder = _workspaces_folder(shell, settings, base)
        path = f"{folder}/{name}"
        if record.spec.extra.get("resume"):
            if not shell.run(f"test -d {q(path)}").ok:
                raise StageError(
                    "provision",
                    f"no workspace {name} to resume in {folder} on {record.spec.extra.get('host')} "
                    "(`--workspace-dir` names another folder)",
                )
        elif not shell.run(f"mkdir -p -m 700 {q(path)}").ok:
            raise StageError(
                "provision",
                f"cannot make the workspace folder {path} on {record.spec.extra.get('host')}",
            )
        self.recorder.save(record.id, workspace=name, workspace_dir=path)
        return path

    @staticmethod
    def _container_runtime(
        shell: LoginShell, spec: LaunchSpec, settings, progress: Progress
    ) -> str:
        """The runtime that runs --image, said in one line with why: the one named by
        --container (trusted: the job says so if the node lacks it), else the first of
        apptainer, singularity, pyxis and charliecloud the login node has (a cluster's nodes
        have what its login node has); none: nothing is submitted."""
        if settings.container != "auto":
            progress.step(
                f"container runtime: {settings.container} (--container {settings.container})"
            )
            return settings.container
        found = shell.run(container_probe()).out.split()
        names = [name for name in CONTAINER_CHECKS if name in found]
        if not names:
            raise StageError(
                "provision",
                f"--image {spec.extra.get('image')}: the cluster {spec.extra.get('host')} has no container runtime "
                f"({', '.join(CONTAINER_CHECKS)}) on its login node; "
                "start without --image (--python, --modules, --conda-env), or name one with --container",
            )
        others = f"; it also has {', '.join(names[1:])}" if names[1:] else ""
        progress.step(
            f"container runtime: {names[0]} (--container auto: the first of "
            f"{', '.join(CONTAINER_CHECKS)} on the login node{others})"
        )
        return names[0]

    def _wait_in_queue(
        self,
        shell: LoginShell,
        job_id: str,
        paths: JobPaths,
        timeout_s: float | None,
        progress: Progress,
    ) -> str:
        """Until the job runs (its first node); the queue state and reason shown as they change.
        Ctrl-C (or a timeout) leaves the job to `stop`, which cancels it."""
        started = time.monotonic()
        said, said_at, delay, partition = "", 0.0, 0.5, ""
        while True:
            # the pending jobs of our partition(s) only: a big cluster has thousands in all
            command = (
                f"squeue -h --states=all -j {job_id} -o {q(states.QUEUE_FORMAT)}; echo {SEP}; "
                f"squeue -h -t PENDING --sort=-p,i -o '%i|%P'"
                + (f" -p {q(partition)}" if partition else "")
            )
            queue_text, _, pending = shell.run(command).out.partition(SEP)
            state = states.parse_queue(queue_text)
            partition = state.partition if state is not None else partition
            if state is None:
                raise StageError("provision", f"job {job_id} is no longer known to Slurm")
            if state.running:
                node = states.first_node(state.nodes)
                progress.step(f"job {job_id} is running on {node}")
                return node
            if not state.waiting:
                raise StageError("provision", self._why_it_ended(shell, job_id, paths, state.state))
            text = _queue_words(state, states.queue_position(pending, job_id))
            now = time.monotonic()
            if text != said or now - said_at > 30:
                progress.step(f"job {job_id} waits: {text}")
                said, said_at = text, now
            if timeout_s and now - started > timeout_s:
                raise StageError(
                    "provision",
                    f"job {job_id} still queued after {format_duration(timeout_s)} ({text})",
                )
            time.sleep(delay)
            delay = min(delay * 1.5, 3.0)

    def connect(self, record: SessionRecord, progress: Progress) -> Link:
        # lazy: docs/architecture.md#imports-kept-inside-functions
        from ...transport.tunnel import Tunnel

        res = record.resource
        job_id, paths = res.get("job_id"), _paths(res)
        if not job_id or paths is None:
            raise StageError("connect", "no Slurm job was recorded for this session")
        shell = self.shell(record.spec.extra.get("host"))
        progress.step(f"waiting for the session runtime in job {job_id}")
        host_keys = self._wait_ready(
            shell, job_id, paths, float(record.spec.extra.get("start_timeout", START_TIMEOUT))
        )
        files = shell.run(
            f"cat {q(paths.state_dir)}/kernel.json; echo {SEP}; cat {q(paths.state_dir)}/runtime.json"
        )
        kernel_text, _, runtime_text = files.out.partition(SEP)
        try:
            info, runtime = json.loads(kernel_text), json.loads(runtime_text)
        except ValueError:
            raise StageError(
                "connect",
                f"cannot read the runtime's kernel.json in {paths.state_dir}: {files.text()}",
            ) from None
        if res.get("container") == "charliecloud" and str(info.get("ip", "")).startswith(
            charliecloud.SESSION_MOUNT + "/"
        ):  # the kernel's sockets as the node sees them: the session folder is bound at /mnt/1
            info["ip"] = paths.session_dir + info["ip"][len(charliecloud.SESSION_MOUNT) :]
        node = res.get("node") or states.first_node(
            (
                states.parse_queue(
                    shell.run(f"squeue -h --states=all -j {job_id} -o {q(states.QUEUE_FORMAT)}").out
                )
                or states.QueueState("")
            ).nodes
        )
        address = states.node_address(shell.run(f"scontrol -o show node {q(node)}").out, node)
        self.recorder.save(record.id, node=node, node_address=address, host_keys=host_keys)
        jump, target = self._targets(record, address, host_keys)
        progress.step(f"opening the SSH tunnel to {node} through {jump.label}")
        tunnel = Tunnel(
            target, jump=jump, connect_timeout=60, on_event=lambda text: self._note(record.id, text)
        )
        tunnel.start()
        try:  # the runtime chose free ports on the node's loopback: kernel.json and runtime.json say which
            return TunnelLink(tunnel, info, runtime.get("agent_port"))
        except BaseException:
            tunnel.close()
            raise

    def _wait_ready(
        self, shell: LoginShell, job_id: str, paths: JobPaths, timeout_s: float
    ) -> list[str]:
        """Until the job's output says READY; returns the node's host keys it printed."""
        deadline = time.monotonic() + timeout_s
        # the markers of the start are at the top; the kernel may print much more later on
        command = (
            f"head -c 1000000 {q(paths.output)} 2>/dev/null; echo {SEP}; "
            f"squeue -h --states=all -j {job_id} -o {q(states.QUEUE_FORMAT)}"
        )
        while True:
            log, _, queue_text = shell.run(command).out.partition(SEP)
            keys, ready = [], False
            for line in marker_lines(log):
                parsed = parse_marker(line)
                if parsed is None:
                    continue
                marker, payload = parsed
                if marker is Marker.HOSTKEY and isinstance(payload, str):
                    keys.append(payload)
                elif marker is Marker.FAILED:
                    raise StageError(
                        "connect",
                        f"job {job_id} could not start the session: {failure_detail(payload)}",
                    )
                elif marker is Marker.READY:
                    ready = True
            if ready:
                if not keys:
                    raise StageError(
                        "connect",
                        f"job {job_id} printed no ssh host key of its node (from /etc/ssh)",
                    )
                return keys
            state = states.parse_queue(queue_text)
            if state is None or not (state.running or state.waiting):
                raise StageError(
                    "connect",
                    self._why_it_ended(shell, job_id, paths, state.state if state else "gone"),
                )
            if time.monotonic() > deadline:
                raise StageError(
                    "connect", f"the runtime in job {job_id} was not ready within {timeout_s:.0f}s"
                )
            time.sleep(0.3)

    def _targets(self, record: SessionRecord, address: str, host_keys: list[str]):
        """(the login node as jump host, the job's node with the host keys its job printed)."""
        import paramiko

        # lazy: docs/architecture.md#imports-kept-inside-functions
        from ...transport.sshlogin import (
            HostKeyCheck,
            SshTarget,
            jump_target,
            lookup_name,
            parse_public_key,
        )

        jump = jump_target(record.spec.extra.get("host"))
        port = int(record.spec.extra.get("node_ssh_port", 22))
        pinned = paramiko.HostKeys()
        for line in host_keys:
            key = parse_public_key(line)
            pinned.add(lookup_name(address, port), key.get_name(), key)
        check = HostKeyCheck(
            pinned, f"stop this session (`gpusession stop {record.name}`) and start a new one"
        )
        return jump, SshTarget(
            host=address, port=port, username=jump.username, keys=jump.keys, host_keys=check
        )

    # -- workspaces: listed and removed (`gpusession workspaces`) ------------------------------

    def list_workspaces(self) -> list[Workspace]:
        """The workspace folders in the folders of workspaces this store's sessions used, on
        their login nodes (one command per cluster), with their files' bytes; in use: a live
        session of this store mounts it."""
        places: dict[str, set[str]] = {}
        users: dict[tuple[str, str], list[str]] = {}
        for r in self.recorder.sessions(self.name):
            path = r.resource.get("workspace_dir")
            if r.spec.extra.get("host") and path:
                places.setdefault(r.spec.extra.get("host"), set()).add(path.rsplit("/", 1)[0])
                if r.state.active:
                    users.setdefault((r.spec.extra.get("host"), path), []).append(r.id)
        found: list[Workspace] = []
        reached = 0
        for host, folders in sorted(places.items()):
            # per workspace folder: its path and its files' bytes, each line marked (a login's
            # startup files may print)
            script = " ".join(
                f'for d in {q(folder)}/*/; do [ -d "$d" ] || continue; '
                f"printf '{SEP}\\t%s\\t' \"${{d%/}}\"; "
                f"find \"$d\" -type f -printf '%s\\n' | awk '{{s+=$1}} END {{print s+0}}'; done;"
                for folder in sorted(folders)
            )
            try:
                listed = self.shell(host).run(script)
            except BackendUnavailable as exc:
                log.info("workspaces: skipping %s: %s", host, exc)
                continue
            reached += 1
            for line in listed.out.splitlines():
                mark, _, rest = line.partition("\t")
                path, _, size = rest.partition("\t")
                if mark != SEP or not path:
                    continue
                found.append(
                    Workspace(
                        self.name,
                        path.rsplit("/", 1)[-1],
                        f"{path} on {host}",
                        int(size) if size.strip().isdigit() else None,
                        in_use_by=users.get((host, path), []),
                        details={"host": host, "path": path},
                    )
                )
        if places and not reached:
            raise BackendUnavailable(f"no Slurm login node answers ({', '.join(sorted(places))})")
        return found

    def remove_workspace(self, workspace: Workspace) -> None:
        path = workspace.details["path"]
        removed = self.shell(workspace.details["host"]).run(f"rm -rf -- {q(path)}")
        if not removed.ok:
            raise StageError(
                "workspace",
                f"cannot remove workspace {workspace.name} at {path}: {removed.text()}",
            )

    # -- moving a workspace (`%gpu switch` to or from another backend) ------------------------

    def export_workspace(self, record: SessionRecord, progress: Progress) -> WorkspaceExport:
        """The workspace folder read by `tar` on the login node, streamed over the login's SSH
        connection (never copied on either side); its size (its files' bytes) said first."""
        shell = self.shell(record.spec.extra.get("host"))
        name = record.resource.get("workspace") or workspace_name(record)
        path = record.resource.get("workspace_dir") or (
            f"{_workspaces_folder(shell, self.job_settings(record.spec), shell.base_dir())}/{name}"
        )
        # its files' bytes, as the local backend counts them
        sized = shell.run(
            f"cd {q(path)} && find . -type f -printf '%s\\n' | awk '{{s+=$1}} END {{print s+0}}'"
        )
        if not sized.ok:
            raise StageError(
                "move",
                f"cannot read workspace {name} at {path} on {record.spec.extra.get('host')}: {sized.text()}",
            )
        bytes_text = (sized.out.strip().splitlines() or [""])[-1]  # the last: startup files print
        size = int(bytes_text) if bytes_text.isdigit() else None

        def done(result) -> None:
            if result.rc == 1:  # GNU tar: a file changed while it was read (the kernel wrote)
                progress.step(f"changed while read, moved as read: {result.text()}")
            elif not result.ok:
                raise StageError(
                    "move",
                    f"reading workspace {name} on {record.spec.extra.get('host')} failed: {result.text()}",
                )

        # the folder's entries as `workspace/...` (symbolic links' targets left as they are)
        command = f"tar -C {q(path)} -cf - --transform 's,^\\.,workspace,S' ."
        chunks = shell.output_chunks(command, done)
        return WorkspaceExport(size, chunks, chunks.close)

    def import_workspace(self, record: SessionRecord, chunks, progress: Progress) -> None:
        """Unpacked by `tar` on the login node into a folder beside the workspace's (private: the
        login user owns every file, modes within 0700), then put in its place once the stream
        arrived whole; an older copy of the workspace there is replaced."""
        import uuid

        shell = self.shell(record.spec.extra.get("host"))
        name = workspace_name(record)
        folder = _workspaces_folder(shell, self.job_settings(record.spec), shell.base_dir())
        path, temp = f"{folder}/{name}", f"{folder}/.{name}.moving-{uuid.uuid4().hex[:8]}"
        unpack = (
            f"umask 077 && mkdir -p {q(folder)} && mkdir {q(temp)} && "
            f"tar -xf - -C {q(temp)} --no-same-owner --no-same-permissions"
        )
        try:
            result = shell.run(unpack, stdin=chunks, timeout=300)
            if not result.ok:
                raise StageError(
                    "move",
                    f"tar on {record.spec.extra.get('host')} could not write workspace {name} into {folder}: "
                    f"{result.text()}",
                )
            placed = shell.run(
                f"mkdir -p {q(temp)}/workspace && "
                f"if [ -e {q(path)} ]; then echo replaced; rm -rf {q(path)}; fi && "
                f"mv {q(temp)}/workspace {q(path)} && chmod 700 {q(path)}"
            )
            if not placed.ok:
                raise StageError(
                    "move", f"cannot put workspace {name} in place at {path}: {placed.text()}"
                )
            if "replaced" in placed.out.split():
                progress.step(f"replaced the older copy of workspace {name} at {path}")
        finally:
            try:
                shell.run(f"rm -rf {q(temp)}")
            except BackendUnavailable as exc:
                progress.step(f"left behind on the cluster: {temp} ({exc})")

    # -- life and teardown ----------------------------------------------------------------

    def is_alive(self, record: SessionRecord) -> bool:
        job_id = record.resource.get("job_id")
        if not job_id or not record.spec.extra.get("host"):
            return False
        try:
            result = self.shell(record.spec.extra.get("host")).run(
                f"squeue -h --states=all -j {job_id} -o {q(states.QUEUE_FORMAT)}"
            )
        except BackendUnavailable:
            return True  # the cluster cannot be asked now: unknown is not gone
        if not result.ok:
            return (
                "Invalid job id" not in result.text()
            )  # the controller forgot it, or does not answer
        state = states.parse_queue(result.out)
        # COMPLETING: the runtime is still writing how it ended; gone once it is done
        return state is not None and (state.running or state.state in states.ENDING)

    def check_alive(self, records: list[SessionRecord]) -> dict[str, bool]:
        """One squeue per login node this process is logged in to already (no new login)."""
        by_host: dict[str, list[SessionRecord]] = {}
        for r in records:
            if r.spec.extra.get("host") and r.resource.get("job_id"):
                by_host.setdefault(r.spec.extra.get("host"), []).append(r)
        found: dict[str, bool] = {}
        for host, group in by_host.items():
            shell = self._shells.get(host)
            if shell is None or not shell.connected:
                continue
            ids = ",".join(str(r.resource["job_id"]) for r in group)
            try:
                result = shell.run(f"squeue -h --states=all -j {ids} -o '%i|%T'", timeout=2)
            except BackendUnavailable:
                continue
            if not result.ok and "Invalid job id" not in result.text():
                continue
            listed = dict(
                line.strip().split("|", 1) for line in result.out.splitlines() if "|" in line
            )
            for r in group:
                state = listed.get(str(r.resource["job_id"]))
                if (
                    state is None
                    or state in states.RUNNING
                    or not (state in states.WAITING or state in states.ENDING)
                ):
                    found[r.id] = state in states.RUNNING
        return found

    def stop_details(self, record: SessionRecord) -> StopDetails | None:
        """Slurm's word (scontrol while it remembers the job, else sacct) on how the job ended,
        combined with what the runtime left (stopped.json, else the markers in the output)."""
        res = record.resource
        job_id, paths = res.get("job_id"), _paths(res)
        if not job_id or paths is None or not record.spec.extra.get("host"):
            return None
        command = (
            f"scontrol -o show job {job_id} 2>/dev/null; echo {SEP}; "
            f"sacct -n -P -X -o {states.SACCT_FIELDS} -j {job_id} 2>/dev/null; echo {SEP}; "
            f"cat {q(paths.state_dir)}/stopped.json 2>/dev/null; echo {SEP}; tail -c 200000 {q(paths.output)} 2>/dev/null"
        )
        try:
            parts = self.shell(record.spec.extra.get("host")).run(command).out.split(SEP)
        except BackendUnavailable:
            return None
        parts += [""] * (4 - len(parts))
        job = states.parse_scontrol_job(parts[0]) or states.parse_sacct(parts[1])
        logged = stop_details_from_log(parts[3]) or StopDetails()
        try:
            saved = StopDetails.from_dict(json.loads(parts[2]))
        except ValueError:
            saved = StopDetails()
        runtime = StopDetails(
            reason=saved.reason or logged.reason,
            at=saved.at,
            summary=saved.summary or logged.summary,
        )
        return states.combine(job, runtime)

    def _why_it_ended(self, shell: LoginShell, job_id: str, paths: JobPaths, state: str) -> str:
        """A job that ended during the start: what its runtime said (a FAILED marker), else
        Slurm's state and reason with the last lines of its output."""
        result = shell.run(
            f"scontrol -o show job {job_id} 2>/dev/null; echo {SEP}; "
            f"sacct -n -P -X -o {states.SACCT_FIELDS} -j {job_id} 2>/dev/null; echo {SEP}; "
            f"tail -c 20000 {q(paths.output)} 2>/dev/null"
        )
        parts = result.out.split(SEP) + ["", ""]
        end = states.parse_scontrol_job(parts[0]) or states.parse_sacct(parts[1])
        for line in marker_lines(parts[2]):
            parsed = parse_marker(line)
            if parsed is not None and parsed[0] is Marker.FAILED:
                return f"job {job_id} could not start the session: {failure_detail(parsed[1])}"
        what = f"{end.state}" + (f" ({end.reason})" if end.reason else "") if end else state
        tail = log_tail(parts[2], 3) if parts[2].strip() else ""
        return f"job {job_id} ended during the start: {what}" + (
            f"; its output: {tail}" if tail else ""
        )

    def stop(self, record: SessionRecord) -> None:
        res = record.resource
        if not record.spec.extra.get("host") or not (res.get("job_id") or res.get("submitting")):
            return  # nothing was submitted
        shell = self.shell(record.spec.extra.get("host"))
        jobs = (
            [res["job_id"]]
            if res.get("job_id")
            else [j["id"] for j in self._our_jobs(shell) if j["session"] == record.id]
        )
        self._cancel(shell, jobs)

    def _cancel(self, shell: LoginShell, jobs: list[str]) -> None:
        """scancel, then wait until the jobs have freed their allocation (COMPLETING ends when
        their processes are gone, KillWait at the latest). Raise when one still runs or waits;
        one still completing at the deadline is Slurm's to finish."""
        if not jobs:
            return
        shell.run("scancel " + " ".join(jobs))
        deadline = time.monotonic() + STOP_WAIT_S
        command = "; ".join(
            f"squeue -h --states=all -j {j} -o {q(states.QUEUE_FORMAT)} 2>/dev/null" for j in jobs
        )
        while True:
            lines = [line for line in shell.run(command).out.splitlines() if line.strip()]
            left = [s for s in map(states.parse_queue, lines) if s is not None and not s.ended]
            if not left:
                return
            if time.monotonic() > deadline:
                held = [s for s in left if s.running or s.waiting]
                if held:
                    raise StageError(
                        "stop",
                        f"Slurm job(s) {', '.join(jobs)} still {held[0].state} "
                        f"{STOP_WAIT_S:.0f}s after scancel",
                    )
                return
            time.sleep(0.5)

    # -- gc ---------------------------------------------------------------------------------

    def _our_jobs(self, shell: LoginShell) -> list[dict]:
        """This store's jobs of the login user that Slurm still lists."""
        result = shell.run("squeue -h -u \"$(id -un)\" -o '%i|%j|%T|%N|%k'")
        if not result.ok:
            raise BackendUnavailable(f"squeue failed on {shell.url}: {result.text()}")
        found = []
        for line in result.out.splitlines():
            parts = line.strip().split("|", 4)
            if len(parts) == 5 and (session := comment_session(parts[4], self.recorder.store_id)):
                found.append(
                    {
                        "id": parts[0],
                        "name": parts[1],
                        "state": parts[2],
                        "nodes": parts[3],
                        "session": session,
                    }
                )
        return found

    def list_resources(self) -> list[RemoteResource]:
        """Our jobs on every login node this store's sessions used."""
        hosts = sorted(
            {
                r.spec.extra.get("host")
                for r in self.recorder.sessions(self.name)
                if r.spec.extra.get("host")
            }
        )
        found: list[RemoteResource] = []
        reached = 0
        for host in hosts:
            try:
                jobs = self._our_jobs(self.shell(host))
            except BackendUnavailable:
                continue
            reached += 1
            for job in jobs:
                where = f" on {job['nodes']}" if job["nodes"] else ""
                found.append(
                    RemoteResource(
                        backend=self.name,
                        session_id=job["session"],
                        resource_id=job["id"],
                        description=f"Slurm job {job['id']} ({job['name']}, {job['state']}{where}) at {host}",
                        running=job["state"] in states.RUNNING or job["state"] in states.WAITING,
                        details={"host": host},
                    )
                )
        if hosts and not reached:
            raise BackendUnavailable(f"no Slurm login node answers ({', '.join(hosts)})")
        return found

    def remove_resource(self, resource: RemoteResource) -> None:
        shell = self.shell(resource.details["host"])
        if any(
            j["id"] == resource.resource_id and j["session"] == resource.session_id
            for j in self._our_jobs(shell)
        ):
            self._cancel(shell, [resource.resource_id])


def _workspaces_folder(shell: LoginShell, settings, base: str) -> str:
    """The cluster folder that holds the workspaces: --workspace-dir, else ~/.gpusession/workspaces."""
    folder = settings.workspace_dir or f"{base}/workspaces"
    if folder.startswith("~/"):
        folder = f"{shell.home()}/{folder[2:]}"
    return folder.rstrip("/")


def _paths(res: dict) -> JobPaths | None:
    folder = res.get("session_dir")
    return JobPaths(session_dir=folder, runtime_dir="") if folder else None


def _queue_words(state: states.QueueState, position: int | None) -> str:
    """'PENDING (Resources), position 1 in the queue, estimated start 2026-11-30T21:50:03'."""
    text = state.state + (f" ({state.reason})" if state.reason else "")
    if position is not None:
        text += f", position {position} in the queue"
    if state.start:
        text += f", estimated start {state.start}"
    return text
