"""Settings: every row of the configuration reference (docs/reference/configuration.md), set through IPython (config file,
`%config`, command line), through the jupyter server's config, and through env vars.

Precedence: `%config` / command line / config files > env var > built-in."""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import tornado.httpclient
from traitlets.config import Config

from gpusession.configuration.config import BUILTIN_IMAGE, ConfigError, GpuSessionConfig
from gpusession.core.durations import parse_duration
from gpusession.core.models import State
from gpusession.session import SessionManager
from gpusession.session.store import Store
from support.notebook_kernel import NotebookKernel

ROOT = Path(__file__).resolve().parent.parent
IPYTHON = str(Path(sys.executable).with_name("ipython"))

# the configuration reference's table: setting -> env var
ENV_VARS = {
    "data_dir": "GPUSESSION_HOME",
    "default_backend": "GPUSESSION_BACKEND",
    "default_type": "GPUSESSION_TYPE",
    "default_idle": "GPUSESSION_IDLE",
    "price_per_hour": "GPUSESSION_PRICE_PER_HOUR",
    "docker_image": "GPUSESSION_IMAGE",
    "monthly_budget": "GPUSESSION_MONTHLY_BUDGET",
    "nvml_replay": "GPUSESSION_NVML_REPLAY",
    "regions": "GPUSESSION_REGIONS",
    "cut_switch": "GPUSESSION_CUT_SWITCH",
}
DATA = ROOT / "tests" / "data"
#: the settings that are a backend's own: their section and trait (c.DockerBackend.image)
SECTIONS = {"docker_image": ("DockerBackend", "image"), "regions": ("AwsBackend", "regions")}
CORE = [name for name in ENV_VARS if name not in SECTIONS]  # GpuSessionConfig's traits


def qualified(name: str) -> str:
    """A setting as config files and %config name it: GpuSessionConfig.default_idle, DockerBackend.image."""
    section, trait = SECTIONS.get(name, ("GpuSessionConfig", name))
    return f"{section}.{trait}"


def as_config(values: dict) -> dict:
    """{setting: value} as a traitlets Config's sections."""
    out: dict = {}
    for name, value in values.items():
        section, trait = SECTIONS.get(name, ("GpuSessionConfig", name))
        out.setdefault(section, {})[trait] = value
    return out


def env_values(tmp_path: Path) -> dict:
    return {
        "data_dir": str(tmp_path / "env-home"),
        "default_backend": "docker",
        "default_type": "l4",
        "default_idle": "5m",
        "price_per_hour": "0.1",
        "docker_image": "env/image:1",
        "monthly_budget": "$300",
        "nvml_replay": str(DATA / "nvml_two_t4.json"),
        "regions": "us-east-1,us-west-2",
        "cut_switch": "keep-old",
    }


def config_values(tmp_path: Path) -> dict:
    return {
        "data_dir": str(tmp_path / "cfg-home"),
        "default_backend": "local",
        "default_type": "a10g",
        "default_idle": "7m",
        "price_per_hour": 0.25,
        "docker_image": "cfg/image:2",
        "monthly_budget": 150.0,
        "nvml_replay": str(DATA / "nvml_four_a100.json"),
        "regions": "eu-west-1",
        "cut_switch": "ask",
    }


def effective(values: dict) -> dict:
    """What `observe` reports when these values are in force."""
    return {
        "data_dir": values["data_dir"],
        "default_backend": values["default_backend"],
        "default_type": f"{values['default_type']}:1",
        "default_idle": parse_duration(values["default_idle"]),
        "price_per_hour": float(values["price_per_hour"]),
        "docker_image": values["docker_image"],
        "monthly_budget": float(str(values["monthly_budget"]).lstrip("$")),
        "nvml_replay": values["nvml_replay"],
        "regions": values["regions"].split(","),
        "cut_switch": values["cut_switch"],
    }


