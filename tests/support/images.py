"""The foreign images of scripts/ci-images.sh (none has sshd, ipykernel or gpusession), what
their Python is, and two helpers their tests share: a tiny wheel served on this machine's
loopback (for `%pip install`) and a tiny registry (for a real pull with progress).

    from support.images import FOREIGN, NO_PYTHON, foreign_available
"""

from __future__ import annotations

import base64
import dataclasses
import gzip
import hashlib
import http.server
import io
import json
import tarfile
import threading
import zipfile
from pathlib import Path


@dataclasses.dataclass(frozen=True)
class Foreign:
    image: str
    version: str  # what sys.version starts with
    executable: str  # sys.executable in the session
    uid: int


FOREIGN = [
    Foreign("gpusession-ci/py-bookworm", "3.11.", "/usr/bin/python3", 0),
    Foreign("gpusession-ci/py-trixie", "3.13.", "/usr/bin/python3", 0),
    Foreign("gpusession-ci/py-opt", "3.11.", "/opt/conda/bin/python3", 0),
    Foreign("gpusession-ci/py-nonroot", "3.11.", "/usr/bin/python3", 1000),
    Foreign("gpusession-ci/pytorch-standin", "3.11.", "/opt/conda/bin/python3", 0),
]
NO_PYTHON = "gpusession-ci/no-python"
STANDIN = "gpusession-ci/pytorch-standin"  # the default image's shape


def foreign_params(ci_slice: tuple[str, ...] | None = None) -> list:
    """FOREIGN as pytest params; with `ci_slice`, the other images are skipped unless
    GPUSESSION_FOREIGN_MATRIX=full (scripts/foreign-matrix.sh runs every image on every engine)."""
    import os

    import pytest

    full = ci_slice is None or os.environ.get("GPUSESSION_FOREIGN_MATRIX") == "full"
    skip = pytest.mark.skip(reason="not in CI's slice: scripts/foreign-matrix.sh runs every image")
    return [
        pytest.param(
            f, id=f.image.split("/")[-1], marks=() if full or f.image in ci_slice else skip
        )
        for f in FOREIGN
    ]


def foreign_available(client) -> bool:
    """Are the images of scripts/ci-images.sh on this engine?"""
    import docker

    try:
        for image in [f.image for f in FOREIGN] + [NO_PYTHON]:
            client.images.get(image)
    except docker.errors.ImageNotFound:
        return False
    return True


def image_ready(image: str) -> bool:
    """Is there a Docker engine here, with `image` on it?"""
    from .hosts import docker_available

    if not docker_available():
        return False
    import docker

    client = docker.from_env()
    try:
        client.images.get(image)
        return True
    except docker.errors.ImageNotFound:
        return False
    finally:
        client.close()


# -- a wheel to %pip install -------------------------------------------------------------------

WHEEL_NAME = "gstinypkg"


def tiny_wheel(folder: Path) -> Path:
    """gstinypkg 1.0 (`gstinypkg.ANSWER == 42`) as a wheel in `folder`."""

    def record(name: str, data: bytes) -> str:
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        return f"{name},sha256={digest},{len(data)}"

    info = f"{WHEEL_NAME}-1.0.dist-info"
    files = {
        f"{WHEEL_NAME}/__init__.py": b"ANSWER = 42\n",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {WHEEL_NAME}\nVersion: 1.0\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: gpusession-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    files[f"{info}/RECORD"] = (
        "\n".join([record(n, d) for n, d in files.items()] + [f"{info}/RECORD,,"]) + "\n"
    ).encode()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{WHEEL_NAME}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return path


class Served:
    """Serve `handler_class` on 127.0.0.1 (sessions on this machine's engine share its network),
    or on `address` (10.200.0.1: this machine's side of the namespace host's link)."""

    def __init__(self, handler_class, address: str = "127.0.0.1"):
        self.httpd = http.server.ThreadingHTTPServer((address, 0), handler_class)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def serve_folder(folder: Path, address: str = "127.0.0.1") -> Served:
    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kw):
            super().__init__(*args, directory=str(folder), **kw)

        def log_message(self, *args):
            pass

    return Served(Handler, address)


# -- a registry to pull from ---------------------------------------------------------------------


def start_pulled(manager, name: str) -> list[str]:
    """A docker session on this machine's engine from image `name` (pulled by the start), a
    cell run in it, stopped: the start's progress lines."""
    lines: list[str] = []
    session = manager.start(
        manager.make_spec("t4", backend="docker", idle="off", image=name), report=lines.append
    )
    assert session.run("1 + 1")["status"] == "ok"
    manager.stop(session.id)
    return lines


MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"


