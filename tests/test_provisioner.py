"""GPU kernelspecs and the kernel provisioner, driven through a real jupyter_client
AsyncKernelManager (what jupyter_server uses) on the local backend: start, execute, interrupt,
restart (a fresh kernel, same session), shut down (the session stopped); the kernelspec command
line. The same in real JupyterLab: tests/test_launcher.py."""

from __future__ import annotations

import asyncio
import json
import queue
import sys
import time
from pathlib import Path

import pytest

from gpusession.core.models import State
from gpusession.core.protocol import StopKind
from gpusession.faces import cli
from gpusession.server.sidebar_state import StartProgress, kernel_ids_by_pid, panel_view
from support.procs import alive

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import bench_restart  # noqa: E402

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def jupyter_dirs(tmp_path, monkeypatch, gs_home):
    """Kernelspecs go to a folder of this test's; sessions run on the local backend."""
    data = tmp_path / "jupyter-data"
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(data))
    monkeypatch.setenv("JUPYTER_PATH", str(data))
    monkeypatch.setenv("GPUSESSION_BACKEND", "local")
    monkeypatch.setenv("GPUSESSION_PRICE_PER_HOUR", "0")
    return data


def _gpusession(*argv: str, capsys) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# -- the kernelspec command ----------------------------------------------------------------------


def test_kernelspec_price_says_where_it_comes_from_as_the_cards_do(jupyter_dirs, monkeypatch):
    """The launcher's name prices a kernel as its sessions' cards will (`Backend.price_basis`):
    the catalog's cloud rate on own hardware says so, a configured price is that price, a
    cloud's rate is said plainly."""
    from gpusession.provisioner import kernelspecs

    monkeypatch.delenv("GPUSESSION_PRICE_PER_HOUR")
    own = kernelspecs.kernel_json({"type": "t4", "backend": "local"})["display_name"]
    assert own == "Python 3 (GPU · T4 · local · $0.5260/h · cloud rate, own hardware)", own
    docker = kernelspecs.kernel_json({"type": "a100:2", "backend": "docker"})["display_name"]
    assert docker.endswith(" · cloud rate, own hardware)"), docker
    cloud = kernelspecs.kernel_json({"type": "t4", "backend": "aws"})["display_name"]
    assert cloud == "Python 3 (GPU · T4 · aws · $0.5260/h)", cloud
    monkeypatch.setenv("GPUSESSION_PRICE_PER_HOUR", "0.25")
    configured = kernelspecs.kernel_json({"type": "t4", "backend": "local"})["display_name"]
    assert configured == "Python 3 (GPU · T4 · local · $0.2500/h · configured price)", configured


