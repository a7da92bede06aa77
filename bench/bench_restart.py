"""Restarting a session kernel in a loop, as JupyterLab's Restart does, with and without an
interrupt just before: restarts ok, sessions lost (must be 0), and the restart's time against
the floor (the same restart of a plain local ipykernel, measured in the same run).

    python bench/bench_restart.py [--restarts 50] [--backend local] [--write docs/benchmarks.md]

Driven through a real jupyter_client AsyncKernelManager (what jupyter_server uses) with the
gpusession kernelspec, so each restart is the provisioner's: a shutdown_request with
restart=true, the kernel manager's wait, then the relaunch. A restart counts as ok when the
fresh kernel answers a cell (and the old variables are gone) in the same session; a session is
lost when it ends (recorded stopped or failed) while it restarts. After a loss the loop starts
a new kernel and goes on, so every round is counted. Every figure: median / p99 / max.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import queue
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from stats import Stats, write_section  # noqa: E402

MODES = ("restart", "interrupt, then restart")


async def run_cell(kc, code: str, timeout: float = 30) -> tuple[dict, str]:
    """Execute `code`; the reply's content and the text it printed (errors as `Name: value`)."""
    printed: list[str] = []

    def hook(msg):
        if msg["msg_type"] == "stream":
            printed.append(msg["content"]["text"])
        elif msg["msg_type"] == "error":
            printed.append(f"{msg['content']['ename']}: {msg['content']['evalue']}")

    reply = await kc.execute_interactive(code, output_hook=hook, timeout=timeout)
    return reply["content"], "".join(printed)


async def _run(kc, code: str) -> str:
    """`code`'s printed text; raises when the cell fails."""
    content, printed = await run_cell(kc, code)
    if content["status"] != "ok":
        raise RuntimeError(printed or content["status"])
    return printed


async def _interrupt_a_sleeping_cell(km, kc) -> None:
    """A running cell, stopped with the kernel manager's interrupt (JupyterLab's stop button)."""
    msg_id = kc.execute("import time; time.sleep(60)")
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:  # the cell runs
        try:
            msg = await kc.get_iopub_msg(timeout=1)
        except queue.Empty:
            continue
        if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "execute_input":
            break
    await asyncio.sleep(0.2)
    await km.interrupt_kernel()
    while time.monotonic() < deadline + 15:  # its reply: interrupted
        try:
            msg = await kc.get_shell_msg(timeout=1)
        except queue.Empty:
            continue
        if msg["parent_header"].get("msg_id") == msg_id:
            return
    raise RuntimeError("the interrupted cell never replied")


class Loop:
    """One kernel manager restarting its kernel `n` times per mode."""

    def __init__(self, kernel_name: str, manager=None):
        self.kernel_name, self.manager = kernel_name, manager
        self.km = self.kc = None
        self.times: dict[str, list[float]] = {m: [] for m in MODES}
        self.ok = dict.fromkeys(MODES, 0)
        self.lost = dict.fromkeys(MODES, 0)
        self.failures: list[str] = []

    async def start(self) -> None:
        from jupyter_client.manager import AsyncKernelManager

        self.km = AsyncKernelManager(kernel_name=self.kernel_name)
        await self.km.start_kernel()
        self.kc = self.km.client()
        self.kc.start_channels()
        await self.kc.wait_for_ready(timeout=120)

    async def close(self) -> None:
        if self.kc is not None:
            self.kc.stop_channels()
        if self.km is not None:
            await self.km.shutdown_kernel(now=True)

    def _session(self):
        """The session's record (None for the floor's plain kernel)."""
        if self.manager is None:
            return None
        return max(self.manager.list(), key=lambda r: r.created_at)

    async def one(self, mode: str) -> None:
        before = self._session()
        await _run(self.kc, "x = 41")
        if mode != MODES[0]:
            await _interrupt_a_sleeping_cell(self.km, self.kc)
        t0 = time.monotonic()
        try:
            await self.km.restart_kernel()
            await self.kc.wait_for_ready(timeout=120)
            if "NameError" not in await _run_failing(self.kc, "print(x)"):
                raise RuntimeError("the old kernel's variables are still there")
            if (await _run(self.kc, "print(6 * 7)")).strip() != "42":
                raise RuntimeError("the fresh kernel did not answer")
        except Exception as exc:  # noqa: BLE001 - counted, then a new kernel for the next round
            self.failures.append(f"{mode}: {type(exc).__name__}: {exc}"[:300])
            after = self._session()
            if before is not None and (
                after.id != before.id or not self.manager.get(before.id).state.active
            ):
                self.lost[mode] += 1
                self.failures[-1] += (
                    f" [session {before.name}: {self.manager.get(before.id).state.value}: "
                    f"{self.manager.get(before.id).error}]"
                )
            await self.close()
            await self.start()
            return
        self.times[mode].append(time.monotonic() - t0)
        if before is not None and self._session().id != before.id:
            self.lost[mode] += 1  # a new session took its place: the user's variables went with it
            return
        self.ok[mode] += 1


