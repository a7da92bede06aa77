"""The fault suite: a docker session met as a user meets it, with faults injected, and its figures.

    python bench/bench_faults.py [--cuts 500] [--seed 1] [--image gpusession/cuda:ci] [--write docs/benchmarks.md]

Needs a Docker engine, the product image and root (`ss -K` cuts the tunnel's TCP connections, as a
network blip does). The cuts need a session reached through an SSH tunnel: one on the remote
engine of scripts/ci-remote-host.sh (`--host ssh://root@10.200.0.2`, brought up here), or, with
`--place local`, on this machine's engine when its sessions are tunneled. tests/test_faults.py
runs the same suite smaller in CI.

- **tunnel cuts**, in cycles of three cells on one session: a cell before the cut (it sets a
  variable), a cell printing 10 lines at 10 Hz with a cut in the middle, and a cut followed at
  once by a cell that reads the variable back. Each cell must end (a cell still waiting after
  CELL_LIMIT_S counts as hung), show every line exactly once and in order or name exactly which
  outputs were lost (else: lost silently), and a cell said not to have run must truly not have run.
  A cut is survived when the variable and the kernel process are still there after it.
- **kills at every start stage**: `SessionManager.start` in a process killed (SIGKILL) as soon as
  the record is provisioning, the container exists, the record is starting, and 0.3 s later
  (tunnel and kernel on the way). A session that got to running is no leak: it outlives its
  starter by design (`gpusession start`), and is stopped as a user would.
- **killed kernel, killed container** while a cell runs: the cell must end with one clear error.
- after everything, `gc`: records still active and containers still there are counted as left.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from gpusession.core.errors import CellLost, GpuSessionError  # noqa: E402
from gpusession.transport.kernel.sink import OutputSink  # noqa: E402
from support.leftovers import remove_workspace_volumes  # noqa: E402

LABEL = "gpusession.session"
CELL_LIMIT_S = 60.0  # a cell still waiting after this is hung
LINES = 10
LOST = re.compile(r"\[gpusession\] outputs? (\d+)(?:-(\d+))? of this cell")


@dataclasses.dataclass
class Figures:
    cuts: int = 0
    cuts_survived: int = 0
    cells: int = 0
    cells_hung: int = 0
    outputs_lost_silently: int = 0  # cells whose output was wrong with no exact warning
    outputs_lost_named: int = 0  # cells that named exactly which outputs were lost
    outputs_recovered: int = 0  # outputs lost in transit and shown again from the kernel's cell log
    replies_recovered: int = 0  # execute replies lost in transit, taken from the kernel's cell log
    cells_said_not_run: int = 0  # CellLost: "did not run; run it again"
    said_not_run_but_ran: int = 0
    start_kills: int = 0
    runtime_kills: int = 0  # kernel or container killed mid-cell
    runtime_kills_clear: int = 0  # ... and the cell ended with one clear error
    stops_failed: int = 0  # `%gpu stop` in the same process right after the cuts failed
    transfer_cuts: int = 0  # cuts inside a 50 MB push, pull, upload or download
    transfer_cuts_inside: int = 0  # ... made before the transfer ended (not after, on a fast link)
    transfers_resumed: int = 0  # ... that ended whole, checked byte for byte
    transfers_failed_clean: int = 0  # ... that ended with one line and nothing under its final name
    transfers_hung: int = 0
    transfers_corrupt: int = 0  # said done, but the bytes differ
    transfers_partial_left: int = 0  # failed, and a partial file stayed under its final name
    records_left: int = 0
    containers_left: int = 0
    notes: list[str] = dataclasses.field(default_factory=list)  # what went wrong: failures
    said: list[str] = dataclasses.field(default_factory=list)  # what happened, as it may
    seconds: float = 0.0

    def rows(self) -> list[tuple[str, str, str]]:
        """(figure, value, target)."""
        return [
            (
                "tunnel cuts survived (variables and kernel kept)",
                f"{self.cuts_survived} / {self.cuts}",
                "all",
            ),
            ("cells run around the cuts", str(self.cells), ""),
            ("cells hung", str(self.cells_hung), "0"),
            ("cells with output lost silently", str(self.outputs_lost_silently), "0"),
            ("cells that named exactly which outputs were lost", str(self.outputs_lost_named), ""),
            (
                "outputs lost in transit, shown in place from the kernel's log",
                str(self.outputs_recovered),
                "",
            ),
            (
                "replies lost in transit, taken from the kernel's log",
                str(self.replies_recovered),
                "",
            ),
            ('cells said not to have run ("run it again")', str(self.cells_said_not_run), ""),
            ("... of which had in fact run", str(self.said_not_run_but_ran), "0"),
            ("starts killed (at each stage)", str(self.start_kills), ""),
            (
                "kernel / container kills mid-cell ended with one clear error",
                f"{self.runtime_kills_clear} / {self.runtime_kills}",
                "all",
            ),
            (
                "stop right after the cuts failed (a new process's stop then worked)",
                str(self.stops_failed),
                "0",
            ),
            (
                "cuts inside transfers (50 MB push / pull / upload / download)",
                str(self.transfer_cuts),
                "",
            ),
            (
                "... of which the cut landed before the transfer ended",
                str(self.transfer_cuts_inside),
                "",
            ),
            ("... resumed (ended whole, checked)", str(self.transfers_resumed), ""),
            (
                "... failed cleanly (one line, nothing under the final name)",
                str(self.transfers_failed_clean),
                "",
            ),
            ("... hung", str(self.transfers_hung), "0"),
            ("... corrupt", str(self.transfers_corrupt), "0"),
            ("... left a partial file under its final name", str(self.transfers_partial_left), "0"),
            ("records left active after gc", str(self.records_left), "0"),
            ("containers left after gc", str(self.containers_left), "0"),
        ]

    def table(self) -> str:
        lines = ["| figure | value | target |", "|---|---|---|"]
        lines += [f"| {a} | {b} | {c} |" for a, b, c in self.rows()]
        return "\n".join(lines)

    def failures(self) -> list[str]:
        bad = []
        if self.cuts_survived != self.cuts:
            bad.append(f"{self.cuts - self.cuts_survived} cuts not survived")
        for name in (
            "cells_hung",
            "outputs_lost_silently",
            "said_not_run_but_ran",
            "stops_failed",
            "records_left",
            "containers_left",
            "transfers_hung",
            "transfers_corrupt",
            "transfers_partial_left",
        ):
            if getattr(self, name):
                bad.append(f"{name}: {getattr(self, name)}")
        if self.runtime_kills_clear != self.runtime_kills:
            bad.append(
                f"{self.runtime_kills - self.runtime_kills_clear} kills without one clear error"
            )
        return bad + self.notes


class Recorder(OutputSink):
    def __init__(self):
        self.out: list[str] = []
        self.err: list[str] = []

    def stream(self, name, text):
        (self.err if name == "stderr" else self.out).append(text)

    def display(self, data, metadata, transient=None, update=False):
        self.out.append(data.get("text/plain", "") + "\n")

    def clear(self, wait):
        pass


class NoTunnel(Exception):
    """This session is reached without an SSH tunnel: there is nothing to cut."""


def tunnel_end(session) -> tuple[str, int]:
    """The (address, port) our TCP connection of the session's tunnel goes to: its jump host's
    sshd when it has one, else the target's."""
    tunnel = getattr(session.link, "tunnel", None)
    if tunnel is None:
        raise NoTunnel(
            f"session {session.name} is reached directly ({type(session.link).__name__})"
        )
    hop = tunnel.jump or tunnel.target
    return hop.host, hop.port


