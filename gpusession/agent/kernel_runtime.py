"""`python -m gpusession.agent run ...`: start the session kernel and keep it, detached from any
SSH connection, until it exits, the agent decides the session is over, or SIGTERM arrives.

Files in --state-dir:
  kernel.json    jupyter connection file (ports on --kernel-ip, random HMAC key)
  runtime.json   {"pid", "kernel_pid", "ready", "started_at", "agent_port", "kernel_generation"};
                 ready=true once the kernel's ports accept connections (false while it restarts)
  activity.json  written by the kernel (gpusession.agent.activity)
  restart-requested  written by the kernel when a shutdown_request asks for a restart
                 (JupyterLab's restart): its exit then starts a fresh kernel on the same
                 connection file instead of ending the session; so does the agent's POST /restart
  stopped.json   why the runtime ended ({"reason": StopReason, "at", "summary"}), for whoever
                 looks afterwards (gpusession.core.protocol.StopDetails reads it)
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import threading
import time

from ..configuration.agentargs import PLACEMENT, AgentArgs, add_arguments
from ..core.envnames import RESTART_FILE
from ..core.listening import kernel_listens
from ..core.protocol import Marker, StopKind, StopReason, marker_line, say_line
from . import service
from .kernelspawn import (
    Early,
    Spawned,
    as_socket,
    forget_restart,
    kernel_plan,
    private_state_dir,
    replace_json,
    say_ready,
    share_sockets,
    where,
    write_connection_file,
    write_runtime,
)


class Runtime:
    """Owns the kernel process. `stop(reason)` ends it; the agent's watchdog calls it too."""

    def __init__(self, args: AgentArgs):
        self.args = args
        self.state_dir = os.path.abspath(args.state_dir)
        private_state_dir(self.state_dir)
        self.connection_file = os.path.join(self.state_dir, "kernel.json")
        self.kernel: subprocess.Popen | Spawned | None = None
        self.stop_reason: StopReason | None = None
        self._stopped = threading.Event()
        self.started_at = time.time()
        self.agent_port: int | None = (
            args.agent_port if args.agent_port > 0 else None
        )  # the agent sets the real one
        self.stop_hooks: list = []  # callables(reason), run by stop() once the kernel is down
        self._stop_lock = threading.Lock()
        self._stopping = False
        self.generation = 0  # kernels started so far: a restart makes the next one
        self.kernel_ready = False
        self.ready_said = False  # READY said by the first step (kernelspawn.announce_early)
        self.agent_socket = None  # the agent's port, bound by the first step: the endpoint's
        self._restart = threading.Event()  # POST /restart asked for a fresh kernel
        self._kernel_lock = (
            threading.Lock()
        )  # a restart request and the swap to the next kernel: one at a time
        self.checkpoint: dict | None = (
            None  # the last save of the namespace (gpusession.agent.saving)
        )

    def spawn_kernel(self) -> dict:
        """A kernel process on the connection file (made at the first start, kept by restarts),
        started (not yet listening); its connection info."""
        info = write_connection_file(
            self.connection_file, self.args.kernel_ip, self.args.kernel_ports
        )
        self._restart.clear()
        forget_restart(self.state_dir)
        cmd, env = kernel_plan(
            self.connection_file,
            self.state_dir,
            self.args.session_id,
            self.args.workspace,
            self.args.restore and self.generation == 0,
        )
        # own process group: an interrupt_request SIGINTs the kernel's group, not us
        self.kernel = subprocess.Popen(
            cmd, env=env, start_new_session=True, cwd=self.args.cwd or None
        )
        if (
            self._stopping
        ):  # a stop came while a restart started this one: stop() may have missed it
            _end_process_group(self.kernel)
            raise RuntimeError("the session is stopping")
        return info

    def await_kernel(self, info: dict) -> dict:
        """Until the spawned kernel listens; then runtime.json says ready and, the first time,
        the READY marker."""
        deadline = time.time() + self.args.ready_timeout
        while time.time() < deadline:
            if self.kernel.poll() is not None:
                raise RuntimeError(f"kernel exited during start with code {self.kernel.returncode}")
            if kernel_listens(info):
                break
            time.sleep(0.01)  # a session's start waits for this
        else:
            raise RuntimeError(f"kernel did not listen within {self.args.ready_timeout}s")
        share_sockets(info)
        self.mark_ready()
        if self.generation == 1 and not self.ready_said:
            say_ready(self.state_dir, self.where(info))
        return info

    def mark_ready(self) -> None:
        """A kernel that listens: counted (a restart makes the next generation) and said in
        runtime.json. Called by await_kernel; the first step's kernel, which listened before
        this loaded (READY said, its sockets shared), is counted (count_ready) before the agent's
        endpoint answers and written after it binds. One of those that has ended since
        (a restart asked while this loaded: ~0.1 s of imports, longer on a busy machine) is
        wait()'s to restart or to end with, as any later kernel's end; not a failed start
        (await_kernel's "exited during start")."""
        self.count_ready()
        self._write_runtime(ready=True)

    def count_ready(self) -> None:
        self.generation += 1
        self.kernel_ready = True

    def where(self, info: dict) -> dict:
        """Where to connect, as KERNEL and READY say it (never the key: logs are read by more
        than the client)."""
        return where(info, self.agent_port)

    def kernel_state(self) -> dict:
        """What the agent's /health reports: which kernel runs (a restart counts up
        `generation`), whether its process runs, whether it listens."""
        kernel = self.kernel
        return {
            "generation": self.generation,
            "running": bool(kernel and kernel.poll() is None),
            "ready": self.kernel_ready,
        }

    def request_restart(self) -> dict:
        """A fresh kernel in this session: end the running kernel's process group (SIGTERM, then
        SIGKILL); `wait` then starts the next one on the same connection file. A kernel still
        booting is left alone: it is the fresh one already (JupyterLab's restart sends the
        kernel a shutdown_request, and the provisioner asks here too when the kernel count has
        not moved on yet; ending the booting kernel then ended the session, "kernel exited
        during start with code -15"). Returns `kernel_state()` as of the request."""
        if self._stopping:
            raise RuntimeError("the session is stopping")
        with self._kernel_lock:
            kernel = self.kernel
            if (
                kernel is not None and self.kernel_ready and kernel.poll() is None
            ):  # else one starts, or the session ends
                self._restart.set()
                threading.Thread(target=_end_process_group, args=(kernel,), daemon=True).start()
        return self.kernel_state()

    def _restart_wanted(self) -> bool:
        return self._restart.is_set() or os.path.exists(os.path.join(self.state_dir, RESTART_FILE))

    def _restart_kernel(self) -> None:
        with self._kernel_lock:  # from here on a restart request sees the next kernel, booting
            self.kernel_ready = False
            info = self.spawn_kernel()
        self._write_runtime(ready=False)
        self.await_kernel(info)

    def _write_runtime(self, **extra) -> None:
        write_runtime(
            self.state_dir,
            kernel=self.kernel,
            started_at=self.started_at,
            agent_port=self.agent_port,
            session_id=self.args.session_id,
            generation=self.generation,
            **extra,
        )

    def stop(self, reason: StopReason) -> None:
        """End the session: kernel first (SIGTERM, then SIGKILL), then this process's main loop."""
        with self._stop_lock:  # the watchdog and a SIGTERM may both ask: the first one wins
            if self._stopping:
                return
            self._stopping = True
        self.stop_reason = reason
        replace_json(
            os.path.join(self.state_dir, "stopped.json"),
            {"reason": reason.to_dict(), "at": time.time()},
        )
        say_line(marker_line(Marker.STOPPED, reason.to_dict()))
        if self.kernel and self.kernel.poll() is None:
            _end_process_group(self.kernel)
        for hook in list(self.stop_hooks):
            try:
                hook(reason)
            except Exception as exc:  # noqa: BLE001 - a failing hook must not keep the session up
                error = f"stop hook failed: {type(exc).__name__}: {exc}"
                say_line(marker_line(Marker.AGENT_ERROR, {"error": error}))
        self._stopped.set()

    def wait(self) -> int:
        while not self._stopped.is_set():
            if self.kernel and self.kernel.poll() is not None:
                if not self._stopping and self._restart_wanted():
                    try:
                        self._restart_kernel()
                    except Exception as exc:  # noqa: BLE001 - reported; the session ends
                        say_line(
                            marker_line(
                                Marker.FAILED, {"stage": "kernel restart", "error": str(exc)}
                            )
                        )
                        self.stop(
                            StopReason(StopKind.START_FAILED, detail=f"restart kernel: {exc}")
                        )
                    continue
                if self._stopping:  # a stop is under way on another thread: let it finish its
                    self._stopped.wait(130)  # hooks (the summary, the shutdown command) first
                    break
                if not self.stop_reason:
                    self.stop_reason = StopReason(
                        StopKind.KERNEL_EXIT, exit_code=self.kernel.returncode
                    )
                    replace_json(
                        os.path.join(self.state_dir, "stopped.json"),
                        {"reason": self.stop_reason.to_dict(), "at": time.time()},
                    )
                break
            self._stopped.wait(0.2)
        return 0


