"""Private images on EC2: the instance pulls an ECR image with a token from
ecr:GetAuthorizationToken (moto serves it), other registries with the user's docker login; the
login goes to the instance over its SSH login, never in the user data or a log. Through the
namespace host that plays the instance (tests/support/ec2_platform.py) and a real registry with
htpasswd auth (tests/support/ec2_registry.py: how the ECR name reaches it)."""

from __future__ import annotations

import base64
import logging
import os
import signal
from pathlib import Path

import pytest
import yaml
from test_aws_e2e import NOTHING, spec_for

from gpusession.core.errors import StageError
from gpusession.transport.pulls import PullLogin
from support.ec2 import leftovers
from support.ec2_platform import INSTANCE_ROOT, _content, _processes
from support.ec2_registry import (
    ECR_HOST,
    ECR_PASSWORD,
    PLAIN_HOST,
    REPOSITORY,
    STATE,
    PrivateRegistry,
    ensure_registry_tools,
)
from support.sinks import Collect
from support.slots import suffix

# the ECR name is mapped in this machine's /etc/hosts, one address at a time
pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.xdist_group("etc-hosts")]
pytest_plugins = ["support.ec2_fixtures"]
NS_DOCKERD_LOG = STATE.parent / f"ec2{suffix()}" / "dockerd.log"


@pytest.fixture(scope="module")
def registry(ec2_host):
    why = ensure_registry_tools()
    if why:
        pytest.skip(why)
    served = PrivateRegistry()
    try:
        served.up()
        yield served
    finally:
        served.down()


def _user_data(look, instance_id: str) -> str:
    """The user data as EC2 keeps it, with every write_files entry unpacked."""
    raw = look.describe_instance_attribute(InstanceId=instance_id, Attribute="userData")
    text = base64.b64decode(raw["UserData"]["Value"]).decode()
    files = [_content(item).decode() for item in yaml.safe_load(text)["write_files"]]
    return "\n".join([text, *files])


def _files_text(*folders: Path) -> str:
    found = []
    for folder in folders:
        for path in sorted(p for p in folder.rglob("*") if p.is_file() and not p.is_symlink()):
            if path.stat().st_size < 50_000_000:
                found.append(path.read_bytes().decode(errors="replace"))
    return "\n".join(found)


def _cut_our_ssh(platform) -> int:
    """Kill the instance sshd's processes of our connection (its listener's children): the
    connection drops, for this session only. How many were killed."""
    (machine,) = platform.machines.values()
    listener = int((machine.folder / "sshd.pid").read_text())
    doomed = [pid for pid, (ppid, _) in _processes().items() if ppid == listener]
    for pid in doomed:
        os.kill(pid, signal.SIGKILL)
    return len(doomed)


def test_an_ecr_image_is_pulled_with_a_token_that_only_the_ssh_login_carries(
    manager, platform, look, registry, caplog, tmp_path, monkeypatch
):
    """The token goes to the instance over its SSH login; while the instance pulls, our SSH
    connection to it drops (its sshd's processes for it killed): the client logs in again and
    follows the boot on."""
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "no-docker-login"))
    caplog.set_level(logging.DEBUG)  # every logger: botocore's logs each response body
    registry.forget_on_instance()
    dockerd_log_at = NS_DOCKERD_LOG.stat().st_size if NS_DOCKERD_LOG.exists() else 0
    image = f"{ECR_HOST}/{REPOSITORY}"
    lines: list[str] = []
    cut: list[int] = []

    def report(line: str) -> None:
        lines.append(line)
        if "instance: pulling" in line and not cut:
            cut.append(_cut_our_ssh(platform))

    session = manager.start(spec_for(manager, image=image), report=report)
    assert cut and cut[0] >= 1, cut
    for said in (
        "the SSH connection to the instance dropped; logging in again (its boot goes on)",
        f"registry login for {ECR_HOST}: a token from ECR, sent to the instance over SSH",
        "instance: waiting for the registry login",
        f"instance: pulling {image}",
        "the image's Python 3.11",
    ):
        assert any(said in line for line in lines), (said, lines)
    out = Collect()
    assert session.run("import sys; print(sys.version_info[:2])", sink=out)["status"] == "ok"
    assert out.text.strip() == "(3, 11)", out.text
    record = session.record
    iid, sid = record.resource["instance_id"], record.id
    # what the secret looks like anywhere: the password, the Basic pair, the Engine API's header
    secrets = (
        ECR_PASSWORD,
        base64.b64encode(f"AWS:{ECR_PASSWORD}".encode()).decode(),
        PullLogin(ECR_HOST, "AWS", ECR_PASSWORD).header(),
    )
    user_data = _user_data(look, iid)
    assert "PULL_LOGIN=1" in user_data  # it says a login will come, not which
    instance_files = _files_text(platform.folder / iid, INSTANCE_ROOT / sid)
    assert "waiting for the registry login" in instance_files  # the instance's logs were read
    dockerd_log = NS_DOCKERD_LOG.read_bytes()[dockerd_log_at:].decode(errors="replace")
    ours = "\n".join([*lines, caplog.text, _files_text(Path(manager.store.path).parent)])
    for secret in secrets:
        for where, text in (
            ("user data", user_data),
            ("the instance's logs and files", instance_files),
            ("the instance's dockerd log", dockerd_log),
            ("our progress, the DEBUG log (botocore's too), store and keys", ours),
        ):
            assert secret not in text, f"the ECR token is in {where}"
    manager.stop(session.id)
    assert leftovers(look) == NOTHING
    session.kernel.close()
    session.link.close()


def test_another_private_registry_wants_the_users_docker_login_in_one_line(
    manager, platform, look, registry, tmp_path, monkeypatch
):
    """No docker login: the instance pulls without one and the registry refuses; a wrong
    password: the login goes over SSH and is refused. One line each, naming the registry and
    `docker login`; nothing left behind."""
    image = f"{PLAIN_HOST}/{REPOSITORY}"
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker"))
    registry.forget_on_instance()

    def failure(name: str) -> str:
        with pytest.raises(StageError) as err:
            manager.start(spec_for(manager, image=image, name=name))
        assert err.value.stage == "image", err.value
        (line,) = str(err.value).splitlines()
        platform.wait_for(lambda: not platform.machines, timeout=60)
        assert leftovers(look) == NOTHING
        return line

    line = failure("nologin")
    assert f"{PLAIN_HOST} wants a login to pull {image}" in line, line
    assert (
        f"run `docker login {PLAIN_HOST}` here" in line
        and "never writes it on the instance" in line
    )
    registry.docker_config(tmp_path / "docker", password="wrong-password")
    line = failure("badlogin")
    assert f"{PLAIN_HOST} refused the pull of {image} with your docker login as ci" in line, line
    assert f"run `docker login {PLAIN_HOST}` again" in line, line