def observe(manager) -> dict:
    """What the next start would use, read from what the manager builds (also runs inside the
    kernels below, so it imports nothing of the test module)."""
    spec = manager.make_spec(None)
    local = manager.make_spec(None, backend="local")
    return {
        "data_dir": str(manager.store.path.parent),
        "default_backend": spec.backend,
        "default_type": f"{spec.gpu_type}:{spec.gpu_count}",
        "default_idle": spec.idle,
        "price_per_hour": manager.backend("local").price_per_hour(local, manager.catalog),
        "docker_image": manager.backend("docker").setting("image"),
        "monthly_budget": (manager.spend.budget() or {}).get("budget", 0.0),
        "nvml_replay": local.extra.get("nvml_replay", ""),
        # where the next --cheapest start compares prices
        "regions": manager.backend("aws").cheapest_regions(local),
        # what a switch cut by its driver's death becomes (session/orphans.py reads it so)
        "cut_switch": manager.config.cut_switch,
    }


PROBE = (
    inspect.getsource(observe) + "\nimport json as _json\n"
    "print('OBSERVED', _json.dumps(observe(get_ipython()._gpusession_magics.manager)))"
)


def observed(text: str) -> dict:
    found = re.search(r"^OBSERVED (.*)$", text, re.M)
    assert found, text
    return json.loads(found.group(1))


