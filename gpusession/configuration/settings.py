"""The settings as the environment gives them, without traitlets (`traitlets.config` alone costs
a `gpusession list` a fifth of its time): the parsers and built-in values `GpuSessionConfig` uses
for its defaults and checks, and `EnvConfig`, the same settings read from the GPUSESSION_* env
vars only, which is all the `gpusession` CLI reads."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import tempfile
from pathlib import Path
from typing import Any, Callable, TypeVar

from traitlets import TraitError

from ..core.datahome import HOME_ENV, builtin_data_dir
from ..core.datahome import data_dir_text as _data_dir
from ..core.durations import (
    IDLE,
    MAX_DOLLARS,
    MAX_RUNTIME,
    RECONNECT,
    format_bound,
    parse_money,
    shown,
)
from ..core.errors import BadInput, GpuSessionError
from ..core.protocol import DEFAULT_IDLE_S
from ..core.textvalues import pools as pools_of
from ..core.wholefiles import write_whole
from .catalog import load_catalog
from .registry import loaded_classes

T = TypeVar("T")

BUILTIN_TYPE = "t4"
BUILTIN_IDLE = format_bound(DEFAULT_IDLE_S)  # "30m"
# PyTorch's own image (runtime: Ubuntu 22.04, CUDA from the wheels) with Python 3.11 in /opt/conda:
# its cu126 build runs on every GPU of the catalog, V100 to H200; half the bytes of the -devel tag,
# which is the one to ask for to build CUDA code (docs/images.md says why, with the figures)
BUILTIN_IMAGE = "pytorch/pytorch:2.7.1-cuda12.6-cudnn9-runtime"
CATALOG_PRICE = -1.0


class ConfigError(GpuSessionError, TraitError):
    """A setting (config file, command line, `%config`) or its env var has a bad value.

    A TraitError, so traitlets rolls back a `%config` line that carries it and IPython prints the
    message; a GpuSessionError, so the faces show it as one line."""


def _from_env(var: str, parse: Callable[[str], T], builtin: T) -> T:
    """The env var's value through `parse`, or `builtin` when it is unset or empty."""
    raw = os.environ.get(var, "").strip()
    if not raw:
        return builtin
    try:
        return parse(raw)
    except (BadInput, ValueError) as exc:
        raise ConfigError(f"environment variable {var}={shown(raw)}: {exc}") from None


def _gpu_type(text: str) -> str:
    load_catalog().parse(text)  # BadInput names the valid types
    return text.strip().lower()


def _idle(text: str) -> str:
    IDLE.parse(text)
    return text.strip()


def _price(text: str | float) -> float:
    try:
        value = float(str(text).strip().lstrip("$"))
    except ValueError:
        raise BadInput(f"not a number of dollars per hour: {shown(text)}") from None
    if not math.isfinite(value) or value > MAX_DOLLARS:
        raise BadInput(
            f"must be a finite number of dollars per hour, at most ${MAX_DOLLARS:,.0f}, got {shown(text)}"
        )
    if value < 0 and value != CATALOG_PRICE:
        raise BadInput(
            f"must be -1 (the catalog's rate) or at least 0 dollars per hour, got {shown(text)}"
        )
    return value


def _budget(text: str | float) -> float:
    """A monthly budget in dollars ("200", "$200"); 0 or "off": none."""
    return parse_money(text, what="monthly budget") or 0.0


_SAID_OPEN: set[str] = set()  # data folders whose openness was said already (once per process)


def data_folder(path: str | os.PathLike[str]) -> Path:
    """The data folder, created 0700 (it holds session keys, kernel keys and API tokens: another
    user on a shared machine must read nothing there). ConfigError, one line naming the folder and
    what to do, when it cannot be: a file in its place or its path, a read-only place."""
    p = Path(path)
    try:
        p.mkdir(mode=0o700, parents=True, exist_ok=True)
        mode = p.stat().st_mode & 0o777
    except OSError as exc:
        raise data_folder_error(p, exc) from None
    if (
        mode & 0o077 and str(p) not in _SAID_OPEN
    ):  # left as it is (its owner may have meant it), said once
        _SAID_OPEN.add(str(p))
        logging.getLogger("gpusession").warning(
            "gpusession: your data folder %s is open to other users on this machine (mode %03o): they may "
            "read your sessions' keys and tokens there. Close it with: chmod 700 %s",
            p,
            mode,
            p,
        )
    return p


