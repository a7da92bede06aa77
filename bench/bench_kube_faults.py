"""Faults of a kubernetes session on the test cluster, as figures (issue 33 §3): what a user's
streaming cell survives, and what hangs, is lost or is left behind.

    python bench/bench_kube_faults.py [--cuts 20] [--restarts 3] [--write docs/benchmarks.md]

- **port-forward cut**: every stream of the session's port-forward shut at a random moment of a
  cell printing 40 lines at 10 Hz (as a proxy's idle timeout or a load balancer cuts them),
  --cuts times.
- **API server restarted**: kube-apiserver killed during such a cell (60 lines), started again by
  `scripts/ci-kubernetes.sh up` a second later; --restarts times.
- **kubelet killed**: the kubelet of the session's node killed during the cell (its containers run
  on under containerd; the port-forward goes through the kubelet, so every stream fails until it
  is back), started again by `up` a second later; --restarts times.

- **pod evicted during a save**: a session holding 100 MB of variables is asked to save (as
  `stop --save` does) and its pod is evicted (the Eviction API, as `kubectl drain`) a moment into
  that save; --evictions times, each its own session and workspace. Survived: the record says
  the cluster took the pod back with the state saved, and `--recover`'s new pod has the very
  bytes (sha256); failed, said: the record says nothing was saved; lost: it says saved, but
  the bytes did not come back.

Each trial: **survived** (the cell ended ok with every line once, in order, and `1+1` answers
after), **failed, said** (the cell ended with an error that says why), **lost** (it said ok but
lines were missing or doubled: a silent loss), **hung** (no end within 120 s). After all: pods of
this run left behind. Zero lost and zero hung is the target.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from gpusession.session import SessionManager  # noqa: E402
from gpusession.transport.kernel.sink import OutputSink  # noqa: E402
from stats import write_section  # noqa: E402

STATE = Path(os.environ.get("GPUSESSION_CI_STATE", "/var/lib/gpusession-ci")) / "kubernetes"
KUBECONFIG = STATE / "admin.kubeconfig"
RUN = Path("/run/gpus-kube")
SCRIPT = ROOT / "scripts" / "ci-kubernetes.sh"
IMAGE = "gpusession/cuda:ci"
CELL = (
    "import time\nfor i in range({n}):\n    print(f'line {{i}}', flush=True)\n    time.sleep(0.1)"
)
DEADLINE_S = 120.0
OUTCOMES = ("survived", "failed, said", "lost", "hung")


class Lines(OutputSink):
    def __init__(self):
        self.text = ""

    def stream(self, name, text):
        self.text += text


def trial(session, n: int, fault) -> tuple[str, str]:
    """One streaming cell with `fault()` run beside it; (outcome, detail)."""
    sink, done = Lines(), {}

    def cell():
        try:
            done["reply"] = session.run(CELL.format(n=n), sink)
        except Exception as exc:  # noqa: BLE001 - the outcome says it
            done["error"] = f"{type(exc).__name__}: {exc}"

    runner = threading.Thread(target=cell, daemon=True)
    runner.start()
    fault()
    runner.join(DEADLINE_S)
    if runner.is_alive():
        return "hung", f"no end after {DEADLINE_S:.0f} s ({len(sink.text.splitlines())} lines)"
    if "error" in done:
        return "failed, said", done["error"][:200]
    lines = sink.text.splitlines()
    if done["reply"].get("status") != "ok":
        return "failed, said", str(done["reply"].get("ename"))
    if lines != [f"line {i}" for i in range(n)]:
        return "lost", f"{len(lines)} lines of {n}, {len(set(lines))} distinct"
    try:
        session.kernel.evaluate("1+1")
    except Exception as exc:  # noqa: BLE001
        return "failed, said", f"after the cell, 1+1: {exc}"
    return "survived", ""


def cut_streams(link):
    def fault():
        time.sleep(random.uniform(0.5, 3.0))
        for stream in list(link.streams):
            try:
                stream.websocket.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    return fault


def kill_and_restart(daemon: str):
    def fault():
        time.sleep(random.uniform(0.5, 2.0))
        pid = int((RUN / f"{daemon}.pid").read_text())
        os.kill(pid, signal.SIGKILL)
        time.sleep(1.0)
        for _ in range(2):  # `up` waits for the nodes' next Ready; once more if it gave up
            done = subprocess.run([str(SCRIPT), "up"], capture_output=True, text=True, timeout=400)
            if done.returncode == 0:
                return
            print(f"    up: {done.stderr.strip().splitlines()[-1:]}", flush=True)

    return fault


SAVED_CELL = (
    "import hashlib, os\ndata = os.urandom(100 * 2**20)\nprint(hashlib.sha256(data).hexdigest())"
)


def evict(pod: str) -> None:
    """The Eviction API on the pod, as `kubectl drain` asks it."""
    import kubernetes

    api = kubernetes.client.CoreV1Api(
        kubernetes.config.new_client_from_config(config_file=str(KUBECONFIG))
    )
    try:
        api.create_namespaced_pod_eviction(
            pod,
            "default",
            kubernetes.client.V1Eviction(
                metadata=kubernetes.client.V1ObjectMeta(name=pod, namespace="default")
            ),
        )
    finally:
        api.api_client.close()


def eviction_trial(manager, i: int) -> tuple[str, str]:
    """A session with 100 MB of variables, evicted a moment into an asked save; (outcome,
    detail) once its replacement answers or says why not."""
    # lazy: the bench's own module list stays short for the other trials
    from gpusession.session.views import session_view
    from gpusession.session.workspace_ops import save_checkpoint

    name = f"ev{i}"
    session = manager.start(
        manager.make_spec(
            "t4",
            backend="kubernetes",
            image=IMAGE,
            idle="off",
            name=name,
            workspace=f"bench-ev-{i}",
        )
    )
    sink = Lines()
    assert session.run(SAVED_CELL, sink)["status"] == "ok"
    digest = sink.text.strip()
    record = session.record
    saving = threading.Thread(
        target=lambda: save_checkpoint(manager.store, record, session), daemon=True
    )
    saving.start()
    time.sleep(random.uniform(0.2, 1.0))
    evict(record.resource["pod"])
    deadline = time.monotonic() + DEADLINE_S
    while manager.get(record.id).state.active and time.monotonic() < deadline:
        time.sleep(1.0)
        try:
            manager.refresh_state(record.id)
        except Exception as exc:  # noqa: BLE001 - asked again until the deadline
            print(f"    refresh: {exc}", flush=True)
    ended = manager.get(record.id)
    if ended.state.active:
        return "hung", f"still {ended.state.value} {DEADLINE_S:.0f} s after the eviction"
    kind = ended.stop_reason.kind.value if ended.stop_reason else "none"
    if session_view(ended)["resume"] is None:
        return "failed, said", f"ended {kind}, nothing saved"
    again = manager.recover(record.id)
    if again is None:
        return "failed, said", f"ended {kind}, saved, but no recovery wanted"
    try:
        sink = Lines()
        reply = again.run("import hashlib\nprint(hashlib.sha256(data).hexdigest())", sink)
        came = sink.text.strip()
    except Exception as exc:  # noqa: BLE001
        return "failed, said", f"the replacement: {exc}"[:200]
    finally:
        again.stop()
    if reply.get("status") != "ok" or came != digest:
        return "lost", f"ended {kind}, said saved; came back {came[:12] or reply.get('ename')}"
    return "survived", ""


def left_behind(store_id: str) -> int:
    out = subprocess.run(
        [str(STATE / "bin" / "kubectl"), "--kubeconfig", str(KUBECONFIG), "get", "pods", "-A",
         "-l", f"gpusession.session.store={store_id}", "-o", "name"],
        capture_output=True, text=True, timeout=60, check=False,
    ).stdout  # fmt: skip
    return len(out.split())


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cuts", type=int, default=20)
    ap.add_argument("--restarts", type=int, default=3)
    ap.add_argument("--evictions", type=int, default=3)
    ap.add_argument("--write", default=None)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gs-kfaults-"))
    os.environ["GPUSESSION_HOME"] = str(work)
    os.environ["KUBECONFIG"] = str(KUBECONFIG)
    subprocess.run([str(SCRIPT), "up"], check=True, capture_output=True, timeout=600)
    subprocess.run([str(SCRIPT), "load", IMAGE], check=True, capture_output=True, timeout=600)
    manager = SessionManager()
    session = manager.start(
        manager.make_spec("t4", backend="kubernetes", image=IMAGE, idle="off", name="faults")
    )
    node = session.record.resource["node"]
    plan = [
        ("port-forward streams cut", args.cuts, 40, lambda: cut_streams(session.link)),
        ("kube-apiserver killed, restarted", args.restarts, 60, lambda: kill_and_restart("kube-apiserver")),
        (f"kubelet of {node} killed, restarted", args.restarts, 60, lambda: kill_and_restart(f"kubelet-{node}")),
    ]  # fmt: skip
    rows = []
    try:
        for label, times, n, make in plan:
            counts = dict.fromkeys(OUTCOMES, 0)
            notes = []
            for i in range(times):
                outcome, detail = trial(session, n, make())
                counts[outcome] += 1
                print(f"  {label} {i + 1}/{times}: {outcome} {detail}", flush=True)
                if detail:
                    notes.append(detail)
            rows.append((label, times, counts, notes[:2]))
    finally:
        store_id = manager.store.store_id
        session.stop()
    counts, notes = dict.fromkeys(OUTCOMES, 0), []
    try:
        for i in range(args.evictions):
            outcome, detail = eviction_trial(manager, i)
            counts[outcome] += 1
            print(f"  pod evicted during a save {i + 1}/{args.evictions}: {outcome} {detail}")
            if detail:
                notes.append(detail)
    finally:
        for record in manager.store.list(active_only=True):
            manager.stop(record.id)
        subprocess.run(  # the trials' workspaces (claims are kept by design): the bench's own
            [str(STATE / "bin" / "kubectl"), "--kubeconfig", str(KUBECONFIG), "delete", "pvc",
             "-l", f"gpusession.session.store={store_id}", "--wait=false"],
            capture_output=True, timeout=60, check=False,
        )  # fmt: skip
        shutil.rmtree(work, ignore_errors=True)
    rows.append(("pod evicted during a save", args.evictions, counts, notes[:2]))
    left = left_behind(store_id)
    table = [
        "| fault | trials | " + " | ".join(OUTCOMES) + " | notes |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, times, counts, notes in rows:
        cells = " | ".join(str(counts[o]) for o in OUTCOMES)
        table.append(f"| {label} | {times} | {cells} | {'; '.join(notes)} |")
    text = "\n".join(table) + f"\n\nPods of this run left behind after its stop: {left}."
    print(text)
    if args.write:
        write_section(Path(args.write), "bench_kube_faults", text)
    bad = sum(c["lost"] + c["hung"] for _, _, c, _ in rows) + left
    return 0 if bad == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