def _end_process_group(kernel: subprocess.Popen | Spawned, grace: float = 5.0) -> None:
    """SIGTERM the kernel's process group, SIGKILL it when it is still there after `grace` s."""
    try:
        os.killpg(kernel.pid, signal.SIGTERM)
        kernel.wait(timeout=grace)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(kernel.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m gpusession.agent")
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser(
        "run", help="start the session kernel and its agent; return when the session ends"
    )
    add_arguments(
        run, PLACEMENT
    )  # gpusession.configuration.agentargs.AgentArgs: every option of `run`, written once
    service.add_arguments(run)
    service.add_commands(sub)
    return p


def run_args(argv: list[str]) -> AgentArgs:
    """The options of `run` (its ARGS, without the command word), as the agent reads them."""
    return AgentArgs.from_namespace(build_parser().parse_args(["run", *argv]))


def main(argv: list[str] | None = None, early: Early | None = None) -> int:
    """`early`: the session's first kernel, started already by gpusession.agent.firststep from
    the same ARGS (the bundle's way in: the kernel boots while this module loads)."""
    parsed = build_parser().parse_args(argv)
    if parsed.command != "run":
        return service.run_command(parsed)
    args = AgentArgs.from_namespace(parsed)
    rt = Runtime(args)

    def on_signal(signum, frame):
        reason = StopReason(StopKind.SIGNAL, signal=int(signum))
        threading.Thread(target=rt.stop, args=(reason,), daemon=True).start()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C in a terminal must not kill the session
    try:
        if early is not None:
            rt.kernel, info = early.kernel, early.info
            rt.agent_socket, rt.ready_said = as_socket(early.agent_socket), early.ready_said
            if early.ready_said:  # counted before /health answers: a restart asked as soon as
                rt.count_ready()  # it does is this kernel's (it said generation 0 and was lost)
        else:
            info = rt.spawn_kernel()
        # before the kernel is ready: runtime.json and READY carry the agent's port
        service.start(rt, args)
        if early is None or not early.kernel_said:
            # a client on this machine may connect now: ZMQ waits for the kernel's ports by itself
            say_line(marker_line(Marker.KERNEL, rt.where(info)))
        if early is not None and early.ready_said:
            rt._write_runtime(ready=True)
        else:
            rt.await_kernel(info)
    except Exception as exc:  # noqa: BLE001 - reported, then exit non-zero
        say_line(marker_line(Marker.FAILED, {"stage": "kernel", "error": str(exc)}))
        rt.stop(StopReason(StopKind.START_FAILED, detail=f"start kernel: {exc}"))
        return 1
    return rt.wait()
