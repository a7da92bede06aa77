"""An aws session's workspace read out as a tar stream (`%gpu switch` from aws to docker, local or
slurm), over the instance's own SSH login (the session key, the pinned host key).

The login may run access.sh only (backends/cloudvm/cloudinit.py), as user `gpusession`, who cannot
read the workspace; its `export` command asks the boot script (root, session.sh `export_one`) to
read the workspace out of the running session container through the engine's archive API
(`docker cp CONTAINER:/workspace -`: entries `workspace/...` with their owners and modes, the
format of `WorkspaceExport`), its size first (the stream's bytes, read once to count), then the
stream itself through a FIFO of the login's group. Nothing is written to a disk on either side; a
read that failed on the instance ends the stream with an error, never as a shorter whole.
"""

from __future__ import annotations

import socket
import time
from typing import Iterator

from ...configuration.agentargs import workspace_name
from ...core.errors import StageError
from ...core.models import SessionRecord
from ...core.progress import Progress
from ..base import WorkspaceExport

LOGIN_WAIT_S = 30.0
FIRST_BYTES_S = 300.0  # the size comes after one read of the whole workspace on the instance
CHUNK_WAIT_S = 120.0  # the longest wait for the next chunk of the stream


def _login(record: SessionRecord):
    """A logged-in transport to the session's instance (its sshd, the pinned host key)."""
    import paramiko

    # lazy: docs/architecture.md#imports-kept-inside-functions
    from ...transport.tunnel import TunnelError, open_transport
    from ..cloudvm.link import instance_target

    hint = f"stop this session (`gpusession stop {record.name}`) and start a new one"
    try:
        target = instance_target(record.resource, hint)
        sock = socket.create_connection((target.host, target.port), timeout=LOGIN_WAIT_S)
        return open_transport(sock, target, timeout=LOGIN_WAIT_S)
    except (OSError, EOFError, KeyError, paramiko.SSHException, TunnelError) as exc:
        raise StageError(
            "move", f"cannot log in to the instance of {record.name} to read its workspace: {exc}"
        ) from None


def export_workspace(record: SessionRecord, progress: Progress) -> WorkspaceExport:
    """The workspace of running aws session `record`, as a tar stream read over its SSH login."""
    import paramiko

    name = record.resource.get("workspace") or workspace_name(record)
    transport = _login(record)
    chan = transport.open_session(timeout=15)

    def close() -> None:
        chan.close()
        transport.close()

    try:
        line, rest = _start_export(chan, record, name, progress)
    except (OSError, EOFError, paramiko.SSHException) as exc:
        close()
        raise _export_failed(name, f"{type(exc).__name__}: {exc}") from None
    except BaseException:
        close()
        raise
    size = int(line)
    return WorkspaceExport(size, _export_chunks(chan, name, rest, close), close)


def _export_failed(name: str, why: str) -> StageError:
    return StageError("move", f"reading workspace {name} on its instance failed: {why}")


def _start_export(
    chan, record: SessionRecord, name: str, progress: Progress
) -> tuple[bytes, bytes]:
    """access.sh export on the instance, up to its first line (the stream's size): (that line,
    the bytes of the stream that came with it)."""
    # lazy: docs/architecture.md#imports-kept-inside-functions
    from ...transport.sshlogin import shutdown_write

    chan.settimeout(FIRST_BYTES_S)
    chan.exec_command("export")
    shutdown_write(chan)
    progress.step(f"reading workspace {name} on {record.resource.get('instance_id')}")
    head = bytearray()
    while b"\n" not in head:
        data = chan.recv(65536)
        if not data:
            break
        head += data
    line, sep, rest = bytes(head).partition(b"\n")
    if not sep or not line.strip().isdigit():
        err = _stderr(chan)
        status = chan.recv_exit_status()
        if status == 2:  # an instance whose access.sh has no `export` (an older gpusession)
            raise StageError(
                "move",
                f"the instance of {record.name} was started by an older gpusession that "
                "cannot hand its workspace out; `%gpu stop --save`, then start where you "
                f"want with `--resume {name}` (aws)",
            )
        raise _export_failed(name, err or f"access.sh exited {status}")
    return line, rest


