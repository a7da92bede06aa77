"""jupyter-server extension: the authenticated REST API under `<base_url>/gpusession/api/`,
read by the JupyterLab sidebar panel. It uses the shared session store, so sessions started from
any notebook or the CLI show up."""

from __future__ import annotations


def _load_jupyter_server_extension(server_app) -> None:
    from .handlers import setup_handlers

    setup_handlers(server_app)
    server_app.log.info("gpusession: REST API at %sgpusession/api/", server_app.web_app.settings["base_url"])


# jupyter_server < 2 name
load_jupyter_server_extension = _load_jupyter_server_extension
