"""`aws`: a session on its own EC2 GPU instance (on-demand or spot). See backend.py.

Importing this package never imports boto3: it is loaded when the backend is first used, with an
install hint (`pip install 'gpusession[aws]'`) when it is missing.
"""

from .backend import AwsBackend

__all__ = ["AwsBackend"]
