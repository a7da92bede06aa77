"""jupyter-server extension: the authenticated REST API under `<base_url>/gpusession/api/`,
read by the JupyterLab sidebar panel. It uses the shared session store, so sessions started from
any notebook or the CLI show up.

Settings: `c.GpuSessionConfig.<name>` in jupyter_server_config.py or `--GpuSessionConfig.<name>=`
on the `jupyter lab` / `jupyter server` command line, over the GPUSESSION_* env vars
(see gpusession/configuration/config.py)."""

from __future__ import annotations

from ..core.errors import GpuSessionError
from ..session import SessionManager


def _load_jupyter_server_extension(server_app) -> None:
    from traitlets import TraitError

    # lazy: docs/architecture.md#imports-kept-inside-functions
    from ..configuration.config import GpuSessionConfig
    from .handlers import setup_handlers

    try:  # jupyter-resource-usage's habit: the server app is the parent, so its config applies
        config = GpuSessionConfig(parent=server_app)
    except TraitError as exc:
        server_app.log.error("gpusession: %s", exc)
        raise
    try:
        config.check()
    except GpuSessionError as exc:  # a bad env var: the API still serves, starts say what is wrong
        server_app.log.error("gpusession: %s", exc)
    try:
        manager, unavailable = SessionManager(config), None
    except (
        GpuSessionError
    ) as exc:  # its store cannot be opened (GPUSESSION_HOME): every call says why
        manager, unavailable = None, str(exc)
        server_app.log.error("gpusession: %s", exc)
    setup_handlers(server_app, manager, unavailable)
    server_app.log.info(
        "gpusession: REST API at %sgpusession/api/ (sessions in %s)",
        server_app.web_app.settings["base_url"],
        config.data_dir,
    )


# jupyter_server < 2 name
load_jupyter_server_extension = _load_jupyter_server_extension
