"""What only a machine with a real NVIDIA GPU can show (scripts/device-check.sh runs this where
torch sees CUDA; `--xp numpy` runs the same steps on a CPU to check the script itself):

1. activity: a kernel whose cell has returned while a thread of it keeps the GPU busy is not
   idle (the watchdog reads NVML utilization); once the load ends the runtime stops after
   --idle, having saved the kernel's variables (CUDA tensors, a module on the GPU) into the
   workspace; a second runtime with --restore has them back, on the GPU, equal.
2. nothing left behind: after each runtime's stop, no process of it holds GPU memory.
3. checkpoint of CUDA tensors (1 MB, 64 MB, 1 GB): saved and restored exactly, timed against
   torch.save + fsync and torch.load of the same tensor (median and max of --runs).
4. a checkpoint of CUDA tensors restored where no GPU is visible: on the CPU, said.
5. the agent's own CPU with NVML sampled at 1 Hz, against the runtime with --no-agent.

Prints one line per finding; writes device-gpu.json into OUT_DIR. Exit 1 when a check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpusession.core.protocol import agent_token  # noqa: E402
from gpusession.session.agentclient import AgentClient  # noqa: E402

FOUND: dict = {"checks": {}}
FAILED: list[str] = []


def say(name: str, ok: bool | None, text: str, **data) -> None:
    mark = {True: "OK", False: "FAIL", None: "INFO"}[ok]
    print(f"[{mark}] {name}: {text}", flush=True)
    FOUND["checks"][name] = {"ok": ok, "text": text, **data}
    if ok is False:
        FAILED.append(name)


class Runtime:
    """A real agent runtime (kernel, agent, watchdog) in its own process group."""

    def __init__(self, state: Path, workspace: Path, *args: str) -> None:
        self.state = state
        state.mkdir(parents=True, exist_ok=True)
        self.log = open(state / "runtime.log", "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gpusession.agent", "run", "--session-id", state.name,
             "--state-dir", str(state), "--workspace", str(workspace), "--check-interval", "0.5",
             "--price-per-hour", "3.5", "--gpu-count", "1", "--gpu-type", "h200", *args],
            stdout=self.log, stderr=subprocess.STDOUT, cwd=str(ROOT), start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + 120
        while not self._ready():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"runtime did not start: {(state / 'runtime.log').read_text()}")
            time.sleep(0.1)
        self.rt = json.loads((state / "runtime.json").read_text())
        info = json.loads((state / "kernel.json").read_text())
        from jupyter_client import BlockingKernelClient

        self.kc = BlockingKernelClient()
        self.kc.load_connection_info(info)
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=60)
        self.agent = AgentClient(
            f"http://127.0.0.1:{self.rt.get('agent_port') or 1}", agent_token(info["key"])
        )

    def _ready(self) -> bool:
        try:
            return json.loads((self.state / "runtime.json").read_text()).get("ready") is True
        except (OSError, ValueError):
            return False

    def run(self, code: str, timeout: float = 300) -> str:
        out: list[str] = []

        def hook(msg):
            c = msg["content"]
            if msg["msg_type"] == "stream" and c["name"] == "stdout":
                out.append(c["text"])
            elif msg["msg_type"] == "error":
                out.append("\n".join(c["traceback"]))

        reply = self.kc.execute_interactive(code, timeout=timeout, output_hook=hook)
        text = "".join(out)
        if reply["content"]["status"] != "ok":
            raise RuntimeError(f"cell failed: {text}")
        return text

    def wait_stopped(self, timeout: float) -> float | None:
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        return time.monotonic()

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.kc.stop_channels()


def gpu_holders(pids: set[int]) -> list[str]:
    """Processes among `pids` (and any other) that hold GPU memory, as nvidia-smi lists them."""
    done = subprocess.run(
        ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    return [ln for ln in done.stdout.splitlines() if ln.strip()] if done.returncode == 0 else []


def tree(pid: int) -> set[int]:
    """`pid` and its descendants, from /proc."""
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                ppid = int(Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            kids.setdefault(ppid, []).append(int(d))
    out, todo = set(), [pid]
    while todo:
        p = todo.pop()
        out.add(p)
        todo.extend(kids.get(p, []))
    return out


SETUP = {
    "torch": (
        "import torch, threading, time\n"
        "w = torch.randn(4096, 4096, device='cuda')\n"
        "model = torch.nn.Linear(1024, 1024).cuda()\n"
        "sums = (float(w.double().sum()), float(model.weight.detach().double().sum()))\n"
        "def _load(seconds):\n"
        "    a = torch.randn(8192, 8192, device='cuda')\n"
        "    end = time.time() + seconds\n"
        "    while time.time() < end:\n"
        "        a = (a @ a).clamp_(-1, 1); torch.cuda.synchronize()\n"
        "print(repr(sums))\n"
    ),
    "numpy": (
        "import numpy as np, threading, time\n"
        "w = np.random.rand(4096, 4096)\n"
        "model = {'weight': np.random.rand(1024, 1024)}\n"
        "sums = (float(w.sum()), float(model['weight'].sum()))\n"
        "def _load(seconds):\n"
        "    end = time.time() + seconds\n"
        "    while time.time() < end:\n"
        "        time.sleep(0.1)\n"
        "print(repr(sums))\n"
    ),
}
CHECK = {
    "torch": "print(repr((w.device.type, float(w.double().sum()), "
    "float(model.weight.detach().double().sum()))))",
    "numpy": "print(repr(('cpu', float(w.sum()), float(model['weight'].sum()))))",
}


def check_activity(work: Path, xp: str, load_s: float, idle_s: float) -> None:
    """Checks 1 and 2."""
    ws = work / "ws-activity"
    first = Runtime(work / "rt-first", ws, "--idle", f"{idle_s:g}s")
    pids = tree(first.proc.pid)
    sums = eval(first.run(SETUP[xp]).strip())
    first.run(f"threading.Thread(target=_load, args=({load_s},), daemon=True).start()")
    ended = time.monotonic()  # the cell has returned: from here the kernel is idle
    utils, idle_seen = [], []
    while first.proc.poll() is None and time.monotonic() - ended < load_s + idle_s + 60:
        try:
            doc = first.agent.stats(limit=1)
            s = (doc.get("samples") or [{}])[-1]
            utils.append(
                (
                    round(time.monotonic() - ended, 1),
                    [g.get("utilization") for g in s.get("gpus", [])],
                )
            )
            idle_seen.append((round(time.monotonic() - ended, 1), doc.get("idle")))
        except Exception as exc:  # the agent goes with its runtime
            utils.append((round(time.monotonic() - ended, 1), f"{type(exc).__name__}"))
        time.sleep(1)
    stopped = first.wait_stopped(30)
    took = None if stopped is None else stopped - ended
    busy = [u for t, u in utils if t < load_s - 1 and isinstance(u, list) and u and u[0]]
    ok = took is not None and took >= load_s and took <= load_s + idle_s + 10
    say(
        "gpu-activity-keeps-it",
        ok if xp == "torch" else None,
        f"cell returned, GPU load for {load_s:g} s, --idle {idle_s:g}s: the runtime stopped "
        f"{'never' if took is None else f'{took:.1f} s'} after the cell (expected between "
        f"{load_s:g} and {load_s + idle_s + 10:g} s); utilization seen under load: "
        f"{sorted({u[0] for u in busy})[:3]}..{max((u[0] for u in busy), default=None)}",
        utils=utils,
        idle=idle_seen[-8:],
    )
    stopped_doc = (
        json.loads((first.state / "stopped.json").read_text())
        if (first.state / "stopped.json").exists()
        else {}
    )
    summary = stopped_doc.get("summary", {})
    cp = summary.get("checkpoint") or {}
    say(
        "idle-stop-saved",
        bool(cp.get("committed")),
        f"reason {summary.get('reason', {}).get('kind')!r}, mean GPU utilization "
        f"{summary.get('mean_gpu_utilization')}, checkpoint committed={cp.get('committed')} "
        f"saved={cp.get('saved')} bytes={cp.get('bytes')} seconds={cp.get('seconds')} "
        f"skipped={cp.get('skipped')}",
        summary=summary,
    )
    first.kill()
    if xp == "torch":
        time.sleep(1)
        left = [ln for ln in gpu_holders(pids) if int(ln.split(",")[0]) in pids]
        say("nothing-left-on-the-gpu", not left, f"GPU memory held by the stopped runtime's "
            f"processes: {left or 'none'}")  # fmt: skip

    second = Runtime(work / "rt-second", ws, "--restore", "--idle", "off")
    try:
        back = eval(second.run(CHECK[xp]).strip())
        restored = {}
        rfile = second.state / "restored.json"
        if rfile.exists():
            restored = json.loads(rfile.read_text())
        want_dev = "cuda" if xp == "torch" else "cpu"
        say(
            "resume-brings-cuda-tensors-back",
            back == (want_dev, *sums),
            f"after --restore: {back!r}; before the stop: {sums!r}; restored "
            f"{sorted(restored.get('restored') or [])}",
            restored=restored,
        )
    finally:
        second.kill()


def _timed(fn, runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def check_checkpoint(work: Path, xp: str, runs: int) -> None:
    """Check 3: CUDA tensors of three sizes through the checkpoint against torch's own."""
    from gpusession.agent import checkpoint

    if xp != "torch":
        say("checkpoint-cuda", None, "skipped: no torch with CUDA")
        return
    import torch

    rows = {}
    for label, n in (("1MB", 1 << 18), ("64MB", 1 << 24), ("1GB", 1 << 28)):
        t = torch.randn(n, device="cuda")
        ws = work / f"ws-{label}"
        floor_file = work / f"floor-{label}.pt"

        def ours():
            checkpoint.save({"t": t}, str(ws), deadline=time.time() + 600, cap_bytes=None)
            checkpoint.tidied(timeout=120)

        def floor():
            with open(floor_file, "wb") as f:
                torch.save(t, f)
                f.flush()
                os.fsync(f.fileno())

        save_ours, save_floor = [], []
        for _ in range(runs):  # alternating, so that both meet the same machine
            save_ours += _timed(ours, 1)
            save_floor += _timed(floor, 1)
        back: dict = {}
        load_ours = _timed(lambda: (back.clear(), checkpoint.restore(back, str(ws))), runs)
        load_floor = _timed(lambda: torch.load(floor_file), runs)
        same = "t" in back and back["t"].device.type == "cuda" and torch.equal(back["t"], t)
        rows[label] = {
            "save": [round(x, 4) for x in save_ours],
            "save_floor": [round(x, 4) for x in save_floor],
            "restore": [round(x, 4) for x in load_ours],
            "restore_floor": [round(x, 4) for x in load_floor],
        }
        ms, mf = statistics.median(save_ours), statistics.median(save_floor)
        mr, mlf = statistics.median(load_ours), statistics.median(load_floor)
        say(
            f"checkpoint-cuda-{label}",
            same,
            f"round trip exact on cuda: {same}; save median {ms * 1e3:.1f} ms (max "
            f"{max(save_ours) * 1e3:.1f}) vs torch.save+fsync {mf * 1e3:.1f} ms (max "
            f"{max(save_floor) * 1e3:.1f}): {ms / mf:.2f}x; restore median {mr * 1e3:.1f} ms "
            f"(max {max(load_ours) * 1e3:.1f}) vs torch.load {mlf * 1e3:.1f} ms: {mr / mlf:.2f}x",
            **rows[label],
        )
        t = back = None  # the GPU memory back before the next size
        torch.cuda.empty_cache()
        floor_file.unlink()
        if label != "64MB":
            shutil.rmtree(ws, ignore_errors=True)


