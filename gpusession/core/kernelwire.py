"""The session kernel's side of the protocol (its cell log, bulk transfers, the count of cells
that ran out of GPU memory): names and one check, free of imports, as gpusession.core.envnames
is, so that the kernel's extensions (gpusession.agent.activity, cellog) load at its start without
the protocol's types. gpusession.core.protocol re-exports them."""

# -- a cell that failed for want of GPU memory (the kernel counts them; advice reads the count) --

#: what the frameworks' out-of-memory errors say (PyTorch, TensorFlow/XLA, JAX, CuPy, CUDA)
OOM_MARKERS = (
    "outofmemoryerror",
    "cuda out of memory",
    "cuda error: out of memory",
    "cuda_error_out_of_memory",
    "resource_exhausted",
    "resourceexhaustederror",
    "out of memory allocating",
    "cudaerrormemoryallocation",
)


def is_out_of_memory(text: str) -> bool:
    """Does an error (its type name and message) say the GPU ran out of memory?"""
    low = text.lower()
    return any(marker in low for marker in OOM_MARKERS)


# -- the session kernel's cell log (gpusession.agent.cellog <-> gpusession.transport.kernel) ---------------

#: the IOPub messages a cell shows; the session kernel numbers each of them per execute request
OUTPUT_MSG_TYPES = (
    "stream",
    "display_data",
    "execute_result",
    "update_display_data",
    "clear_output",
    "error",
)
META_SEQ = "gpusession_seq"  # message metadata of an output: its number in its cell, from 1
META_OUTPUTS = (
    "gpusession_outputs"  # on a cell's execute_reply and final idle status: how many outputs
)
META_CELL_LOG = (
    "gpusession_cell_log"  # on kernel_info_reply: this kernel keeps a cell log (version)
)
#: control-channel request {"msg_id", "since"} -> reply {"state": "unknown"|"started"|"done",
#: "outputs_total", "first_kept", "outputs": [{"seq", "msg_type", "content"}], "reply"}
CELL_LOG_REQUEST = "gpusession_cell_request"
# bulk bytes on the shell channel, binary frames in `buffers` (gpusession.agent.transfer_handler)
TRANSFER_REQUEST = "gpusession_transfer_request"
TRANSFER_REPLY = "gpusession_transfer_reply"
CELL_LOG_REPLY = "gpusession_cell_reply"