def cut(end: tuple[str, int]) -> None:
    """A network blip: every TCP connection to the tunnel's sshd is killed."""
    subprocess.run(
        ["ss", "-K", "dst", end[0], "dport", "=", str(end[1])], check=True, capture_output=True
    )


def run_cell(session, code: str, limit: float = CELL_LIMIT_S) -> tuple[Recorder, object, bool]:
    """(output, the reply or the exception, hung)."""
    sink, box = Recorder(), {}

    def go():
        try:
            box["result"] = session.run(code, sink)
        except BaseException as exc:  # noqa: BLE001 - counted by the caller
            box["result"] = exc

    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(limit)
    return sink, box.get("result"), t.is_alive()


class Broken(Exception):
    """A cell ended with an error other than "did not run": the session is no longer to be trusted."""


def ask(session, expression: str) -> str:
    """A value from the session kernel, asking again when a cut lost the question."""
    for _ in range(3):
        try:
            return session.kernel.evaluate(expression)
        except CellLost:
            continue
    return session.kernel.evaluate(expression)


def judge(fig: Figures, sink: Recorder, result, expected: list[str], what: str) -> str:
    """Count one cell: 'ok', 'named' (exact loss warning), 'not-run' (CellLost) or 'bad'."""
    fig.cells += 1
    if isinstance(result, CellLost):
        fig.cells_said_not_run += 1
        return "not-run"
    if isinstance(result, BaseException):
        fig.notes.append(f"{what}: {type(result).__name__}: {result}")
        raise Broken(what) from result
    got = [line for line in "".join(sink.out).splitlines() if line]
    if got == expected:
        return "ok"
    lost: set[int] = set()
    for m in LOST.finditer("".join(sink.err)):
        lost.update(range(int(m.group(1)), int(m.group(2) or m.group(1)) + 1))
    if lost and got == [line for n, line in enumerate(expected, 1) if n not in lost]:
        fig.outputs_lost_named += 1
        return "named"
    fig.outputs_lost_silently += 1
    fig.notes.append(f"{what}: expected {expected}, got {got}, stderr {''.join(sink.err)!r}")
    return "bad"