KINDS = """
big = torch.randn(1000, 1000, device="cuda")
cases = {
    "f32_cuda": torch.randn(1000, 100, device="cuda"),
    "bf16_cuda": torch.randn(64, 64, device="cuda", dtype=torch.bfloat16),
    "view_cuda": big[10:20, ::2],
    "scalar_cuda": torch.tensor(3.5, device="cuda"),
    "empty_cuda": torch.empty(0, 3, device="cuda"),
    "grad_leaf_cuda": torch.randn(5, device="cuda", requires_grad=True),
    "bool_cpu": torch.rand(100) > 0.5,
    "int64_cpu": torch.arange(10),
    "conj_cpu": torch.randn(10, dtype=torch.complex64).conj(),
    "sparse_cpu": torch.randn(4, 4).to_sparse(),
    "module_cuda": torch.nn.Linear(8, 4).cuda(),
    "nested": {"a": [torch.ones(3, device="cuda"), torch.zeros(2)], "b": (torch.arange(4),)},
}
"""


def _same(torch, a, b) -> bool:
    if isinstance(a, dict):
        return (
            isinstance(b, dict)
            and a.keys() == b.keys()
            and all(_same(torch, a[k], b[k]) for k in a)
        )
    if isinstance(a, (list, tuple)):
        return (
            type(a) is type(b)
            and len(a) == len(b)
            and all(_same(torch, x, y) for x, y in zip(a, b))
        )
    if isinstance(a, torch.nn.Module):
        sa, sb = a.state_dict(), b.state_dict()
        return sa.keys() == sb.keys() and all(_same(torch, sa[k], sb[k]) for k in sa)
    if a.is_sparse:
        return b.is_sparse and torch.equal(a.to_dense(), b.to_dense())
    return (
        type(a) is type(b) and a.dtype == b.dtype and a.shape == b.shape
        and a.device == b.device and a.requires_grad == b.requires_grad
        and torch.equal(a.detach().resolve_conj(), b.detach().resolve_conj())
    )  # fmt: skip


