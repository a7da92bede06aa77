"""User settings: traitlets config (jupyter config files) with environment-variable defaults.

Every trait's help says its unit, the env var that sets its default, and what 0/empty means.
"""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs
from traitlets import Float, Unicode, default
from traitlets.config import Configurable


class GpuSessionConfig(Configurable):
    """`c.GpuSessionConfig.<name> = ...` in jupyter_server_config.py / ipython_config.py."""

    data_dir = Unicode(
        help="Folder of the session store (sessions.sqlite3) and per-session keys. "
        "Default: env GPUSESSION_HOME, else the platform's user data dir for 'gpusession'."
    ).tag(config=True)

    default_backend = Unicode(
        help="Backend used when %gpu start names none: 'local', 'docker' or 'aws'. Empty means "
        "'docker' when a Docker engine answers, else 'local'. Env: GPUSESSION_BACKEND."
    ).tag(config=True)

    default_type = Unicode(
        "t4", help="GPU type when none is given (catalog name, e.g. t4, a100:8). Env: GPUSESSION_TYPE."
    ).tag(config=True)

    default_idle = Unicode(
        "30m",
        help="Idle timeout when none is given: e.g. 15m, 1h; 'off' never stops. Env: GPUSESSION_IDLE.",
    ).tag(config=True)

    price_per_hour = Float(
        -1.0,
        help="Dollars per hour charged for local and docker sessions (your own hardware). "
        "-1 (default) uses the catalog's on-demand price of the same GPUs; 0 makes them free. "
        "Env: GPUSESSION_PRICE_PER_HOUR.",
    ).tag(config=True)

    docker_image = Unicode(
        help="Image for docker sessions. Default: env GPUSESSION_IMAGE, else 'gpusession/cuda:latest' "
        "built from Dockerfile.cuda on first use."
    ).tag(config=True)

    @default("data_dir")
    def _data_dir_default(self) -> str:
        return os.environ.get("GPUSESSION_HOME") or platformdirs.user_data_dir("gpusession", appauthor=False)

    @default("default_backend")
    def _backend_default(self) -> str:
        return os.environ.get("GPUSESSION_BACKEND", "")

    @default("docker_image")
    def _image_default(self) -> str:
        return os.environ.get("GPUSESSION_IMAGE", "gpusession/cuda:latest")

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        env = os.environ
        if "GPUSESSION_TYPE" in env and "default_type" not in kwargs:
            self.default_type = env["GPUSESSION_TYPE"]
        if "GPUSESSION_IDLE" in env and "default_idle" not in kwargs:
            self.default_idle = env["GPUSESSION_IDLE"]
        if "GPUSESSION_PRICE_PER_HOUR" in env and "price_per_hour" not in kwargs:
            self.price_per_hour = float(env["GPUSESSION_PRICE_PER_HOUR"])

    @property
    def data_path(self) -> Path:
        p = Path(self.data_dir)
        p.mkdir(parents=True, exist_ok=True)
        return p
