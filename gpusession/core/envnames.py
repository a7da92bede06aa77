"""The environment variables (and the state file names) between the local side, the runtime and the kernel (re-exported by
gpusession.core.protocol). Apart, and free of imports, so that the runtime's first step in a container
(gpusession.agent.firststep) reads them without loading the protocol's types."""

ENV_SESSION_ID = "GPUSESSION_SESSION_ID"  # the session a runtime, container or process belongs to
ENV_STATE_DIR = (
    "GPUSESSION_STATE_DIR"  # the runtime's state folder, seen by the kernel's activity hook
)
ENV_KERNEL_KEY = "GPUSESSION_KERNEL_KEY"  # a kernel connection key chosen by the local side (else the runtime makes one)
ENV_RUNTIME_ROOT = "GPUSESSION_RUNTIME_ROOT"  # set by the runtime bundle's boot.sh: the bundle's folder in the image
ENV_RUNTIME_PYTHON = (
    "GPUSESSION_RUNTIME_PYTHON"  # the image's python as the bundle's probe found it (boot.sh)
)
ENV_RUNTIME_BRINGS = (
    "GPUSESSION_RUNTIME_BRINGS"  # what the bundle gives the kernel: "ipykernel,pip", a part, or ""
)
ENV_WORKSPACE = "GPUSESSION_WORKSPACE"  # the workspace's folder as the kernel sees it (its checkpoint goes there)
ENV_ZYGOTE = "GPUSESSION_ZYGOTE"  # the pid of a kernel begun before the runtime (gpusession.agent.kernelzygote)
ENV_SPAWN_FIRST = "GPUSESSION_SPAWN_FIRST_KERNEL"  # "1": the first kernel a fresh process, not the first step's fork
ENV_RESTORE = "GPUSESSION_RESTORE"  # "1" for a session's first kernel when --resume asks to restore the checkpoint

#: in the runtime's state folder: the first kernel's plan, for a kernel begun before the runtime
#: (gpusession.agent.kernelzygote.PLAN, which cannot import this)
ZYGOTE_PLAN = "zygote.json"

#: in the runtime's state folder: READY's payload, written as READY is said (a Kubernetes start
#: reads it over exec: the pod's log is served only once the kubelet has seen its container run)
READY_FILE = "ready.json"

#: a kernel's five ports, in the order the runtime allocates them (jupyter connection file keys)
KERNEL_PORT_NAMES = ("shell_port", "iopub_port", "stdin_port", "control_port", "hb_port")

#: in the runtime's state folder: the kernel asks for a restart (gpusession.agent.activity writes it)
RESTART_FILE = "restart-requested"

#: in the runtime's state folder, between the agent (gpusession.agent.saving) and the kernel's
#: checkpoint extension (gpusession.agent.checkpoint): here, so that the agent does not load the
#: pickling side to name them
SAVE_REQUEST = "save-request.json"
SAVE_RESULT = "save-result.json"
SAVE_READY = (
    "save-ready"  # the kernel's pid: its SIGUSR1 handler is installed (no mark: still starting)
)
RESTORE_RESULT = "restored.json"

#: the first words of the runtime's lines that say its kernel started, then listens
#: (gpusession.core.protocol.Marker.KERNEL and .READY; the runtime's first step says them too)
MARKER_KERNEL = "GPUSESSION_KERNEL"
MARKER_READY = "GPUSESSION_READY"
