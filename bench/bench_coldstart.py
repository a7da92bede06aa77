"""Cold start with an image of the default's size, from a real registry, against its floor.

    python bench/bench_coldstart.py [--variant runtime|devel|both] [--rounds 3] [--scale 1.0]
                                    [--write docs/benchmarks.md]

A stand-in for `pytorch/pytorch:2.7.1-cuda12.6-cudnn9-{runtime,devel}`: the same number of layers
and the same compressed sizes (LAYERS, with their source), of incompressible data (AES-CTR
keystream, sent as plain tar layers: random bytes do not compress, so gzip would only add CPU on
both sides), and a python3 base (the root filesystem of gpusession-ci/py-bookworm: Debian 12's
python3 3.11, no ipykernel, as the real image has none) inside the biggest layer. It is pushed to
a registry of this run's own (Debian's `docker-registry`, on loopback, htpasswd auth, the login in
a DOCKER_CONFIG of this run), and removed with it at the end.

Each round, on this machine's engine, with the image removed from it before each side:
- floor: `docker pull` (the CLI), then `docker run` of the image until a plain ipykernel in it
  answers `1+1` (host network, a connection file we wrote; ipykernel from a site volume made
  before the rounds, as the image has none);
- ours: `SessionManager.start(--image ...)` + `1+1` (what `%gpu start` and the CLI run), with no
  runtime cache: no probe of the image kept, and runtime volumes the engine has never seen (a
  gpusession build and ipykernel site named anew each round, made before the clock starts).
Which goes first alternates. Ratios: our start over the floor's, paired per round (median); our
pull rate (the start's pull stage, `find_or_pull_image`) over the `docker pull` of the floor.
Targets: cold start <= 1.1x, pull rate >= 0.95x. `--scale` shrinks the random part of every layer
(not the python3 base: ~290 MB) for a bounded slice. The load average is printed per round.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import dataclasses
import hashlib
import http.client
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import uuid
from pathlib import Path

import docker

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_docker import floor_kernel  # noqa: E402
from gpusession.backends.docker import container_setup  # noqa: E402
from gpusession.core.progress import Progress  # noqa: E402
from gpusession.session import SessionManager  # noqa: E402
from gpusession.transport import bundle  # noqa: E402
from gpusession.transport.pulls import format_bytes  # noqa: E402
from openssh import free_port  # noqa: E402
from stats import Stats, report  # noqa: E402

BASE = "gpusession-ci/py-bookworm"  # python3 3.11 from Debian, no ipykernel (scripts/ci-images.sh)
MB = 1_000_000
# Compressed layer sizes of the real images. Totals: Docker Hub's tag pages, as quoted for these
# two tags ("3.3GB" runtime, "6.8GB" devel: github.com/shadnygren/protenix, docs of its
# docker-pytorch-runtime / -devel branches). The layers: PyTorch's Dockerfile, stage `official`
# (FROM the base; RUN apt-get ca-certificates libjpeg-dev libpng-dev; COPY /opt/conda; RUN apt
# install gcc; WORKDIR), on ubuntu:22.04 (runtime) or nvidia/cuda:12.6.3-cudnn-devel-ubuntu22.04
# (devel: nvidia's base, runtime, devel and cudnn Dockerfiles, 13 layers). The split of each
# total over its layers is our estimate (the conda layer is the same in both tags); the layer
# marked BASE_AT holds the python3 base's files, padded with random bytes to its size.
LAYERS = {
    "runtime": [29.5, 7.0, 3213.5, 50.0, 0.001],
    "devel": [29.5, 4.5, 60.0, 0.001, 0.007, 0.001, 0.001]  # nvidia/cuda base
    + [1400.0, 0.001, 0.001]  # + runtime: the CUDA libraries
    + [1470.0, 0.001]  # + devel: nvcc, headers, static libraries
    + [560.0]  # + cudnn 9 (libcudnn9-cuda-12, -dev)
    + [7.0, 3213.5, 5.0, 0.001],  # PyTorch's official stage: apt, /opt/conda, gcc, WORKDIR
}
BASE_AT = {"runtime": 2, "devel": 14}  # the /opt/conda layer
REPOSITORY = "bench/pytorch-standin"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_TAR = "application/vnd.oci.image.layer.v1.tar"
CHUNK = 8 << 20


class Registry:
    """Debian's docker-registry (2.8) on 127.0.0.1, htpasswd auth, data in a folder of this run."""

    def __init__(self, work: Path):
        if not shutil.which("docker-registry") or not shutil.which("htpasswd"):
            raise SystemExit(
                "needs Debian's docker-registry and apache2-utils: "
                "apt-get install -y --no-install-recommends docker-registry apache2-utils"
            )
        self.dir = work / "registry"
        self.dir.mkdir(parents=True)
        self.port = free_port()
        self.host = f"127.0.0.1:{self.port}"
        self.user, self.password = "bench", uuid.uuid4().hex
        htpasswd = subprocess.run(
            ["htpasswd", "-Bbn", self.user, self.password], capture_output=True, check=True
        ).stdout
        (self.dir / "htpasswd").write_bytes(htpasswd)
        (self.dir / "config.yml").write_text(
            "version: 0.1\nlog: {level: warn}\n"
            f"storage: {{filesystem: {{rootdirectory: {self.dir / 'data'}}}, delete: {{enabled: true}}}}\n"
            f'http: {{addr: "{self.host}"}}\n'
            f"auth: {{htpasswd: {{realm: bench, path: {self.dir / 'htpasswd'}}}}}\n"
        )
        self.proc = subprocess.Popen(
            ["docker-registry", "serve", str(self.dir / "config.yml")],
            stdout=subprocess.DEVNULL,
            stderr=open(self.dir / "log", "wb"),
        )
        for _ in range(100):
            with contextlib.suppress(OSError):
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            time.sleep(0.1)
        # the login as `docker login` writes it: read by the CLI and by gpusession's pulls
        self.docker_config = work / "docker-config"
        self.docker_config.mkdir()
        auth = base64.b64encode(f"{self.user}:{self.password}".encode()).decode()
        (self.docker_config / "config.json").write_text(
            json.dumps({"auths": {self.host: {"auth": auth}}})
        )

    def request(self, method: str, path: str, body=b"", headers=None) -> http.client.HTTPResponse:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
        token = base64.b64encode(f"{self.user}:{self.password}".encode()).decode()
        conn.request(method, path, body, {"Authorization": f"Basic {token}", **(headers or {})})
        response = conn.getresponse()
        response.read()
        if response.status >= 300:
            raise RuntimeError(f"registry: {method} {path}: {response.status} {response.reason}")
        return response

    def blob_writer(self) -> "BlobUpload":
        start = self.request("POST", f"/v2/{REPOSITORY}/blobs/uploads/")
        return BlobUpload(self, start.getheader("Location"))

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


