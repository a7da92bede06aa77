"""What a kernel's process is, as a cell in it sees it (tests of gpusession.agent.kernelzygote: a
kernel begun before the runtime must be the kernel a plain start gives)."""

from __future__ import annotations

import json
import re

# a cell: prints one JSON line
CELL = r"""
import json as _j, os as _o, signal as _s, sys as _y
_u = _o.umask(0); _o.umask(_u)
print(_j.dumps({
    "pid": _o.getpid(),
    "session_leader": _o.getsid(0) == _o.getpid(),
    "cmdline": open("/proc/self/cmdline", "rb").read().decode(errors="replace").split("\0")[:3],
    "executable": _y.executable,
    "path": _y.path,
    "argv": _y.argv,
    "env": dict(_o.environ),
    "cwd": _o.getcwd(),
    "umask": _u,
    "signals": {str(n): repr(_s.getsignal(n)) for n in _s.valid_signals()},
    "blocked": sorted(int(n) for n in _s.pthread_sigmask(_s.SIG_BLOCK, [])),
    "main": _y.modules["__main__"].__name__,
    "flags": repr(_y.flags),
    "stdio": [type(_y.stdout).__name__, type(_y.stderr).__name__, type(_y.stdin).__name__],
    "modules": sorted(_y.modules),
}))
"""


def parse(output: str) -> dict:
    """The cell's JSON line out of its output."""
    (line,) = [x for x in output.splitlines() if x.startswith("{")]
    return json.loads(line)


def comparable(state: dict, *, replace: dict[str, str]) -> dict:
    """The state without what differs between any two kernels (the pid, how the process was
    started), the paths of `replace` (a run's own folders) put as their names."""
    text = json.dumps({k: v for k, v in state.items() if k not in ("pid", "cmdline")})
    text = re.sub(r" at 0x[0-9a-f]+", "", text)  # a handler's repr: the same function
    for path, name in sorted(replace.items(), key=lambda kv: -len(kv[0])):
        text = text.replace(path, name)
    return json.loads(text)
