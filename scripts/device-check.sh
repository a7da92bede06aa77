#!/usr/bin/env bash
# Run the gpusession agent's NVML sampler once on a machine with a real NVIDIA GPU and print
# what it saw (about 1-2 minutes). Needs python3 and nvidia-ml-py (pynvml); without it, put
# pynvml.py on PYTHONPATH (it is a single file: carry it from the venv, see below).
#
#   scripts/device-check.sh [OUT_DIR]        # default OUT_DIR: $OUT, else ./device-check-out
#
# Writes into OUT_DIR:
#   sample-idle.json     `python -m gpusession.agent sample --count 5` with the GPU idle
#   sample-busy.json     the same while a small CUDA load runs (only when torch or cupy exists)
#   nvml-record.json     raw NVML values (`nvml-record`): the replay format of tests/data/
#   agent-stats.json     GET /stats from a real agent runtime (only when ipykernel exists)
#   box-reading.txt      what a docker start reads of the box to pick free GPUs (READ_SCRIPT),
#                        parsed as the picker parses it: every GPU, every MIG slice by UUID
#   sample-slice.json    the sampler limited to the first MIG slice (only when a card is split):
#                        one GPU, its profile, its memory, utilization null ("n/a (MIG)")
# It only reads: it never changes a card's MIG mode or slices (an admin's job: nvidia-smi -mig 1,
# nvidia-smi mig -cgi ... -C); on a card not in MIG mode the MIG checks say so and are skipped.
#   device-gpu.json      scripts/device_gpu_checks.py's findings (only where torch sees CUDA and
#                        ipykernel is there): GPU load as activity, the idle stop's save of CUDA
#                        tensors and their --restore, CUDA checkpoints timed against torch.save
#   summary.txt          what to paste into docs/gpu-agent.md
set -euo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${1:-${OUT:-./device-check-out}}
mkdir -p "$OUT_DIR"
PY=${PYTHON:-}
if [ -z "$PY" ]; then
    for candidate in .venv/bin/python python3; do
        if command -v "$candidate" >/dev/null 2>&1; then PY=$candidate; break; fi
    done
