"""gpusession: a GPU kernel for your local notebook, and it stops billing when nobody uses it.

%load_ext gpusession
%gpu start --type t4
"""

from __future__ import annotations

__version__ = "0.1.0"


def load_ipython_extension(ip) -> None:
    # lazy: docs/architecture.md#imports-kept-inside-functions
    from .faces.magics import load_ipython_extension as _load

    _load(ip)


def unload_ipython_extension(ip) -> None:
    # lazy: docs/architecture.md#imports-kept-inside-functions
    from .faces.magics import unload_ipython_extension as _unload

    _unload(ip)


def _jupyter_server_extension_points() -> list[dict]:
    return [{"module": "gpusession.server"}]


def _jupyter_labextension_paths() -> list[dict]:
    return [{"src": "labextension", "dest": "gpusession-labextension"}]
