"""A private registry for the aws tests' instances: Debian's docker-registry (the reference
registry) with htpasswd auth and TLS from a CA of its own, on this machine's side of the
gpus-ec2(-N) link (10.201.N.1:443), holding one small image with python3 (gpusession-ci/py-bookworm)
as ci/py:1.

It answers to two names, as the tests' images name it:
- `ECR_HOST` (moto's account 123456789012 in us-east-1): an ECR registry. This machine's
  /etc/hosts maps that name to 10.201.N.1 while the fixture runs (one machine-wide name: the
  tests that use it share the xdist group "etc-hosts", so one runs at a time) (the instance's Docker is the
  namespace's dockerd, which shares this machine's files), as a VPC interface endpoint's private
  DNS maps it to an address in the VPC. Its htpasswd user is `AWS` with the password moto's
  GetAuthorizationToken hands out (`ACCOUNT-auth-token`): the pull works only with that token.
- `10.201.N.1` (port 443): any other private registry, user `ci` with a password of its own,
  which a test writes into a `docker login` config (DOCKER_CONFIG).

Both Docker engines here trust the CA through /etc/docker/certs.d/<name>/ca.crt.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from .ec2_platform import HOST_IP, NS_DOCKER
from .slots import suffix

ACCOUNT = "123456789012"  # moto's
ECR_HOST = f"{ACCOUNT}.dkr.ecr.us-east-1.amazonaws.com"
ECR_PASSWORD = f"{ACCOUNT}-auth-token"  # what moto's GetAuthorizationToken gives
PLAIN_HOST = HOST_IP  # the same registry by address: not ECR, a docker login
REPOSITORY = "ci/py:1"
SOURCE = "gpusession-ci/py-bookworm"  # Debian 12 + python3: its layers are small
STATE = (
    Path(os.environ.get("GPUSESSION_CI_STATE", "/var/lib/gpusession-ci"))
    / f"ec2-registry{suffix()}"
)
HOSTS_LINE = f"{HOST_IP} {ECR_HOST}  # gpusession tests (tests/support/ec2_registry.py)"


def _run(*cmd: str, **kw) -> str:
    return subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=600, **kw).stdout


class PrivateRegistry:
    def __init__(self):
        self.dir = STATE
        self.proc: subprocess.Popen | None = None

    @property
    def password(self) -> str:
        """The `ci` user's password (for docker login to PLAIN_HOST)."""
        return (self.dir / "password").read_text().strip()

    def docker_config(self, folder: Path, password: str | None = None) -> Path:
        """A docker login config (what `docker login PLAIN_HOST` writes) in `folder`."""
        auth = base64.b64encode(f"ci:{password or self.password}".encode()).decode()
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text(json.dumps({"auths": {PLAIN_HOST: {"auth": auth}}}))
        return folder

    def up(self) -> None:
        d = self.dir
        (d / "data").mkdir(parents=True, exist_ok=True)
        if not (d / "server.crt").exists():
            _run("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "3650",
                 "-subj", "/CN=gpusession ec2 registry CA", "-keyout", str(d / "ca.key"),
                 "-out", str(d / "ca.crt"))  # fmt: skip
            _run("openssl", "req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={ECR_HOST}",
                 "-keyout", str(d / "server.key"), "-out", str(d / "server.csr"))  # fmt: skip
            (d / "san.ext").write_text(f"subjectAltName=DNS:{ECR_HOST},IP:{PLAIN_HOST}\n")
            _run("openssl", "x509", "-req", "-in", str(d / "server.csr"), "-CA", str(d / "ca.crt"),
                 "-CAkey", str(d / "ca.key"), "-CAcreateserial", "-days", "3650",
                 "-extfile", str(d / "san.ext"), "-out", str(d / "server.crt"))  # fmt: skip
        if not (d / "password").exists():
            (d / "password").write_text(secrets.token_urlsafe(18) + "\n")
        users = [("AWS", ECR_PASSWORD), ("ci", self.password)]
        (d / "htpasswd").write_text(
            "".join(_run("htpasswd", "-Bbn", u, p).strip() + "\n" for u, p in users)
        )
        (d / "config.yml").write_text(
            "version: 0.1\nlog: {level: warn}\n"
            f"storage: {{filesystem: {{rootdirectory: {d / 'data'}}}}}\n"
            f'http: {{addr: "{HOST_IP}:443", tls: {{certificate: {d / "server.crt"}, key: {d / "server.key"}}}}}\n'
            f"auth: {{htpasswd: {{realm: gpusession-ec2, path: {d / 'htpasswd'}}}}}\n"
        )
        for name in (ECR_HOST, PLAIN_HOST):
            certs = Path("/etc/docker/certs.d") / name
            certs.mkdir(parents=True, exist_ok=True)
            shutil.copy(d / "ca.crt", certs / "ca.crt")
        hosts = Path("/etc/hosts").read_text()
        if HOSTS_LINE not in hosts:
            with open("/etc/hosts", "a") as f:
                f.write(("" if hosts.endswith("\n") else "\n") + HOSTS_LINE + "\n")
        self.log = open(d / "registry.log", "ab")
        self.proc = subprocess.Popen(
            ["docker-registry", "serve", str(d / "config.yml")],
            stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 20
        while self._status("/v2/") != 401:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"docker-registry did not start: see {d / 'registry.log'}")
            time.sleep(0.2)
        self._push()

    def _status(self, path: str, user: str | None = None, password: str = "") -> int:
        import ssl

        request = urllib.request.Request(
            f"https://{PLAIN_HOST}{path}",
            method="HEAD" if "manifests" in path else "GET",
            headers={"Accept": "application/vnd.docker.distribution.manifest.v2+json"},
        )
        if user:
            token = base64.b64encode(f"{user}:{password}".encode()).decode()
            request.add_header("Authorization", f"Basic {token}")
        context = ssl.create_default_context(cafile=str(self.dir / "ca.crt"))
        try:
            with urllib.request.urlopen(request, context=context, timeout=5):
                return 200
        except urllib.error.HTTPError as exc:
            return exc.code
        except OSError:
            return 0

    def _push(self) -> None:
        """SOURCE as ci/py:1, once (the registry keeps it)."""
        name, _, tag = REPOSITORY.partition(":")
        if self._status(f"/v2/{name}/manifests/{tag}", "ci", self.password) == 200:
            return
        config = self.docker_config(self.dir / "pusher")
        env = dict(os.environ, DOCKER_CONFIG=str(config))
        ref = f"{PLAIN_HOST}/{REPOSITORY}"
        _run("docker", "tag", SOURCE, ref, env=env)
        _run("docker", "push", "-q", ref, env=env)
        _run("docker", "rmi", ref, env=env)

    def forget_on_instance(self) -> None:
        """Remove the pulled image from the instances' engine: the next start pulls it."""
        for host in (ECR_HOST, PLAIN_HOST):
            subprocess.run(
                ["docker", "-H", NS_DOCKER, "rmi", "-f", f"{host}/{REPOSITORY}"],
                capture_output=True, timeout=60,
            )  # fmt: skip

    def down(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        hosts = Path("/etc/hosts").read_text()
        if HOSTS_LINE in hosts:
            Path("/etc/hosts").write_text(hosts.replace(HOSTS_LINE + "\n", ""))


def ensure_registry_tools() -> str | None:
    """None when the registry can run here, else why not (for pytest.skip)."""
    for tool in ("docker-registry", "htpasswd", "openssl"):
        if not shutil.which(tool):
            return f"needs {tool} (apt-get install docker-registry apache2-utils openssl: scripts/ci-slurm.sh)"
    return None