def clean_env(tmp_path: Path, **env_settings) -> dict[str, str]:
    """The test process's environment without GPUSESSION_* and with a private IPYTHONDIR."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUSESSION_")}
    env["IPYTHONDIR"] = str(tmp_path / "ipython")
    env["PYTHONUNBUFFERED"] = "1"
    env["GPUSESSION_HOME"] = str(tmp_path / "home")
    for name, value in env_settings.items():
        env[ENV_VARS[name]] = str(value)
    return env


def write_ipython_config(env: dict[str, str], values: dict) -> None:
    profile = Path(env["IPYTHONDIR"]) / "profile_default"
    profile.mkdir(parents=True, exist_ok=True)
    lines = ["c = get_config()  # noqa"] + [f"c.{qualified(k)} = {v!r}" for k, v in values.items()]
    (profile / "ipython_config.py").write_text("\n".join(lines) + "\n")


def ipython(
    env: dict[str, str], code: str, *flags: str, timeout: float = 120
) -> subprocess.CompletedProcess:
    """Terminal IPython, as in `ipython --GpuSessionConfig.default_type=a10g -c ...`."""
    return subprocess.run(
        [IPYTHON, "--no-banner", "--colors=nocolor", *flags, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=env["IPYTHONDIR"].rsplit("/", 1)[0],
    )


@pytest.fixture
def kernel_factory(tmp_path):
    kernels: list[NotebookKernel] = []

    def make(env: dict[str, str]) -> NotebookKernel:
        nk = NotebookKernel(env, cwd=str(tmp_path))
        kernels.append(nk)
        return nk

    yield make
    for nk in kernels:
        nk.close()


# --- the configuration reference stays true ---------------------------------------------------------------


def test_configuration_reference_lists_every_setting_with_its_env_var():
    table = (ROOT / "docs" / "reference" / "configuration.md").read_text()
    rows = dict(re.findall(r"^\| `c\.(\w+\.\w+)` \| `(\w+)` \|", table, re.M))
    # the core's, and each backend's own (AwsBackend.image too, which the tables here leave out)
    assert {qualified(name): var for name, var in ENV_VARS.items()}.items() <= rows.items()
    assert set(GpuSessionConfig.class_trait_names(config=True)) == set(CORE)
    for name in CORE:
        var = ENV_VARS[name]
        help_text = GpuSessionConfig.class_traits()[name].help
        assert var in help_text, f"{name}'s help must name {var}"
        assert "empty" in help_text or " 0 " in help_text or "0 makes" in help_text, (
            f"{name}: what empty/0 means"
        )


# --- env vars: each sets the default, config overrides it ----------------------------------


@pytest.fixture
def no_env(monkeypatch):
    for var in ENV_VARS.values():
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


def _observe_with(config: dict) -> dict:
    manager = SessionManager(GpuSessionConfig(config=Config(as_config(config))))
    try:
        return observe(manager)
    finally:
        manager.close()


@pytest.mark.parametrize("name", list(ENV_VARS))
def test_env_var_sets_the_default_and_config_overrides_it(name, tmp_path, no_env):
    env, cfg = env_values(tmp_path), config_values(tmp_path)
    # so that observing needs no Docker engine and writes only under tmp_path
    others = {"data_dir": str(tmp_path / "home"), "default_backend": "local"}
    others.pop(name, None)
    no_env.setenv(ENV_VARS[name], str(env[name]))
    assert _observe_with(others)[name] == effective(env)[name]
    assert _observe_with({**others, name: cfg[name]})[name] == effective(cfg)[name]


def test_built_in_defaults(tmp_path, no_env):
    import platformdirs

    config = GpuSessionConfig()
    assert config.data_dir == platformdirs.user_data_dir("gpusession", appauthor=False)
    assert config.default_backend == ""  # docker when an engine answers, else local
    found = _observe_with({"data_dir": str(tmp_path / "home"), "default_backend": "local"})
    assert found["default_type"] == "t4:1" and found["default_idle"] == 1800
    assert found["price_per_hour"] == pytest.approx(0.526)  # the catalog's on-demand t4 rate
    assert found["docker_image"] == BUILTIN_IMAGE


def test_empty_means_the_built_in_value(tmp_path, no_env):
    for name in ("default_type", "default_idle", "docker_image", "data_dir"):
        no_env.setenv(ENV_VARS[name], "")
    config = GpuSessionConfig(config=Config(as_config({"default_type": "", "docker_image": ""})))
    manager = SessionManager(config)
    assert (
        config.default_type,
        config.default_idle,
        manager.backend("docker").setting("image"),
    ) == (
        "t4",
        "30m",
        BUILTIN_IMAGE,
    )
    assert config.data_dir.endswith("gpusession")
    config.price_per_hour = 0
    assert config.price_per_hour == 0  # free, not the catalog rate


@pytest.mark.parametrize(
    "var, value, name",
    [
        ("GPUSESSION_IDLE", "abc", "default_idle"),
        ("GPUSESSION_PRICE_PER_HOUR", "abc", "price_per_hour"),
        ("GPUSESSION_PRICE_PER_HOUR", "-2", "price_per_hour"),
        ("GPUSESSION_TYPE", "t5", "default_type"),
        ("GPUSESSION_NVML_REPLAY", "/no/such/recording.json", "nvml_replay"),
    ],
)
def test_a_bad_env_var_is_an_error_naming_it_when_read(var, value, name, no_env):
    no_env.setenv(var, value)
    config = GpuSessionConfig()  # building it is fine: nothing reads env at import or construction
    with pytest.raises(ConfigError, match=f"environment variable {var}={value!r}"):
        getattr(config, name)
    with pytest.raises(ConfigError, match=var):
        config.check()
    good = {
        "default_idle": "5m",
        "price_per_hour": 0.5,
        "default_type": "l4",
        "nvml_replay": str(DATA / "nvml_two_t4.json"),
    }[name]
    assert (
        getattr(GpuSessionConfig(config=Config({"GpuSessionConfig": {name: good}})), name) == good
    )


@pytest.mark.integration
def test_the_replay_switch_charts_a_local_session_labelled_recorded(tmp_path, no_env):
    """GPUSESSION_NVML_REPLAY (scripts/demo.sh sets it): a local session's GPU values are the
    recording's, and the words say "recorded"; a docker session keeps its real GPUs."""
    from gpusession.words.status import RECORDED_WORDS, status_lines

    no_env.setenv("GPUSESSION_HOME", str(tmp_path / "home"))
    no_env.setenv("GPUSESSION_NVML_REPLAY", str(DATA / "nvml_two_t4.json"))
    manager = SessionManager()
    try:
        assert "nvml_replay" not in manager.make_spec("t4", backend="docker").extra
        session = manager.start(manager.make_spec("t4", backend="local", idle="off"))
        try:
            deadline = time.monotonic() + 20
            while not (stats := manager.stats.fetch(session.id))["samples"]:
                assert time.monotonic() < deadline, stats
                time.sleep(0.2)
            assert stats["source"] == "recorded"
            lines = status_lines(stats)
            assert lines[0] == f"  {RECORDED_WORDS}", lines
            assert any(line.startswith("  GPU 0 Tesla T4: Util ") for line in lines), lines
        finally:
            manager.stop(session.id)
    finally:
        manager.close()


