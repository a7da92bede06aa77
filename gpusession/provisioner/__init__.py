"""JupyterLab's own kernels on a GPU session: a jupyter_client kernel provisioner
(`GpuSessionProvisioner`, entry point `gpusession-provisioner`) and the kernelspecs that name it
(`gpusession kernelspec install|list|remove`, gpusession/provisioner/kernelspecs.py).
See docs/kernels.md."""

from .kernelspecs import PROVISIONER_NAME
from .provisioner import GpuSessionProvisioner

__all__ = ["GpuSessionProvisioner", "PROVISIONER_NAME"]