def data_folder_error(path: Path, exc: OSError | Exception) -> ConfigError:
    """The one line for a data folder that cannot hold the session store."""
    if isinstance(exc, (FileExistsError, NotADirectoryError)):
        why = "a file is in the way"
    else:
        why = (getattr(exc, "strerror", None) or str(exc)).rstrip(".").lower()
    return ConfigError(
        f"cannot keep sessions in {path} ({why}): set GPUSESSION_HOME (or GpuSessionConfig.data_dir) "
        "to a folder you can write"
    )


# name -> (env var, parse, built-in): each setting's default, as GpuSessionConfig's @default reads it
def _recording(text: str) -> str:
    """A recording of raw NVML values for the agent's labelled replay (--nvml-replay): a file."""
    path = Path(text).expanduser().resolve()
    if not path.is_file():
        raise BadInput(
            f"no recording of NVML values at {path}: name a file `python -m gpusession.agent "
            "nvml-record` wrote (tests/data/nvml_two_t4.json in a source checkout), or unset it"
        )
    return str(path)


CUT_SWITCH_CHOICES = ("ask", "keep-old")


def _cut_switch(text: str) -> str:
    """What becomes of a switch whose driving process died while both sessions run."""
    value = text.strip().lower()
    if value not in CUT_SWITCH_CHOICES:
        raise BadInput(
            f"must be 'ask' (both keep running, every face says so) or 'keep-old' (the new "
            f"session is stopped, the old one keeps the variables), got {shown(text)}"
        )
    return value


ENV_SETTINGS: dict[str, tuple[str, Callable[[str], object], Callable[[], object]]] = {
    "data_dir": (HOME_ENV, _data_dir, builtin_data_dir),
    "default_backend": ("GPUSESSION_BACKEND", lambda s: s.lower(), lambda: ""),
    "default_type": ("GPUSESSION_TYPE", _gpu_type, lambda: BUILTIN_TYPE),
    "default_idle": ("GPUSESSION_IDLE", _idle, lambda: BUILTIN_IDLE),
    "price_per_hour": ("GPUSESSION_PRICE_PER_HOUR", _price, lambda: CATALOG_PRICE),
    "monthly_budget": ("GPUSESSION_MONTHLY_BUDGET", _budget, lambda: 0.0),
    "nvml_replay": ("GPUSESSION_NVML_REPLAY", _recording, lambda: ""),
    "cut_switch": ("GPUSESSION_CUT_SWITCH", _cut_switch, lambda: "ask"),
}


RECONNECT_ENV = "GPUSESSION_RECONNECT_TIMEOUT"
RECONNECT_DEFAULT_S = 60.0


def reconnect_give_up() -> float | None:
    """How long a dropped tunnel may stay down before a waiting cell ends (seconds; None: never):
    GPUSESSION_RECONNECT_TIMEOUT in the duration grammar (90s, 2m; a bare number is minutes).
    No trait: it is the tunnel's, read by every process that opens one; `check_env` reads it
    before a start, so a bad value starts nothing."""
    return _from_env(RECONNECT_ENV, RECONNECT.parse, RECONNECT_DEFAULT_S)


def check_env() -> None:
    """Read the settings that are env vars only (no trait); ConfigError names a bad one."""
    reconnect_give_up()


#: the user's own settings, written by `gpusession setup`: one JSON object, read by every face
#: (the CLI, the magics, the server) under the env vars and over the built-in values
USER_SETTINGS_ENV = "GPUSESSION_SETTINGS"
USER_SETTINGS_KEYS = ("default_backend", "default_host")  # what setup writes


