"""torch tensors in a checkpoint as their bytes: a tensor pickled the way torch does it goes
through an in-memory `torch.save` of its whole storage (copied on the way, and a view saves the
storage it views), which on a real H200 made a save of CUDA tensors 1.8-1.9x `torch.save` + fsync
and a restore 2.1-2.3x `torch.load` (docs/workspaces.md). Here a plain strided tensor on the CPU
or a GPU is reduced to its contiguous bytes, as a uint8 numpy array that the checkpoint's pickler
writes to the file as it is (protocol 5's buffer), and `rebuild` makes it again, on its device
when that is here, else on the CPU (`MOVED` says so to the restore). Anything else (sparse,
quantized, nested, named, a subclass, a non-leaf in a graph) keeps torch's own pickling.
Standard library only; torch is looked up, never imported, when saving.
Python 3.9 syntax.
"""

from __future__ import annotations

import sys

MOVED: list = []  # devices restored tensors asked for that are not here (they came on the CPU)


def reduce_tensor(obj):
    """(rebuild, its arguments) for a plain tensor; None for anything else (pickled as usual)."""
    torch = sys.modules.get("torch")
    if type(obj) is not getattr(torch, "Tensor", None):  # (not a torch that has tensors, too)
        return None
    try:
        if (
            obj.layout is not torch.strided
            or obj.is_quantized
            or getattr(obj, "is_nested", False)
            or obj.device.type not in ("cpu", "cuda")
            or any(name is not None for name in obj.names)
            or (obj.requires_grad and not obj.is_leaf)
        ):
            return None
        data = obj.detach()
        if data.is_conj():
            data = data.resolve_conj()
        if data.is_neg():
            data = data.resolve_neg()
        raw = data.contiguous().cpu().reshape(-1).view(torch.uint8).numpy()
    except Exception:  # noqa: BLE001 - whatever this torch cannot do: its own pickling
        return None
    dtype = str(obj.dtype).rpartition(".")[2]
    return rebuild, (raw, dtype, tuple(obj.shape), str(obj.device), bool(obj.requires_grad))


def rebuild(raw, dtype: str, shape: tuple, device: str, requires_grad: bool):
    """The tensor `reduce_tensor` took apart: on `device` when it is here (a GPU index this
    machine lacks: its first GPU), else on the CPU, noted in MOVED."""
    import torch

    tensor = torch.from_numpy(raw).view(getattr(torch, dtype)).reshape(shape)
    if device != "cpu":
        if device.startswith("cuda") and torch.cuda.is_available():
            index = int(device.partition(":")[2] or 0)
            tensor = tensor.to(f"cuda:{index if index < torch.cuda.device_count() else 0}")
        else:
            MOVED.append(device)
    return tensor.requires_grad_() if requires_grad else tensor
