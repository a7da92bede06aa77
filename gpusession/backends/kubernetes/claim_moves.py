"""A workspace's claim read out and filled in over the API server's exec stream, for `%gpu switch`
between Kubernetes and another backend (base.py `export_workspace`, `import_workspace`).

Out: the running session's pod writes a tar of /workspace (entries under `workspace/`, owners and
modes kept) on its stdout, read here frame by frame. In: the claim (made when new) is mounted by a
helper pod of the session's image, labelled with the session (its stop and gc remove it), running
as root so owners are kept; the tar goes to its stdin, preceded by its length (the exec stream
cannot say "end of input"), into a staging folder on the claim first: only a whole tar replaces
what the workspace held, so a cut stream leaves the older copy as it was."""

from __future__ import annotations

import json
import tempfile
from typing import Any, Iterable

from ...configuration.agentargs import WORKSPACE_MOUNT, workspace_name
from ...core.envnames import ENV_RUNTIME_PYTHON
from ...core.errors import StageError
from ...core.models import SessionRecord
from ...core.progress import Progress
from ...transport.bundle import RUNTIME_ROOT, ImagePython
from ..base import WorkspaceExport
from . import podexec, pods
from .apiserver import Cluster
from .runtime_copy import probe_path

HELPER_WAIT_S = 120.0  # the helper pod, until it runs
IMPORT_TIMEOUT_S = 3600.0
STAGE = ".gpusession-incoming"  # on the claim, while a workspace comes in

# Python 3.9 syntax: a tar of the workspace on stdout, its folder first
EXPORT = f"""
import sys, tarfile
with tarfile.open(fileobj=sys.stdout.buffer, mode="w|") as tar:
    tar.add({WORKSPACE_MOUNT!r}, arcname="workspace")
sys.stdout.buffer.flush()
"""

# Exactly N bytes of a tar from stdin into the staging folder of the claim at ROOT (its
# arguments: ROOT N); only once whole, what the workspace held goes and the tar's `workspace/`
# takes its place. Where the claim takes no more (full, read-only), the staging folder goes,
# the claim keeps what it held, and the rest of stdin is read and dropped before the exit
# (podexec.HEAD's `leave`: an exec that ends with its input unread is held open until
# IMPORT_TIMEOUT_S)
IMPORT = (
    podexec.HEAD
    + f"""
import shutil
root, size = args[0], int(args[1])
stage = os.path.join(root, {STAGE!r})
part = os.path.join(stage, "in.tar")
def refused(exc):
    shutil.rmtree(stage, ignore_errors=True)
    leave("the claim did not take the workspace: %s" % exc)
try:
    shutil.rmtree(stage, ignore_errors=True)
    os.makedirs(stage)
    with open(part, "wb") as out:
        while left:
            chunk = take(min(left, 1 << 20))
            if not chunk:
                shutil.rmtree(stage)
                sys.exit("the workspace arrived short: %d of %d bytes" % (size - left, size))
            out.write(chunk)
except OSError as exc:
    refused(exc)
tree = os.path.join(stage, "tree")
try:
    with tarfile.open(part) as tar:
        safe = {{"filter": "tar"}} if hasattr(tarfile, "tar_filter") else {{}}
        tar.extractall(tree, **safe)
except (OSError, tarfile.TarError) as exc:
    refused(exc)
for name in os.listdir(root):
    if name != {STAGE!r}:
        path = os.path.join(root, name)
        shutil.rmtree(path) if os.path.isdir(path) and not os.path.islink(path) else os.remove(path)
came = os.path.join(tree, "workspace")
for name in os.listdir(came) if os.path.isdir(came) else []:
    os.rename(os.path.join(came, name), os.path.join(root, name))
shutil.rmtree(stage)
print("workspace in: %d bytes" % size)
"""
)


def export(cluster: Cluster, record: SessionRecord, progress: Progress) -> WorkspaceExport:
    """The running session's workspace as a tar stream, read by its pod's own Python."""
    pod = record.resource.get("pod")
    if not pod:
        raise StageError("move", f"session {record.name} has no pod to read its workspace from")
    progress.step(f"reading workspace {record.resource.get('workspace')} from pod {pod}")
    script = f'. {RUNTIME_ROOT}/{pods.LAUNCH_ENV}; exec ${ENV_RUNTIME_PYTHON} -c "$0"'
    chunks, close = podexec.stream_out(
        cluster, pod, ["/bin/sh", "-c", script, EXPORT], what="reading the workspace"
    )
    return WorkspaceExport(None, chunks, close)


