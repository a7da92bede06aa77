"""Commands in a session's pod over the API server's exec stream (`pods/exec`): the probe of the
image's Python, the runtime bundle's copy (a tar on stdin, unpacked by the image's own python3),
and reading the runtime's files (kernel.json, stopped.json).

The exec stream (channel protocol v4) cannot say "end of input", so what goes to stdin is
preceded by its length on the command line and the reader takes exactly that many bytes. The
bytes go as binary websocket frames (the client's `binary=True`, checked with kubernetes 34.1.0):
no base64."""

from __future__ import annotations

import time
from typing import BinaryIO, Callable, Iterator

from ...core.errors import StageError
from .apiserver import Cluster, answering, api_words, sdk
from .pods import CONTAINER

CHUNK = 256 * 1024  # bytes per stdin frame
EXEC_TIMEOUT = 120.0

# The head of every copy's script: the archives' sizes, `take` (stdin, counted) and `leave`,
# which ends the script with the rest of stdin read first. A command that ends with its input
# unread is not an exec's end: the node holds the stream open until the client gives up
# (EXEC_TIMEOUT): a start whose GUARD refused stood two minutes at "its container is being
# created". Python 3.9 syntax.
HEAD = """
import io, os, sys, tarfile
args = sys.argv[1:]
left = sum(map(int, args[1::2]))
def take(n):
    global left
    chunk = sys.stdin.buffer.read(n)
    left -= len(chunk)
    return chunk
def leave(code):
    while left > 0 and take(min(left, 1 << 20)):
        pass
    sys.exit(code)
"""

# Unpack exactly N bytes of a tar (gzip'd or not) from stdin into a folder, each in turn
UNPACK = """
for dest, size in zip(args[::2], map(int, args[1::2])):
    data = bytearray()
    while len(data) < size:
        chunk = take(min(size - len(data), 1 << 20))
        if not chunk:
            sys.exit("the archive for %s arrived short: %d of %d bytes" % (dest, len(data), size))
        data += chunk
    try:
        os.makedirs(dest, exist_ok=True)
        with tarfile.open(fileobj=io.BytesIO(bytes(data))) as archive:
            safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
            archive.extractall(dest, **safe)
    except Exception as exc:
        print("unpacking into %s failed: %s" % (dest, exc), flush=True)
        leave(1)
    print("unpacked %d bytes into %s" % (size, dest), flush=True)  # before a wait that may be cut
"""


# Before UNPACK, where the Python is taken from an earlier pod of the image's name (a tag may
# have moved since): exit 3, unpacking nothing (its input read and dropped: HEAD's leave),
# when this one is not what that probe found
GUARD = """
import importlib.util
have = {{"version": list(sys.version_info[:3]), "uid": os.getuid(),
        "ipykernel": importlib.util.find_spec("ipykernel") is not None,
        "pip": importlib.util.find_spec("pip") is not None}}
if have != {want!r}:
    print("not the Python probed in this image's last pod: %r" % (have,), flush=True)
    leave(3)
"""
NOT_PROBED = 3  # GUARD's exit status

# After UNPACK, where the copy lets the pod go on to its runtime: wait for the runtime's READY
# file (a look every 0.005 s by the Python that is running already) and say it, one line: a
# start learns READY in this exec, which answers as soon as the container runs, where the pod's
# log is served only once the kubelet has seen the container run (its next relist, each second)
WAIT_READY = """
import time
ready, until = {path!r}, time.monotonic() + {wait_s!r}
while not os.path.exists(ready) and time.monotonic() < until:
    time.sleep(0.005)
try:
    with open(ready) as f:
        print(READY_SAID + f.read().strip(), flush=True)
except OSError:
    pass
"""
READY_SAID = "ready "


def _open(cluster: Cluster, api, pod: str, command: list[str], stdin: bool, what: str, **more):
    """The exec stream of `command` in the pod's container; StageError when it is refused.
    `capture_all=False`: the client keeps no copy of everything read (a long stream's), a
    websocket option the API method itself would refuse as an argument."""
    kubernetes = sdk()
    streamer = kubernetes.stream.stream
    if not more.pop("capture_all", True):
        # lazy: docs/architecture.md#imports-kept-inside-functions
        import functools

        from kubernetes.stream import ws_client

        call = functools.partial(ws_client.websocket_call, capture_all=False)
        streamer = functools.partial(streamer.func, call, None)
    with answering(cluster, f"while {what}"):
        try:
            return streamer(
                api.connect_get_namespaced_pod_exec,
                pod,
                cluster.namespace,
                container=CONTAINER,
                command=command,
                stdin=stdin,
                stdout=True,
                stderr=True,
                tty=False,
                binary=True,
                _preload_content=False,
                **more,
            )
        except kubernetes.client.ApiException as exc:
            raise StageError("provision", f"{what}: {api_words(exc)}") from None


def run(
    cluster: Cluster,
    pod: str,
    command: list[str],
    *,
    stdin: bytes | BinaryIO | None = None,
    timeout: float = EXEC_TIMEOUT,
    what: str,
) -> tuple[int | None, str]:
    """Run `command` in the pod's container: (its exit status, None when it did not end within
    `timeout`; its stdout and stderr). `stdin`: bytes, or a file read to its end. BackendUnavailable
    when the API does not answer; StageError when the exec is refused (RBAC: pods/exec)."""
    api = cluster.stream_api()
    try:
        ws = _open(cluster, api, pod, command, stdin is not None, what)
        try:
            return _pump(ws, stdin, timeout)
        finally:
            ws.close()
    finally:
        api.api_client.close()