def cut_cycles(manager, n_cuts: int, fig: Figures, rng: random.Random, host: str | None) -> None:
    """n_cuts cuts (two per cycle) on one session on `host` (None: this machine's engine)."""
    session = manager.start(
        manager.make_spec("t4", backend="docker", idle="off", name="cuts", host=host)
    )
    try:
        end = tunnel_end(session)
        pid = ask(session, "__import__('os').getpid()")
        _cycles(session, end, pid, n_cuts, fig, rng)
        counts = getattr(session.kernel, "counts", {})
        fig.outputs_recovered = counts.get("outputs_recovered", 0)
        fig.replies_recovered = counts.get("replies_recovered", 0)
    except Broken:
        pass  # noted; the cuts not made count as not survived
    except NoTunnel as exc:
        fig.notes.append(f"no cuts: {exc}")
    finally:
        try:
            manager.stop(session.id)  # as the user does after the cuts
        except GpuSessionError as exc:
            fig.stops_failed += 1
            fig.notes.append(f"stop after the cuts failed: {exc}")
            _stop_elsewhere(session.id)  # `gpusession stop cuts`, as the user would then


def _stop_elsewhere(session_id: str) -> None:
    from gpusession.session import SessionManager

    other = SessionManager()
    try:
        other.stop(session_id)
    finally:
        other.close()


def _cycles(
    session, end: tuple[str, int], pid: str, n_cuts: int, fig: Figures, rng: random.Random
) -> None:
    """Before, during, after: until n_cuts cuts are made (or a cell hangs)."""
    i = 0
    while fig.cuts < n_cuts:
        i += 1
        # before: a variable to find again
        sink, result, hung = run_cell(session, f"v{i} = {i}\nprint('before {i}')")
        if hung:
            fig.cells_hung += 1
            return
        if judge(fig, sink, result, [f"before {i}"], f"cycle {i} before") == "not-run":
            session.run(f"v{i} = {i}", Recorder())
        # during: 10 Hz output with a cut in the middle
        timer = threading.Timer(rng.uniform(0.15, 0.9), cut, (end,))
        timer.start()
        code = (
            f"import time\nran_{i} = True\nfor k in range({LINES}):\n"
            f"    print(f'{i}:{{k}}', flush=True)\n    time.sleep(0.1)\n"
        )
        sink, result, hung = run_cell(session, code)
        timer.join()
        fig.cuts += 1
        if hung:
            fig.cells_hung += 1
            return
        verdict = judge(fig, sink, result, [f"{i}:{k}" for k in range(LINES)], f"cycle {i} during")
        if verdict == "not-run" and ask(session, f"'ran_{i}' in globals()") == "True":
            fig.said_not_run_but_ran += 1
        # after: a cut, then at once a cell
        cut(end)
        fig.cuts += 1
        sink, result, hung = run_cell(
            session, f"after_{i} = True\nprint(v{i}, __import__('os').getpid())"
        )
        if hung:
            fig.cells_hung += 1
            return
        verdict = judge(fig, sink, result, [f"{i} {pid}"], f"cycle {i} after")
        if verdict == "not-run":
            if ask(session, f"'after_{i}' in globals()") == "True":
                fig.said_not_run_but_ran += 1
            sink, result, hung = run_cell(session, f"print(v{i}, __import__('os').getpid())")
            verdict = "ok" if not hung and "".join(sink.out).split() == [str(i), pid] else "bad"
        if verdict in ("ok", "named"):
            fig.cuts_survived += 2