def test_kernelspec_install_list_remove(jupyter_dirs, capsys):
    code, out, err = _gpusession(
        "kernelspec", "install", "--type", "t4", "--idle", "10m", capsys=capsys
    )
    assert code == 0, err
    assert out.startswith(
        "installed kernelspec gpusession-t4 (Python 3 (GPU · T4 · $0.0000/h · configured price)) in "
    )
    kernel = json.loads((jupyter_dirs / "kernels" / "gpusession-t4" / "kernel.json").read_text())
    assert (
        kernel["display_name"] == "Python 3 (GPU · T4 · $0.0000/h · configured price)"
    )  # type and price
    assert kernel["interrupt_mode"] == "message"
    assert kernel["metadata"]["kernel_provisioner"] == {
        "provisioner_name": "gpusession-provisioner",
        "config": {"type": "t4", "idle": "10m"},
    }
    assert (jupyter_dirs / "kernels" / "gpusession-t4" / "logo-64x64.png").exists()
    # the launcher shows logo-svg first: a GPU chip, not Python's logo
    logo = (jupyter_dirs / "kernels" / "gpusession-t4" / "logo-svg.svg").read_text()
    assert ">GPU</text>" in logo

    code, out, err = _gpusession(
        "kernelspec",
        "install",
        "--type",
        "a100:8",
        "--backend",
        "docker",
        "--image",
        "my/image:1",
        "--gpu-only",
        capsys=capsys,
    )
    assert code == 0, err
    assert (
        "gpusession-a100-8-docker-my-image-1 (Python 3 (GPU · 8 x A100 · docker · my/image:1 · $0.0000/h · configured price))"
        in out
    )

    from jupyter_client.kernelspec import KernelSpecManager

    found = KernelSpecManager().get_all_specs()
    assert (
        found["gpusession-t4"]["spec"]["display_name"]
        == "Python 3 (GPU · T4 · $0.0000/h · configured price)"
    )

    code, out, err = _gpusession("kernelspec", "list", capsys=capsys)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith(
        "gpusession-a100-8-docker-my-image-1  Python 3 (GPU · 8 x A100 · docker · my/image:1 · $0.0000/h · configured price)  "
        "[--type a100:8 --backend docker --image my/image:1 --gpu-only]"
    )
    assert lines[1].startswith(
        "gpusession-t4  Python 3 (GPU · T4 · $0.0000/h · configured price)  [--type t4 --idle 10m]"
    )

    code, out, err = _gpusession("kernelspec", "remove", "gpusession-t4", capsys=capsys)
    assert (code, out) == (
        0,
        "removed kernelspec gpusession-t4 (Python 3 (GPU · T4 · $0.0000/h · configured price))\n",
    ), err
    assert "gpusession-t4" not in KernelSpecManager().find_kernel_specs()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["install", "--type", "t5"], "gpusession kernelspec: --type: unknown GPU type 't5'"),
        (
            ["install", "--type", "t4", "--idle", "abc"],
            "gpusession kernelspec: --idle: bad idle timeout 'abc'",
        ),
        (
            ["install", "--type", "t4", "--backend", "nowhere"],
            "gpusession kernelspec: --backend: unknown backend 'nowhere'",
        ),
        (
            ["install", "--type", "t4", "--name", "my kernel"],
            "gpusession kernelspec: kernelspec name 'my kernel': use letters",
        ),
        (
            ["remove", "nothing-here"],
            "gpusession kernelspec: no gpusession kernelspec named 'nothing-here'",
        ),
    ],
)
def test_kernelspec_mistakes_are_one_line(jupyter_dirs, capsys, argv, message):
    code, out, err = _gpusession("kernelspec", *argv, capsys=capsys)
    assert code == 1
    assert err.startswith(message), err
    assert len(err.strip().splitlines()) == 1, err
    assert not (jupyter_dirs / "kernels").exists() or not any((jupyter_dirs / "kernels").iterdir())


def test_kernelspec_remove_refuses_other_kernels(jupyter_dirs, capsys):
    other = jupyter_dirs / "kernels" / "plain"
    other.mkdir(parents=True)
    (other / "kernel.json").write_text(
        json.dumps({"argv": ["python3"], "display_name": "Plain", "language": "python"})
    )
    code, out, err = _gpusession("kernelspec", "remove", "plain", capsys=capsys)
    assert code == 1
    assert err.startswith(
        "gpusession kernelspec: kernelspec 'plain' is not a gpusession kernelspec"
    )
    assert other.exists()


# -- the provisioner through jupyter_client ------------------------------------------------------


_run = bench_restart.run_cell  # execute; (the reply's content, the text it printed)


def _runtime(manager, session_id: str) -> dict:
    state_dir = Path(manager.get(session_id).resource["state_dir"])
    return json.loads((state_dir / "runtime.json").read_text())


class _OneKernel:
    """The Jupyter server's kernel manager as the sidebar's API reads it, holding one kernel."""

    def __init__(self, km):
        self.km = km

    def list_kernel_ids(self) -> list[str]:
        return ["k-gpu"]

    def get_kernel(self, kernel_id: str):
        return self.km


