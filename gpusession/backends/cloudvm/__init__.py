"""What a cloud VM needs to boot a session, shared by the cloud backends (aws; a second cloud
imports it rather than copying it): cloudinit.py (the pinned host key, the cloud-config user data,
the boot script's header and access.sh), session.sh (the boot script's body: pull the image, probe
its Python, take the runtime bundle, run the session container, power off), link.py (wait for
sshd, follow the boot, send the bundle, tunnel to the kernel). It knows no cloud's SDK: a backend
makes the instance and hands it the user data; this layer never imports a backend.
"""