def _python(image_id: str) -> str:
    """A shell line that runs the image's Python on the script "$0" with "$@": the one an earlier
    session's probe found (not probed here: the helper runs as root, and a probe's answer is
    kept for the image), else the first of the usual ones."""
    found = []
    try:
        found.append(
            ImagePython.from_payload(json.loads(probe_path(image_id).read_text())).start_with
        )
    except (OSError, ValueError, KeyError, TypeError):
        pass
    tried = " ".join(
        [*found, "python3", "/opt/conda/bin/python3", "/usr/local/bin/python3", "python"]
    )
    return (
        f'for p in {tried}; do command -v "${{p%% *}}" >/dev/null 2>&1 && exec $p -c "$0" "$@"; '
        'done; echo "no Python in the image" >&2; exit 127'
    )


def helper_manifest(
    name: str, labels: dict[str, str], image: str, claim: str, placement: dict[str, Any]
) -> dict[str, Any]:
    """A pod of `image` that mounts the claim and waits (as root: owners are kept), no GPU."""
    body = pods.manifest(
        name=name,
        labels=labels,
        annotations={"gpusession.image": image},
        image=image,
        agent_argv=[],
        session_id=labels[pods.LABEL],
        resource=("cpu", 0),
        placement={**placement, "priority_class": "", "service_account": ""},
        claim=claim,
    )
    (container,) = body["spec"]["containers"]
    container["command"] = ["/bin/sh", "-c", "sleep 3600 & wait"]
    container["resources"] = {}
    container["securityContext"] = {"runAsUser": 0, "runAsGroup": 0}
    body["spec"]["volumes"] = [
        v for v in body["spec"]["volumes"] if v["name"] != pods.RUNTIME_VOLUME
    ]
    container["volumeMounts"] = [
        m for m in container["volumeMounts"] if m["name"] != pods.RUNTIME_VOLUME
    ]
    body["spec"]["terminationGracePeriodSeconds"] = 0
    return body


def fill(
    backend, cluster: Cluster, record: SessionRecord, chunks: Iterable[bytes], progress: Progress
) -> None:
    """The tar stream into the session's claim (made when new), through a helper pod."""
    claim = backend.workspace_claim(cluster, record, progress, make=True)
    image = record.spec.extra.get("image") or backend.default_image()
    name = f"{pods.pod_name(record.name, record.id)}-ws"
    placement = backend.placement(record.spec)
    selector = {k: v for k, v in placement["node_selector"].items() if k != pods.PRODUCT_LABEL}
    body = helper_manifest(
        name,
        {pods.LABEL: record.id, pods.STORE_LABEL: backend.recorder.store_id},
        image,
        claim,
        {"node_selector": selector, "tolerations": placement["tolerations"]},
    )
    progress.step(f"helper pod {name} mounts claim {claim}")
    backend._create(cluster, body)
    try:
        _, image_id = backend._wait_running(cluster, name, claim, HELPER_WAIT_S, progress)
        python = _python(image_id)
        with tempfile.TemporaryFile() as spool:  # the stream's length goes first
            size = 0
            for chunk in chunks:
                spool.write(chunk)
                size += len(chunk)
            spool.seek(0)
            progress.step(f"writing workspace {workspace_name(record)} into claim {claim}")
            status, output = podexec.run(
                cluster,
                name,
                ["/bin/sh", "-c", python, IMPORT, WORKSPACE_MOUNT, str(size)],
                stdin=spool,
                timeout=IMPORT_TIMEOUT_S,
                what="writing the workspace",
            )
        if status != 0:
            said = " | ".join(output.strip().splitlines()[-3:]) or "no output"
            raise StageError("move", f"writing the workspace into claim {claim} failed: {said}")
    finally:
        backend._delete(cluster, name)  # and waited for: the claim is free for the session's pod
