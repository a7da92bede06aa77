"""`slurm`: a session in a batch job on a Slurm cluster, through its login node. See backend.py
and docs/slurm.md."""

from .backend import SlurmBackend

__all__ = ["SlurmBackend"]