class BlobUpload:
    """A blob streamed to the registry in CHUNK-sized PATCHes; its sha256 (and that of what was
    written, for the layer's diff id: the same, as layers go uncompressed)."""

    def __init__(self, registry: Registry, location: str):
        self.registry, self.location = registry, location
        self.hash, self.size, self.buffer = hashlib.sha256(), 0, bytearray()

    def _path(self) -> str:
        return self.location.split(self.registry.host, 1)[-1]

    def write(self, data: bytes) -> None:
        self.hash.update(data)
        self.size += len(data)
        self.buffer += data
        if len(self.buffer) >= CHUNK:
            self._flush()

    def _flush(self) -> None:
        if self.buffer:
            done = self.registry.request(
                "PATCH",
                self._path(),
                bytes(self.buffer),
                {"Content-Type": "application/octet-stream"},
            )
            self.location = done.getheader("Location")
            self.buffer = bytearray()

    def finish(self) -> dict:
        self._flush()
        digest = "sha256:" + self.hash.hexdigest()
        sep = "&" if "?" in self._path() else "?"
        self.registry.request("PUT", f"{self._path()}{sep}digest={digest}")
        return {"digest": digest, "size": self.size}


def keystream():
    """Incompressible bytes fast (AES-CTR over zeros: ~0.5 GB/s a core; os.urandom is ~10x slower)."""
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    enc = Cipher(algorithms.AES(os.urandom(16)), modes.CTR(os.urandom(16))).encryptor()
    zeros = bytes(CHUNK)
    return lambda n: enc.update(zeros[:n]) if n <= CHUNK else enc.update(bytes(n))


def _tar_member(out: BlobUpload, info: tarfile.TarInfo, data=None, random_bytes=None) -> None:
    out.write(info.tobuf(tarfile.PAX_FORMAT))
    left = info.size
    if data is not None:
        out.write(data)
    else:
        while left:
            n = min(left, CHUNK)
            out.write(random_bytes(n))
            left -= n
    if info.size % 512:
        out.write(bytes(512 - info.size % 512))


