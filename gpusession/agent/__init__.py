"""The remote side: runs next to the session kernel (in the container, on the instance, or as a
local process) and owns the kernel's life. Standard library and nvidia-ml-py only, so it installs
into any image without Jupyter or Node.
"""
