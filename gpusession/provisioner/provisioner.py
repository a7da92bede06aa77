"""`GpuSessionProvisioner`: a jupyter_client kernel provisioner whose kernel is a gpusession session.

A kernelspec names it (`metadata.kernel_provisioner`, see gpusession/provisioner/kernelspecs.py)
with start options from the option table as its config ({"type": "t4", "backend": "docker",
"idle": "30m", ...}); the defaults come from `GpuSessionConfig`, with the jupyter server's config
applied (the server's kernel manager is the provisioner's parent). The server's kernel manager
then talks ZMQ to the session kernel through the session's local tunnel ends, which this
provisioner keeps open: it holds the session's Link for as long as the server uses the kernel.

What JupyterLab's buttons do:
- interrupt: the kernelspec says `interrupt_mode: message`, so an interrupt_request goes to the
  kernel, which SIGINTs its own process group (a signal could not cross the tunnel);
- restart: a fresh kernel in the same session. The kernel marks the restart as it handles the
  shutdown_request (gpusession/agent/activity.py), and the runtime starts the next kernel on the
  same ports and key instead of ending the session; one that does not exit is ended through the
  agent (POST /restart). A restart after the session ended (its idle watchdog stopped it) starts
  a new session only when a user asked for it; the kernel manager's automatic restart of a dead
  kernel never does, so an idle stop stays stopped and JupyterLab shows the kernel dead. (A
  forced restart, `restart_kernel(now=True)`, reaches the provisioner as a kill: the session
  stops, and the launch that follows starts a new one);
- shut down: stops the session (`SessionManager.stop`, by "JupyterLab kernel shutdown");
- closing the tab: nothing; the session's idle watchdog stops it once nobody uses it.

Every blocking call into the session core runs in a worker thread, off the server's event loop.
"""

from __future__ import annotations

import asyncio
import functools
import signal
from typing import Any, Callable, TypeVar

from jupyter_client.provisioning import KernelProvisionerBase

from ..configuration import options
from ..configuration.config import GpuSessionConfig
from ..core.errors import GpuSessionError
from ..core.models import State
from ..session import SessionManager
from ..session.agentclient import AgentUnavailable
from ..session.handle import Session
from ..words.stops import error_text

SHUTDOWN_BY = "JupyterLab kernel shutdown"
T = TypeVar("T")
ENDED = 1  # poll()'s exit code for a session that ended (watchdog, stopped elsewhere, failed)


async def _blocking(func: Callable[..., T], *args: Any) -> T:
    """`func(*args)` in a worker thread. Not asyncio.to_thread: that copies this context, where
    jupyter_client's run_sync finds the server's running loop (a context variable) and fails."""
    return await asyncio.get_running_loop().run_in_executor(None, functools.partial(func, *args))