def _random_layer(size: int) -> bytes:
    """A layer tar holding one file of `size` random bytes: no engine has it yet."""
    import os

    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        info = tarfile.TarInfo("gpusession-pull-test.bin")
        info.size = size
        tar.addfile(info, io.BytesIO(os.urandom(size)))
    return raw.getvalue()


def serve_registry(
    client,
    image: str,
    repository: str,
    tag: str,
    extra_layers: tuple[int, ...] = (),
    *,
    rate: int = 0,
    cut_once_after: int = 0,
) -> Served:
    """A read-only Docker registry (the v2 API a pull uses) on 127.0.0.1 holding `image` (from the
    engine, `docker save`) as repository:tag, its layers gzip'd, with layers of random bytes
    (`extra_layers`: their sizes) on top, which a pull must download. Loopback registries need
    no TLS. `rate`: bytes per second per blob (0: as fast as it goes); `cut_once_after`: the
    first download of the top layer drops its connection after that many bytes (a link that
    breaks mid-pull). `served.state`: "sent" (blob bytes sent), "gets" ((digest, Range header)
    of each blob request), "cut" (the connection was dropped), and "rate" and "cut_once_after",
    which a test may change between pulls."""
    saved = tarfile.open(fileobj=io.BytesIO(b"".join(client.images.get(image).save())))
    (entry,) = json.loads(saved.extractfile("manifest.json").read())
    blobs: dict[str, bytes] = {}

    def add(data: bytes) -> dict:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        blobs[digest] = data
        return {"size": len(data), "digest": digest}

    tars = [saved.extractfile(name).read() for name in entry["Layers"]] + [
        _random_layer(n) for n in extra_layers
    ]
    image_config = json.loads(saved.extractfile(entry["Config"]).read())
    image_config["rootfs"]["diff_ids"] = ["sha256:" + hashlib.sha256(t).hexdigest() for t in tars]
    image_config["history"] = [
        h for h in image_config.get("history", []) if h.get("empty_layer")
    ] + [{"created_by": f"layer {n}"} for n in range(len(tars))]
    config = add(json.dumps(image_config).encode())
    layers = [add(gzip.compress(t, compresslevel=1, mtime=0)) for t in tars]
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": MANIFEST,
            "config": {"mediaType": "application/vnd.docker.container.image.v1+json", **config},
            "layers": [
                {"mediaType": "application/vnd.docker.image.rootfs.diff.tar.gzip", **layer}
                for layer in layers
            ],
        }
    ).encode()
    manifest_digest = "sha256:" + hashlib.sha256(manifest).hexdigest()
    top = layers[-1]["digest"]  # the last of `extra_layers`: one the engine has not
    state = {"sent": 0, "cut": False, "gets": [], "rate": rate, "cut_once_after": cut_once_after}

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def _send(self, body: bytes, kind: str, digest: str, head: bool) -> None:
            start = 0
            ranged = self.headers.get("Range", "")
            if ranged.startswith("bytes=") and digest in blobs:
                start = int(ranged[6:].split("-")[0] or 0)
            self.send_response(206 if start else 200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body) - start))
            if start:
                self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
            self.send_header("Docker-Content-Digest", digest)
            self.end_headers()
            if head:
                return
            rate, cut_once_after = state["rate"], state["cut_once_after"]
            if digest not in blobs or not (rate or cut_once_after):
                self.wfile.write(body[start:])
                return
            import time

            state["gets"].append((digest, ranged))
            step = max(1, rate // 20) if rate else 1 << 20
            for at in range(start, len(body), step):
                if cut_once_after and digest == top and not state["cut"] and at >= cut_once_after:
                    state["cut"] = True
                    self.close_connection = True
                    self.connection.shutdown(2)  # the link breaks: the engine sees a short body
                    return
                self.wfile.write(body[at : at + step])
                state["sent"] += len(body[at : at + step])
                if rate:
                    time.sleep(step / rate)

        def _route(self, head: bool) -> None:
            path = self.path.split("?")[0]
            if path == "/v2/":
                return self._send(b"{}", "application/json", "", head)
            if path in (
                f"/v2/{repository}/manifests/{tag}",
                f"/v2/{repository}/manifests/{manifest_digest}",
            ):
                return self._send(manifest, MANIFEST, manifest_digest, head)
            prefix = f"/v2/{repository}/blobs/"
            if path.startswith(prefix) and path[len(prefix) :] in blobs:
                digest = path[len(prefix) :]
                return self._send(blobs[digest], "application/octet-stream", digest, head)
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_GET(self):
            self._route(head=False)

        def do_HEAD(self):
            self._route(head=True)

    served = Served(Handler)
    served.state = state  # type: ignore[attr-defined]
    served.layers = len(layers)  # type: ignore[attr-defined]
    served.bytes = sum(layer["size"] for layer in layers)  # type: ignore[attr-defined]
    return served
