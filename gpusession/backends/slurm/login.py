"""Commands on a cluster's login node over SSH (paramiko), the way `ssh login.cluster CMD` would
run them: the user's ~/.ssh/config, keys and known_hosts (an unknown or changed host key is
refused), one connection kept per login node and opened again when it dropped. And the session
runtime, brought to the cluster's shared storage once per version of gpusession."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import io
import re
import shlex
import socket
import tarfile
import threading
from pathlib import Path
from typing import Callable, Iterable, Iterator

from ...core.errors import BackendUnavailable

PACKAGE_DIR = Path(__file__).resolve().parents[2]  # .../gpusession
BASE_DIR = ".gpusession"  # under the login user's home, shared with the compute nodes


@dataclasses.dataclass(frozen=True)
class Result:
    rc: int
    out: str
    err: str

    @property
    def ok(self) -> bool:
        return self.rc == 0

    def text(self) -> str:
        """What the command said, for a message: its stderr, else its stdout, one line."""
        said = (self.err.strip() or self.out.strip()).splitlines()
        return " | ".join(said[-3:]) or f"exit status {self.rc}"


class LoginShell:
    """Run commands on the login node of `url` (ssh://[user@]host[:port])."""

    def __init__(self, url: str):
        self.url = url
        self._transport = None
        self._lock = threading.Lock()
        self._home: str | None = None
        self.target = None  # the SshTarget, once connected (the tunnel jumps through it too)

    def _connect(self):
        # lazy: docs/architecture.md#imports-kept-inside-functions
        from ...transport.sshlogin import TunnelError, jump_target, open_transport, tcp_socket

        with self._lock:
            t = self._transport
            if t is not None and t.is_active():
                return t
            try:
                target = jump_target(self.url)
                sock = tcp_socket(target.host, target.port, timeout=15)
                t = open_transport(sock, target)
            except TunnelError as exc:
                raise BackendUnavailable(f"Slurm login node {self.url}: {exc}") from None
            except Exception as exc:  # noqa: BLE001 - OSError, EOFError, paramiko's SSHException and kin
                raise BackendUnavailable(
                    f"cannot reach the Slurm login node {self.url}: {type(exc).__name__}: {exc}"
                ) from None
            self._transport, self.target = t, target
            return t

    @property
    def connected(self) -> bool:
        """Logged in already (a command costs no new login)."""
        t = self._transport
        return t is not None and t.is_active()

    def run(
        self,
        command: str,
        *,
        stdin: bytes | Iterable[bytes] | None = None,
        timeout: float = 60.0,
        on_out: Callable[[bytes], None] | None = None,
    ) -> Result:
        """Run `command` in the login user's shell; BackendUnavailable when the node cannot be
        reached or does not answer within `timeout` seconds. `on_out` sees its output as it comes;
        `stdin` may be chunks (a stream: an error of their source ends the command and is
        raised as it is, never taken for the login node's)."""
        # lazy: docs/architecture.md#imports-kept-inside-functions
        from ...transport.sshlogin import run_on_channel

        source_failed: list[BaseException] = []
        if stdin is not None and not isinstance(stdin, (bytes, bytearray)):
            stdin = _watched(stdin, source_failed)
        chan = self._channel()
        with self._failures(command, timeout, source_failed):
            rc, out, err = run_on_channel(
                chan, command, stdin=stdin, timeout=timeout, on_out=on_out
            )
        return Result(rc, out.decode(errors="replace"), err.decode(errors="replace"))

    def output_chunks(
        self, command: str, done: Callable[[Result], None], *, timeout: float = 120.0
    ) -> Iterator[bytes]:
        """`command`'s standard output in chunks as it comes (a stream of any size, never held
        whole); at its end `done` gets its exit status and stderr (and may raise). Closing the
        iterator early closes the channel. `timeout`: the longest wait for the next chunk."""
        # lazy: docs/architecture.md#imports-kept-inside-functions
        from ...transport.sshlogin import shutdown_write

        chan = self._channel()
        err = bytearray()
        try:
            with self._failures(command, timeout):
                chan.settimeout(timeout)
                chan.exec_command(command)
                shutdown_write(chan)
            while True:
                with self._failures(command, timeout):
                    data = chan.recv(1 << 20)
                    while chan.recv_stderr_ready():
                        err += chan.recv_stderr(65536)
                if not data:
                    break
                yield data
            with self._failures(command, timeout):
                rc = chan.recv_exit_status()
                while chan.recv_stderr_ready():
                    err += chan.recv_stderr(65536)
        finally:
            chan.close()
        done(Result(rc, "", err.decode(errors="replace")))

    def _channel(self):
        """A new session channel on the login connection (logged in again once if it dropped)."""
        for attempt in (1, 2):
            transport = self._connect()
            try:
                return transport.open_session(timeout=15)
            except Exception as exc:  # noqa: BLE001 - the connection dropped since: once more
                self.close()
                if attempt == 2:
                    raise BackendUnavailable(
                        f"Slurm login node {self.url}: {type(exc).__name__}: {exc}"
                    ) from None
        raise AssertionError("unreachable")

    @contextlib.contextmanager
    def _failures(self, command: str, timeout: float, passed: Iterable[BaseException] = ()):
        """A timeout or a dropped connection, as BackendUnavailable in one line (an exception in
        `passed` goes on as it is)."""
        import paramiko

        try:
            yield
        except BaseException as exc:
            if any(exc is p for p in passed):
                raise
            if not isinstance(exc, (OSError, EOFError, paramiko.SSHException)):
                raise
            if isinstance(exc, (socket.timeout, TimeoutError)):
                raise BackendUnavailable(
                    f"Slurm login node {self.url}: no answer within {timeout:.0f}s to {command[:60]!r}"
                ) from None
            raise BackendUnavailable(
                f"Slurm login node {self.url}: {type(exc).__name__}: {exc}"
            ) from None

    def home(self) -> str:
        """The login user's home directory (the cluster shares it with the nodes)."""
        if self._home is None:
            result = self.run('printf "@@home=%s@@" "$HOME"')  # marked: startup files may print too
            found = re.search(r"@@home=(/[^\n]*?)@@", result.out)
            if not result.ok or found is None:
                raise BackendUnavailable(
                    f"Slurm login node {self.url}: no home directory ({result.text()})"
                )
            self._home = found.group(1)
        return self._home

    def base_dir(self) -> str:
        return f"{self.home()}/{BASE_DIR}"

    def close(self) -> None:
        with self._lock:
            t, self._transport = self._transport, None
        if t is not None:
            t.close()


def _watched(pieces: Iterable[bytes], failed: list[BaseException]) -> Iterator[bytes]:
    """`pieces`, passed on; an exception of theirs is noted in `failed` before it goes on."""
    try:
        yield from pieces
    except BaseException as exc:
        failed.append(exc)
        raise


# -- the runtime on the cluster ------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def runtime_bundle() -> tuple[str, bytes]:
    """(version, tar.gz) of gpusession's Python sources: what `python -m gpusession.agent run` needs
    on a node whose Python has no gpusession (the agent uses the standard library, nvidia-ml-py
    when it is there, and the environment's ipykernel)."""
    files = sorted(
        p
        for p in PACKAGE_DIR.rglob("*.py")
        if "labextension" not in p.relative_to(PACKAGE_DIR).parts and "__pycache__" not in p.parts
    )
    digest = hashlib.sha256()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=6) as tar:
        for path in files:
            name = "gpusession/" + path.relative_to(PACKAGE_DIR).as_posix()
            data = path.read_bytes()
            digest.update(name.encode() + b"\0" + data + b"\0")
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    return digest.hexdigest()[:16], buf.getvalue()