def _export_chunks(chan, name: str, rest: bytes, close) -> Iterator[bytes]:
    """The rest of the stream as it comes; an error when it is cut (the reader must not take a
    cut tar as whole). `close` ends the login once it is read or abandoned."""
    import paramiko

    try:
        if rest:
            yield rest
        chan.settimeout(CHUNK_WAIT_S)
        while True:
            try:
                data = chan.recv(1 << 20)
            except (OSError, EOFError, paramiko.SSHException) as exc:
                raise _export_failed(
                    name, f"the connection dropped ({type(exc).__name__}: {exc})"
                ) from None
            if not data:
                break
            yield data
        status = chan.recv_exit_status()
        if status != 0:  # the tar is cut: the reader must not take it as whole
            raise _export_failed(name, _stderr(chan) or f"access.sh exited {status}")
    finally:
        close()


def _stderr(chan) -> str:
    """What the command said on its standard error (waits briefly for its end)."""
    err = bytearray()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if chan.recv_stderr_ready():
            err += chan.recv_stderr(65536)
        elif chan.exit_status_ready() and not chan.recv_stderr_ready():
            break
        else:
            time.sleep(0.02)
    return err.decode(errors="replace").strip()[-300:]


def import_over(transport, record: SessionRecord, chunks, progress: Progress) -> None:
    """The tar stream `chunks` into the fresh workspace volume of the instance starting for
    `record`, whose boot waits for it (BootPlan.import_files) before its kernel restores: sent on
    access.sh import's standard input, then its hash on import-end, which answers once the boot
    put the files in place (or says why not; a cut stream leaves nothing there)."""
    import hashlib

    import paramiko

    # lazy: docs/architecture.md#imports-kept-inside-functions
    from ...transport.sshlogin import run_on_channel

    name = workspace_name(record)
    digest = hashlib.sha256()

    def hashed():
        for chunk in chunks:
            digest.update(chunk)
            yield chunk

    try:
        try:
            status, _, err = run_on_channel(
                transport.open_session(timeout=15), "import", stdin=hashed(), timeout=CHUNK_WAIT_S
            )
        except BaseException:  # the source failed (or this side): the boot drops what came
            _abandon(transport)
            raise
        if status != 0:
            raise StageError(
                "move",
                f"the new instance did not take workspace {name}'s files: "
                f"{err.decode(errors='replace').strip()[-300:] or f'access.sh exited {status}'}",
            )
        status, _, err = run_on_channel(
            transport.open_session(timeout=15),
            f"import-end {digest.hexdigest()}",
            timeout=FIRST_BYTES_S,
        )
    except (OSError, EOFError, TimeoutError, paramiko.SSHException) as exc:
        raise StageError(
            "move",
            f"sending workspace {name}'s files to the new instance failed "
            f"({type(exc).__name__}: {exc}); nothing of them was kept there",
        ) from None
    if status != 0:
        raise StageError(
            "move",
            f"the new instance did not keep workspace {name}'s files: "
            f"{err.decode(errors='replace').strip()[-300:] or f'access.sh exited {status}'}",
        )
    progress.step(f"workspace {name}'s files are in place on the new instance")


def _abandon(transport) -> None:
    """Tell the boot that the stream it got is not whole (a hash no stream has), so that it
    drops what came at once; best effort: without it the boot waits a minute, then drops it."""
    import paramiko

    # lazy: docs/architecture.md#imports-kept-inside-functions
    from ...transport.sshlogin import run_on_channel

    try:
        run_on_channel(transport.open_session(timeout=5), "import-end 0", timeout=30)
    except (OSError, EOFError, TimeoutError, paramiko.SSHException):
        pass
