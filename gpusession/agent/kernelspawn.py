"""How the runtime starts a session's kernel (kernel_plan, write_connection_file), its restarts
too; and early_kernel, the first one, started by gpusession.agent.firststep before the runtime
loads, in a fork of the first step (Spawned.forked: the kernel's own Python start spared).
Standard library only, and nothing costly on the way to the first spawn (no json, re, enum or
subprocess); Python 3.9 syntax.
"""

from __future__ import annotations

import _signal
import _thread
import os
import sys
import time

from ..core.envnames import (
    ENV_KERNEL_KEY,
    ENV_RESTORE,
    ENV_SESSION_ID,
    ENV_SPAWN_FIRST,
    ENV_STATE_DIR,
    ENV_WORKSPACE,
    ENV_ZYGOTE,
    KERNEL_PORT_NAMES,
    MARKER_KERNEL,
    MARKER_READY,
    READY_FILE,
    RESTART_FILE,
    ZYGOTE_PLAN,
)
from .kernelenv import kernel_command, kernel_environment

VALUED = (
    "--session-id",
    "--state-dir",
    "--kernel-ip",
    "--kernel-ports",
    "--cwd",
    "--workspace",
    "--agent-port",
    "--ready-timeout",
)


def _ephemeral_low() -> int:
    """The lowest port this host gives outgoing connections (Linux), 0 when not known."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def _free_port(ip: str) -> int:
    """A port free now, below the ephemeral range where the host says which it is: the kernel
    binds it a moment later, and while a client's connects through the tunnel are refused
    (the kernel still boots), an outgoing connection there can take an ephemeral port (or
    connect to itself, TCP's simultaneous open) and the kernel's bind then fails."""
    import _socket

    low = _ephemeral_low()
    tries = (
        [int.from_bytes(os.urandom(2), "big") % (low - 10000) + 10000 for _ in range(20)]
        if low > 11000
        else []
    )
    for port in tries + [0]:
        s = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
        try:
            s.bind((ip, port))
            return s.getsockname()[1]
        except OSError:
            continue
        finally:
            s.close()
    raise OSError(f"no free port on {ip}")


def _plain(text: str) -> bool:
    """A string JSON writes as it is between quotes."""
    return text.isascii() and text.isprintable() and not set(text) & set('"\\')


def write_connection_file(path: str, ip: str, base_port: int) -> dict:
    """Write (once) the kernel's connection file: 5 ports from base_port, or free ones when 0;
    the key from the local side (GPUSESSION_KERNEL_KEY), else a new one. Read back when there.

    An `ip` that is a path (`/dir/k`) asks for unix sockets (ZMQ's ipc transport, at `/dir/k-1`
    .. `/dir/k-5`) in a 0700 folder: only the session's owner can subscribe to its output or
    send it code; a loopback port is open to every user of the machine."""
    if os.path.exists(path):
        import json  # a restart, or a runtime started again: the runtime has json loaded by then

        with open(path) as f:
            return json.load(f)
    if ip.startswith("/"):
        transport, ports = "ipc", [1, 2, 3, 4, 5]
        os.makedirs(os.path.dirname(ip), mode=0o700, exist_ok=True)
    else:
        transport, ports = "tcp", [base_port + i for i in range(5)] if base_port else []
    while len(ports) < 5:  # five different ones
        port = _free_port(ip)
        if port not in ports:
            ports.append(port)
    info: dict = dict(zip(KERNEL_PORT_NAMES, ports))
    info.update(
        ip=ip,
        key=os.environ.get(ENV_KERNEL_KEY) or os.urandom(32).hex(),
        transport=transport,
        signature_scheme="hmac-sha256",
        kernel_name="python3",
    )
    text = _json(info)  # ints and plain words: JSON without loading json
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return info


def kernel_plan(
    connection_file: str, state_dir: str, session_id: str, workspace: str, restore: bool
) -> tuple[list[str], dict[str, str]]:
    """(argv, environment) of a session kernel: the image's own Python, ipykernel from the bundle
    only when the image has none; the agent's activity hook, and the workspace's checkpoint.
    Sets this process's SIGUSR1 disposition for the spawn that follows (_save_signal_for_next_kernel)."""
    env = dict(
        os.environ, **kernel_environment(), **{ENV_STATE_DIR: state_dir, ENV_SESSION_ID: session_id}
    )
    env.pop(ENV_KERNEL_KEY, None)
    # ipykernel's parent poller: the kernel ends when we do (it runs in a session of its own for
    # interrupts, so a killed runtime would otherwise leave it running; pid 1 turns the poller off)
    env["JPY_PARENT_PID"] = str(os.getpid())
    extensions = ["gpusession.agent.activity"]
    if workspace:  # the kernel saves its namespace there, and the first one restores it
        os.makedirs(workspace, exist_ok=True)
        env[ENV_WORKSPACE] = workspace
        if restore:
            env[ENV_RESTORE] = "1"
        extensions.append("gpusession.agent.checkpoint")
    _save_signal_for_next_kernel(bool(workspace))
    return kernel_command(connection_file, extensions), env


def _save_signal_for_next_kernel(saves: bool) -> None:
    """SIGUSR1 (the agent's save) as the kernel spawned next gets it from this process: ignored
    when it saves (an ignored signal stays ignored across exec: a save asked before
    gpusession.agent.checkpoint installs its handler is dropped, not the kernel's end, SIGUSR1's
    default action), the default otherwise. The runtime itself never takes SIGUSR1."""
    try:
        _signal.signal(_signal.SIGUSR1, _signal.SIG_IGN if saves else _signal.SIG_DFL)
    except ValueError:  # not the main thread: the kernel gets this process's disposition
        pass


def private_state_dir(state_dir: str) -> None:
    """The session's state folder (its kernel's key, its logs), the owner's alone: made 0700, an
    older one closed to others, and umask 077 for what the runtime and its kernels write."""
    os.umask(0o077)
    os.makedirs(state_dir, mode=0o700, exist_ok=True)
    try:
        os.chmod(state_dir, 0o700)
    except OSError:  # not ours (an image's own folder): its owner decides
        pass


def forget_restart(state_dir: str) -> None:
    """A restart request is for the kernel that was running: gone once the next one starts."""
    try:
        os.remove(os.path.join(state_dir, RESTART_FILE))
    except FileNotFoundError:
        pass


class Spawned:
    """A process started with os.posix_spawn in a session of its own (an interrupt_request
    SIGINTs the kernel's group, not the runtime), with what the runtime asks of a Popen: pid,
    returncode, poll(), wait(timeout)."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: str | None):
        here = os.getcwd() if cwd else None
        if cwd:
            os.chdir(cwd)
        try:
            self.pid = os.posix_spawn(argv[0], argv, env, setsid=True)
        finally:
            if here is not None:
                os.chdir(here)
        self._known(argv)

    @classmethod
    def forked(cls, argv: list[str], env: dict[str, str], cwd: str | None) -> "Spawned":
        """The session's first kernel as a fork of this process (the first step, whose Python
        has started already: the kernel's own start is spared), which runs the plan here where
        a fresh start would end up the same (gpusession.agent.kernelzygote's test) and execs it
        otherwise, as posix_spawn would have. Before the runtime loads: no thread runs yet."""
        for stream in (sys.stdout, sys.stderr):  # nothing of this process's said twice
            if stream is not None:
                stream.flush()
        made, told = os.pipe()
        pid = os.fork()
        if pid == 0:  # never returns
            os.close(made)
            _become_kernel(argv, env, cwd, told)
        os.close(told)
        try:
            os.read(made, 1)  # end of file: its session is made (or it ended), as a spawn's is
        finally:
            os.close(made)
        return cls.adopt(pid, argv)

    @classmethod
    def adopt(cls, pid: int, argv: list[str]) -> "Spawned":
        """A child of this process started otherwise (a kernel begun before the runtime)."""
        kernel = cls.__new__(cls)
        kernel.pid = pid
        kernel._known(argv)
        return kernel

    def _known(self, argv: list[str]) -> None:
        self.args = argv
        self.returncode: int | None = None
        self._lock = (
            _thread.allocate_lock()
        )  # poll() comes from the runtime's loop and the agent's threads

    def poll(self) -> int | None:
        with self._lock:
            if self.returncode is None:
                try:
                    pid, status = os.waitpid(self.pid, os.WNOHANG)
                except ChildProcessError:  # reaped by someone else: as Popen does, taken as 0
                    pid, status = self.pid, 0
                if pid:
                    self.returncode = os.waitstatus_to_exitcode(status)
            return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                import subprocess

                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(0.01)
        return self.returncode


def _one_thread() -> bool:
    """Does this process run one thread (a fork keeps only the caller's: an image's
    sitecustomize may have started more)? Unknown (no /proc) is no."""
    try:
        return len(os.listdir("/proc/self/task")) == 1
    except OSError:
        return False


IN_PROCESS_MODULES = ("ipykernel_launcher", "gpusession.agent.kernelboot")


def _become_kernel(argv: list[str], env: dict[str, str], cwd: str | None, told: int) -> None:
    """In the child of Spawned.forked: this process as the kernel a spawn of `argv` would be
    (a session of its own, the plan's environment, folder, umask and signals, sys.path and
    sys.argv as `python -m` sets them), or the plan exec'd where it would not be the same; then
    it ends as Python ends (threads joined, atexit run), never returning to the first step.
    `told`: the pipe's end closed once the session is made (the parent's killpg finds it)."""
    code: object = 1
    try:
        os.setsid()
        os.close(told)
        from . import kernelzygote as zygote

        plan, started_with = _plan(argv, env, cwd), dict(os.environ)
        module = argv[2] if len(argv) > 2 and argv[1] == "-m" else ""
        prepended = not getattr(sys.flags, "safe_path", False)
        if prepended:  # what the first step's start put first ('' for `-c`, its folder for `-m`)
            del sys.path[0]
        where, extra = _appended_path(sys.path, started_with, env)
        same = (
            module in IN_PROCESS_MODULES
            and where >= 0
            and _started_plainly(started_with)
            and _site_folders_made_since(sys.path)
            and zygote._same_start(  # its argv test is for the launcher: both modules pass it
                dict(plan, argv=[argv[0], "-m", "ipykernel_launcher"]),
                dict(started_with, PYTHONPATH=env.get("PYTHONPATH", "")),
            )
        )
        if not same:
            if cwd:
                os.chdir(cwd)
            os.execve(argv[0], argv, env)
        zygote._take(plan, started_with, zygote._dispositions())
        import importlib
        import runpy

        importlib.invalidate_caches()  # folders made since this Python started (a site's)

        sys.path[where:where] = extra  # the plan's PYTHONPATH adds these after this one's
        if prepended:
            sys.path.insert(0, os.getcwd())  # as `-m` puts it (ipykernel_launcher takes it out)
        sys.argv = ["-m", *argv[3:]]
        code = 0
        runpy._run_module_as_main(module)
    except SystemExit as exc:
        code = exc.code
    except BaseException:  # noqa: BLE001 - said as Python says it, then the exit below
        sys.excepthook(*sys.exc_info())
        code = 1
    finally:
        _exit_as_python(code)


def _plan(argv: list[str], env: dict[str, str], cwd: str | None) -> dict:
    """What a process this one spawned would start with (gpusession.agent.kernelzygote's plan):
    argv, environment, folder, umask, and of this process's signals what an exec keeps: the
    ignored ones (SIGUSR1 as _save_signal_for_next_kernel set it; SIGQUIT where this process's
    parent ignored it) and the blocked ones; any other starts at its default."""
    mask = os.umask(0)
    os.umask(mask)
    return {
        "argv": argv,
        "env": env,
        "cwd": cwd,
        "umask": mask,
        "ignored": [
            int(s) for s in _signal.valid_signals() if _signal.getsignal(s) == _signal.SIG_IGN
        ],
        "blocked": [int(s) for s in _signal.pthread_sigmask(_signal.SIG_BLOCK, [])],
    }


def _started_plainly(env_now: dict[str, str]) -> bool:
    """Did this Python start as `python -c` or `-m` with no option before (-S, -I, -X...: a
    plain start of the kernel has none), and is its environment the one it started with (but for
    our own variables)? Python's start changes it where it coerces a C locale (PEP 538:
    LC_CTYPE=C.UTF-8, and UTF-8 mode on), which a Python started with the changed one does not
    do (boot.sh says the locale first, so that it is the same). Unknown (no /proc) is no."""
    try:
        with open("/proc/self/cmdline", "rb") as f:
            if f.read().split(b"\0")[1:2] not in ([b"-c"], [b"-m"]):
                return False
        with open("/proc/self/environ", "rb") as f:
            given = f.read().split(b"\0")
    except OSError:
        return False
    from .kernelzygote import OWN_PREFIXES

    start = dict(x.decode("utf-8", "surrogateescape").split("=", 1) for x in given if b"=" in x)
    for name in set(start) | set(env_now):
        if not name.startswith(OWN_PREFIXES) and start.get(name) != env_now.get(name):
            return False
    return True


def _site_folders_made_since(path: list[str]) -> bool:
    """The site folders made since this Python started (kernel_environment makes the one pip
    installs into, which a fresh start puts on sys.path as it exists then), put on `path` where
    that start puts them: the user's first, then the system's, in site's order. False where one
    holds .pth files (what site would run for them: a fresh start then)."""
    import site

    order = [site.getusersitepackages()] if site.ENABLE_USER_SITE else []
    order += site.getsitepackages()
    for i, folder in enumerate(order):
        if folder in path or not os.path.isdir(folder):
            continue
        if any(name.endswith(".pth") for name in os.listdir(folder)):
            return False
        later = [p for p in order[i + 1 :] if p in path]
        path.insert(path.index(later[0]) if later else len(path), folder)
    return True


def _appended_path(
    path: list[str], env_now: dict[str, str], env: dict[str, str]
) -> tuple[int, list[str]]:
    """Where in sys.path (`path`, without what the start put first: PYTHONPATH's folders lead)
    the folders go that the kernel's PYTHONPATH adds after this process's (the bundle's pip, a
    session's pip target), and which; (-1, []) where it is not this one's with folders added."""
    ours = [p for p in env_now.get("PYTHONPATH", "").split(os.pathsep) if p]
    theirs = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if theirs == ours:
        return 0, []
    given = path[: len(ours)]
    if theirs[: len(ours)] != ours or [os.path.abspath(p) for p in given] != [
        os.path.abspath(p) for p in ours
    ]:
        return -1, []
    return len(ours), theirs[len(ours) :]


def _exit_as_python(code: object) -> None:
    """End this forked process as Python's own exit would: non-daemon threads joined, atexit
    handlers run, the standard streams flushed, SystemExit's code turned into a status."""
    try:
        if "threading" in sys.modules:
            sys.modules["threading"]._shutdown()
        import atexit

        atexit._run_exitfuncs()
    except BaseException:  # noqa: BLE001 - the exit goes on
        pass
    if code is None:
        status = 0
    elif isinstance(code, int):
        status = code & 0xFF
    else:
        print(code, file=sys.stderr)
        status = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001 - a closed stream
            pass
    os._exit(status)


def _options(argv: list[str]) -> dict[str, str]:
    """The options of `run` the kernel's start needs (`--name value`, `--name=value`, --restore)."""
    found: dict[str, str] = {}
    i = 0
    while i < len(argv):
        name, eq, value = argv[i].partition("=")
        if name in VALUED and not eq and i + 1 < len(argv):
            value, i = argv[i + 1], i + 1
        if name in VALUED or name == "--restore":
            found[name] = value
        i += 1
    return found


def take_zygote() -> int | None:
    """The pid of a kernel begun before the runtime (gpusession.agent.kernelzygote), which the pod's
    command names in GPUSESSION_ZYGOTE, where it is this process's child still running; the name
    is taken out of the environment (no kernel's environment has it)."""
    said = os.environ.pop(ENV_ZYGOTE, "")
    try:
        pid = int(said)
        return pid if os.waitpid(pid, os.WNOHANG) == (0, 0) else None
    except (ValueError, ChildProcessError):
        return None


def drop_zygote(pid: int | None) -> None:
    """A kernel begun before the runtime, not taken: ended and reaped."""
    if pid is None:
        return
    try:
        os.kill(pid, _signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass


def hand_to_zygote(
    pid: int, state_dir: str, argv: list[str], env: dict[str, str], cwd: str | None
) -> Spawned | None:
    """The kernel begun before the runtime, given the plan that posix_spawn would be given (it
    runs it where a fresh start would end up the same, else execs it); None where it has ended,
    or the kernel's folder is missing (the plain start says so)."""
    if cwd and not os.path.isdir(cwd):
        return None
    kernel = Spawned.adopt(pid, argv)
    if kernel.poll() is not None:
        return None
    replace_json(os.path.join(state_dir, ZYGOTE_PLAN), _plan(argv, env, cwd))
    return kernel


def early_kernel(argv: list[str], zygote: int | None = None) -> tuple[Spawned, dict]:
    """The session's first kernel, started from `run`'s ARGS: (its process, its connection info).
    `zygote`: the pid of one begun before the runtime (take_zygote), given the plan."""
    opts = _options(argv)
    state_dir = os.path.abspath(opts["--state-dir"])
    private_state_dir(state_dir)
    connection_file = os.path.join(state_dir, "kernel.json")
    info = write_connection_file(
        connection_file,
        opts.get("--kernel-ip") or "127.0.0.1",
        int(opts.get("--kernel-ports") or 0),
    )
    forget_restart(state_dir)
    spawn = os.environ.pop(ENV_SPAWN_FIRST, "") == "1"  # (no kernel's environment has it)
    argv_, env = kernel_plan(
        connection_file,
        state_dir,
        opts["--session-id"],
        opts.get("--workspace", ""),
        "--restore" in opts,
    )
    cwd = opts.get("--cwd") or None
    if zygote is not None:
        kernel = hand_to_zygote(zygote, state_dir, argv_, env, cwd)
        if kernel is not None:
            return kernel, info
    if spawn or (cwd and not os.path.isdir(cwd)) or not _one_thread():
        return Spawned(argv_, env, cwd), info  # a missing folder: posix_spawn says so
    return Spawned.forked(argv_, env, cwd), info


EARLY_WAIT_S = (
    2.0  # the first step waits this long at most for the kernel to listen (announce_early)
)


class Early:
    """The session's first kernel as the first step hands it to the runtime: its process, its
    connection info, the agent's listening socket bound ahead (None: the runtime binds its own),
    and which of KERNEL and READY were said already (the runtime says the others)."""

    def __init__(self, kernel: Spawned, info: dict):
        self.kernel, self.info = kernel, info
        self.agent_socket = None
        self.kernel_said = self.ready_said = False


def announce_early(early: Early, argv: list[str]) -> None:
    """KERNEL as soon as the kernel's process runs, READY once it listens, said by the first
    step before the runtime loads: the runtime's imports (~0.1 s of CPU) then come after the
    kernel's boot, not beside it, which a busy machine felt. The agent's port, which both name,
    is bound here first and handed to the runtime's endpoint. Nothing is said where the runtime
    must say it itself: no agent (--no-agent), or its fixed port taken (the runtime's retries);
    READY is left to the runtime when the kernel ends (its FAILED) or boots longer than
    EARLY_WAIT_S (the runtime then loads beside it: its agent answers while a kernel boots slowly)."""
    opts = _options(argv)
    if "--no-agent" in argv:
        return
    port = int(opts.get("--agent-port") or 0)
    if port >= 0:  # -1: no endpoint
        try:
            early.agent_socket = _listening(port)
        except OSError:
            return
    info = early.info
    agent_port = early.agent_socket.getsockname()[1] if early.agent_socket else None
    said = where(info, agent_port)
    _say(MARKER_KERNEL, said)
    early.kernel_said = True
    # lazy: docs/architecture.md#imports-kept-inside-functions (not in the kernel, forked before)
    from ..core.listening import kernel_listens

    deadline = time.monotonic() + min(EARLY_WAIT_S, float(opts.get("--ready-timeout") or 60))
    while not kernel_listens(info):
        if early.kernel.poll() is not None or time.monotonic() > deadline:
            return
        time.sleep(0.01)
    share_sockets(info)
    write_runtime(  # this process's pid: the runtime's own, once it loads here
        os.path.abspath(opts["--state-dir"]),
        kernel=early.kernel,
        started_at=time.time(),
        agent_port=agent_port,
        session_id=opts.get("--session-id"),
        generation=1,
        ready=True,
    )
    say_ready(os.path.abspath(opts["--state-dir"]), said)
    early.ready_said = True


SETTLE_S = 1.0  # the first step waits this long at most for the kernel's boot to end (settled)


def settled(pid: int, limit: float = SETTLE_S) -> bool:
    """Until the kernel's process has ended its boot: asleep, and no CPU spent, in two looks 10 ms
    apart (its event loop waits), `limit` seconds at most. The runtime's imports then come after
    the kernel's, not beside them: a listening kernel still boots for 0.1-0.4 s before it
    answers, and on a busy machine CPU the runtime takes is CPU the kernel waits for. Asleep is
    every thread's state, looked at once the first thread's and the CPU say so: a main thread
    waiting on another (ipykernel's flush waits for its IOPub thread) is asleep while that one
    waits for a CPU, spending none, and the boot was taken for over (CI, at load)."""
    # lazy: docs/architecture.md#imports-kept-inside-functions (after READY, never in the kernel)
    from ..core.procs import stat_fields, threads_asleep

    deadline = time.monotonic() + limit
    last = None
    quiet = 0
    while time.monotonic() < deadline:
        fields = stat_fields(pid)
        if fields is None:
            return False
        now = (fields[0], int(fields[11]) + int(fields[12]))
        still = now[0] == "S" and last is not None and now[1] == last[1]
        quiet = quiet + 1 if still and threads_asleep(pid) else 0
        if quiet >= 2:
            return True
        last = now
        time.sleep(0.01)
    return False


def say_ready(state_dir: str, payload: dict) -> None:
    """READY: in the state folder's READY_FILE first, then said on stdout (the log)."""
    replace_json(os.path.join(state_dir, READY_FILE), payload)
    _say(MARKER_READY, payload)


def where(info: dict, agent_port: int | None) -> dict:
    """Where to connect, as KERNEL and READY say it (never the key: logs are read by more than
    the client)."""
    return {
        "ports": {name: info[name] for name in KERNEL_PORT_NAMES},
        "agent_port": agent_port,
        "transport": info.get("transport", "tcp"),
        "ip": info["ip"],
    }


def write_runtime(
    state_dir: str, *, kernel, started_at, agent_port, session_id, generation, **extra
) -> None:
    """`runtime.json` in the state folder (what it holds: gpusession.agent.kernel_runtime)."""
    replace_json(
        os.path.join(state_dir, "runtime.json"),
        {
            "pid": os.getpid(),
            "kernel_pid": kernel.pid if kernel else None,
            "started_at": started_at,
            "agent_port": agent_port,
            "session_id": session_id,
            "kernel_generation": generation,
            **extra,
        },
    )


def replace_json(path: str, data: dict) -> None:
    """`data` as JSON into `path`, replaced whole (written beside it, then renamed)."""
    with open(path + ".tmp", "w") as f:
        f.write(_json(data))
    os.replace(path + ".tmp", path)


def _json(value) -> str:
    """`value` as compact JSON. What the first step says and writes before the runtime loads is
    plain (_plain_json) and written without loading json, whose import (with re's) is 3-6 ms of a
    fresh interpreter's CPU, which a busy machine's kernel boot waited for."""
    text = _plain_json(value)
    if text is not None:
        return text
    import json

    return json.dumps(value, separators=(",", ":"))


def _plain_json(value) -> str | None:
    """JSON for dicts of None, booleans, ints, finite floats and plain strings (_plain); None
    for anything else (json writes that)."""
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    if isinstance(value, int):
        return str(int(value))
    if isinstance(value, float):
        return repr(value) if value - value == 0 else None  # not NaN nor infinite
    if isinstance(value, str):
        return f'"{value}"' if _plain(value) else None
    if not isinstance(value, dict):
        return None
    parts = []
    for key, item in value.items():
        text = _plain_json(item)
        if not isinstance(key, str) or not _plain(key) or text is None:
            return None
        parts.append(f'"{key}":{text}')
    return "{" + ",".join(parts) + "}"


def _listening(port: int):
    """The agent's socket on the loopback, listening (as its HTTP server would bind it); a
    `_socket.socket` (the socket module's imports wait for the runtime: as_socket)."""
    import _socket

    sock = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
    try:
        sock.setsockopt(_socket.SOL_SOCKET, _socket.SO_REUSEADDR, 1)  # as http.server does
        sock.bind(("127.0.0.1", port))
        sock.listen(16)
    except OSError:
        sock.close()
        raise
    return sock


def _say(word: str, payload: dict) -> None:
    """The marker line in one write (protocol.say_line: the kernel writes to the same stdout)."""
    sys.stdout.write(f"{word} {_json(payload)}\n")
    sys.stdout.flush()


def as_socket(sock):
    """The agent's socket the first step bound (_listening) as a `socket.socket`, which the HTTP
    server accepts on; None stays None."""
    import socket

    if sock is None or isinstance(sock, socket.socket):
        return sock
    return socket.socket(sock.family, sock.type, sock.proto, fileno=sock.detach())


def share_sockets(info: dict) -> None:
    """A kernel's unix sockets in a folder its group may use too (setgid, 2770: a container's,
    whose owner outside is another uid than the kernel's) are made that group's too: connecting
    to a unix socket needs write on it, and the runtime's umask made them the kernel's alone. The
    folder stays the gate: in a 0700 one they stay 0700."""
    if info.get("transport") != "ipc":
        return
    for name in KERNEL_PORT_NAMES:
        share_socket(f"{info['ip']}-{info[name]}")


def share_socket(path: str) -> None:
    """One unix socket, as share_sockets says: its group's too where its folder is (2770)."""
    if os.stat(os.path.dirname(path)).st_mode & 0o070 == 0o070:
        os.chmod(path, 0o660)