@pytest.mark.integration
async def test_a_kernel_is_a_session_restart_keeps_it_shutdown_stops_it(
    jupyter_dirs, manager, capsys
):
    from jupyter_client.manager import AsyncKernelManager

    assert (
        _gpusession("kernelspec", "install", "--type", "t4", "--idle", "10m", capsys=capsys)[0] == 0
    )
    km = AsyncKernelManager(kernel_name="gpusession-t4")
    t0 = time.monotonic()
    await km.start_kernel()
    kc = km.client()
    kc.start_channels()
    try:
        await kc.wait_for_ready(timeout=60)
        started_s = time.monotonic() - t0
        [record] = manager.list()
        assert record.state == State.RUNNING and record.backend == "local"
        assert (record.spec.gpu_type, record.spec.idle) == ("t4", 600.0)
        assert any("kernel of JupyterLab" in e.detail for e in record.events)
        first = _runtime(manager, record.id)
        # the sidebar's view names this kernel as the session's (the status bar follows it)
        view = panel_view(manager, record, StartProgress(), kernel_ids_by_pid(_OneKernel(km)))
        assert view["kernel_id"] == "k-gpu"

        # the notebook's cells run in the session kernel
        reply, printed = await _run(kc, "import os; x = 41; print(os.getpid())")
        assert reply["status"] == "ok"
        assert int(printed) == first["kernel_pid"]

        # interrupt: JupyterLab's stop button
        msg_id = kc.execute("import time; print('sleeping', flush=True); time.sleep(60)")
        await _wait_busy(kc, msg_id)
        t1 = time.monotonic()
        await km.interrupt_kernel()
        reply = await _reply(kc, msg_id, timeout=15)
        assert (
            reply["content"]["status"] == "error"
            and reply["content"]["ename"] == "KeyboardInterrupt"
        )
        interrupt_s = time.monotonic() - t1

        # restart: a fresh kernel in the same session
        t2 = time.monotonic()
        await km.restart_kernel()
        await kc.wait_for_ready(timeout=60)
        restart_s = time.monotonic() - t2
        reply, printed = await _run(kc, "print(x)")
        assert reply["status"] == "error" and "NameError" in printed
        [after] = manager.list()
        assert after.id == record.id and after.state == State.RUNNING
        second = _runtime(manager, record.id)
        assert second["pid"] == first["pid"] and second["kernel_pid"] != first["kernel_pid"]
        assert second["kernel_generation"] == 2
        assert not alive(first["kernel_pid"])
        reply, printed = await _run(kc, "print(6 * 7)")
        assert printed.strip() == "42"
    finally:
        kc.stop_channels()
        t3 = time.monotonic()
        await km.shutdown_kernel()
        shutdown_s = time.monotonic() - t3

    # shut down: the session stops, and so does its process
    [ended] = manager.list()
    assert ended.state == State.STOPPED
    assert ended.resource["stop_reason"]["kind"] == StopKind.USER.value
    assert ended.resource["stop_reason"]["by"] == "JupyterLab kernel shutdown"
    assert not alive(first["pid"]) and not alive(second["kernel_pid"])
    assert not await km.is_alive()
    print(
        f"start {started_s:.1f}s, interrupt {interrupt_s:.1f}s, restart {restart_s:.1f}s, "
        f"shutdown {shutdown_s:.1f}s"
    )


