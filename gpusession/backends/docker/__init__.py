"""`docker`: a session in a GPU container on a Docker engine, this machine's or one at
`ssh://user@host`. See backend.py; engine.py (the SDK client, labels, markers), container_setup.py
(what a container needs before it starts: the image and the runtime bundle's volumes), runtime_volumes.py
(gc of old runtime volumes), workspace_volumes.py (workspace volumes), ssh.py (the SDK's ssh://
transport made resilient).

Importing this package never imports the Docker SDK: it is loaded when the backend is first used.
"""

from .backend import DockerBackend

__all__ = ["DockerBackend"]