def push_layer(registry: Registry, size: int, random_bytes, rootfs: Path | None) -> dict:
    """One layer (a plain tar) of `size` bytes: the python3 base's files when `rootfs` is given,
    then one file of random bytes filling it up."""
    out = registry.blob_writer()
    if rootfs is not None:
        with tarfile.open(rootfs, mode="r|") as tar:
            for member in tar:
                data = tar.extractfile(member).read() if member.isfile() else None
                _tar_member(out, member, data=data or (b"" if member.isfile() else None))
    end = 1024
    pad = max(0, size - out.size - 1536 - end)  # header (PAX) + the file + end of archive
    info = tarfile.TarInfo(f"standin/{uuid.uuid4().hex}.bin")
    info.size, info.mode, info.mtime = pad, 0o644, int(time.time())
    _tar_member(out, info, random_bytes=random_bytes)
    out.write(bytes(end))
    return out.finish()


def push_standin(client, registry: Registry, variant: str, scale: float, work: Path) -> tuple:
    """Push the stand-in of `variant`; (its reference, bytes of its layers, layer count)."""
    rootfs = work / "rootfs.tar"
    if not rootfs.exists():  # the python3 base's files, flattened (docker export)
        holder = client.containers.create(BASE, entrypoint=["/bin/true"])
        try:
            with open(rootfs, "wb") as f:
                for chunk in holder.export():
                    f.write(chunk)
        finally:
            holder.remove(force=True)
    random_bytes = keystream()
    layers = []
    for i, mb in enumerate(LAYERS[variant]):
        with_base = i == BASE_AT[variant]
        size = int(mb * MB * (scale if mb > 1 else 1))
        if with_base:
            size = max(size, rootfs.stat().st_size + 4096)
        layers.append(push_layer(registry, size, random_bytes, rootfs if with_base else None))
    attrs = client.images.get(BASE).attrs
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": attrs["Config"],
            "rootfs": {"type": "layers", "diff_ids": [layer["digest"] for layer in layers]},
            "history": [{"created_by": f"bench_coldstart layer {n}"} for n in range(len(layers))],
        }
    ).encode()
    upload = registry.blob_writer()
    upload.write(config)
    config_ref = upload.finish()
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": {"mediaType": OCI_CONFIG, **config_ref},
            "layers": [{"mediaType": OCI_TAR, **layer} for layer in layers],
        }
    ).encode()
    registry.request(
        "PUT", f"/v2/{REPOSITORY}/manifests/{variant}", manifest, {"Content-Type": OCI_MANIFEST}
    )
    return f"{registry.host}/{REPOSITORY}:{variant}", sum(x["size"] for x in layers), len(layers)


def remove_image(client, ref: str) -> None:
    with contextlib.suppress(docker.errors.ImageNotFound):
        client.images.remove(ref, force=True)


def floor_round(client, ref: str, site_volume: str) -> tuple[float, float]:
    """(`docker pull` seconds, seconds from the pull's start to a plain kernel's `1+1`)."""
    t0 = time.perf_counter()
    subprocess.run(["docker", "pull", "-q", ref], check=True, capture_output=True)
    pulled = time.perf_counter() - t0

    def run(script: str):
        name = f"bench-floor-{uuid.uuid4().hex[:8]}"
        argv = ["docker", "run", "-d", "--name", name, "--init", "--network", "host"]
        argv += ["--gpus", "all", "-v", f"{site_volume}:{bundle.SITE_DIR}:ro"]
        argv += ["-e", f"PYTHONPATH={bundle.SITE_DIR}/deps", "--label", "gpusession.bench=floor"]
        argv += ["--entrypoint", "/bin/sh", ref, "-c", script]
        subprocess.run(argv, check=True, capture_output=True)
        return client.containers.get(name)

    started, container, kernel = floor_kernel(run, 120)
    try:
        kernel.close()
    finally:
        container.remove(force=True)
    return pulled, pulled + started


class FreshRuntime:
    """No runtime cache for one start: this build's code and the image's site under names no
    engine has seen (a marker file in each archive, made before the clock starts), and no probe
    of the image kept. The volumes are removed after."""

    def __init__(self, client, cache: Path, site: bundle.Archive):
        self.client = client
        self.code = _marked(bundle.code_archive())
        self.site = _marked(site)
        # the start compiles this code ahead for the image's Python itself (on the clock), as
        # a new build's first start does
        bundle.code_archive = lambda: self.code
        bundle._CODE_FOR.clear()
        container_setup.site_archive = lambda python, cache_dir, say: self.site
        shutil.rmtree(cache / "probes", ignore_errors=True)

    def remove(self) -> None:
        names = [self.code.copy_name + "-cp311", self.site.copy_name]
        for name in names + [n + "-ok" for n in names]:
            with contextlib.suppress(docker.errors.NotFound):
                self.client.volumes.get(name).remove(force=True)