TRANSFER_SIZE = 50_000_000
TRANSFER_LIMIT_S = 120.0  # a transfer still going after this is hung
TRANSFER_KINDS = ("push", "pull", "upload", "download")


def transfer_cuts(
    manager, n_cuts: int, fig: Figures, rng: random.Random, host: str | None, work: Path
) -> None:
    """n_cuts transfers of 50 MB (push, pull, upload, download in turn) on one session on `host`,
    each with a tunnel cut at a random point inside it; each counted by what the user is left with."""
    import hashlib

    session = manager.start(
        manager.make_spec("t4", backend="docker", idle="off", name="xfercuts", host=host)
    )
    try:
        end = tunnel_end(session)
        blob = os.urandom(TRANSFER_SIZE)
        digest = hashlib.sha256(blob).hexdigest()
        (work / "up.bin").write_bytes(blob)
        session.push({"blob": blob})
        session.run("open('big.bin', 'wb').write(blob)", Recorder())
        for i in range(n_cuts):
            kind = TRANSFER_KINDS[i % len(TRANSFER_KINDS)]
            _transfer_cut(session, kind, i, end, rng.uniform(0.1, 0.9), blob, digest, work, fig)
            if fig.transfers_hung:
                return  # a hung transfer holds the kernel's connection: the rest would not say more
    except NoTunnel as exc:
        fig.notes.append(f"no transfer cuts: {exc}")
    finally:
        try:
            manager.stop(session.id)
        except GpuSessionError as exc:
            fig.notes.append(f"stop after the transfer cuts failed: {exc}")
            _stop_elsewhere(session.id)


def _transfer_cut(
    session, kind: str, i: int, end, at: float, blob: bytes, digest: str, work: Path, fig: Figures
) -> None:
    import hashlib

    state: dict = {"cut": None}

    def cut_now() -> None:
        cut(end)
        state["cut"] = time.monotonic()

    def progress(done, total):
        if not state.get("asked") and total and done >= at * total:
            state["asked"] = True
            threading.Thread(target=cut_now, daemon=True).start()

    out, name = work / f"out{i}", f"in{i}"
    calls = {
        "push": lambda: session.push({f"p{i}": blob}, progress),
        "pull": lambda: session.pull(["blob"], progress),
        "upload": lambda: session.upload([str(work / "up.bin")], name, progress),
        "download": lambda: session.download(["big.bin"], str(out), progress),
    }
    box: dict = {}

    def go():
        try:
            box["result"] = calls[kind]()
        except BaseException as exc:  # noqa: BLE001 - counted below
            box["result"] = exc
        box["ended"] = time.monotonic()

    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(TRANSFER_LIMIT_S)
    fig.transfer_cuts += 1
    if t.is_alive():
        fig.transfers_hung += 1
        fig.notes.append(f"transfer {i} ({kind}) still going after {TRANSFER_LIMIT_S:.0f}s")
        return
    result = box.get("result")
    if state["cut"] is not None and state["cut"] < box["ended"]:
        fig.transfer_cuts_inside += 1
    sha = "__import__('hashlib').sha256({}).hexdigest()"
    if kind == "push":
        there = ask(session, sha.format(f"globals().get('p{i}', b'')")).strip("'")
        whole, left = there == digest, False
    elif kind == "pull":
        whole = (
            isinstance(result, dict)
            and hashlib.sha256(result.get("blob", b"")).hexdigest() == digest
        )
        left = False
    elif kind == "upload":
        file = repr(f"{name}/up.bin")
        read = sha.format(f"open({file}, 'rb').read()")
        there = ask(session, f"{read} if __import__('os').path.exists({file}) else ''").strip("'")
        whole, left = there == digest, there not in ("", digest)
    else:
        path = out / "big.bin"
        there = hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else ""
        whole, left = there == digest, there not in ("", digest)
    if not isinstance(result, BaseException):
        if whole:
            fig.transfers_resumed += 1
        else:
            fig.transfers_corrupt += 1
            fig.notes.append(f"transfer {i} ({kind}) said done, but the bytes differ")
    elif left:
        fig.transfers_partial_left += 1
        fig.notes.append(
            f"transfer {i} ({kind}) failed ({result}) and left a partial file under its name"
        )
    elif isinstance(result, GpuSessionError) and "\n" not in str(result):
        fig.transfers_failed_clean += 1
        fig.said.append(f"transfer {i} ({kind}) failed cleanly: {result}")  # an allowed end
    else:
        fig.notes.append(f"transfer {i} ({kind}) ended with {type(result).__name__}: {result}")