def user_settings_path() -> Path:
    """GPUSESSION_SETTINGS, else $XDG_CONFIG_HOME/gpusession/settings.json (~/.config/...)."""
    named = os.environ.get(USER_SETTINGS_ENV, "").strip()
    if named:
        return Path(named).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME", "").strip() or str(Path.home() / ".config")
    return Path(base) / "gpusession" / "settings.json"


def user_settings() -> dict[str, str]:
    """The user's settings file, {} when there is none; ConfigError naming it when unreadable."""
    path = user_settings_path()
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        why = getattr(exc, "strerror", None) or str(exc)
        raise ConfigError(
            f"your gpusession settings {path} cannot be read ({why}): fix or remove it, or run "
            "`gpusession setup` again"
        ) from None
    if not isinstance(raw, dict):
        raise ConfigError(f"your gpusession settings {path} must hold a JSON object: remove it")
    return {k: str(v) for k, v in raw.items() if k in USER_SETTINGS_KEYS}


def write_user_settings(values: dict[str, str]) -> Path:
    """Merge `values` into the user's settings file (made 0600); returns its path."""
    path = user_settings_path()
    merged = dict(user_settings(), **values)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_whole(path, json.dumps(merged, indent=2, sort_keys=True) + "\n")  # 0600
    return path


HOST_ENV = "GPUSESSION_HOST"


def default_host_for(backend: str) -> str:
    """The --host a start on `backend` takes when the backend was not named (the default place
    `gpusession setup` chose: a remote engine, a login node): GPUSESSION_HOST, else the settings
    file's default_host when its default_backend is that backend; '' for none. No trait: it goes
    with the default backend, which a face's own setting may change."""
    named = os.environ.get(HOST_ENV, "").strip()
    if named:
        return _checked_host(named, HOST_ENV)
    mine = user_settings()
    if mine.get("default_backend", "").strip().lower() != backend or not mine.get("default_host"):
        return ""
    return _checked_host(mine["default_host"], str(user_settings_path()))


def _checked_host(text: str, where: str) -> str:
    from ..core.textvalues import ssh_host

    try:
        return ssh_host(text)
    except BadInput as exc:
        raise ConfigError(f"{where}: default_host: {exc}") from None


def env_setting(name: str):
    """Setting `name` from its env var, else the user's settings file (`gpusession setup`), else
    its built-in value; ConfigError names a bad var or file."""
    var, parse, builtin = ENV_SETTINGS[name]
    if not os.environ.get(var, "").strip() and name in USER_SETTINGS_KEYS:
        mine = user_settings().get(name, "").strip()
        if mine:
            try:
                return parse(mine)
            except (BadInput, ValueError) as exc:
                raise ConfigError(f"{user_settings_path()}: {name}: {exc}") from None
    return _from_env(var, parse, builtin())


def env_origin(name: str) -> str:
    """'env' when the setting's GPUSESSION_ variable is set (not empty), else 'default'."""
    return "env" if os.environ.get(ENV_SETTINGS[name][0], "").strip() else "default"


def env_var(name: str) -> str:
    """The environment variable a setting is read from (monthly_budget: GPUSESSION_MONTHLY_BUDGET)."""
    return ENV_SETTINGS[name][0]


class EnvConfig:
    """GpuSessionConfig's settings from the env vars alone (no config files, no traitlets), each
    read when first asked, as a trait default is: what the CLI gives a SessionManager."""

    read_by = "cli"  # which process reads these settings (GpuSessionConfig.read_by)

    def origin(self, name: str) -> str:
        """Where a setting's value comes from: 'env' or 'default' (GpuSessionConfig.origin)."""
        return env_origin(name)

    def __getattr__(self, name: str):
        if name not in ENV_SETTINGS:
            raise AttributeError(name)
        value = env_setting(name)
        setattr(self, name, value)
        return value

    def check(self) -> None:
        for name in sorted(ENV_SETTINGS):
            getattr(self, name)
        check_env()

    @property
    def data_path(self) -> Path:
        return data_folder(self.data_dir)