def ensure_runtime(shell: LoginShell) -> str:
    """The folder on the cluster holding this version's runtime (its `gpusession` package),
    uploaded when it is not there yet. Safe when two starts upload at once."""
    version, tarball = runtime_bundle()
    folder = f"{shell.base_dir()}/runtime/{version}"
    q = shlex.quote(folder)
    if shell.run(f"test -f {q}/.complete && touch {q}/.complete").ok:  # touched: in use
        return folder
    # versions unused for longer than any session may run (30 days) go
    prune = f"find {shlex.quote(folder.rsplit('/', 1)[0])} -mindepth 2 -maxdepth 2 -name .complete -mtime +31"
    script = (
        f'set -e; umask 022; tmp={q}.tmp.$$; rm -rf "$tmp"; mkdir -p "$tmp"; tar -xzf - -C "$tmp"; '
        f'touch "$tmp/.complete"; mv -T "$tmp" {q} 2>/dev/null || rm -rf "$tmp"; test -f {q}/.complete; '
        f'{prune} | while read -r mark; do rm -rf "${{mark%/.complete}}"; done'
    )
    result = shell.run(script, stdin=tarball, timeout=120)
    if not result.ok:
        raise BackendUnavailable(
            f"cannot put gpusession's runtime on {shell.url} at {folder}: {result.text()}"
        )
    return folder
