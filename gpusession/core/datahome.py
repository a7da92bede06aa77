"""Where this user's gpusession data lives, as the environment says: GPUSESSION_HOME, else the
platform's user data folder. Below the configuration, so that both the settings (the store's
folder) and the catalog (the user's price snapshot there) read it one way."""

from __future__ import annotations

import os

HOME_ENV = "GPUSESSION_HOME"


def builtin_data_dir() -> str:
    import platformdirs

    return platformdirs.user_data_dir("gpusession", appauthor=False)


def data_dir_text(text: str) -> str:
    """A data folder as written (`~` and relative paths allowed), made absolute."""
    return os.path.abspath(os.path.expanduser(text.strip()))


def data_dir_from_env() -> str:
    """GPUSESSION_HOME, else the platform's folder (what the CLI's settings read)."""
    raw = os.environ.get(HOME_ENV, "").strip()
    return data_dir_text(raw) if raw else builtin_data_dir()
