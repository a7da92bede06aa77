"""A session's first kernel, begun before the runtime is in the pod (the Kubernetes backend: its
pod's command runs this file's text as `PYTHON -c SOURCE STATE_DIR WAIT_S` in the background as
the container starts, for an image whose Python and ipykernel are known from its last pod). It
imports ipykernel and what its kernel loads at start (~0.2 s of a kernel's ~0.3 s boot) while
the runtime is copied in and its first step starts, then waits for the first step's plan
(STATE_DIR/PLAN, written by gpusession.agent.kernelspawn.hand_to_zygote): the kernel's argv,
environment, folder, umask and signals, what a process it spawned would start with. It runs that
plan here, as `python -m ipykernel_launcher` would, only where a fresh start would end up the
same: the same Python, `-m ipykernel_launcher`, and an environment that differs from the one
these imports saw in our own variables only (GPUSESSION_*, PIP_*, JPY_PARENT_PID: no library
reads them while it imports; every PYTHON* variable is the same, so sys.path and the
interpreter's settings are too) and no user site folder made since. Anything else, or imports
that failed, and it execs the plan instead: a plain start, a moment later. Given no plan in
WAIT_S seconds, it ends.

Standard library only, no import of the package (it is not in the pod yet), Python 3.9 syntax.
"""

import os
import signal
import sys
import time

PLAN = "zygote.json"
OWN_PREFIXES = ("GPUSESSION_", "PIP_")
OWN_NAMES = ("JPY_PARENT_PID",)
# what ipykernel's kernel imports at its start (its app's module, then its initialize: the
# debugger's, the shell's history database, the completer): a kernel's imports, made early
PRELOAD = (
    "ipykernel.kernelapp",
    "ipykernel.ipkernel",
    "ipykernel.zmqshell",
    "ipykernel.debugger",
    "IPython.core.debugger",
    "IPython.core.completerlib",
    "IPython.core.oinspect",
    "IPython.extensions.storemagic",
    "sqlite3",
    "json",
    "runpy",
)


def _preload() -> bool:
    """The kernel's imports; False where ipykernel's own cannot be made (a plain start then
    says what is wrong, in its own words). The others are taken where they import: what an
    older ipykernel does not load at start is only loaded early."""
    import importlib

    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - see above
            if name == PRELOAD[0]:
                return False
    return True


def _plan(path: str, wait_s: float) -> "dict | None":
    deadline = time.monotonic() + wait_s
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            return None
        time.sleep(0.005)
    import json

    with open(path) as f:
        plan = json.load(f)
    os.remove(path)
    return plan


def _same_start(plan: dict, started_with: dict) -> bool:
    """Would a fresh start of the plan's argv end up as this process has: same Python, the
    launcher, the same environment but for our own variables, no user site made since?"""
    argv, env = plan["argv"], plan["env"]
    if argv[1:3] != ["-m", "ipykernel_launcher"]:
        return False
    try:
        if not os.path.samefile(argv[0], sys.executable):
            return False
    except OSError:
        return False
    for name in set(env) | set(started_with):
        if name.startswith(OWN_PREFIXES) or name in OWN_NAMES:
            continue
        if env.get(name) != started_with.get(name):
            return False
    import site

    user_site = site.getusersitepackages() if site.ENABLE_USER_SITE else None
    return not (user_site and os.path.isdir(user_site) and user_site not in sys.path)


def _dispositions() -> dict:
    return {number: signal.getsignal(number) for number in signal.valid_signals()}


def _signals(plan: dict, at_start: dict) -> None:
    """Each signal as a process the first step spawned would have it: ignored where the first
    step ignores it, else at its default (an exec keeps only ignored signals), then as Python's
    start sets them (SIGPIPE and SIGXFSZ ignored; SIGINT raising KeyboardInterrupt where it is
    not ignored); the first step's blocked signals blocked. A handler the imports installed
    (`at_start`: before them) stays: they install it in a plain start too."""
    ignored, now = set(plan["ignored"]), _dispositions()
    for number in now:
        if number in (signal.SIGKILL, signal.SIGSTOP):
            continue
        if now[number] is not at_start.get(number) and number != signal.SIGUSR1:
            continue  # set by an import
        try:
            signal.signal(number, signal.SIG_IGN if number in ignored else signal.SIG_DFL)
        except (OSError, ValueError, TypeError):  # one Python may not set (a real-time one)
            pass
    for name in ("SIGPIPE", "SIGXFSZ"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_IGN)
    if signal.SIGINT not in ignored:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.pthread_sigmask(signal.SIG_SETMASK, plan["blocked"])


def _take(plan: dict, started_with: dict, signals_at_start: dict) -> None:
    """This process as the plan's: its environment (with what the imports set in theirs, as
    they set it over the plan's in a plain start: ipykernel's debugger sets
    PYDEVD_USE_FRAME_EVAL), folder, umask and signals."""
    changed = {k: v for k, v in os.environ.items() if started_with.get(k) != v}
    removed = [k for k in started_with if k not in os.environ]
    os.environ.clear()
    os.environ.update(plan["env"])
    os.environ.update(changed)
    for name in removed:
        os.environ.pop(name, None)
    if plan.get("cwd"):
        os.chdir(plan["cwd"])
    os.umask(plan["umask"])
    _signals(plan, signals_at_start)


def _as_pythons_child() -> None:
    """Started again, once, where Python's own start changed this process's environment (PEP
    538: a C locale gets LC_CTYPE=C.UTF-8, which UTF-8 mode and the locale follow at start): the
    first step's Python made that change too, and a kernel it spawns starts with it, so this
    one must. /proc/self/environ is the environment this process was started with."""
    try:
        with open("/proc/self/environ", "rb") as f:
            given = dict(x.split(b"=", 1) for x in f.read().split(b"\0") if b"=" in x)
        with open("/proc/self/cmdline", "rb") as f:
            argv = f.read().split(b"\0")[:-1]
    except OSError:
        return
    if given != dict(os.environb) and len(sys.argv) == 3:
        os.execve(sys.executable, [*argv, b"again"], os.environb)


def main() -> None:
    _as_pythons_child()
    started_with = dict(os.environ)
    state_dir, wait_s = sys.argv[1], float(sys.argv[2])
    # as ipykernel_launcher: this folder must not shadow the packages imported now
    if sys.path and sys.path[0] in ("", os.getcwd()):
        del sys.path[0]
    # as the first step's posix_spawn(setsid=True): a session of its own (the plan's signals
    # come with the plan: until then, sh's `&` ignores SIGINT and SIGQUIT)
    os.setsid()
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # nothing asks a save before the plan
    signals_at_start = _dispositions()
    loaded = _preload()
    plan = _plan(os.path.join(state_dir, PLAN), wait_s)
    if plan is None:
        sys.exit(0)
    _take(plan, started_with, signals_at_start)
    argv = plan["argv"]
    if not (loaded and _same_start(plan, started_with)):
        os.execve(argv[0], argv, plan["env"])
    import importlib
    import runpy

    importlib.invalidate_caches()  # the runtime's folders appeared after this Python started
    sys.path.insert(0, os.getcwd())  # as `-m` puts it (ipykernel_launcher takes it out again)
    sys.argv = ["-m", *argv[3:]]
    runpy._run_module_as_main("ipykernel_launcher")  # what `python -m` runs


if __name__ == "__main__":
    main()
