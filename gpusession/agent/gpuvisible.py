"""Which of the GPUs NVML sees belong to this session: the ones CUDA would use.

NVML lists every GPU of the machine (unless cgroups hide the others, `ConstrainDevices=yes`).
A Slurm job, or anyone setting `CUDA_VISIBLE_DEVICES`, gets a subset; the stats, the idle rule
and the cost must be about that subset only.

- `CUDA_VISIBLE_DEVICES`: a comma list of indices (NVML's order, which is the PCI bus order Slurm
  uses) or of UUIDs (`GPU-...`, a unique prefix is enough). As CUDA does, the list ends at the
  first entry that names no GPU (`NoDevFiles`, `-1`, an index past the end); an empty value
  selects none.
- else `SLURM_JOB_GPUS` / `SLURM_STEP_GPUS`: the job's GPUs by index on the node, used only when
  NVML sees more GPUs than the job has (else cgroups already show the job's alone).
- else `NVIDIA_VISIBLE_DEVICES` when it names GPUs by UUID (`GPU-...`, `MIG-...`): a docker
  session pinned to GPUs of a shared box (issue 34). In a real container NVML sees those alone
  and the UUIDs match them; where NVML sees the whole box (a replayed recording, a runtime that
  does not hide the others) they select the session's own. Indices there are not used: in the
  container NVML numbers its GPUs from 0.
- else every GPU.
"""

from __future__ import annotations

from typing import Callable, Mapping


def visible_indices(
    env: Mapping[str, str], count: int, uuid_of: Callable[[int], str | None]
) -> tuple[list[int], str | None]:
    """(NVML indices to read, the variable that chose them or None when all are read)."""
    cuda = env.get("CUDA_VISIBLE_DEVICES")
    if cuda is not None:
        return _cuda(cuda, count, uuid_of), "CUDA_VISIBLE_DEVICES"
    for name in ("SLURM_JOB_GPUS", "SLURM_STEP_GPUS"):
        value = env.get(name)
        if value:
            wanted = [int(t) for t in value.split(",") if t.strip().isdigit()]
            if count <= len(wanted):
                return list(range(count)), None  # constrained: NVML sees the job's GPUs alone
            return sorted({i for i in wanted if i < count}), name
    if names_gpus(env):  # NVIDIA_VISIBLE_DEVICES by UUID: the ones above are not set
        return _cuda(env["NVIDIA_VISIBLE_DEVICES"], count, uuid_of), "NVIDIA_VISIBLE_DEVICES"
    return list(range(count)), None


def names_gpus(env: Mapping[str, str]) -> bool:
    """Whether the environment names the session's GPUs among the machine's (CUDA_VISIBLE_DEVICES,
    SLURM_JOB_GPUS / SLURM_STEP_GPUS, NVIDIA_VISIBLE_DEVICES by UUID): a replayed recording then
    stands for the whole machine, as recorded, and that choice picks the session's among them."""
    if env.get("CUDA_VISIBLE_DEVICES") is not None:
        return True
    if env.get("SLURM_JOB_GPUS") or env.get("SLURM_STEP_GPUS"):
        return True
    tokens = [t.strip() for t in env.get("NVIDIA_VISIBLE_DEVICES", "").split(",") if t.strip()]
    return bool(tokens) and all(t.upper().startswith(("GPU-", "MIG-")) for t in tokens)


def _cuda(value: str, count: int, uuid_of: Callable[[int], str | None]) -> list[int]:
    chosen: list[int] = []
    uuids: list[str | None] | None = None
    for token in (t.strip() for t in value.split(",")):
        if token.isdigit():
            index = int(token)
        elif token.upper().startswith(("GPU-", "MIG-")):
            if uuids is None:
                uuids = [uuid_of(i) for i in range(count)]
            matches = [i for i, u in enumerate(uuids) if u and u.lower().startswith(token.lower())]
            index = matches[0] if len(matches) == 1 else -1
        else:
            index = -1
        if not 0 <= index < count or index in chosen:
            break  # CUDA ignores the rest of the list from the first entry naming no GPU
        chosen.append(index)
    return chosen
