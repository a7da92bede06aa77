"""Reaching a session: SSH login with pinned host keys, port and socket forwarding, the runtime
bundle brought into any image, image pulls, tar streams, and the kernel client (kernel/)."""