async def _wait_busy(kc, msg_id: str, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            msg = await kc.get_iopub_msg(timeout=1)
        except queue.Empty:
            continue
        if (
            msg["parent_header"].get("msg_id") == msg_id
            and msg["msg_type"] == "stream"
            and "sleeping" in msg["content"]["text"]
        ):  # the cell's own line: the interrupt lands in its code, however slow the machine
            return
    raise AssertionError("the cell never started")


async def _reply(kc, msg_id: str, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            msg = await kc.get_shell_msg(timeout=1)
        except queue.Empty:
            continue
        if msg["parent_header"].get("msg_id") == msg_id:
            return msg
    raise AssertionError(f"no reply within {timeout}s")


@pytest.mark.integration
async def test_a_session_stopped_elsewhere_is_a_dead_kernel_that_does_not_come_back(
    jupyter_dirs, manager, capsys
):
    """The sidebar (or the idle watchdog) stops the session: the kernel manager finds the kernel
    dead, and its automatic restart starts no new paid session."""
    from jupyter_client.manager import AsyncKernelManager

    assert _gpusession("kernelspec", "install", "--type", "t4", capsys=capsys)[0] == 0
    km = AsyncKernelManager(kernel_name="gpusession-t4")
    await km.start_kernel()
    try:
        [record] = manager.list()
        manager.stop(record.id, by="the sidebar")
        assert not await km.is_alive()
        await km.restart_kernel(
            now=True
        )  # what the kernel manager's restarter does with a dead kernel
        assert not await km.is_alive()
        assert [r.id for r in manager.list()] == [record.id]
        assert manager.get(record.id).state == State.STOPPED
    finally:
        await km.shutdown_kernel(now=True)
    assert manager.get(record.id).resource["stop_reason"]["by"] == "the sidebar"


@pytest.mark.integration
def test_a_kernel_that_does_not_go_is_ended_by_the_agent(manager, monkeypatch):
    """Session.restart_kernel(force=True): POST /restart ends the kernel; the runtime starts the
    next on the same ports and key."""
    monkeypatch.setenv("GPUSESSION_PRICE_PER_HOUR", "0")
    session = manager.start(manager.make_spec("t4", backend="local", idle="10m"))
    session.run("x = 1")
    before = session.kernel_state()
    info = dict(session.link.endpoint.connection_info)
    generation = session.restart_kernel(before["generation"], force=True, timeout=60)
    assert generation == before["generation"] + 1
    assert session.kernel.evaluate("'x' in globals()") == "False"
    assert session.link.endpoint.connection_info == info
    assert manager.get(session.id).state == State.RUNNING


@pytest.mark.integration
async def test_an_idle_stop_leaves_the_kernel_dead_and_starts_nothing(
    jupyter_dirs, manager, capsys
):
    """Closing the tab leaves the idle watchdog in charge: it stops the session, and the
    server's kernel restarter (what JupyterLab's server runs) finds the kernel dead, tries its
    restarts, none of which starts a session, and gives up: the kernel is reported dead."""
    from jupyter_client.ioloop import AsyncIOLoopKernelManager
    from traitlets.config import Config

    assert (
        _gpusession("kernelspec", "install", "--type", "t4", "--idle", "3s", capsys=capsys)[0] == 0
    )
    config = Config({"KernelRestarter": {"time_to_dead": 0.5, "restart_limit": 2}})
    km = AsyncIOLoopKernelManager(kernel_name="gpusession-t4", config=config)
    await km.start_kernel()
    dead = asyncio.Event()
    km.add_restart_callback(dead.set, "dead")
    try:
        [record] = manager.list()
        await asyncio.wait_for(dead.wait(), timeout=45)
        assert [r.id for r in manager.list()] == [record.id]
        ended = manager.get(record.id)
        assert ended.state == State.STOPPED
        assert ended.resource["stop_reason"]["kind"] == StopKind.IDLE.value
    finally:
        await km.shutdown_kernel(now=True)
    assert [r.id for r in manager.list()] == [record.id]


@pytest.mark.integration
async def test_a_restart_asked_for_after_the_session_ended_starts_a_new_one(
    jupyter_dirs, manager, capsys
):
    """JupyterLab's restart button on a kernel whose session was stopped: someone asked for a
    kernel, so a new session starts (only an explicit restart does that)."""
    from jupyter_client.manager import AsyncKernelManager

    assert _gpusession("kernelspec", "install", "--type", "t4", capsys=capsys)[0] == 0
    km = AsyncKernelManager(kernel_name="gpusession-t4")
    await km.start_kernel()
    try:
        [first] = manager.list()
        manager.stop(first.id, by="the sidebar")
        await km.restart_kernel()
        assert await km.is_alive()
        second = [r for r in manager.list() if r.id != first.id]
        assert [r.state for r in second] == [State.RUNNING]
        kc = km.client()
        kc.start_channels()
        try:
            await kc.wait_for_ready(timeout=60)
            reply, printed = await _run(kc, "print(1 + 1)")
            assert printed.strip() == "2"
        finally:
            kc.stop_channels()
    finally:
        await km.shutdown_kernel()
    assert {r.state for r in manager.list()} == {State.STOPPED}