def stream_out(
    cluster: Cluster, pod: str, command: list[str], *, what: str
) -> tuple[Iterator[bytes], Callable[[], None]]:
    """`command`'s stdout as it comes, frame by frame (none kept here), and what closes the
    stream; at its end, StageError when the command failed, with its stderr's end."""
    api = cluster.stream_api()
    ws = _open(cluster, api, pod, command, False, what, capture_all=False)

    def close() -> None:
        ws.close()
        api.api_client.close()

    def chunks() -> Iterator[bytes]:
        said = b""
        try:
            while ws.is_open():
                ws.update(timeout=1.0)
                out = ws._channels.pop(1, None)  # stdout; the client keeps frames per channel
                said = (said + (ws._channels.pop(2, None) or b""))[-2000:]  # stderr
                if out:
                    yield bytes(out)
            out = ws._channels.pop(1, None)
            if out:
                yield bytes(out)
            try:
                status = ws.returncode
            except (TypeError, ValueError, KeyError, IndexError):  # no exit code said
                status = 1
        finally:
            close()
        if status != 0:
            text = " | ".join(said.decode(errors="replace").strip().splitlines()[-3:])
            raise StageError("move", f"{what} failed in pod {pod} (exit {status}): {text}")

    return chunks(), close


def _pump(ws, stdin: bytes | BinaryIO | None, timeout: float) -> tuple[int | None, str]:
    if isinstance(stdin, bytes):
        for at in range(0, len(stdin), CHUNK):
            ws.write_stdin(stdin[at : at + CHUNK])
    elif stdin is not None:
        while chunk := stdin.read(CHUNK):
            ws.write_stdin(chunk)
    deadline = time.monotonic() + timeout
    while ws.is_open() and time.monotonic() < deadline:
        ws.update(timeout=min(1.0, max(0.0, deadline - time.monotonic())))
    if ws.is_open():
        return None, _output(ws)
    try:
        status = ws.returncode  # read first: read_all() empties every channel
    except (TypeError, ValueError, KeyError, IndexError):  # an error channel without an exit code
        status = 1
    return status, _output(ws)


def _output(ws) -> str:
    text = ws.read_all()
    return text.decode(errors="replace") if isinstance(text, bytes) else str(text)


def send_archives(
    cluster: Cluster,
    pod: str,
    python: str,
    archives: list[tuple[bytes, str]],
    what: str,
    expect: dict | None = None,
    ready: tuple[str, float] | None = None,
) -> str | None:
    """Unpack each tar of `archives` (data, folder) into its folder of the pod, in order, by
    the image's own `python`: one exec for them all (each exec starts that Python again).
    `expect`: what that Python must be (GUARD), else nothing is unpacked (StageError).
    `ready`: (the runtime's READY file, seconds): then wait for it (WAIT_READY) and return its
    text; None where it did not come in that time (the pod's log says why)."""
    argv = [python, "-c", copy_script(expect, ready)]
    for data, folder in archives:
        argv += [folder, str(len(data))]
    status, output = run(
        cluster, pod, argv, stdin=b"".join(data for data, _ in archives), what=f"copying {what}"
    )
    unpacked = sum(line.startswith("unpacked ") for line in output.splitlines())
    if status != 0 and unpacked < len(archives):
        said = " | ".join(output.strip().splitlines()[-3:]) or "no output"
        raise StageError("runtime", f"copying {what} into pod {pod} failed (exit {status}): {said}")
    # every archive said unpacked: the copy is done, whatever became of the exec's status (the
    # last archive lets the container go on; a container that then ends at once, e.g. on a
    # workspace it cannot write, cut the stream before its exit code came: a loaded run said
    # "copying failed" where the pod's own reason was the one to show, and the start's next
    # stage shows it)
    said_ready = [x for x in output.splitlines() if x.startswith(READY_SAID)]
    return said_ready[-1][len(READY_SAID) :] if said_ready else None


def copy_script(expect: dict | None = None, ready: tuple[str, float] | None = None) -> str:
    """What send_archives runs with the image's Python (its arguments: folder, size, ...)."""
    script = HEAD + (GUARD.format(want=expect) if expect is not None else "") + UNPACK
    if ready is not None:
        script += "READY_SAID = %r\n" % READY_SAID + WAIT_READY.format(
            path=ready[0], wait_s=ready[1]
        )
    return script


def read_files(cluster: Cluster, pod: str, paths: list[str], what: str) -> list[str | None]:
    """The text of each file in the pod's container (None for one that is not there), by one
    exec of `sh`."""
    separator = "@@gpusession-file@@"
    script = "; ".join(
        f'if [ -f "{p}" ]; then cat "{p}"; else printf %s @@missing@@; fi; echo "{separator}"'
        for p in paths
    )
    status, output = run(cluster, pod, ["/bin/sh", "-c", script], timeout=30.0, what=what)
    if status is None:
        raise StageError("connect", f"{what}: the pod did not answer within 30s")
    parts = output.split(separator + "\n")
    return [
        None if i >= len(parts) - 1 or parts[i] == "@@missing@@" else parts[i]
        for i in range(len(paths))
    ]