async def _run_failing(kc, code: str) -> str:
    try:
        return await _run(kc, code)
    except RuntimeError as exc:
        return str(exc)


async def measure(restarts: int, backend: str, floor: bool = True) -> Loop | tuple[Loop, Loop]:
    """The loop (and, with `floor`, the floor's, interleaved so both see the same machine)."""
    from gpusession.faces import cli
    from gpusession.session import SessionManager

    if (
        cli.main(["kernelspec", "install", "--type", "t4", "--backend", backend, "--idle", "off"])
        != 0
    ):
        raise SystemExit("could not install the kernelspec")
    manager = SessionManager()
    loops = [Loop(f"gpusession-t4-{backend}", manager)] + ([Loop("python3")] if floor else [])
    try:
        for loop in loops:
            await loop.start()
        for i in range(restarts):
            for mode in MODES:
                for loop in loops:
                    await loop.one(mode)
            if (i + 1) % 10 == 0:
                print(f"  {i + 1}/{restarts} rounds", flush=True)
    finally:
        for loop in loops:
            await loop.close()
        manager.close()
    return (loops[0], loops[1]) if floor else loops[0]


def report(ours: Loop, floor: Loop | None, restarts: int, backend: str) -> str:
    lines = [
        f"Restart of a {backend} session kernel through jupyter_client, {restarts} per row "
        "(floor: the same restart of a plain local ipykernel, interleaved).",
        "",
        "| restart | ok | sessions lost | time median / p99 / max | floor median / p99 / max | median ratio |",
        "|---|---|---|---|---|---|",
    ]
    for mode in MODES:
        mine, base = ours.times[mode], floor.times[mode] if floor else []
        head = f"| {mode} | {ours.ok[mode]}/{restarts} | {ours.lost[mode]} |"
        if not mine:
            lines.append(f"{head} - | - | - |")
            continue
        s = Stats.of(mine)
        if not base:
            lines.append(f"{head} {s.cell('s', 1)} | - | - |")
            continue
        f = Stats.of(base)
        lines.append(f"{head} {s.cell('s', 1)} | {f.cell('s', 1)} | {s.median / f.median:.2f}x |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--restarts", type=int, default=50, help="restarts per mode (default 50)")
    parser.add_argument("--backend", default="local", help="local (default) or docker")
    parser.add_argument(
        "--no-floor",
        action="store_true",
        help="skip the floor (a quicker loop: sessions lost only)",
    )
    parser.add_argument(
        "--write", type=Path, help="write the table into this markdown file (docs/benchmarks.md)"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-restart-") as tmp:
        os.environ.update(
            GPUSESSION_HOME=str(Path(tmp) / "home"),
            JUPYTER_DATA_DIR=str(Path(tmp) / "jupyter"),
            JUPYTER_PATH=str(Path(tmp) / "jupyter"),
            GPUSESSION_PRICE_PER_HOUR="0",
        )
        os.environ.pop("GPUSESSION_BACKEND", None)
        measured = asyncio.run(measure(args.restarts, args.backend, floor=not args.no_floor))
    ours, floor = measured if isinstance(measured, tuple) else (measured, None)
    table = report(ours, floor, args.restarts, args.backend)
    print(table)
    for failure in ours.failures + [f"floor: {f}" for f in (floor.failures if floor else [])]:
        print("failed:", failure)
    if args.write:
        write_section(args.write, "bench-restart", table)
    return 1 if any(ours.lost.values()) or sum(ours.ok.values()) < 2 * args.restarts else 0


if __name__ == "__main__":
    sys.exit(main())
