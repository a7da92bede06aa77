"""`local`: the session kernel is a separate process on this machine.

The embedded default when no Docker engine answers. Its remote side is the same agent runtime a
container runs (`python -m gpusession.agent run`), started in its own process session so it
outlives the notebook kernel that started it, exactly like a container would. The label is the
environment variable GPUSESSION_SESSION_ID in that process, which `list_resources` reads from
/proc.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from ..configuration.agentargs import AgentArgs, flag_of, workspace_name
from ..configuration.cost import BILLED_FROM
from ..configuration.settings import private_socket_dir
from ..core import procs
from ..core.errors import StageError
from ..core.models import KernelEndpoint, SessionRecord
from ..core.progress import Progress
from ..core.protocol import ENV_SESSION_ID, StopDetails
from .base import (
    Backend,
    Link,
    Place,
    RemoteResource,
    Workspace,
    WorkspaceExport,
    gpu_words,
    log_tail,
    run_probe,
)


class LocalLink(Link):
    def __init__(self, endpoint: KernelEndpoint, pid: int):
        self.endpoint = endpoint
        self.pid = pid

    def close(self) -> None:
        pass

    def healthy(self) -> bool:
        return _pid_alive(self.pid)


def _pid_alive(pid: int | None) -> bool:
    return bool(pid) and procs.alive(pid)  # a zombie is dead for our purposes


def _process_label(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = f.read().split(b"\0")
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read()
    except OSError:
        return None
    if b"gpusession.agent" not in cmdline:
        return None
    prefix = ENV_SESSION_ID.encode() + b"="
    for item in env:
        if item.startswith(prefix):
            return item[len(prefix) :].decode()
    return None


class LocalBackend(Backend):
    name = "local"
    keeps_workspaces = True  # a folder per workspace
    agent_beside_us = True
    default_rank = 90  # the default when no engine answers: it needs nothing but this Python
    order = 10

    @classmethod
    def available(cls, timeout: float = 2.0) -> bool:
        """Always: it needs nothing but this Python."""
        return True

    @classmethod
    def discover(cls, timeout: float = 4.0) -> list[Place]:
        """This machine's NVIDIA GPUs, as nvidia-smi lists them."""
        if shutil.which("nvidia-smi") is None:
            return [Place("this machine", "this machine", "none", cls.name, False, "no nvidia-smi")]
        rc, out = run_probe(["nvidia-smi", "-L"], timeout)
        gpus = gpu_words(out) if rc == 0 else "none"
        note = "" if rc == 0 else f"nvidia-smi failed: {out[:100]}"
        return [Place("this machine", "this machine", gpus, cls.name, gpus != "none", note)]

    @classmethod
    def workspace_where(cls, place: str) -> str:
        return "this machine's folder"

    def state_dir(self, record: SessionRecord) -> Path:
        return self.config.data_path / "sessions" / record.id

    def workspace_dir(self, name: str) -> Path:
        return self.config.data_path / "workspaces" / name

    def provision(self, record: SessionRecord, progress: Progress) -> None:
        state_dir = self.state_dir(record)
        _private_dirs(state_dir)
        workspace = self.workspace_dir(workspace_name(record))  # the kernel's working folder, kept
        if record.spec.extra.get("resume") and not workspace.is_dir():
            raise StageError(
                "provision",
                f"no workspace {workspace.name} to resume (`gpusession workspaces` lists them)",
            )
        _private_dirs(workspace)
        sockets = private_socket_dir()
        self.recorder.save(record.id, sockets=sockets)
        cmd = [
            sys.executable,
            "-m",
            "gpusession.agent",
            "run",
            *AgentArgs.for_record(
                record,
                session_id=record.id,
                state_dir=str(state_dir),
                kernel_ip=os.path.join(
                    sockets, "k"
                ),  # unix sockets in a 0700 folder: no other user reaches the kernel
                cwd=str(workspace),
                workspace=str(workspace),
            ).argv(),
        ]
        env = dict(os.environ, **{ENV_SESSION_ID: record.id})
        env.pop("JPY_PARENT_PID", None)
        progress.step("starting kernel process")
        log = os.fdopen(
            os.open(state_dir / "runtime.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600), "ab"
        )
        try:
            # umask 077: what the runtime and its kernel write (checkpoints, the user's files) is the user's alone
            proc = subprocess.Popen(
                cmd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                umask=0o077,
            )
        finally:
            log.close()
        self.recorder.save(
            record.id,
            pid=proc.pid,
            state_dir=str(state_dir),
            workspace=workspace.name,
            **{BILLED_FROM: time.time()},  # billed from the kernel process's start
        )
        # reap it if we outlive it, so it never lingers as a zombie of ours
        import threading

        threading.Thread(target=proc.wait, daemon=True).start()

    def connect(self, record: SessionRecord, progress: Progress) -> Link:
        state_dir = Path(record.resource["state_dir"])
        pid = record.resource.get("pid")
        deadline = time.monotonic() + 60
        progress.step("waiting for the kernel")
        while True:
            runtime = _read_json(state_dir / "runtime.json")
            if runtime.get("ready"):
                break
            if not _pid_alive(pid):
                raise StageError(
                    "connect",
                    f"kernel process exited during start: {_tail(state_dir / 'runtime.log')}",
                )
            if time.monotonic() > deadline:
                raise StageError("connect", "kernel did not become ready within 60s")
            time.sleep(0.05)
        info = _read_json(state_dir / "kernel.json")
        agent_port = runtime.get("agent_port")
        agent_url = f"http://127.0.0.1:{agent_port}" if agent_port else None
        return LocalLink(KernelEndpoint(connection_info=info, agent_url=agent_url), pid)

    def is_alive(self, record: SessionRecord) -> bool:
        pid = record.resource.get("pid")
        return _pid_alive(pid) and _process_label(pid) == record.id

    def check_alive(self, records: list[SessionRecord]) -> dict[str, bool]:
        """/proc answers, in microseconds; only for sessions started on this machine (a store
        shared between machines holds others)."""
        here = socket.gethostname()
        return {
            r.id: self.is_alive(r)
            for r in records
            if r.owner.partition(":")[0].rpartition("@")[2] == here
        }

    def stop_details(self, record: SessionRecord) -> StopDetails | None:
        """What the runtime left at its end: the stopped.json in its state folder."""
        state_dir = record.resource.get("state_dir")
        saved = _read_json(Path(state_dir) / "stopped.json") if state_dir else {}
        return StopDetails.from_dict(saved) if saved else None

    def stop(self, record: SessionRecord) -> None:
        """By its saved pid, and by label: a starter that died after spawning the runtime and
        before saving its pid left a process only the label finds."""
        pid = record.resource.get("pid")
        if pid and _process_label(pid) == record.id:
            _terminate(pid)
        for found in self.list_resources():
            if found.session_id == record.id:
                self.remove_resource(found)
        if record.resource.get("sockets") and not _pid_alive(pid):
            import shutil

            shutil.rmtree(record.resource["sockets"], ignore_errors=True)

    def list_resources(self) -> list[RemoteResource]:
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            pid = int(entry)
            label = _process_label(pid)
            # only this store's sessions: another GPUSESSION_HOME (another user, a parallel test
            # run) has its own store, and gc here cannot know its records
            if (
                label
                and _pid_alive(pid)
                and _under(_state_dir_of(pid), self.config.data_path / "sessions")
            ):
                found.append(
                    RemoteResource(
                        backend=self.name,
                        session_id=label,
                        resource_id=str(pid),
                        description=f"local kernel process {pid}",
                        running=True,
                    )
                )
        return found

    def remove_resource(self, resource: RemoteResource) -> None:
        pid = int(resource.resource_id)
        if _process_label(pid) == resource.session_id:
            _terminate(pid)

    def list_workspaces(self) -> list[Workspace]:
        """Folders under the data folder's workspaces/; in use: a live runtime's --workspace."""
        root = self.config.data_path / "workspaces"
        if not root.is_dir():
            return []
        using: dict[str, list[str]] = {}
        for resource in self.list_resources():
            folder = _arg_of(int(resource.resource_id), "workspace")
            if folder:
                using.setdefault(Path(folder).name, []).append(resource.session_id)
        return [
            Workspace(self.name, d.name, str(d), folder_size(d), in_use_by=using.get(d.name, []))
            for d in sorted(root.iterdir())
            if d.is_dir()
        ]

    def remove_workspace(self, workspace: Workspace) -> None:
        import shutil

        shutil.rmtree(self.workspace_dir(workspace.name))

    def export_workspace(self, record: SessionRecord, progress: Progress) -> WorkspaceExport:
        # lazy: docs/architecture.md#imports-kept-inside-functions
        from ..transport.tarsafe import folder_chunks

        folder = self.workspace_dir(record.resource.get("workspace") or workspace_name(record))
        return WorkspaceExport(folder_size(folder), folder_chunks(str(folder), "workspace"))

    def import_workspace(self, record: SessionRecord, chunks, progress: Progress) -> None:
        """Unpacked beside the workspace's folder (by tarsafe's rules), then put in its place."""
        import shutil
        import tarfile
        import uuid

        # lazy: docs/architecture.md#imports-kept-inside-functions
        from ..transport.tarsafe import ChunkReader, Extraction

        folder = self.workspace_dir(workspace_name(record))
        _private_dirs(folder.parent)
        temp = folder.parent / f".{folder.name}.moving-{uuid.uuid4().hex[:8]}"
        extraction = Extraction(str(temp), links=True)
        try:
            with tarfile.open(fileobj=ChunkReader(chunks), mode="r|") as tar:
                extraction.run(tar)
            extraction.commit()
            if extraction.refused:
                progress.step(f"not written: {'; '.join(extraction.refused[:5])}")
            moved = temp / "workspace"
            moved.mkdir(mode=0o700, exist_ok=True)
            if folder.exists():
                shutil.rmtree(folder)  # an older copy of this workspace: the moved one replaces it
            moved.rename(folder)
        finally:
            extraction.discard()
            shutil.rmtree(temp, ignore_errors=True)


def _private_dirs(folder: Path) -> None:
    """`folder` and its parents up to the data folder, made 0700 where new."""
    for parent in reversed([folder, *folder.parents]):
        if not parent.is_dir():
            parent.mkdir(mode=0o700, exist_ok=True)


def folder_size(path: Path) -> int:
    """Bytes of the files under `path` (what `du` counts, roughly: file sizes)."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


def _state_dir_of(pid: int) -> str | None:
    """The --state-dir a runtime process was started with."""
    return _arg_of(pid, "state_dir")


def _arg_of(pid: int, field: str) -> str | None:
    """The value of AgentArgs' `field` on a runtime process's command line."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().decode(errors="replace").split("\0")
    except OSError:
        return None
    return next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a == flag_of(field)), None)


def _under(path: str | None, folder: Path) -> bool:
    if not path:
        return False
    try:
        return Path(path).resolve().is_relative_to(folder.resolve())
    except OSError:
        return False


def _terminate(pid: int, timeout: float = 10.0) -> None:
    """SIGTERM the runtime (it shuts its kernel down), then SIGKILL its whole group."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and _pid_alive(pid):
        time.sleep(0.05)
    if _pid_alive(pid):
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _read_json(path: Path) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}


def _tail(path: Path, lines: int = 5) -> str:
    try:
        return log_tail(Path(path).read_text(errors="replace"), lines)
    except OSError:
        return "(no log)"
