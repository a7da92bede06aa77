"""`gpusession setup` (issue 32 §2): where GPUs are, in one table; the choice written as the
default that every face reads; a first start on a default that cannot give the type asked is
refused before anything is pulled. The integration tests probe the real Docker engine, this
slot's sshd namespace host, and the Slurm login node when it is up."""

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from gpusession.backends.base import Place, gpu_words
from gpusession.configuration.catalog import load_catalog
from gpusession.configuration.options import build_spec, form_defaults
from gpusession.configuration.settings import (
    ConfigError,
    EnvConfig,
    default_host_for,
    user_settings,
    write_user_settings,
)
from gpusession.session.discovery import _ssh_place
from gpusession.words.setup import chosen_line, places_table, setup_summary

SLURM_STATE = Path(os.environ.get("GPUSESSION_CI_STATE", "/var/lib/gpusession-ci")) / "slurm"
SLURM_LOGIN = "10.210.0.10"


def setup_cli(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gpusession", "setup", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


# -- the words and the data, no service ------------------------------------------------------------


def test_the_table_says_what_was_found_and_what_can_run():
    places = [
        Place("this machine", "this machine", "none", "local", False, "no nvidia-smi"),
        Place(
            "docker engine", "unix:///var/run/docker.sock", "GPU runtime (nvidia)", "docker", True
        ),
        Place("ssh host", "ssh://box", "no nvidia-smi", "docker", False, "has docker", "ssh://box"),
        Place("kubeconfig", "/home/u/.kube/config", "unknown", None, False, "no backend"),
    ]
    lines = places_table(places).splitlines()
    assert lines[0].split() == ["#", "found", "where", "GPUs", "backend", "note"]
    assert lines[1].startswith("(1)  this machine") and lines[1].endswith("no nvidia-smi")
    assert lines[2].startswith("2    docker engine")  # can run: a plain number
    assert "ssh://box" in lines[3] and "no nvidia-smi" in lines[3] and "has docker" in lines[3]
    assert lines[4].split()[4] == "-"  # no backend for it
    assert "1 place(s) can give a GPU session" in setup_summary(places)
    assert "no place here can give a GPU session yet" in setup_summary(places[:1])
    assert chosen_line(places[2], "/x/settings.json") == (
        "your default is now docker on ssh://box (a start with no --backend goes there), "
        "written to /x/settings.json"
    )


def test_what_an_ssh_host_said_is_read_as_a_place():
    gpu_box = _ssh_place(
        "ssh://gpu1",
        "GPU 0: Tesla T4 (UUID: GPU-1)\nGPU 1: Tesla T4 (UUID: GPU-2)\n---\n/usr/bin/docker\n",
    )
    assert (gpu_box.gpus, gpu_box.backend, gpu_box.usable) == ("2 x Tesla T4", "docker", True)
    plain = _ssh_place("ssh://plain", "---\n/usr/bin/docker\n")
    assert (plain.gpus, plain.backend, plain.usable, plain.note) == (
        "no nvidia-smi",
        "docker",
        False,
        "has docker",
    )
    login = _ssh_place("ssh://login", "---\nsinfo\ngpu:t4:2\ngpu:a100_40g:1\n(null)\n")
    assert (login.gpus, login.backend, login.usable) == ("gpu:a100_40g:1, gpu:t4:2", "slurm", True)
    bare = _ssh_place("ssh://bare", "---\n")
    assert (bare.backend, bare.usable, bare.note) == (None, False, "no docker, no sinfo")
    assert gpu_words("GPU 0: NVIDIA A100-SXM4-40GB (UUID: x)") == "1 x NVIDIA A100-SXM4-40GB"
    assert gpu_words("No devices were found") == "none"


def test_the_users_settings_file_is_read_by_every_face(tmp_path, monkeypatch):
    """Under the env vars, over the built-in values: the CLI's EnvConfig and the Jupyter faces'
    GpuSessionConfig read the same file."""
    from gpusession.configuration.config import GpuSessionConfig

    path = tmp_path / "conf" / "settings.json"
    monkeypatch.setenv("GPUSESSION_SETTINGS", str(path))
    monkeypatch.delenv("GPUSESSION_BACKEND", raising=False)
    assert user_settings() == {} and EnvConfig().default_backend == ""
    assert write_user_settings({"default_backend": "docker"}) == path
    assert path.stat().st_mode & 0o777 == 0o600
    assert json.loads(path.read_text()) == {"default_backend": "docker"}
    assert EnvConfig().default_backend == "docker"
    assert GpuSessionConfig().default_backend == "docker"
    monkeypatch.setenv("GPUSESSION_BACKEND", "local")  # the env var wins
    assert EnvConfig().default_backend == "local"
    monkeypatch.delenv("GPUSESSION_BACKEND")
    # the place chosen goes with the default backend: its --host when none is named
    write_user_settings({"default_host": "ssh://gpubox"})
    built = build_spec(
        {"type": "t4"}, config=EnvConfig(), catalog=load_catalog(), backend_default="docker"
    )
    assert built.backend == "docker" and built.extra["host"] == "ssh://gpubox"
    named = build_spec(
        {"type": "t4", "backend": "docker"},
        config=EnvConfig(),
        catalog=load_catalog(),
        backend_default="docker",
    )
    assert "host" not in named.extra, "a backend named: this machine's engine, as before"
    assert default_host_for("slurm") == "", "another backend's place is not this one's"
    assert form_defaults(EnvConfig(), "docker")["host"] == "ssh://gpubox"
    path.write_text("{not json")
    with pytest.raises(ConfigError, match=f"your gpusession settings {path} cannot be read"):
        EnvConfig().default_backend  # noqa: B018 - reading it is the test


@pytest.mark.integration
def test_a_choice_out_of_the_table_is_one_line(tmp_path):
    env = dict(os.environ, GPUSESSION_SETTINGS=str(tmp_path / "s.json"), HOME=str(tmp_path))
    env["DOCKER_HOST"] = f"unix://{tmp_path}/no-engine.sock"  # nothing answers there
    done = setup_cli(env, "--choose", "99", "--yes")
    assert done.returncode == 1, done
    assert done.stderr.strip().startswith("gpusession setup: --choose takes a number from 1 to ")
    assert "Traceback" not in done.stderr and not (tmp_path / "s.json").exists()


# -- the real parts: the Docker engine, this slot's SSH host, the Slurm login -------------------


def _ssh_config(home: Path, *blocks: str) -> None:
    ssh = home / ".ssh"
    ssh.mkdir(mode=0o700, parents=True, exist_ok=True)
    (ssh / "config").write_text("\n".join(blocks))


def _slurm_up() -> bool:
    if not (SLURM_STATE / "ssh_config").is_file():
        return False
    try:
        with socket.create_connection((SLURM_LOGIN, 22), timeout=2):
            return True
    except OSError:
        return False


@pytest.mark.integration
def test_setup_finds_the_engine_the_ssh_hosts_and_the_cloud(tmp_path):
    """On this machine: the Docker engine (no GPU runtime: listed as such), this slot's ssh://
    host (logged in with its pinned key: no nvidia-smi, has docker), the Slurm login node (its
    GPUs as Slurm counts them) and, under another name whose key is not pinned, not logged in
    to; the test cloud's credentials. Then the choice is written and read back."""
    from support.hosts import docker_available, ensure_remote_host

    if not docker_available():
        pytest.skip("no Docker engine")
    remote = ensure_remote_host()
    if remote is None:
        pytest.skip("the namespace Docker host cannot run here (needs root)")
    home = tmp_path / "home"
    blocks = [Path(remote["ssh_config"]).read_text().replace(remote["address"], "gpubox", 1)]
    blocks[0] = blocks[0].replace("Host gpubox", f"Host gpubox\n    HostName {remote['address']}")
    slurm = _slurm_up()
    if slurm:
        login = (SLURM_STATE / "ssh_config").read_text()
        blocks.append(
            login.replace(f"Host {SLURM_LOGIN}", "Host login\n    HostName " + SLURM_LOGIN)
        )
        # the same login node under another name, its key pinned nowhere: never logged in to
        blocks.append(f"Host stranger\n    HostName {SLURM_LOGIN}\n    User root\n")
    _ssh_config(home, *blocks)
    (home / ".ssh" / "known_hosts").write_text(Path(remote["known_hosts"]).read_text())
    # a docker context, as `docker context create far --docker host=...` keeps it: the slot's
    # second engine by its socket; and a kubeconfig, with no backend installed for it
    meta = home / ".docker" / "contexts" / "meta" / "0f1e"
    meta.mkdir(parents=True)
    (meta / "meta.json").write_text(
        json.dumps({"Name": "far", "Endpoints": {"docker": {"Host": remote["docker_host_env"]}}})
    )
    # a context of an engine over TCP with TLS, as `docker context create tls --docker
    # host=tcp://...,ca=...` keeps it: listed, never probed nor offered
    tls = home / ".docker" / "contexts" / "meta" / "7a2b"
    tls.mkdir(parents=True)
    (tls / "meta.json").write_text(
        json.dumps(
            {
                "Name": "tls",
                "Endpoints": {"docker": {"Host": "tcp://10.0.0.9:2376", "SkipTLSVerify": False}},
            }
        )
    )
    (home / ".kube").mkdir()
    (home / ".kube" / "config").write_text("apiVersion: v1\nkind: Config\n")
    env = dict(
        os.environ,
        HOME=str(home),
        GPUSESSION_SETTINGS=str(tmp_path / "settings.json"),
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_DEFAULT_REGION="us-east-1",
    )
    env.pop("DOCKER_HOST", None)
    env.pop("GPUSESSION_BACKEND", None)
    env.pop("KUBECONFIG", None)  # the home's kubeconfig above, not one the shell running this named
    done = setup_cli(env)
    assert done.returncode == 0, done.stderr
    cells = [re.split(r"\s{2,}", line) for line in done.stdout.splitlines()[2:-1]]
    rows = {c[2]: "  ".join(c) for c in cells}  # by where
    engine = rows["unix:///var/run/docker.sock"]
    assert " none " in engine and "gives containers no GPU (no nvidia runtime)" in engine, engine
    box = rows["ssh://gpubox"]
    assert "no nvidia-smi" in box and " docker " in box and "has docker" in box, box
    assert box.startswith("("), "no GPU there: listed, not offered"
    assert "credentials: env" in rows["us-east-1"], done.stdout
    far = rows[remote["docker_host_env"]]
    assert far.startswith("(") and "docker context far" in far and "no nvidia runtime" in far, far
    over_tcp = rows["tcp://10.0.0.9:2376"]
    assert over_tcp.startswith("(") and "docker context tls" in over_tcp, over_tcp
    assert "not used: gpusession reaches a remote engine over ssh://" in over_tcp, over_tcp
    kube = rows.get(str(home / ".kube" / "config"), done.stdout)  # a kubeconfig, no context
    assert kube.startswith("(") and " kubernetes " in kube, kube
    if slurm:
        assert "gpu:t4:2" in rows["ssh://login"] and " slurm " in rows["ssh://login"], done.stdout
        assert "not probed: host 10.210.0.10 is not in known_hosts" in rows["ssh://stranger"]
    assert "Traceback" not in done.stderr

    chosen = box.split()[0].strip("()")  # a place without a GPU may still be chosen
    written = setup_cli(env, "--choose", chosen, "--yes")
    assert written.returncode == 0, written.stderr
    assert written.stdout.splitlines()[-1] == (
        "your default is now docker on ssh://gpubox (a start with no --backend goes there), "
        f"written to {tmp_path}/settings.json"
    )
    assert json.loads((tmp_path / "settings.json").read_text()) == {
        "default_backend": "docker",
        "default_host": "ssh://gpubox",
    }


@pytest.mark.integration
def test_a_first_start_on_an_engine_without_a_gpu_says_so_before_pulling(gs_home, tmp_path):
    """A fresh machine with a Docker engine and no GPU: no backend named, none configured, the
    default is that engine, which cannot give a T4: one line with what to do, before anything
    is recorded or pulled."""
    from support.hosts import docker_available

    if not docker_available():
        pytest.skip("no Docker engine")
    env = dict(os.environ)
    env.pop("DOCKER_HOST", None)
    env.pop("GPUSESSION_NVML_REPLAY", None)
    done = subprocess.run(
        [sys.executable, "-m", "gpusession", "start", "--type", "t4"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done
    (line,) = done.stderr.strip().splitlines()
    assert line == (
        "gpusession start: no backend was named, and the default (docker) cannot give 1 x T4: "
        "this machine's Docker engine gives containers no GPU (no nvidia runtime); nothing was "
        "pulled or started. Run `gpusession setup` to find where your GPUs are and make that "
        "the default, or name one with --backend (--backend local runs on this machine without "
        "a GPU)"
    ), line
    listed = subprocess.run(
        [sys.executable, "-m", "gpusession", "list", "--all"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert listed.returncode == 0 and "t4-1" not in listed.stdout, listed.stdout


@pytest.mark.integration
async def test_the_rest_api_refuses_the_same_default_before_anything_is_recorded(
    jp_fetch, manager, monkeypatch
):
    """The sidebar's and a GPU kernel's face: POST sessions with no backend is a 400 with the
    same line, and nothing is recorded."""
    from tornado.httpclient import HTTPClientError

    from support.hosts import docker_available

    if not docker_available():
        pytest.skip("no Docker engine")
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    with pytest.raises(HTTPClientError) as err:
        await jp_fetch(
            "gpusession", "api", "sessions", method="POST", body=json.dumps({"type": "a100"})
        )
    assert err.value.code == 400
    message = json.loads(err.value.response.body)["message"]
    assert "the default (docker) cannot give 1 x A100" in message, message
    assert "nothing was pulled or started. Run `gpusession setup`" in message, message
    assert manager.list() == []


@pytest.mark.integration
def test_gpu_setup_in_a_notebook(gs_home, tmp_path, monkeypatch, capsys):
    """`%gpu setup` says the same table in a notebook; `--choose N` (the line is the choice: no
    question) writes the default, and a number out of the table is one UsageError line."""
    from IPython.core.error import UsageError
    from IPython.core.interactiveshell import InteractiveShell

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("GPUSESSION_SETTINGS", str(tmp_path / "s.json"))
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")  # nothing answers
    shell = InteractiveShell.instance()
    try:
        shell.run_line_magic("load_ext", "gpusession")
        shell.run_line_magic("gpu", "setup")
        said = capsys.readouterr().out.splitlines()
        assert said[0].startswith("looking for GPUs: this machine, Docker engines")
        assert said[1].split()[:3] == ["#", "found", "where"]
        assert "`%gpu setup --choose N`" in said[-1], said
        engine = next(line for line in said if f"unix://{tmp_path}/no-engine.sock" in line)
        number = engine.split()[0].strip("()")
        with pytest.raises(UsageError, match="--choose takes a number from 1 to "):
            shell.run_line_magic("gpu", "setup --choose 99")
        assert not (tmp_path / "s.json").exists()
        shell.run_line_magic("gpu", f"setup --choose {number}")
        assert capsys.readouterr().out.splitlines()[-1] == (
            "your default is now docker (a start with no --backend goes there), written to "
            f"{tmp_path}/s.json"
        )
        assert json.loads((tmp_path / "s.json").read_text())["default_backend"] == "docker"
    finally:
        shell.run_line_magic("unload_ext", "gpusession")
        InteractiveShell.clear_instance()


def test_the_toolkits_hook_on_this_machine_gives_gpus(tmp_path, monkeypatch):
    """`--gpus` works without a registered nvidia runtime where dockerd finds the toolkit's hook
    (the most common setup), which `docker info` does not show: on this machine the hook and a
    GPU that nvidia-smi lists count; neither alone does, nor a remote engine's info."""
    from gpusession.backends.docker.engine_probe import gives_gpus, on_this_machine

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    info = {"Runtimes": {"runc": {}}, "DiscoveredDevices": []}
    assert not gives_gpus(info, here=True)  # no hook
    hook = bin_dir / "nvidia-container-cli"
    hook.write_text("#!/bin/sh\nexit 0\n")
    hook.chmod(0o755)
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'No devices were found'\nexit 6\n")
    smi.chmod(0o755)
    assert not gives_gpus(info, here=True)  # a hook, no GPU
    smi.write_text("#!/bin/sh\necho 'GPU 0: Tesla T4 (UUID: GPU-1234)'\n")
    assert gives_gpus(info, here=True)
    assert not gives_gpus(info, here=False)  # another machine's engine: its info alone
    assert gives_gpus({"Runtimes": {"nvidia": {}}})
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    assert on_this_machine(None) and not on_this_machine("ssh://gpu1")
    monkeypatch.setenv("DOCKER_HOST", "tcp://10.0.0.9:2376")
    assert not on_this_machine(None)