def _marked(archive: bundle.Archive) -> bundle.Archive:
    files = bundle._members_of(archive.data)
    files[".bench-build"] = uuid.uuid4().hex.encode()
    return dataclasses.replace(bundle._archive(archive.kind, files), bytecode=archive.bytecode)


def ours_round(manager: SessionManager, ref: str) -> tuple[float, list[str]]:
    """Seconds from `start` to the kernel's `1+1`, and the start's progress lines."""
    lines: list[str] = []
    t0 = time.perf_counter()
    session = manager.start(
        manager.make_spec("t4", backend="docker", idle="off", image=ref), report=lines.append
    )
    session.kernel.evaluate("1+1")
    total = time.perf_counter() - t0
    session.stop()
    return total, lines


def timed_pulls(pulls: list[float]) -> None:
    """Time every pull of the start (the docker backend's pull stage)."""
    real = container_setup.find_or_pull_image

    def find_or_pull_image(client, image, progress):
        t = time.perf_counter()
        try:
            return real(client, image, progress)
        finally:
            pulls.append(time.perf_counter() - t)

    container_setup.find_or_pull_image = find_or_pull_image


def run_variant(client, manager, registry, variant, args, work, cache, site, site_volume):
    ref, size, count = push_standin(client, registry, variant, args.scale, work)
    print(f"{variant}: pushed {ref}: {format_bytes(size)} in {count} layers", flush=True)
    floors, floor_pulls, ours, our_pulls, loads, rest = [], [], [], [], [], []
    pulls: list[float] = []
    timed_pulls(pulls)
    for n in range(args.rounds):
        for side in ("floor", "ours") if n % 2 == 0 else ("ours", "floor"):
            remove_image(client, ref)
            loads.append(os.getloadavg()[0])
            if side == "floor":
                pulled, total = floor_round(client, ref, site_volume)
                floor_pulls.append(pulled)
                floors.append(total)
            else:
                fresh = FreshRuntime(client, cache, site)
                try:
                    total, lines = ours_round(manager, ref)
                finally:
                    fresh.remove()
                ours.append(total)
                our_pulls.append(pulls[-1])
                rest.append(total - pulls[-1])
            print(f"  round {n + 1} {side}: {total:.1f} s, load {loads[-1]:.1f}", flush=True)
        print(f"  ours: {' | '.join(lines)}", flush=True)
    remove_image(client, ref)
    paired = statistics.median(o / f for o, f in zip(ours, floors))
    pull_ratio = statistics.median(fp / op for fp, op in zip(floor_pulls, our_pulls))
    rate = lambda times: f"{size / statistics.median(times) / MB:.0f} MB/s"  # noqa: E731
    what = f"{variant} stand-in ({format_bytes(size)}, {count} layers)"
    return [
        (
            f"cold start to first `1+1`, {what}",
            Stats.of(ours).cell("s", 1),
            f"{Stats.of(floors).cell('s', 1)} (docker pull + docker run)",
            paired,
            "<= 1.1x",
            paired <= 1.1,
        ),
        (
            f"pull rate, {what}",
            f"{rate(our_pulls)} ({Stats.of(our_pulls).cell('s', 1)})",
            f"{rate(floor_pulls)} ({Stats.of(floor_pulls).cell('s', 1)}) (docker pull)",
            pull_ratio,
            ">= 0.95x",
            pull_ratio >= 0.95,
        ),
        (
            f"of our start, after the pull (runtime, container, kernel), {variant}",
            Stats.of(rest).cell("s", 1),
            f"{Stats.of([f - p for f, p in zip(floors, floor_pulls)]).cell('s', 1)} (docker run)",
            statistics.median(rest)
            / statistics.median([f - p for f, p in zip(floors, floor_pulls)]),
            "",
            True,
        ),
    ], loads


