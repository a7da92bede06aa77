"""Shared fixtures. Every test gets its own session store (GPUSESSION_HOME in a tmp dir).

Tiers (docs/testing.md): a test is `integration` when it needs root, a Docker engine, a network
namespace host, the Slurm cluster, Chromium, moto's EC2 API or processes of ours (kernels, the
agent, the CLI, servers): by its markers (docker, browser, slurm, root, slow, or integration
itself) or by the fixtures it takes (INTEGRATION_FIXTURES). The rest is the fast tier,
`pytest -m "not integration"` (scripts/test.sh --fast): no root, no services, no processes of
ours, which the fast tier itself holds to (`_fast_tier_starts_no_interpreter`)."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from support.leftovers import remove_workspace_volumes  # noqa: E402

#: markers that make a test an integration test (pyproject.toml declares them)
INTEGRATION_MARKS = ("docker", "browser", "slurm", "kubernetes", "root", "slow")
#: fixtures that bring a real service along: a test taking one is an integration test
INTEGRATION_FIXTURES = frozenset(
    {
        *("engine", "remote", "platform", "ec2_host", "cluster", "registry", "browser", "page"),
        *("moto_server", "ec2_api", "aws_env", "look"),  # the local EC2 API (moto's server)
    }
)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if any(item.get_closest_marker(m) for m in INTEGRATION_MARKS) or (
            INTEGRATION_FIXTURES & set(getattr(item, "fixturenames", ()))
        ):
            item.add_marker(pytest.mark.integration)
    _quick_tests_last(items)


def _quick_tests_last(items) -> None:
    """The fast tier's tests run after the integration tests (each kind in its order): the
    workers hand out tests in this order, so the run ends on some 700 tests of a fraction of a
    second each, which even out the workers' last minute, not on an integration test of half a
    minute that one worker began last (docs/testing.md)."""
    items.sort(key=lambda i: i.get_closest_marker("integration") is None)  # stable


def pytest_runtest_setup(item):
    """With --dist loadgroup, a test of an xdist group must carry the group in its id (that is how
    xdist sends the group to one worker). pytest 9.2 stopped reading the id xdist 3.8 sets, and the
    Slurm tests then ran on two workers at once and cancelled each other's jobs: said here."""
    if (
        getattr(item.config.option, "loadgroup", False)
        and item.get_closest_marker("xdist_group")
        and "@" not in item.nodeid
    ):
        pytest.fail(
            f"pytest-xdist does not group this test with this pytest ({pytest.__version__}): "
            "pin pytest as pyproject.toml does",
            pytrace=False,
        )


def fast_tier(config) -> bool:
    """Is this run the fast tier (`-m "not integration"`, scripts/test.sh --fast)?"""
    return "not integration" in (config.getoption("markexpr", "") or "")


#: what a fast-tier test may not start: an interpreter (a kernel, the agent, the CLI: a second or
#: more each) or a service; short tools (git, bash -n, ssh-keygen) are fine
SLOW_PROGRAMS = ("python", "sshd", "ssh", "docker", "dockerd", "chromium", "moto_server", "jupyter")
_running: list[str] = []  # the node id of the test being run, for the fast tier's refusal


def _ctrl_c_works() -> None:
    """Ctrl-C reaches every process the tests start, however the run was started. A run put in
    the background by a shell without job control (`pytest ... &` in a script, `bash -c`) begins
    with SIGINT ignored, Python keeps it so, and every child inherits it: each test that presses
    Ctrl-C (a `gpusession start` cut mid-pull, an interrupted cell) then sees it ignored and
    fails far from the cause. Python's own handler again, here and so in the children."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _own_ipython_dir() -> None:
    """Each test process's IPython shells and the kernels it starts keep their history in a folder
    of its own, not the machine's ~/.ipython: parallel workers' shells wrote one history.sqlite at
    once, and IPython, finding it locked or moved aside, printed 'attempt to write a readonly
    database' at their exit."""
    import atexit
    import shutil
    import tempfile

    folder = tempfile.mkdtemp(prefix="gpusession-tests-ipython-")
    os.environ["IPYTHONDIR"] = folder
    atexit.register(shutil.rmtree, folder, True)


def pytest_configure(config):
    """The fast tier's rules, held for the whole run (fixtures of any scope included): no
    Docker engine in sight (a test that needs one skips, as on a machine without, and says so),
    and no Python process or service started (a kernel, the agent, the CLI, sshd, a server,
    moto): a test that starts one fails, saying to mark it integration. And Ctrl-C works
    (_ctrl_c_works), in the controller and in each xdist worker."""
    _ctrl_c_works()
    _own_ipython_dir()
    if not fast_tier(config):
        return
    if not hasattr(config, "workerinput") and getattr(config.option, "numprocesses", None):
        return  # xdist's controller: it starts the workers, which hold the rules
    import subprocess

    os.environ["DOCKER_HOST"] = "unix:///nonexistent/gpusession-fast-tier.sock"
    execute = subprocess.Popen._execute_child

    def checked(self, args, executable, *rest):
        argv = [args] if isinstance(args, (str, bytes, os.PathLike)) else list(args)
        program = os.path.basename(os.fsdecode(executable or argv[0])).split()[0]
        if program.startswith(SLOW_PROGRAMS) or os.fsdecode(argv[0]) == sys.executable:
            raise AssertionError(
                f"{_running[-1] if _running else 'a fixture'} starts {program} in the fast "
                "tier: mark it `pytest.mark.integration` (tests/conftest.py, docs/testing.md)"
            )
        return execute(self, args, executable, *rest)

    subprocess.Popen._execute_child = checked


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _running.append(item.nodeid)
    started = time.time()
    yield
    _running.pop()
    _timeline(item, started)