def private_socket_dir(prefix: str = "gpusession-") -> str:
    """A new 0700 folder for a session's unix sockets, in the user's runtime folder
    ($XDG_RUNTIME_DIR) or the temp folder: short paths (a socket's path has at most 107 bytes),
    and only this user may connect to what listens there. The caller removes it."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    return tempfile.mkdtemp(
        prefix=prefix, dir=runtime if runtime and os.path.isdir(runtime) else None
    )


# -- an administrator's policy (docs/cost.md): bounds a user's settings cannot loosen ----------

POLICY_ENV = "GPUSESSION_POLICY"
POLICY_FILE = "gpusession_policy.json"


@dataclasses.dataclass(frozen=True)
class Policy:
    """The bounds of one policy file. None: no bound of that kind."""

    path: str  # the file, named in every refusal and note
    max_idle_s: float | None = None  # the longest idle timeout ("off" is refused)
    max_runtime_s: float | None = None  # the longest --max-runtime (none given: this one)
    max_cost: float | None = None  # the largest --max-cost, dollars (none given: this one)
    allowed_types: tuple[str, ...] | None = None  # catalog names
    allowed_backends: tuple[str, ...] | None = None
    allowed_regions: tuple[str, ...] | None = None
    # pools of boxes every user of the policy gets (`--host pool:NAME`), over a user's own of the
    # same name: {"lab": ("ssh://gpu1", "ssh://gpu2")}
    pools: dict[str, tuple[str, ...]] | None = None
    monthly_cap: float | None = None  # dollars a user may spend in a calendar month (UTC)
    # stop running sessions (saving their workspace) once monthly_cap is spent; false: they are
    # only warned, as a user's own budget does
    stop_at_monthly_cap: bool = False

    # (field of the option table, spec attribute, policy attribute) of the upper bounds
    _LIMITS = (
        ("idle", "idle", "max_idle_s"),
        ("max_runtime", "max_runtime", "max_runtime_s"),
        ("max_cost", "max_cost", "max_cost"),
    )

    def bound(self, spec, given: set[str]) -> tuple[dict[str, str], list[dict[str, Any]]]:
        """Apply the policy to a LaunchSpec: (problems, bounds). problems: field -> why it is
        refused (an option the user gave beyond a bound, a type, backend or region not allowed);
        bounds: the limits the policy put in where the user gave none (or the default was
        looser), as data {"field", "limit", "policy"}, and set on `spec`."""
        problems: dict[str, str] = {}
        bounds: list[dict[str, Any]] = []
        for name, attr, limit_attr in self._LIMITS:
            limit = getattr(self, limit_attr)
            value = getattr(spec, attr)
            if limit is None or (value is not None and value <= limit):
                continue
            if name in given:  # what the user asked for is refused, in one line naming the file
                most = f"${limit:,.2f}" if name == "max_cost" else format_bound(limit)
                problems[name] = f"your policy ({self.path}) allows at most {most}" + (
                    "" if value is not None else " (off is not allowed)"
                )
            else:
                setattr(spec, attr, limit)
                bounds.append({"field": name, "limit": limit, "policy": self.path})
        for name, value, allowed in (
            ("type", spec.gpu_type, self.allowed_types),
            ("backend", spec.backend, self.allowed_backends),
            ("region", spec.extra.get("region"), self.allowed_regions),
        ):
            if allowed is not None and value is not None and value not in allowed:
                problems[name] = (
                    f"your policy ({self.path}) allows only {', '.join(allowed)}, not {shown(value)}"
                )
        return problems, bounds


def _policy_path() -> str | None:
    """GPUSESSION_POLICY, else the first gpusession_policy.json in Jupyter's environment and
    system config folders (not the user's: a user's file cannot loosen the policy)."""
    named = os.environ.get(POLICY_ENV, "").strip()
    if named:
        return named
    try:
        from jupyter_core.paths import ENV_CONFIG_PATH, SYSTEM_CONFIG_PATH

        folders = [*ENV_CONFIG_PATH, *SYSTEM_CONFIG_PATH]
    except ImportError:  # the CLI without Jupyter: the usual system folders
        folders = ["/usr/local/etc/jupyter", "/etc/jupyter"]
    for folder in folders:
        path = os.path.join(folder, POLICY_FILE)
        if os.path.isfile(path):
            return path
    return None


def load_policy() -> Policy | None:
    """The policy in force, read now (an administrator may change it at any time); None when
    there is none. ConfigError, one line naming the file, when it cannot be used."""
    path = _policy_path()
    if path is None:
        return None
    try:
        with open(path) as f:
            raw = json.load(f)
        if not isinstance(raw, dict):
            raise BadInput("it must hold a JSON object")
        unknown = sorted(set(raw) - _POLICY_KEYS)
        if unknown:
            raise BadInput(
                f"unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(_POLICY_KEYS))}"
            )
        values = _PolicyValues(raw)
        return Policy(
            path=path,
            max_idle_s=values.duration("max_idle", IDLE),
            max_runtime_s=values.duration("max_runtime", MAX_RUNTIME),
            max_cost=values.money("max_cost"),
            allowed_types=values.names("allowed_types"),
            allowed_backends=values.names("allowed_backends"),
            allowed_regions=values.names("allowed_regions"),
            pools=values.pools("pools"),
            monthly_cap=values.money("monthly_cap"),
            stop_at_monthly_cap=values.flag("stop_at_monthly_cap"),
        )
    except (OSError, ValueError, BadInput) as exc:
        why = getattr(exc, "strerror", None) or str(exc)
        raise ConfigError(
            f"the gpusession policy {path} cannot be used ({why}); ask your administrator "
            f"(it is named by {POLICY_ENV} or found in Jupyter's system config folder)"
        ) from None


class _PolicyValues:
    """A policy file's values read by kind; BadInput naming the key when one is not of its kind."""

    def __init__(self, raw: dict[str, Any]):
        self.raw = raw

    def names(self, key: str) -> tuple[str, ...] | None:
        value = self.raw.get(key)
        if value is None:
            return None
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise BadInput(f"{key} must be a list of names")
        return tuple(v.strip().lower() for v in value)

    def pools(self, key: str) -> dict[str, tuple[str, ...]] | None:
        value = self.raw.get(key)
        if value is None:
            return None
        if not isinstance(value, dict):
            raise BadInput(f'{key} must be an object, e.g. {{"lab": ["ssh://gpu1"]}}')
        read = pools_of(json.dumps(value))
        return {name: tuple(boxes) for name, boxes in read.items()}

    def money(self, key: str) -> float | None:
        return None if self.raw.get(key) is None else parse_money(self.raw[key], what=key)

    def flag(self, key: str) -> bool:
        value = self.raw.get(key, False)
        if not isinstance(value, bool):
            raise BadInput(f"{key} must be true or false")
        return value

    def duration(self, key: str, rule) -> float | None:
        try:
            return None if self.raw.get(key) is None else rule.parse(self.raw[key])
        except BadInput as exc:
            raise BadInput(f"{key}: {exc}") from None