def runtime_rows(client, cache: Path, site: bundle.Archive, rounds: int) -> list[tuple]:
    """The runtime cache's cold cost alone (the image present): probe, the agent's copy, the site's
    copy, as a new engine pays it, with the site compiled ahead here against the same site
    compiled on the engine by the image's Python (as before it came compiled); alternating."""
    plain = dataclasses.replace(
        bundle._archive(
            site.kind,
            {n: d for n, d in bundle._members_of(site.data).items() if "__pycache__" not in n},
        ),
        bytecode=None,
    )
    image = client.images.get(BASE)
    times: dict[str, list[float]] = {"ahead": [], "engine": []}
    for n in range(rounds):
        for kind in ("ahead", "engine") if n % 2 == 0 else ("engine", "ahead"):
            fresh = FreshRuntime(client, cache, site if kind == "ahead" else plain)
            t = time.perf_counter()
            try:
                container_setup.prepare_runtime(
                    client,
                    image,
                    cache_dir=cache,
                    labels={"gpusession.session": "bench"},
                    progress=Progress(),
                )
                times[kind].append(time.perf_counter() - t)
            finally:
                fresh.remove()
            print(f"  runtime, site compiled {kind}: {times[kind][-1]:.1f} s", flush=True)
    ahead, engine = Stats.of(times["ahead"]), Stats.of(times["engine"])
    return [
        (
            f"runtime cache, cold, {BASE} (python3 only): probe + agent + ipykernel site, "
            f"site compiled ahead here vs on the engine",
            ahead.cell("s", 1),
            f"{engine.cell('s', 1)} (compiled on the engine)",
            statistics.median(a / e for a, e in zip(times["ahead"], times["engine"])),
            "",
            True,
        )
    ]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--variant", choices=("runtime", "devel", "both"), default="both")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--scale", type=float, default=1.0, help="of each layer's random part")
    ap.add_argument("--write", default=None, help="update the cold-start section of this file")
    ap.add_argument(
        "--runtime-only", action="store_true", help="only the runtime cache's cold cost (no pulls)"
    )
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a timeout still cleans up
    work = Path(tempfile.mkdtemp(prefix="gs-coldstart-"))
    os.environ["GPUSESSION_HOME"] = str(work / "home")
    cache = work / "cache"
    os.environ[bundle.CACHE_ENV] = str(cache)
    seeded = bundle.cache_dir().parent  # this run's cache, seeded with the user's sites (no PyPI)
    user_sites = Path.home() / ".cache" / "gpusession" / "runtime" / "sites"
    if user_sites.is_dir():
        shutil.copytree(user_sites, seeded / "runtime" / "sites")
    client = docker.from_env()
    registry = Registry(work)
    os.environ["DOCKER_CONFIG"] = str(registry.docker_config)
    manager = SessionManager()
    rows, loads = [], []
    try:
        # the floor's ipykernel: the site volume of the base's Python, made (warm) before the rounds
        prepared = container_setup.prepare_runtime(
            client,
            client.images.get(BASE),
            cache_dir=bundle.cache_dir(),
            labels={"gpusession.session": "bench"},
            progress=Progress(),
        )
        site_volume = next(v for v, m in prepared.volumes.items() if m["bind"] == bundle.SITE_DIR)
        python = prepared.python
        site = bundle.site_archive(python, bundle.cache_dir(), print)
        t0, load0 = time.perf_counter(), os.getloadavg()
        loads.append(load0[0])
        rows += runtime_rows(client, bundle.cache_dir(), site, args.rounds)
        variants = ("runtime", "devel") if args.variant == "both" else (args.variant,)
        for variant in () if args.runtime_only else variants:
            got, seen = run_variant(
                client,
                manager,
                registry,
                variant,
                args,
                work,
                bundle.cache_dir(),
                site,
                site_volume,
            )
            rows += got
            loads += seen
            for a, b, c, r, t, ok in got:  # as it comes: a run cut short keeps what it measured
                print(f"| {a} | {b} | {c} | {r:.2f}x | {t} |", flush=True)
            # this variant's blobs go before the next one is pushed: disk (the engine's copy is gone)
            shutil.rmtree(registry.dir / "data", ignore_errors=True)
    finally:
        for variant in LAYERS:
            remove_image(client, f"{registry.host}/{REPOSITORY}:{variant}")
        # the sessions' workspaces (a docker session makes one; it outlives the session)
        for volume in client.volumes.list(filters={"label": "gpusession.workspace"}):
            if volume.name.startswith(f"gpusession-ws-{manager.store.store_id[:8]}-"):
                with contextlib.suppress(docker.errors.APIError):
                    volume.remove(force=True)
        registry.close()
        shutil.rmtree(work, ignore_errors=True)
    note = (
        f"{args.rounds} rounds per variant, scale {args.scale:g}, {time.perf_counter() - t0:.0f} s; "
        f"times are median / p99 / max (nearest rank: under 100 rounds p99 is the max); a ratio "
        f"is the median of the rounds' own ratios. Load average (1 min) at each side's start: "
        f"{min(loads):.1f}-{max(loads):.1f} (median {statistics.median(loads):.1f}; "
        f"{os.cpu_count()} CPUs; {load0[0]:.1f} when the run began)."
    )
    return report(rows, note, args.write, "bench_coldstart")


if __name__ == "__main__":
    sys.exit(main())