def _timeline(item, started: float) -> None:
    """GPUSESSION_TEST_TIMELINE=FILE: each test's worker, start and end appended there (one JSON
    line each), to see which tests hold the run's last minutes (docs/testing.md)."""
    path = os.environ.get("GPUSESSION_TEST_TIMELINE")
    if path:
        import json

        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        row = {"test": item.nodeid, "worker": worker, "start": started, "end": time.time()}
        with open(path, "a") as out:
            out.write(json.dumps(row) + "\n")


@pytest.fixture(autouse=True)
def _no_user_settings(tmp_path_factory, monkeypatch) -> None:
    """No test reads the machine's user settings file (`gpusession setup` writes it)."""
    unset = tmp_path_factory.getbasetemp() / "no-user-settings.json"
    monkeypatch.setenv("GPUSESSION_SETTINGS", str(unset))


@pytest.fixture(autouse=True)
def _umask_kept():
    """A test leaves this worker's umask as it found it: the agent's code run in-process sets 077
    for its own process, and a worker's later aws tests then made the fake instances' shared
    /var/lib/gpusession 0700, so that no instance's login could read its boot's status (every
    worker's aws starts timed out, "no image pull seen": CI stop 51)."""
    before = os.umask(0o022)
    os.umask(before)
    yield
    after = os.umask(before)
    assert after == before, f"the test left this process's umask {after:o} (was {before:o})"


@pytest.fixture
def gs_home(tmp_path, monkeypatch) -> Path:
    home = tmp_path / "gshome"
    home.mkdir(mode=0o700)  # as gpusession makes it: an open one is warned about
    monkeypatch.setenv("GPUSESSION_HOME", str(home))
    monkeypatch.delenv("GPUSESSION_BACKEND", raising=False)
    # the user's settings file (`gpusession setup`) is the test's own, never the machine's
    monkeypatch.setenv("GPUSESSION_SETTINGS", str(tmp_path / "user-settings.json"))
    # its volumes go after the test: _workspace_volumes_go finds its store in tmp_path
    return home


@pytest.fixture(autouse=True)
def _workspace_volumes_go(request, monkeypatch, tmp_path, tmp_path_factory):
    """After an integration test, the volumes its stores made go: the store of its
    GPUSESSION_HOME (whichever fixture set it; torn down before monkeypatch restores the
    environment) and any store one folder down in its tmp_path (a server or CLI it started with
    its own; tmp_path is taken here so that it is removed after this looked). Only stores under
    this run's temporary folder: never a user's own."""
    yield
    if request.node.get_closest_marker("integration") is None:
        return
    homes = [Path(os.environ["GPUSESSION_HOME"])] if os.environ.get("GPUSESSION_HOME") else []
    homes += [db.parent for db in tmp_path.glob("*/sessions.sqlite3")]
    base = tmp_path_factory.getbasetemp().resolve()
    for home in dict.fromkeys(h.resolve() for h in homes):
        if home.is_relative_to(base):
            remove_workspace_volumes(home)


@pytest.fixture
def manager(gs_home):
    from support.managed import managed

    yield from managed()


@pytest.fixture
def engine():
    """A docker SDK client for the local engine (tests that need one skip without it)."""
    import docker

    client = docker.from_env()
    yield client
    client.close()


@pytest.fixture
def remote(tmp_path, monkeypatch):
    """The namespace Docker host reached over ssh:// (scripts/ci-remote-host.sh), with a HOME whose
    ~/.ssh knows it; the test skips where that host cannot run."""
    from support.hosts import ensure_remote_host, ssh_home

    host = ensure_remote_host()
    if host is None:
        pytest.skip(
            "the namespace Docker host cannot run here (needs root; scripts/ci-remote-host.sh)"
        )
    monkeypatch.setenv("HOME", ssh_home(host, tmp_path / "home"))
    return host


@pytest.fixture
def nb_env(gs_home) -> dict[str, str]:
    env = dict(os.environ)
    env["GPUSESSION_HOME"] = str(gs_home)
    env.setdefault("GPUSESSION_BACKEND", "local")
    env["PYTHONUNBUFFERED"] = "1"
    return env


@pytest.fixture
def notebook(nb_env, tmp_path):
    """A real notebook kernel with gpusession loaded."""
    from support.notebook_kernel import NotebookKernel

    nk = NotebookKernel(nb_env, cwd=str(tmp_path))
    r = nk.run("%load_ext gpusession")
    assert r.status == "ok", r.text
    yield nk
    nk.close()


# --- jupyter server (pytest-jupyter); the Kubernetes test cluster's fixtures and lanes -------
pytest_plugins = ["pytest_jupyter.jupyter_server", "support.kube"]


@pytest.fixture
def jp_server_config(gs_home):
    return {"ServerApp": {"jpserver_extensions": {"gpusession": True}}}
