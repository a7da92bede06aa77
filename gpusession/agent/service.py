"""The agent as the runtime uses it: command-line options, wiring, and the `sample` /
`nvml-record` commands.

    kernel_runtime.build_parser -> add_arguments(run_parser), add_commands(subparsers)
    kernel_runtime.main         -> start(rt, args) while the kernel starts (binds the endpoint
                                   and sets rt.agent_port, which runtime.json and READY carry)
    backends                    -> AgentArgs.for_record(record, ...).argv(): the options (gpusession.configuration.agentargs)

Standard library only (and nvidia-ml-py, lazily), like the rest of gpusession.agent.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from typing import Any, Mapping

from ..configuration.agentargs import (
    DEFAULT_SAVE_TIMEOUT_S,
    RECORDING,
    WATCHDOG,
    AgentArgs,
    positive,
)
from ..configuration.agentargs import add_arguments as add_agent_arguments
from ..core.protocol import NOTICE_SAVE_S, Marker, Notice, StopReason, marker_line, say_line
from .gpuvisible import names_gpus
from .idle import ActivityTracker
from .notices import NoticeWatcher, save_for_notice
from .nvml import NvmlReader, RecordedNvml, record_raw
from .sampler import Sampler
from .saving import restore_report, save_kernel
from .watchdog import Watchdog


def _recording(path: str) -> str:
    """--nvml-replay: a recording of raw NVML values (`nvml-record`'s format), checked readable
    as the command line is read (a bad one is the command's error); replayed in a loop."""
    try:
        RecordedNvml.from_file(path, loop=True)
    except (OSError, ValueError) as exc:
        raise argparse.ArgumentTypeError(
            f"cannot read the NVML recording {path!r}: {exc}"
        ) from None
    return path


def replayed(
    path: str | None,
    gpus: int | None = None,
    gpu_type: str = "",
    env: Mapping[str, str] | None = None,
) -> RecordedNvml | None:
    """--nvml-replay's recording, loaded to replay in a loop as the session's `gpus` GPUs (None:
    the real GPUs); `gpu_type`, the session's, for the stats to say whether it is of that type.
    Where the environment names the session's GPUs among the machine's (a Slurm job's
    CUDA_VISIBLE_DEVICES, a docker session's NVIDIA_VISIBLE_DEVICES by UUID) the recording is
    the machine, replayed as recorded, and that choice picks the session's GPUs from it."""
    if not path:
        return None
    if names_gpus(os.environ if env is None else env):
        gpus = None
    return RecordedNvml.from_file(path, loop=True, gpus=gpus, gpu_type=gpu_type)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The watchdog's and the stats' options (gpusession.configuration.agentargs.AgentArgs holds them all)."""
    add_agent_arguments(
        parser.add_argument_group(WATCHDOG), WATCHDOG, types={RECORDING: _recording}
    )


def save_namespace(
    rt, args: AgentArgs, *, asked: bool = False, cause: Notice | None = None
) -> dict:
    """The kernel's namespace into the workspace, within --save-timeout (the watchdog before its
    stops; `asked`: POST /save, `stop --save`, which saves even with --save-timeout off, within
    the default bound; `cause`: a notice, which saves whatever --save-timeout says, within
    NOTICE_SAVE_S at most); the result is kept for the stop summary."""
    timeout = args.save_timeout or (DEFAULT_SAVE_TIMEOUT_S if asked or cause else None)
    if cause is not None:
        timeout = min(timeout, NOTICE_SAVE_S)
    if not args.workspace or not timeout:
        result = {"committed": False, "error": "no workspace" if timeout else "saving is off"}
    else:
        kernel = rt.kernel
        pid = kernel.pid if kernel is not None and kernel.poll() is None else None
        result = save_kernel(
            rt.state_dir,
            pid,
            timeout_s=timeout,
            cap_bytes=args.save_cap or None,
            cause=cause.value if cause else None,
        )
    if cause is not None:
        result = dict(result)
        result["for"] = cause.value
    rt.checkpoint = result
    return result


def _save_then_stop(rt, args: AgentArgs, reason: StopReason) -> None:
    """The watchdog's stop: save first (bounded), then stop, whatever the save did."""
    if reason.kind.by_watchdog and args.workspace and args.save_timeout:
        try:
            save_namespace(rt, args)
        except Exception as exc:  # noqa: BLE001 - the stop must happen: it is what saves money
            rt.checkpoint = {"committed": False, "error": f"{type(exc).__name__}: {exc}"[:300]}
    rt.stop(reason)


def start(rt, args: AgentArgs) -> Watchdog | None:
    """Start the endpoint and the watchdog for runtime `rt` (called before its kernel starts)."""
    if args.no_agent:
        return None
    tracker = ActivityTracker(args, args.billed_since or rt.started_at, active_since=time.time())
    replay = replayed(args.nvml_replay, args.gpu_count, args.gpu_type)
    sampler = Sampler(
        NvmlReader(replay) if replay is not None else None,
        interval_s=args.sample_interval or 1.0,
        history_s=int(args.history),
    )
    watchdog = Watchdog(
        session_id=args.session_id,
        state_dir=rt.state_dir,
        tracker=tracker,
        sampler=sampler,
        stop=lambda reason: _save_then_stop(rt, args, reason),
        gpu_count=args.gpu_count,
        check_interval_s=args.check_interval or 1.0,
        sample_interval_s=args.sample_interval,
    )
    watchdog.running = True  # its thread starts below: /stats, served first, waits for a sample
    if args.agent_port >= 0:
        _serve_endpoint(rt, args, watchdog)
    rt.stop_hooks.append(lambda reason: _on_stop(rt, watchdog, args, reason))
    threading.Thread(target=watchdog.run, name="gpusession-watchdog", daemon=True).start()
    notices = NoticeWatcher(
        args.notice_dir or os.path.join(rt.state_dir, "notices"),
        lambda kind, notice: save_for_notice(
            kind, notice, save=lambda k: save_namespace(rt, args, cause=k), stop=rt.stop
        ),
    )
    threading.Thread(target=notices.run, name="gpusession-notices", daemon=True).start()
    return watchdog


BIND_RETRY_S = 90.0  # a fixed agent port held by a closing socket: TIME_WAIT lasts 60 s


def _serve_endpoint(rt, args: AgentArgs, watchdog: Watchdog, retry_s: float = BIND_RETRY_S) -> None:
    """The stats and control endpoint on --agent-port. A fixed port that is taken (a socket in
    TIME_WAIT, a connect that got it as its own port) is tried again, on a thread of its own,
    every second for `retry_s`: the client reaches the agent only there. Said in an AGENT_ERROR
    marker when it is taken and when it stays so; the watchdog, what saves money, runs meanwhile."""
    # lazy: docs/architecture.md#imports-kept-inside-functions (the kernel boots meanwhile)
    from .endpoint import AgentServer, token_from_connection_file

    def serve() -> None:
        server = AgentServer(
            watchdog,
            token_from_connection_file(rt.connection_file),
            port=args.agent_port,
            sock=getattr(rt, "agent_socket", None),  # bound by the first step, when it was
            kernel=rt,
            save=lambda: save_namespace(rt, args, asked=True),
            restored=lambda: restore_report(rt.state_dir),
        ).start()
        rt.agent_port = server.port

    def say(error: str) -> None:
        say_line(marker_line(Marker.AGENT_ERROR, {"error": error}))

    try:
        serve()
        return
    except OSError as exc:
        rt.agent_port = None
        if not args.agent_port:  # any free port was asked: nothing to wait for
            say(f"no stats endpoint: {exc}")
            return
        say(f"port {args.agent_port} is taken ({exc}): trying again for {retry_s:.0f}s")

    def again() -> None:
        deadline, last = time.monotonic() + retry_s, None
        while time.monotonic() < deadline:
            time.sleep(1.0)
            try:
                serve()
                return
            except OSError as exc:
                last = exc
        say(f"no stats endpoint on port {args.agent_port}: {last}")

    threading.Thread(target=again, name="gpusession-agent-bind", daemon=True).start()


def _on_stop(rt, watchdog: Watchdog, args: AgentArgs, reason: StopReason) -> None:
    """At any stop: leave the summary next to stopped.json and in the log, then run the
    shutdown command (the instance powers off; the container has already lost its kernel)."""
    summary = watchdog.summary()
    summary["reason"] = reason.to_dict()
    if getattr(rt, "checkpoint", None) is not None:
        summary["checkpoint"] = rt.checkpoint
    path = os.path.join(rt.state_dir, "stopped.json")
    try:
        with open(path) as f:
            stopped = json.load(f)
    except (OSError, ValueError):
        stopped = {"reason": reason.to_dict(), "at": time.time()}
    stopped["summary"] = summary
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(stopped, f)
    os.replace(tmp, path)
    say_line(marker_line(Marker.SUMMARY, summary))
    if args.termination_log:
        _write_brief(args.termination_log, stopped, summary)
    if args.shutdown_command:
        say_line(marker_line(Marker.SHUTDOWN, {"command": args.shutdown_command}))
        try:
            subprocess.run(args.shutdown_command, shell=True, timeout=120, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            say_line(marker_line(Marker.AGENT_ERROR, {"error": f"shutdown command failed: {exc}"}))


BRIEF_BYTES = 4096  # what Kubernetes keeps of a container's termination message


def _write_brief(path: str, stopped: dict, summary: dict) -> None:
    """The end in brief (stopped.json's reason and time, the save), within BRIEF_BYTES: where
    the session's log may be gone by the time the local side asks (a pod deleted by its
    cluster), its status still holds this (pods.termination_brief reads it)."""
    checkpoint = summary.get("checkpoint")
    brief = {
        "reason": stopped.get("reason"),
        "at": stopped.get("at"),
        "summary": {
            k: v for k, v in summary.items() if k in ("reason", "at", "session_id", "checkpoint")
        },
    }
    text = json.dumps(brief, separators=(",", ":"))
    if len(text.encode()) > BRIEF_BYTES and isinstance(checkpoint, dict):
        keep = ("committed", "for", "error", "saved", "bytes", "seconds", "folder", "noticed_at")
        brief["summary"]["checkpoint"] = {k: checkpoint.get(k) for k in keep if k in checkpoint}
        text = json.dumps(brief, separators=(",", ":"))
    if len(text.encode()) > BRIEF_BYTES:
        brief["summary"].pop("checkpoint", None)
        text = json.dumps(brief, separators=(",", ":"))[:BRIEF_BYTES]
    try:
        with open(path, "w") as f:
            f.write(text)
    except OSError as exc:
        say_line(marker_line(Marker.AGENT_ERROR, {"error": f"no brief in {path}: {exc}"}))


# -- commands besides `run` --------------------------------------------------------------------


def add_commands(subparsers) -> None:
    s = subparsers.add_parser(
        "sample", help="read the GPUs (and this machine's CPU/memory) and print JSON"
    )
    s.add_argument("--count", type=int, default=1, help="samples to take (default 1)")
    s.add_argument("--interval", type=positive, default=1.0, help="seconds between samples")
    s.add_argument(
        "--recorded",
        default="",
        help="replay raw NVML values from this JSON file instead of the driver",
    )
    r = subparsers.add_parser(
        "nvml-record", help="print the driver's raw NVML values (tests/data format)"
    )
    r.add_argument("--frames", type=int, default=1, help="readings to record, one a second")


def run_command(args: argparse.Namespace) -> int:
    if args.command == "sample":
        return _sample_command(args)
    if args.command == "nvml-record":
        doc: dict[str, Any] = {"frames": []}
        for i in range(max(1, args.frames)):
            try:
                one = record_raw()
            except ImportError as exc:  # no nvidia-ml-py: one line, not our frames
                raise SystemExit(f"nvml-record: {exc}") from None
            doc.update({k: v for k, v in one.items() if k != "frames"})
            doc["frames"] += one["frames"]
            if one.get("init_error"):
                break
            if i + 1 < args.frames:
                time.sleep(1)
        json.dump(doc, sys.stdout, indent=1)
        print()
        return 0
    raise SystemExit(f"unknown command {args.command}")


def _sample_command(args: argparse.Namespace) -> int:
    reader = NvmlReader(RecordedNvml.from_file(args.recorded) if args.recorded else None)
    sampler = Sampler(reader, interval_s=args.interval)
    timings = []
    for i in range(max(1, args.count)):
        t0 = time.perf_counter()
        sampler.sample(time.time(), kernel_busy=False)
        timings.append((time.perf_counter() - t0) * 1000)
        if i + 1 < args.count:
            time.sleep(args.interval)
    doc = {
        "gpus_visible": sampler.gpus_visible,
        "message": sampler.message,
        "driver_version": reader.driver_version,
        "samples": sampler.samples(),
        "sample_ms": {"mean": round(sum(timings) / len(timings), 3), "max": round(max(timings), 3)},
    }
    reader.close()
    json.dump(doc, sys.stdout, indent=1)
    print()
    return 0
