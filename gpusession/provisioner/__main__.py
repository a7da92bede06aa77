"""The argv of a GPU kernelspec. jupyter_client 7 and later never run it: the kernelspec's
provisioner starts a session instead. Run, it says why it cannot start a kernel."""

import sys

if __name__ == "__main__":
    print(
        "this GPU kernelspec starts its kernel through the gpusession kernel provisioner: it needs "
        "jupyter_client>=7 and gpusession installed where the jupyter server runs",
        file=sys.stderr,
    )
    sys.exit(1)
