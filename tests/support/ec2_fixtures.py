"""pytest fixtures for the aws backend's tests (`pytest_plugins = ["support.ec2_fixtures"]`):
moto_server (one per test run), ec2_api (a clean moto behind a FaultProxy), look (a boto3 client
straight to moto, for looking only), aws_env (credentials, region and the endpoint seam), platform
(the instances' machines: ec2_platform.FakePlatform, the backend pointed at it)."""

from __future__ import annotations

import pytest

from .ec2 import FaultProxy, MotoServer, aws_test_env, inspector
from .ports import free_port


@pytest.fixture(scope="session")
def moto_server():
    pytest.importorskip("boto3")
    pytest.importorskip("moto")
    server = MotoServer()
    yield server
    server.close()


@pytest.fixture
def ec2_api(moto_server):
    """A clean moto behind a FaultProxy; yields the proxy (faults, calls)."""
    moto_server.reset()
    proxy = FaultProxy(moto_server.url)
    yield proxy
    proxy.close()


@pytest.fixture
def look(moto_server):
    return inspector(moto_server.url)


@pytest.fixture
def aws_env(monkeypatch, gs_home, ec2_api, tmp_path):
    aws_test_env(monkeypatch, ec2_api.url, tmp_path)
    # moto's instance addresses lead nowhere; without a fake platform they lead to a closed port
    monkeypatch.setenv("GPUSESSION_AWS_ADDRESS_MAP", f"*=127.0.0.1:{free_port()}")
    return ec2_api


@pytest.fixture(scope="session")
def ec2_host():
    from .ec2_platform import ensure_ec2_host

    why = ensure_ec2_host()
    if why:
        pytest.skip(why)


@pytest.fixture
def platform(ec2_host, aws_env, moto_server, tmp_path, monkeypatch):
    from .ec2_platform import MACHINE_IP, FakePlatform

    monkeypatch.setenv("GPUSESSION_AWS_ADDRESS_MAP", f"*={MACHINE_IP}")
    p = FakePlatform(moto_server.url, tmp_path / "platform")
    aws_env.answers["GetConsoleOutput"] = p.console_output  # the machines' consoles, as EC2 keeps
    for action in ("TerminateInstances", "StopInstances"):
        aws_env.after[action] = p.instances_ending
    yield p
    p.close()