STARTER = """
import os, sys
from gpusession.session import SessionManager
m = SessionManager()
m.start(m.make_spec("t4", backend="docker", idle="off", name=sys.argv[1]))
print("running", flush=True)
import time; time.sleep(600)
"""


def start_kills(manager, engine, env: dict, fig: Figures) -> None:
    """A starting process killed at each stage; gc at the end collects what they left."""
    from gpusession.core.models import State

    def kernel_on_its_way(name: str) -> bool:
        """Connecting: the kernel's process runs (its KERNEL line is in the container's log) and
        the start waits for it. An event, not a time in STARTING: a start's connect can now be
        over in less than the 0.3 s this waited for."""
        if _state(manager, name) != State.STARTING:
            return False
        found = _ours(engine, _id(manager, name))
        return bool(found) and b"GPUSESSION_KERNEL" in found[0].logs()

    stages = {
        "provisioning": lambda name: _state(manager, name) == State.PROVISIONING,
        "container": lambda name: bool(_ours(engine, _id(manager, name))),
        "starting": lambda name: _state(manager, name) == State.STARTING,
        "connecting": kernel_on_its_way,
    }
    for stage, reached in stages.items():
        name = f"start-kill-{stage}"  # names stay with their sessions: not runtime_kills' kill-*
        proc = subprocess.Popen(
            [sys.executable, "-c", STARTER, name],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 120
        try:
            while not reached(name):
                if proc.poll() is not None or time.monotonic() > deadline:
                    fig.notes.append(f"start kill at {stage}: never reached (exit {proc.poll()})")
                    break
                time.sleep(0.005)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
        fig.start_kills += 1
        if _state(manager, name) == State.RUNNING:  # it was faster than the kill: a user stops it
            manager.stop(name)


def _state(manager, name: str):
    try:
        return manager.store.get(name).state
    except GpuSessionError:
        return None


def _id(manager, name: str) -> str | None:
    try:
        return manager.store.get(name).id
    except GpuSessionError:
        return None


def _ours(engine, session_id: str | None) -> list:
    if session_id is None:
        return []
    return engine.containers.list(
        all=True, ignore_removed=True, filters={"label": f"{LABEL}={session_id}"}
    )


def runtime_kills(manager, engine, fig: Figures) -> None:
    """The kernel process, then the whole container, killed while a cell runs."""
    from gpusession.words.stops import error_text

    for what in ("kernel", "container"):
        session = manager.start(
            manager.make_spec("t4", backend="docker", idle="off", name=f"kill-{what}")
        )
        container = engine.containers.get(session.record.resource["container_id"])

        def kill(container=container, what=what):
            time.sleep(1.0)
            if what == "container":
                container.kill()
                return
            from gpusession.backends.docker.container_setup import (
                STATE_DIR,
            )  # the runtime's state folder there

            runtime = json.loads(
                container.exec_run(["sh", "-c", f"cat {STATE_DIR}/runtime.json"]).output
            )
            done = container.exec_run(["sh", "-c", f"kill -9 {runtime['kernel_pid']}"])
            if done.exit_code:
                fig.notes.append(f"could not kill the kernel: {done.output!r}")

        killer = threading.Thread(target=kill, daemon=True)
        killer.start()
        sink, result, hung = run_cell(
            session, "import time\nprint('go', flush=True)\ntime.sleep(30)"
        )
        killer.join()
        fig.runtime_kills += 1
        fig.cells += 1
        if hung:
            fig.cells_hung += 1
        elif (
            isinstance(result, GpuSessionError)
            and "\n" not in error_text(result)
            and error_text(result)
        ):
            fig.runtime_kills_clear += 1
        else:
            fig.notes.append(f"killed {what}: the cell ended with {result!r}")


def gc_and_count(manager, engines: list, fig: Figures) -> None:
    """`gpusession gc` as a user runs it: a new process (here: a new manager, its own engine
    connections), then what is left."""
    from gpusession.session import SessionManager

    fresh = SessionManager()
    try:
        fresh.gc(backends=["docker"])
    finally:
        fresh.close()
    fig.records_left = len(manager.store.list(active_only=True))
    fig.containers_left = sum(
        len(
            engine.containers.list(
                all=True,
                ignore_removed=True,
                filters={"label": f"gpusession.session.store={manager.store.store_id}"},
            )
        )
        for engine in engines
    )
    for rec in manager.store.list(active_only=True):
        fig.notes.append(f"left after gc: {rec.name} {rec.state.value}")


def remote_engine(home: str | os.PathLike) -> dict | None:
    """Bring up the namespace Docker host (scripts/ci-remote-host.sh) and point HOME at an ssh
    setup that reaches it, as a user's ~/.ssh would; None when it cannot run here."""
    from support.hosts import ensure_remote_host, ssh_home

    remote = ensure_remote_host()
    if remote is not None:
        os.environ["HOME"] = ssh_home(remote, home)
    return remote


def run_suite(
    cuts: int,
    *,
    seed: int = 1,
    kills: bool = True,
    env: dict | None = None,
    remote: dict | None = None,
    transfers: int = 0,
) -> Figures:
    """The whole suite in this process's GPUSESSION_HOME: cuts on the `remote` engine (from
    remote_engine; None: this machine's), kills on this machine's engine, then gc on both."""
    import docker

    from gpusession.session import SessionManager

    t0 = time.monotonic()
    fig, rng = Figures(), random.Random(seed)
    manager = SessionManager()
    engines = [docker.from_env()]
    if remote is not None:
        engines.append(docker.DockerClient(base_url=remote["docker_host_env"]))
    try:
        if cuts:
            cut_cycles(manager, cuts, fig, rng, remote["url"] if remote else None)
        if transfers:
            with tempfile.TemporaryDirectory(prefix="gpusession-xfer-") as work:
                transfer_cuts(
                    manager, transfers, fig, rng, remote["url"] if remote else None, Path(work)
                )
        if kills:
            runtime_kills(manager, engines[0], fig)
            start_kills(manager, engines[0], dict(env or os.environ), fig)
        gc_and_count(manager, engines, fig)
    finally:
        manager.close()
        for engine in engines:
            engine.close()
    fig.seconds = time.monotonic() - t0
    return fig


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cuts", type=int, default=500)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--image", default=os.environ.get("GPUSESSION_TEST_IMAGE", "gpusession/cuda:ci")
    )
    ap.add_argument("--transfer-cuts", type=int, default=100, help="cuts inside 50 MB transfers")
    ap.add_argument("--no-kills", action="store_true")
    ap.add_argument(
        "--place",
        choices=("remote", "local"),
        default="remote",
        help="where the cut session runs: the namespace host's engine, or this machine's",
    )
    ap.add_argument(
        "--write", help="put the table into this markdown file between bench_faults markers"
    )
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpusession-faults-") as home:
        env = dict(
            os.environ,
            GPUSESSION_HOME=home,
            GPUSESSION_IMAGE=args.image,
            PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        )
        os.environ.update(GPUSESSION_HOME=home, GPUSESSION_IMAGE=args.image)
        remote = remote_engine(Path(home) / "home") if args.place == "remote" else None
        if args.place == "remote" and remote is None:
            print(
                "the remote engine cannot run here (root and a Docker engine are needed)",
                file=sys.stderr,
            )
            return 2
        try:
            fig = run_suite(
                args.cuts,
                seed=args.seed,
                kills=not args.no_kills,
                env=env,
                remote=remote,
                transfers=args.transfer_cuts,
            )
        finally:  # its sessions' workspaces ("cuts", "xfercuts"), here and on the host
            remove_workspace_volumes(Path(home))
    table = fig.table()
    print(table)
    print(f"\n{fig.seconds:.0f} s; seed {args.seed}")
    for note in fig.said:
        print("note:", note)
    for note in fig.notes:
        print("failure:", note)
    if args.write:
        path = Path(args.write)
        text = path.read_text()
        block = (
            f"<!-- bench_faults:begin -->\n{table}\n\nRun: {args.cuts} cuts, {args.transfer_cuts} transfer "
            f"cuts, seed {args.seed}, {fig.seconds:.0f} s.\n<!-- bench_faults:end -->"
        )
        if "<!-- bench_faults:begin -->" in text:
            text = re.sub(
                r"<!-- bench_faults:begin -->.*<!-- bench_faults:end -->", block, text, flags=re.S
            )
        else:
            text = text.rstrip() + "\n\n" + block + "\n"
        path.write_text(text)
    return 1 if fig.failures() else 0


if __name__ == "__main__":
    sys.exit(main())