fi
# a carried copy of nvidia-ml-py (pynvml.py), used only when the interpreter has none
if ! "$PY" -c 'import pynvml' 2>/dev/null && [ -f .device/pylib/pynvml.py ]; then
    export PYTHONPATH=$PWD/.device/pylib${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
{
    echo "== machine"
    uname -a
    "$PY" --version
    nvidia-smi --query-gpu=index,name,driver_version,memory.total,power.limit --format=csv 2>&1 || echo "(no nvidia-smi)"
} | tee "$OUT_DIR/summary.txt"

echo "== sampler, GPU idle (5 samples, 1 s apart)" | tee -a "$OUT_DIR/summary.txt"
timeout 60 "$PY" -m gpusession.agent sample --count 5 --interval 1 >"$OUT_DIR/sample-idle.json"
"$PY" - "$OUT_DIR/sample-idle.json" <<'EOF' | tee -a "$OUT_DIR/summary.txt"
import json, sys
doc = json.load(open(sys.argv[1]))
print(f"gpus_visible={doc['gpus_visible']} message={doc['message']!r} driver={doc['driver_version']}")
print(f"time per sample: mean {doc['sample_ms']['mean']} ms, max {doc['sample_ms']['max']} ms")
last = doc["samples"][-1]
for g in last["gpus"]:
    print(json.dumps(g))
print(f"cpu_percent={last['cpu_percent']} memory_used={last['memory_used']} memory_total={last['memory_total']}")
EOF

echo "== raw NVML values" | tee -a "$OUT_DIR/summary.txt"
timeout 30 "$PY" -m gpusession.agent nvml-record --frames 2 >"$OUT_DIR/nvml-record.json"
head -c 600 "$OUT_DIR/nvml-record.json" | tee -a "$OUT_DIR/summary.txt"; echo

LOAD='
import sys, time
end = time.time() + float(sys.argv[1])
try:
    import torch
    a = torch.randn(8192, 8192, device="cuda")
    while time.time() < end:
        a = (a @ a).clamp_(-1, 1)
        torch.cuda.synchronize()
except ImportError:
    import cupy
    a = cupy.random.rand(8192, 8192, dtype=cupy.float32)
    while time.time() < end:
        a = cupy.clip(a @ a, -1, 1)
        cupy.cuda.Device().synchronize()
'
if "$PY" -c 'import torch' 2>/dev/null || "$PY" -c 'import cupy' 2>/dev/null; then
    echo "== sampler under a CUDA load" | tee -a "$OUT_DIR/summary.txt"
    "$PY" -c "$LOAD" 12 & load_pid=$!
    sleep 4
    timeout 60 "$PY" -m gpusession.agent sample --count 5 --interval 1 >"$OUT_DIR/sample-busy.json"
    wait "$load_pid" || true
    "$PY" - "$OUT_DIR/sample-busy.json" <<'EOF' | tee -a "$OUT_DIR/summary.txt"
import json, sys
doc = json.load(open(sys.argv[1]))
for s in doc["samples"]:
    print([(g["index"], g["utilization"], g["power_draw"], g["sm_clock"], [(p["pid"], p["name"], p["memory_used"]) for p in g["processes"]]) for g in s["gpus"]])
EOF
else
    echo "== no torch or cupy here: no CUDA load, utilization stays near 0" | tee -a "$OUT_DIR/summary.txt"
fi

echo "== what a docker start reads of this box (free-GPU pick), and MIG slices" | tee -a "$OUT_DIR/summary.txt"
nvidia-smi --query-gpu=index,mig.mode.current --format=csv,noheader 2>&1 | tee -a "$OUT_DIR/summary.txt" || true
"$PY" - "$OUT_DIR/box-reading.txt" <<'EOF' | tee -a "$OUT_DIR/summary.txt"
import subprocess, sys
from gpusession.backends.docker import gpus
out = subprocess.run(["sh", "-c", gpus.READ_SCRIPT], capture_output=True, text=True, timeout=60).stdout
open(sys.argv[1], "w").write(out)
parsed = gpus.parse_reading(out)
if parsed is None:
    print("the picker read no GPU here: " + out[:200])
else:
    found, kind = parsed
    print(f"{len(found)} GPUs/slices read from {kind}; free now: {len(gpus.free_gpus(found, {}))}")
    for g in found:
        print(f"  {g.label}: {g.uuid} {g.name} used={g.memory_used} util={g.utilization} split={g.split}")
EOF
slice=$(nvidia-smi -L 2>/dev/null | sed -n 's/.*MIG .*(UUID: \(MIG-[^)]*\)).*/\1/p' | head -n 1)
if [ -n "$slice" ]; then
    echo "== the sampler on one MIG slice ($slice)" | tee -a "$OUT_DIR/summary.txt"
    CUDA_VISIBLE_DEVICES=$slice timeout 60 "$PY" -m gpusession.agent sample --count 3 --interval 1 >"$OUT_DIR/sample-slice.json"
    "$PY" - "$OUT_DIR/sample-slice.json" <<'EOF' | tee -a "$OUT_DIR/summary.txt"
import json, sys
from gpusession.words.status import gpu_lines
doc = json.load(open(sys.argv[1]))
last = doc["samples"][-1]
gpus = last["gpus"]
ok = len(gpus) == 1 and gpus[0].get("mig") and gpus[0]["utilization"] is None and gpus[0]["memory_total"]
print(("OK" if ok else "UNEXPECTED") + f": {len(gpus)} GPU(s) seen: " + json.dumps(gpus)[:400])
print("\n".join(gpu_lines(last)))
EOF
else
    echo "== no MIG slice on this machine (no card in MIG mode): MIG checks skipped" | tee -a "$OUT_DIR/summary.txt"
fi

if "$PY" -c 'import ipykernel' 2>/dev/null; then
    echo "== a real agent runtime: GET /stats" | tee -a "$OUT_DIR/summary.txt"
    state=$(mktemp -d)
    "$PY" -m gpusession.agent run --session-id device-check --state-dir "$state" --idle 20s --price-per-hour 3.5 \
        >"$OUT_DIR/runtime.log" 2>&1 & rt_pid=$!
    for _ in $(seq 100); do grep -q '"ready": true' "$state/runtime.json" 2>/dev/null && break; sleep 0.2; done
    sleep 3
    "$PY" - "$state" "$OUT_DIR/agent-stats.json" <<'EOF' | tee -a "$OUT_DIR/summary.txt"
import json, sys
from gpusession.core.protocol import agent_token
from gpusession.session.agentclient import AgentClient
state, out = sys.argv[1], sys.argv[2]
rt = json.load(open(f"{state}/runtime.json"))
key = json.load(open(f"{state}/kernel.json"))["key"]
doc = AgentClient(f"http://127.0.0.1:{rt['agent_port']}", agent_token(key)).stats()
json.dump(doc, open(out, "w"), indent=1)
print(f"{len(doc['samples'])} samples; gpus_visible={doc['gpus_visible']}; idle={doc['idle']}; cost={doc['cost']}")
EOF
    kill "$rt_pid" 2>/dev/null || true
    wait "$rt_pid" 2>/dev/null || true
fi
if "$PY" -c 'import torch, ipykernel, jupyter_client; assert torch.cuda.is_available()' 2>/dev/null; then
    echo "== GPU activity, the idle stop's save, --restore, CUDA checkpoints (scripts/device_gpu_checks.py)" | tee -a "$OUT_DIR/summary.txt"
    "$PY" scripts/device_gpu_checks.py "$OUT_DIR" 2>&1 | tee -a "$OUT_DIR/summary.txt" || gpu_checks_failed=1
fi
echo "== a Docker engine with the NVIDIA runtime here?" | tee -a "$OUT_DIR/summary.txt"
if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
    docker info --format 'runtimes: {{json .Runtimes}}' 2>&1 | tee -a "$OUT_DIR/summary.txt"
else
    echo "no Docker engine answers here: the container-with-GPU start is not checked" | tee -a "$OUT_DIR/summary.txt"
fi
echo "== done: $OUT_DIR" | tee -a "$OUT_DIR/summary.txt"
exit "${gpu_checks_failed:-0}"