@pytest.mark.integration
def test_bad_env_vars_do_not_break_imports(tmp_path):
    env = clean_env(tmp_path)
    env.update(GPUSESSION_IDLE="abc", GPUSESSION_PRICE_PER_HOUR="abc", GPUSESSION_TYPE="t5")
    r = subprocess.run(
        [
            sys.executable,
            "-c",
            "import gpusession.faces.magics, gpusession.server, gpusession.faces.cli",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize(
    "name, value, needle",
    [
        ("default_idle", "abc", "GpuSessionConfig.default_idle: bad idle timeout 'abc'"),
        ("default_type", "t5", "GpuSessionConfig.default_type: unknown GPU type 't5'"),
        ("price_per_hour", -3, "GpuSessionConfig.price_per_hour: must be -1"),
    ],
)
def test_a_bad_config_value_names_the_setting(name, value, needle, no_env):
    with pytest.raises(ConfigError, match=re.escape(needle)):
        GpuSessionConfig(config=Config({"GpuSessionConfig": {name: value}}))


def test_cli_reads_env_vars_and_names_a_bad_one(tmp_path, no_env, capsys):
    from gpusession.faces import cli

    no_env.setenv("GPUSESSION_HOME", str(tmp_path / "cli-home"))
    assert cli.main(["list"]) == 0
    assert (tmp_path / "cli-home" / "sessions.sqlite3").exists()
    no_env.setenv("GPUSESSION_IDLE", "abc")
    capsys.readouterr()
    assert cli.main(["start", "--backend", "local", "--type", "t4"]) == 1
    err = capsys.readouterr().err.strip()
    assert (
        err.startswith("gpusession start: environment variable GPUSESSION_IDLE='abc'")
        and "\n" not in err
    )
    assert Store(tmp_path / "cli-home" / "sessions.sqlite3").list() == []


# --- IPython --------------------------------------------------------------------------------


@pytest.mark.integration
def test_ipython_config_file_sets_every_setting_over_the_env(tmp_path, kernel_factory):
    env = clean_env(tmp_path, **env_values(tmp_path))
    write_ipython_config(env, config_values(tmp_path))
    nk = kernel_factory(env)  # a notebook kernel reads ipython_config.py from IPYTHONDIR
    r = nk.run("%load_ext gpusession")
    assert r.status == "ok" and not r.text, r.text
    assert observed(nk.run(PROBE).text) == effective(config_values(tmp_path))


@pytest.mark.integration
def test_percent_config_after_loading_applies_to_the_next_start(tmp_path, kernel_factory):
    env = clean_env(tmp_path, **env_values(tmp_path))
    cfg = config_values(tmp_path)
    nk = kernel_factory(env)
    assert nk.run("%load_ext gpusession").status == "ok"
    assert nk.run(f"%config GpuSessionConfig.data_dir = {cfg['data_dir']!r}").status == "ok"
    assert "no sessions yet" in nk.run("%gpu list").text  # the manager and its store exist now
    for name, value in cfg.items():
        if name != "data_dir":
            r = nk.run(f"%config {qualified(name)} = {value!r}")
            assert r.status == "ok" and not r.text, r.text
    assert nk.run("%config GpuSessionConfig.default_idle").text.strip() == "'7m'"
    assert observed(nk.run(PROBE).text) == effective(cfg)
    # the store is open: a new data_dir is refused with a message, nothing changes
    refused = nk.run(f"%config GpuSessionConfig.data_dir = {str(tmp_path / 'elsewhere')!r}")
    assert "already keeps its sessions in" in refused.text and cfg["data_dir"] in refused.text
    bad = nk.run("%config GpuSessionConfig.default_idle = 'abc'")
    assert "GpuSessionConfig.default_idle: bad idle timeout 'abc'" in bad.text
    assert observed(nk.run(PROBE).text) == effective(cfg)


@pytest.mark.integration
def test_a_bad_env_var_in_a_notebook_is_one_message_and_config_can_override_it(
    tmp_path, kernel_factory
):
    env = clean_env(tmp_path, default_backend="local")
    env["GPUSESSION_IDLE"] = "abc"
    nk = kernel_factory(env)
    loaded = nk.run("%load_ext gpusession")
    assert loaded.status == "ok" and "GPUSESSION_IDLE='abc'" in loaded.text
    r = nk.run("%gpu start --type t4")
    assert r.status == "error" and r.error["ename"] == "UsageError"
    assert "environment variable GPUSESSION_IDLE='abc'" in r.error["evalue"]
    assert len(r.error["traceback"]) <= 2, "a message, not a traceback"
    nk.run("%config GpuSessionConfig.default_idle = '5m'")
    assert observed(nk.run(PROBE).text)["default_idle"] == 300


def test_a_bad_value_in_ipython_config_fails_loading_with_one_message(tmp_path):
    env = clean_env(tmp_path)
    write_ipython_config(env, {"default_idle": "abc"})
    r = ipython(env, "%load_ext gpusession")
    assert (
        "UsageError: gpusession: GpuSessionConfig.default_idle: bad idle timeout 'abc'"
        in r.stderr + r.stdout
    )
    assert "Traceback" not in r.stderr + r.stdout


def test_command_line_flags_start_an_a10g_with_a_7m_idle_timeout(tmp_path):
    """The issue's reproduction, end to end: a real session on the local backend."""
    env = clean_env(tmp_path)
    r = ipython(
        env,
        "%load_ext gpusession\n%gpu start --backend local\n%gpu status\n%gpu stop",
        "--GpuSessionConfig.default_type=a10g",
        "--GpuSessionConfig.default_idle=7m",
    )
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "a10g-1: 1 x a10g on local - running" in out
    assert re.search(r"idle \S+ of 7m00s: stops in", out), out
    assert "stopped a10g-1" in out
    (record,) = Store(tmp_path / "home" / "sessions.sqlite3").list()
    assert (record.spec.gpu_type, record.spec.idle, record.state) == (
        "a10g",
        420,
        State.STOPPED,
    )


# --- jupyter server --------------------------------------------------------------------------


@pytest.fixture
def server_case() -> str:
    """What the server is given: "config" (GpuSessionConfig in its config, over env vars), "file"
    (the same in jupyter_server_config.py), "env", "bad-env" or "none"."""
    return "none"


@pytest.fixture
def jp_server_config(gs_home, server_case, tmp_path, jp_config_dir, monkeypatch):
    """The server's config and environment."""
    env = {
        "config": _as_env(env_values(tmp_path)),
        "file": _as_env(env_values(tmp_path)),
        "env": _as_env(env_values(tmp_path)),
        "bad-env": {"GPUSESSION_IDLE": "abc"},
    }.get(server_case, {})
    for var in ENV_VARS.values():
        if var != "GPUSESSION_HOME":
            monkeypatch.delenv(var, raising=False)
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    settings = config_values(tmp_path) if server_case == "config" else {}
    if server_case == "file":  # JUPYTER_CONFIG_DIR is jp_config_dir while the server starts
        lines = ["c = get_config()  # noqa"] + [
            f"c.{qualified(k)} = {v!r}" for k, v in config_values(tmp_path).items()
        ]
        (jp_config_dir / "jupyter_server_config.py").write_text("\n".join(lines) + "\n")
    return {"ServerApp": {"jpserver_extensions": {"gpusession": True}}, **as_config(settings)}


def _server_manager(jp_serverapp):
    return jp_serverapp.web_app.settings["gpusession_api"].manager


def _as_env(values: dict) -> dict[str, str]:
    return {ENV_VARS[k]: str(v) for k, v in values.items()}


async def _fetch(jp_fetch, *path, **kwargs):
    r = await jp_fetch("gpusession", "api", *path, **kwargs)
    return r.code, json.loads(r.body)


@pytest.mark.integration
@pytest.mark.parametrize("server_case", ["config", "file"])
async def test_server_config_sets_every_setting_over_the_env(jp_serverapp, jp_fetch, tmp_path):
    cfg = config_values(tmp_path)
    manager = _server_manager(jp_serverapp)
    assert manager.config.parent is jp_serverapp
    assert observe(manager) == effective(cfg)

    # what the REST API does with it: a start that names no backend or idle uses the config
    code, view = await _fetch(
        jp_fetch, "sessions", method="POST", body=json.dumps({"type": "t4", "name": "cfg1"})
    )
    assert code == 202
    assert (view["backend"], view["idle"]["timeout_s"], view["price_per_hour"]) == (
        "local",
        420,
        0.25,
    )
    try:
        _, options = await _fetch(jp_fetch, "options")
    except tornado.httpclient.HTTPClientError as exc:
        assert exc.code == 404  # GET options is not there yet
    else:
        text = json.dumps(options)
        assert '"a10g"' in text and '"7m"' in text, text
    deadline = time.monotonic() + 60
    while view["state"] not in ("running", "failed") and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
        _, view = await _fetch(jp_fetch, "sessions", view["id"])
    assert view["state"] == "running", view
    _, stopped = await _fetch(jp_fetch, "sessions", view["id"], method="DELETE")
    assert stopped["state"] == "stopped"
    assert [r.name for r in Store(Path(cfg["data_dir"]) / "sessions.sqlite3").list()] == ["cfg1"]


@pytest.mark.parametrize("server_case", ["env"])
def test_server_reads_env_vars_without_config(jp_serverapp, tmp_path):
    assert observe(_server_manager(jp_serverapp)) == effective(env_values(tmp_path))


@pytest.mark.parametrize(
    "jp_argv", [["--GpuSessionConfig.default_type=a10g", "--GpuSessionConfig.default_idle=7m"]]
)
def test_server_command_line_flags(jp_serverapp, jp_argv):
    config = _server_manager(jp_serverapp).config
    assert (config.default_type, config.default_idle) == ("a10g", "7m")


@pytest.mark.parametrize("server_case", ["bad-env"])
async def test_server_with_a_bad_env_var_says_which_on_start(jp_fetch):
    with pytest.raises(tornado.httpclient.HTTPClientError) as exc:
        await _fetch(
            jp_fetch, "sessions", method="POST", body=json.dumps({"type": "t4", "backend": "local"})
        )
    assert (
        "environment variable GPUSESSION_IDLE='abc'"
        in json.loads(exc.value.response.body)["message"]
    )


def test_the_cli_env_config_reads_every_setting_as_the_traitlets_one_does(tmp_path, monkeypatch):
    # the CLI builds its manager on settings.EnvConfig (no traitlets.config to import): the same
    # settings, from the same env vars, with the same values
    from gpusession.configuration.settings import ENV_SETTINGS, EnvConfig

    assert {name: var for name, (var, _, _) in ENV_SETTINGS.items()} == {
        name: ENV_VARS[name] for name in CORE
    }
    assert set(ENV_SETTINGS) == set(GpuSessionConfig().trait_names(config=True))
    for name, value in env_values(tmp_path).items():
        monkeypatch.setenv(ENV_VARS[name], str(value))
    ours, traits = EnvConfig(), GpuSessionConfig()
    assert {n: getattr(ours, n) for n in ENV_SETTINGS} == {
        n: getattr(traits, n) for n in ENV_SETTINGS
    }
    # and each backend's own settings, read from the env vars alike
    on_env, on_traits = SessionManager(ours), SessionManager(traits)
    for name, (backend, trait) in SECTIONS.items():
        backend = {"DockerBackend": "docker", "AwsBackend": "aws"}[backend]
        assert on_env.backend(backend).setting(trait) == on_traits.backend(backend).setting(trait)
    assert ours.data_path == Path(tmp_path / "env-home") and ours.data_path.is_dir()


def test_a_backends_setting_under_its_earlier_name_still_applies(tmp_path, no_env):
    """c.GpuSessionConfig.docker_image and .regions were the core's before the docker and aws
    backends owned them (issue 31): a config file that still says so is read, with a line to
    rename it; the backend's own section wins over it."""
    no_env.setenv("GPUSESSION_HOME", str(tmp_path / "home"))
    old = {"GpuSessionConfig": {"docker_image": "old/img:1", "regions": "eu-west-1"}}
    manager = SessionManager(GpuSessionConfig(config=Config(old)))
    assert manager.backend("docker").setting("image") == "old/img:1"
    assert manager.backend("aws").setting("regions") == "eu-west-1"
    both = Config({**old, "DockerBackend": {"image": "new/img:2"}})
    assert SessionManager(GpuSessionConfig(config=both)).backend("docker").setting("image") == (
        "new/img:2"
    )