_POLICY_KEYS = {
    "max_idle",
    "max_runtime",
    "max_cost",
    "allowed_types",
    "allowed_backends",
    "allowed_regions",
    "pools",
    "monthly_cap",
    "stop_at_monthly_cap",
}


# -- a backend's own settings (a section of its own: c.DockerBackend.image) ---------------------


@dataclasses.dataclass(frozen=True)
class Setting:
    """One setting a backend declares (`Backend.settings`), as GpuSessionConfig's traits are
    written: `c.<its class name>.<name>` in a config file or `%config`, else its env var (the one
    source the CLI reads), else the built-in value. `parse` reads and checks a value (BadInput
    says what is wrong); `legacy`: the GpuSessionConfig trait that held it before it was the
    backend's, still read (below this section) from a config file that sets it."""

    name: str
    env: str
    default: Any
    help: str  # units, what empty means; the env var and the default are added
    parse: Callable[[str], Any] = str
    legacy: str | None = None

    @property
    def full_help(self) -> str:
        shown_default = repr(self.default) if self.default not in ("", None) else "empty"
        return f"{self.help} Default: env {self.env}, else {shown_default}."


def _checked_setting(owner: str, setting: Setting, value: Any) -> Any:
    if isinstance(value, str) and not value.strip():
        return setting.default
    try:
        return setting.parse(value)
    except (BadInput, ValueError) as exc:
        raise ConfigError(f"{owner}.{setting.name}: {exc}") from None