class GpuSessionProvisioner(KernelProvisionerBase):
    """Registered as `gpusession-provisioner` in the `jupyter_client.kernel_provisioners` group."""

    def __init__(self, **kwargs: Any):
        # the kernelspec's config arrives as keyword arguments: the start options are ours
        start = {name: kwargs.pop(name) for name in list(kwargs) if name in options.table().names}
        super().__init__(**kwargs)
        self.start_options: dict[str, Any] = start
        self.manager: SessionManager | None = None
        self.session: Session | None = None
        self.session_id: str | None = None
        self._generation = (
            0  # the session kernel this server talks to (the runtime counts restarts)
        )
        self._restarting = False  # the kernel manager shut the kernel down to restart it
        self._user_restart = (
            False  # ... because someone asked (not the automatic restart of a dead kernel)
        )
        self._exit_code: int | None = None  # set once the session is over for this kernel
        self._launched = False

    # -- start ---------------------------------------------------------------------------------

    @property
    def has_process(self) -> bool:
        return self._launched

    def _manager(self) -> SessionManager:
        if self.manager is None:
            self.manager = SessionManager(GpuSessionConfig(parent=self))
        return self.manager

    async def pre_launch(self, **kwargs: Any) -> dict[str, Any]:
        """The kernelspec's argv is not run: the session's runtime starts its own kernel."""
        if kwargs.pop("transport_encryption", None) == "required":
            raise RuntimeError(
                "gpusession kernels do not support CurveZMQ transport encryption yet"
            )
        kwargs.pop("extra_arguments", None)
        kwargs = await super().pre_launch(**kwargs)
        kwargs["cmd"] = list(self.kernel_spec.argv) if self.kernel_spec else []
        return kwargs

    async def launch_kernel(self, cmd: list[str], **kwargs: Any) -> dict[str, Any]:
        # The kernel's unix sockets (ipc transport) are the session's: its runtime binds them
        # again for a restart's fresh kernel and removes them when the session ends. The kernel
        # manager's own clean-up would delete them on a restart, racing the fresh kernel's bind
        # (it then never answered: "kernel did not answer within 60s").
        if self.parent is not None:
            self.parent.cleanup_ipc_files = _leave_the_sessions_sockets
        if self.session is None:
            await _blocking(self._start_session)
        else:  # the kernel manager restarts the kernel
            await _blocking(self._relaunch)
        self._launched = True
        return self.connection_info

    def _start_session(self) -> None:
        manager = self._manager()
        try:
            spec = manager.spec_from(
                self.start_options, options.REST
            )  # the kernelspec's metadata names fields as REST does
            self.log.info(
                "gpusession: starting a %s session on %s for kernel %s",
                spec.gpu_type,
                spec.backend,
                self.kernel_id,
            )
            session = manager.start(spec, report=lambda line: self.log.info("gpusession: %s", line))
        except GpuSessionError as exc:
            raise RuntimeError(f"gpusession: {error_text(exc)}") from None
        manager.store.note(session.id, f"kernel of JupyterLab (kernel id {self.kernel_id})")
        self._use(session)

    def _use(self, session: Session) -> None:
        self.session, self.session_id = session, session.id
        try:
            self._generation = session.kernel_state()["generation"]
        except AgentUnavailable:
            self._generation = 1
        self._exit_code = None
        info = dict(session.link.endpoint.connection_info)
        key = info.get("key", b"")
        info["key"] = key.encode() if isinstance(key, str) else key  # what jupyter_client compares
        self.connection_info = info

    def _relaunch(self) -> None:
        """A fresh kernel in the same session; see the module doc for a session that ended."""
        user, self._restarting, self._user_restart = self._user_restart, False, False
        assert self.session is not None
        if self._exit_code is None and self._session_running():
            try:
                self._generation = self.session.restart_kernel(self._generation, force=True)
            except (GpuSessionError, TimeoutError, OSError) as exc:
                raise RuntimeError(
                    f"gpusession: the kernel did not restart: {error_text(exc)}"
                ) from None
            self.log.info(
                "gpusession: session %s has a fresh kernel (%d)",
                self.session.name,
                self._generation,
            )
            return
        if (
            not user and self._exit_code != 0
        ):  # it ended by itself: the automatic restart of a dead kernel
            self.log.warning(
                "gpusession: session %s has ended; not starting another by itself",
                self.session.name,
            )
            self._exit_code = (
                ENDED  # poll says dead again: the kernel manager gives up and reports it
            )
            return
        # someone asked for a restart, or the kernel manager stopped it here to start it again (now=True)
        self.log.info(
            "gpusession: session %s has ended; the restart starts a new one", self.session.name
        )
        self._start_session()

    # -- is it alive ---------------------------------------------------------------------------

    def _session_running(self) -> bool:
        """Asks the backend (throttled by the session handle); records an end found here."""
        if self.session is None or self.manager is None:
            return False
        if self.session.healthy():
            return True
        record = self.manager.refresh_state(self.session.id)
        return record.state == State.RUNNING

    def _poll(self) -> int | None:
        if self._exit_code is not None:
            return self._exit_code
        if not self._session_running():
            self._exit_code = ENDED
            return ENDED
        if (
            self._restarting
        ):  # the old kernel is gone once the runtime counts on or it stopped running
            assert self.session is not None
            try:
                state = self.session.kernel_state()
            except AgentUnavailable:
                return None
            if state["generation"] > self._generation or not state["running"]:
                return 0
        return None

    async def poll(self) -> int | None:
        return await _blocking(self._poll)

    async def wait(self) -> int | None:
        while True:
            code = await self.poll()
            if code is not None:
                return code
            await asyncio.sleep(0.2)

    # -- signals, shutdown, restart ------------------------------------------------------------

    async def send_signal(self, signum: int) -> None:
        """SIGINT becomes an interrupt_request (no signal crosses the tunnel); 0 asks whether it
        runs; others end the kernel like a shutdown would."""
        if self.session is None or signum == 0:
            return
        if signum == signal.SIGINT:
            await _blocking(self.session.kernel.interrupt)
        elif signum in (signal.SIGTERM, signal.SIGKILL):
            await self.terminate(restart=self._restarting)
        else:
            self.log.warning("gpusession: signal %d is not sent to a session kernel", signum)

    async def shutdown_requested(self, restart: bool = False) -> None:
        """After the kernel manager sent its shutdown_request: for a restart, the kernel exits
        and the runtime starts the next; otherwise the session stops here."""
        if restart:
            self._restarting = self._user_restart = True
        else:
            await _blocking(self._stop, True)

    async def terminate(self, restart: bool = False) -> None:
        # the kernel manager asks with restart=False even while it restarts a kernel that is slow to go
        if restart or self._restarting:
            self._restarting = True
            await _blocking(self._end_old_kernel)
        else:
            await _blocking(self._stop)

    async def kill(self, restart: bool = False) -> None:
        await self.terminate(restart=restart)

    def _end_old_kernel(self) -> None:
        """The kernel did not go on its shutdown_request: the runtime ends it and starts the next."""
        if self.session is None or self._exit_code is not None:
            return
        try:
            state = self.session.kernel_state()
            if (
                state["generation"] <= self._generation and state["running"] and state["ready"]
            ):  # not the next one booting
                self.session.agent.restart_kernel()
        except AgentUnavailable as exc:
            self.log.warning(
                "gpusession: could not restart the kernel of session %s: %s", self.session.name, exc
            )

    def _stop(self, kernel_told: bool = False) -> None:
        if self.session_id is None or self.manager is None or self._exit_code is not None:
            return
        try:
            record = self.manager.stop(self.session_id, by=SHUTDOWN_BY, kernel_told=kernel_told)
        except GpuSessionError as exc:  # still recorded as stopping: gc retries
            self.log.error("gpusession: stopping session %s: %s", self.session_id, error_text(exc))
            return
        self._exit_code = 0
        self.log.info(
            "gpusession: session %s is %s (kernel shut down)", record.name, record.state.value
        )

    async def cleanup(self, restart: bool = False) -> None:
        if restart:
            return
        if self._exit_code is None:  # a kernel manager that never asked to shut down: stop anyway
            await _blocking(self._stop)
        self._launched = False
        if self.manager is not None:
            await _blocking(self.manager.close)

    def get_shutdown_wait_time(self, recommended: float = 5.0) -> float:
        """Enough for a kernel to go on its shutdown_request through a tunnel."""
        return max(recommended, 6.0)

    # -- persistence (an application that moves kernels between servers) -----------------------

    async def get_provisioner_info(self) -> dict[str, Any]:
        info = await super().get_provisioner_info()
        info.update(
            gpusession={
                "session_id": self.session_id,
                "generation": self._generation,
                "options": self.start_options,
            }
        )
        return info

    async def load_provisioner_info(self, provisioner_info: dict) -> None:
        """Attach to the session another provisioner started (its record says how to connect)."""
        await super().load_provisioner_info(provisioner_info)
        saved = provisioner_info.get("gpusession") or {}
        self.start_options = dict(saved.get("options") or self.start_options)
        if saved.get("session_id"):
            try:
                session = await _blocking(self._manager().attach, saved["session_id"])
            except GpuSessionError as exc:
                raise RuntimeError(f"gpusession: {error_text(exc)}") from None
            self._use(session)
            self._launched = True


def _leave_the_sessions_sockets() -> None:
    """The kernel manager's `cleanup_ipc_files`, for a gpusession kernel: the session's runtime
    owns its sockets (see launch_kernel)."""
