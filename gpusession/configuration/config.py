"""User settings: one traitlets `Configurable`, built by each face with the app as parent.

Where a value comes from, strongest first:

1. `%config GpuSessionConfig.<name> = ...` in a running kernel (applies to the next `%gpu start`);
2. the command line (`ipython --GpuSessionConfig.default_idle=7m`, `jupyter lab --GpuSessionConfig...`);
3. the config files (`c.GpuSessionConfig.<name> = ...` in `ipython_config.py` for the magics,
   `jupyter_server_config.py` for the REST API and the JupyterLab panel);
4. the environment variable named in each trait's help (the only source the `gpusession` CLI reads);
5. the built-in default.

Every trait's default comes from its env var through a `@default` method, so anything set through
traitlets overrides the env var. A bad value says which setting or variable was wrong
(`ConfigError`, raised when the value is read or set, never at import).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from traitlets import Float, Unicode, default, validate
from traitlets.config import Configurable

from ..core.errors import BadInput
from .settings import (  # noqa: F401 - ConfigError, EnvConfig and the built-ins are used from here too
    BUILTIN_IDLE,
    BUILTIN_IMAGE,
    BUILTIN_TYPE,
    CATALOG_PRICE,
    ConfigError,
    EnvConfig,
    T,
    _budget,
    _cut_switch,
    _data_dir,
    _gpu_type,
    _idle,
    _price,
    _recording,
    builtin_data_dir,
    check_env,
    data_folder,
    env_origin,
    env_setting,
)


class GpuSessionConfig(Configurable):
    """`c.GpuSessionConfig.<name> = ...` in ipython_config.py (the magics) or
    jupyter_server_config.py (the REST API and panel); env vars set the defaults."""

    # The static defaults are the built-in values: traitlets skips validating a value equal to
    # the static default while it loads config, so that value must already be a valid one.
    data_dir = Unicode(
        builtin_data_dir(),
        help="Folder of the session store (sessions.sqlite3), per-session keys and local session "
        "state. Default: env GPUSESSION_HOME, else the platform's user data dir "
        "(~/.local/share/gpusession); empty means that platform dir. Read once, when the process "
        "first opens the store (in a notebook: the first %gpu command); changing it afterwards is "
        "refused. Give every face (notebooks, server, CLI) the same folder, or they see different "
        "sessions: GPUSESSION_HOME is the one way all of them read.",
    ).tag(config=True)

    default_backend = Unicode(
        "",
        help="Backend used when none is named (%gpu start --backend, POST sessions 'backend'): "
        "the name of a registered backend (`%gpu help start` lists them). Default: env "
        "GPUSESSION_BACKEND; empty means the first registered backend, in their default rank, "
        "that answers (a Docker engine, else this machine).",
    ).tag(config=True)

    default_type = Unicode(
        BUILTIN_TYPE,
        help="GPU type when none is given: a catalog name, optionally with a count (t4, a100:8; "
        "see %gpu types). Default: env GPUSESSION_TYPE, else 't4'; empty means 't4'.",
    ).tag(config=True)

    default_idle = Unicode(
        BUILTIN_IDLE,
        help="Idle timeout when none is given: 90s, 15m, 1h30m, or a bare number of minutes; "
        "'off' (or 0) means never stop on idle. Default: env GPUSESSION_IDLE, else "
        f"'{BUILTIN_IDLE}'; empty means '{BUILTIN_IDLE}'.",
    ).tag(config=True)

    price_per_hour = Float(
        CATALOG_PRICE,
        help="Dollars per hour charged for sessions on your own hardware (every backend that "
        "prices no cloud). -1 uses the catalog's rate of the same GPUs; 0 makes them free. "
        "Default: env GPUSESSION_PRICE_PER_HOUR, else -1.",
    ).tag(config=True)

    monthly_budget = Float(
        0.0,
        help="Dollars this user may spend on sessions in a calendar month (UTC), counted from the "
        "session store as `gpusession report` counts it: at 80% every start warns, at 100% a start "
        "is refused (a running session is warned, never stopped). 0 means no budget. "
        "Default: env GPUSESSION_MONTHLY_BUDGET, else 0.",
    ).tag(config=True)

    nvml_replay = Unicode(
        "",
        help="Charts without a GPU, on purpose (demos, screenshots): every session this process "
        "starts replays the raw NVML values recorded in this file (`python -m gpusession.agent "
        "nvml-record` writes one; tests/data/nvml_two_t4.json in a source checkout) instead of "
        "its machine's GPUs, and every face labels them 'recorded'. A path this machine's agent "
        "can read: the local backend. Default: env GPUSESSION_NVML_REPLAY; empty means off (the "
        "real GPUs).",
    ).tag(config=True)

    cut_switch = Unicode(
        "ask",
        help="What becomes of a switch whose driving process (a notebook, the CLI) died while "
        "both sessions run: 'ask' keeps both running and every face says so in one line, with "
        "which one holds the variables and what to stop; 'keep-old' stops the new session "
        "automatically (the old one keeps the variables). A cut switch whose new session never "
        "answered is always cleaned up (docs/switch.md). Default: env GPUSESSION_CUT_SWITCH, "
        "else 'ask'; empty means 'ask'.",
    ).tag(config=True)

    # set by data_path: the folder this process's store lives in (None until first use)
    _data_dir_in_use: str | None = None

    # -- defaults: the env var, else the built-in ---------------------------------------------

    @default("data_dir")
    def _data_dir_default(self) -> str:
        return env_setting("data_dir")

    @default("default_backend")
    def _backend_default(self) -> str:
        return env_setting("default_backend")

    @default("default_type")
    def _type_default(self) -> str:
        return env_setting("default_type")

    @default("default_idle")
    def _idle_default(self) -> str:
        return env_setting("default_idle")

    @default("monthly_budget")
    def _budget_default(self) -> float:
        return env_setting("monthly_budget")

    @validate("monthly_budget")
    def _check_budget(self, proposal) -> float:
        return self._checked("monthly_budget", _budget, proposal.value, 0.0)

    @default("price_per_hour")
    def _price_default(self) -> float:
        return env_setting("price_per_hour")

    @default("nvml_replay")
    def _replay_default(self) -> str:
        return env_setting("nvml_replay")

    @default("cut_switch")
    def _cut_switch_default(self) -> str:
        return env_setting("cut_switch")

    @validate("cut_switch")
    def _check_cut_switch(self, proposal) -> str:
        return self._checked("cut_switch", _cut_switch, proposal.value, "ask")

    # -- values set through traitlets (files, command line, %config) --------------------------

    @validate("data_dir")
    def _check_data_dir(self, proposal) -> str:
        value = _data_dir(proposal.value) if proposal.value.strip() else builtin_data_dir()
        if self._data_dir_in_use is not None and value != self._data_dir_in_use:
            raise ConfigError(
                f"GpuSessionConfig.data_dir: this process already keeps its sessions in "
                f"{self._data_dir_in_use}; a new data_dir applies in a new kernel (or after "
                f"`%reload_ext gpusession`), set before the first %gpu command"
            )
        return value

    @validate("default_backend")
    def _check_backend(self, proposal) -> str:
        return proposal.value.strip().lower()

    @validate("default_type")
    def _check_type(self, proposal) -> str:
        return self._checked("default_type", _gpu_type, proposal.value, BUILTIN_TYPE)

    @validate("default_idle")
    def _check_idle(self, proposal) -> str:
        return self._checked("default_idle", _idle, proposal.value, BUILTIN_IDLE)

    @validate("price_per_hour")
    def _check_price(self, proposal) -> float:
        return self._checked("price_per_hour", _price, proposal.value, CATALOG_PRICE)

    @validate("nvml_replay")
    def _check_replay(self, proposal) -> str:
        return self._checked("nvml_replay", _recording, proposal.value, "")

    @staticmethod
    def _checked(name: str, parse: Callable[[str], T], value, builtin: T) -> T:
        if isinstance(value, str) and not value.strip():
            return builtin
        try:
            return parse(value)
        except (BadInput, ValueError) as exc:
            raise ConfigError(f"GpuSessionConfig.{name}: {exc}") from None

    # -- use ----------------------------------------------------------------------------------

    def check(self) -> None:
        """Read every setting now, so a bad env var is reported (ConfigError) at load rather
        than at the first start."""
        for name in sorted(self.trait_names(config=True)):
            getattr(self, name)
        check_env()

    def origin(self, name: str) -> str:
        """Where a setting's value comes from: 'config' (a config file, the command line,
        `%config`, code), 'env' (its GPUSESSION_ variable) or 'default'."""
        if name in self.config.get(type(self).__name__, {}):
            return "config"
        if env_origin(name) == "env":
            return "env" if getattr(self, name) == env_setting(name) else "config"
        return "config" if getattr(self, name) != self.trait_defaults(name) else "default"

    @property
    def read_by(self) -> str:
        """Which process reads these settings, by what made this object: 'server' (the Jupyter
        server's extension: REST and the sidebar), 'notebook' (a kernel's magics), 'launcher' (a
        GPU kernelspec's provisioner), else 'process'."""
        names = {c.__name__ for c in type(self.parent).__mro__} if self.parent else set()
        for marker, reader in (
            ("ServerApp", "server"),
            ("InteractiveShell", "notebook"),
            ("KernelProvisionerBase", "launcher"),
        ):
            if marker in names:
                return reader
        return "process"

    @property
    def data_path(self) -> Path:
        """The data dir, created. From the first call on, it stays this process's data dir."""
        p = data_folder(self.data_dir)
        self._data_dir_in_use = str(p)
        return p