def check_tensor_kinds(work: Path, xp: str) -> None:
    """Check 3b: every kind of tensor a user holds comes back as it was (dtype, shape, device,
    requires_grad, values): the plain ones as their bytes, the others by torch's pickling."""
    if xp != "torch":
        return
    import torch

    from gpusession.agent import checkpoint

    scope: dict = {"torch": torch}
    exec(KINDS, scope)
    cases = scope["cases"]
    ws = work / "ws-kinds"
    result = checkpoint.save(dict(cases), str(ws), deadline=time.time() + 120, cap_bytes=None)
    checkpoint.tidied(timeout=60)
    back: dict = {}
    report = checkpoint.restore(back, str(ws))
    wrong = [k for k in cases if k not in back or not _same(torch, cases[k], back[k])]
    say(
        "tensor-kinds-round-trip",
        result.get("committed") and not wrong and not report.get("failed"),
        f"{len(cases)} kinds saved ({result.get('saved')}, skipped {result.get('skipped')}), "
        f"restored {len(report.get('restored') or [])}; not as they were: {wrong or 'none'}; "
        f"failed: {report.get('failed') or 'none'}",
    )


def check_restore_without_gpu(work: Path, xp: str) -> None:
    """Check 4: the 64 MB CUDA checkpoint, restored by a process that sees no GPU."""
    if xp != "torch":
        return
    code = (
        "import json, sys; sys.path.insert(0, sys.argv[2])\n"
        "from gpusession.agent import checkpoint\n"
        "from gpusession.words.workspaces import restore_lines\n"
        "ns = {}\n"
        "r = checkpoint.restore(ns, sys.argv[1])\n"
        "print(json.dumps({'report': r, 'names': sorted(ns)}, default=str))\n"
        "print('\\n'.join(restore_lines(r, 'ws-64MB')))\n"
        "assert r['restored'] == ['t'] and r.get('on_cpu') == ['t'] and ns['t'].device.type == 'cpu'\n"
    )
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    done = subprocess.run(
        [sys.executable, "-c", code, str(work / "ws-64MB"), str(ROOT)],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    say(
        "restore-cuda-checkpoint-without-gpu",
        done.returncode == 0,
        f"exit {done.returncode}; said: {done.stdout.strip()[-1500:]} {done.stderr.strip()[-800:]}",
    )


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def check_agent_cost(work: Path, seconds: float = 20.0) -> None:
    """Check 5: the runtime process's CPU (the kernel is a child of its own) with the agent
    sampling NVML at 1 Hz, against the same runtime with --no-agent."""
    pct = {}
    for label, extra in (("agent", ()), ("no-agent", ("--no-agent",))):
        rt = Runtime(work / f"rt-cost-{label}", work / "ws-cost", "--idle", "off", *extra)
        try:
            time.sleep(3)
            c0, w0 = _cpu_s(rt.proc.pid), time.monotonic()
            time.sleep(seconds)
            pct[label] = 100 * (_cpu_s(rt.proc.pid) - c0) / (time.monotonic() - w0)
        finally:
            rt.kill()
    say(
        "agent-cost-with-nvml",
        pct["agent"] - pct["no-agent"] < 1.0,
        f"runtime CPU over {seconds:g} s: {pct['agent']:.2f}% of a core with the agent sampling "
        f"NVML at 1 Hz, {pct['no-agent']:.2f}% with --no-agent: the agent's cost "
        f"{pct['agent'] - pct['no-agent']:.2f}% (target < 1%)",
        **pct,
    )


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out_dir")
    ap.add_argument("--xp", choices=("torch", "numpy"), default="torch")
    ap.add_argument("--load", type=float, default=15.0, help="seconds of GPU load after the cell")
    ap.add_argument("--idle", type=float, default=6.0, help="the runtime's --idle, seconds")
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="gpusession-device-"))
    try:
        for step in (
            lambda: check_activity(work, args.xp, args.load, args.idle),
            lambda: check_tensor_kinds(work, args.xp),
            lambda: check_checkpoint(work, args.xp, args.runs),
            lambda: check_restore_without_gpu(work, args.xp),
            lambda: check_agent_cost(work),
        ):
            try:
                step()
            except Exception as exc:  # one check's failure must not hide the others'
                import traceback

                say(f"error-{len(FAILED)}", False, f"{type(exc).__name__}: {exc}")
                traceback.print_exc()
    finally:
        for log in work.glob("rt-*/runtime.log"):
            shutil.copy(log, out / f"{log.parent.name}.log")
        (out / "device-gpu.json").write_text(json.dumps(FOUND, indent=1, default=str))
        shutil.rmtree(work, ignore_errors=True)
    print(f"device-gpu: {len(FAILED)} failed: {FAILED}" if FAILED else "device-gpu: all passed")
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