_SECTIONS: dict[tuple[str, tuple[Setting, ...]], type] = {}


def section_class(owner: str, settings: tuple[Setting, ...]) -> type:
    """The traitlets Configurable of a backend's settings, named as its class (`owner`), so that
    `c.<owner>.<name>` (config files, the command line, `%config`) reaches it: one Unicode trait
    per setting, its default read from the env var when first asked (as GpuSessionConfig's)."""
    key = (owner, settings)
    if key in _SECTIONS:
        return _SECTIONS[key]
    from traitlets import Unicode, default, validate
    from traitlets.config import Configurable

    body: dict[str, Any] = {"__doc__": f"`c.{owner}.<name> = ...`: the {owner}'s own settings."}
    for s in settings:
        body[s.name] = Unicode(str(s.default), help=s.full_help).tag(config=True)

        def env_or_legacy(self, s=s):
            legacy = _legacy_value(self, s)
            return legacy if legacy is not None else _from_env(s.env, s.parse, s.default)

        body[f"_default_{s.name}"] = default(s.name)(env_or_legacy)
        body[f"_check_{s.name}"] = validate(s.name)(
            lambda self, proposal, s=s: _checked_setting(owner, s, proposal.value)
        )
    cls = type(owner, (Configurable,), body)
    _SECTIONS[key] = cls
    return cls


def _legacy_value(section, setting: Setting) -> Any:
    """A value a config file gives under the setting's earlier name (GpuSessionConfig.x)."""
    if not setting.legacy:
        return None
    old_section, _, old_name = setting.legacy.partition(".")
    found = section.config.get(old_section, {})
    if old_name not in found:
        return None
    logging.getLogger("gpusession").warning(
        "c.%s is now c.%s.%s (the setting belongs to its backend): please rename it",
        setting.legacy,
        type(section).__name__,
        setting.name,
    )
    return _checked_setting(type(section).__name__, setting, found[old_name])


def setting_value(owner: str, settings: tuple[Setting, ...], name: str, config: Any) -> Any:
    """A backend's setting `name`: from its section where `config` is a traitlets Configurable
    (the section takes `config` as its parent, so the app's config files and command line apply),
    else (the CLI's EnvConfig) from its env var or the built-in value."""
    setting = next(s for s in settings if s.name == name)
    if hasattr(config, "config") and hasattr(config, "parent"):
        return getattr(section_for(owner, settings, config), name)
    return _from_env(setting.env, setting.parse, setting.default)


_INSTANCES: dict[tuple[str, int], Any] = {}


def section_for(owner: str, settings: tuple[Setting, ...], config: Any):
    """The section instance of `owner` under `config` (one per config object, so `%config`'s
    updates to it are what every backend of that config reads)."""
    key = (owner, id(config))
    found = _INSTANCES.get(key)
    if found is None or found.parent is not config:
        found = section_class(owner, settings)(parent=config)
        _INSTANCES[key] = found
    return found


def backend_sections(config: Any) -> list:
    """The settings sections of every registered backend that declares some, under `config` (a
    GpuSessionConfig with its app as parent): what a face registers so `%config` reaches them."""
    return [
        section_for(cls.__name__, cls.settings, config)
        for cls in loaded_classes().values()
        if getattr(cls, "settings", ())
    ]
