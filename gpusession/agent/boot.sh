#!/bin/sh
# The gpusession runtime's way into any image (gpusession/transport/bundle.py puts it in the runtime
# bundle, mounted read-only at $ROOT). It finds the image's own Python, then
#   sh boot.sh probe        prints one GPUSESSION_PYTHON line: that Python and what it has (JSON)
#   sh boot.sh run ARGS...  runs gpusession.agent.firststep's main with `run ARGS...` (the kernel's
#                           process first, then `gpusession.agent run ARGS...`) with the bundle's
#                           code on PYTHONPATH; the kernel runs with the image's Python and packages
# Without a python3 (3.9 or newer) it prints one GPUSESSION_FAILED line and exits 3.
# POSIX sh only: most images have dash or busybox, not bash.
# where a container runtime that cannot add mount points mounts it elsewhere (ch-run: /mnt/0)
ROOT=${GPUSESSION_RUNTIME_ROOT:-/opt/gpusession-runtime}
GPUSESSION_RUNTIME_ROOT=$ROOT
export GPUSESSION_RUNTIME_ROOT

new_enough='import sys; sys.exit(0 if sys.version_info >= (3, 9) else 1)'

# PATH first (what `python3` means in the image), then where Python lives in images that do not
# put it on PATH: conda and venv layouts under /opt, /usr/local (python:3.x images), /usr.
find_python() {
    for candidate in "$(command -v python3 2>/dev/null)" "$(command -v python 2>/dev/null)" \
        /opt/*/bin/python3 /opt/*/envs/*/bin/python3 /opt/*/*/bin/python3 /usr/local/bin/python3 \
        /usr/bin/python3 /opt/*/bin/python /usr/local/bin/python /usr/bin/python; do
        [ -n "$candidate" ] && [ -x "$candidate" ] || continue
        if "$candidate" -c "$new_enough" >/dev/null 2>&1; then
            PY=$candidate
            return 0
        fi
    done
    return 1
}

# What the local side needs to know to bring the rest: version, platform, and whether the image
# has ipykernel (6 or newer) and pip. Python 3.9 syntax.
probe='
import importlib.util, json, os, platform, sys
def version_of(name):
    if importlib.util.find_spec(name) is None:
        return None
    try:
        from importlib.metadata import version
        return version(name)
    except Exception:
        return "unknown"
libc = platform.libc_ver()
print("GPUSESSION_PYTHON " + json.dumps({
    "executable": sys.executable, "version": list(sys.version_info[:3]), "implementation": sys.implementation.name,
    "machine": platform.machine(), "libc": [libc[0], libc[1]], "ipykernel": version_of("ipykernel"),
    "pip": version_of("pip"), "uid": os.getuid(), "venv": sys.prefix != getattr(sys, "base_prefix", sys.prefix),
    "command": sys.argv[1],
}, separators=(",", ":")), flush=True)
'

# the local side says which, when it probed the image before: one Python start less
if [ -n "${GPUSESSION_RUNTIME_PYTHON:-}" ] && [ -x "$GPUSESSION_RUNTIME_PYTHON" ]; then
    PY=$GPUSESSION_RUNTIME_PYTHON
elif ! find_python; then
    echo 'GPUSESSION_FAILED {"stage":"python","error":"no python3 (3.9 or newer) on PATH, in /opt/*/bin, /usr/local/bin or /usr/bin"}'
    exit 3
fi

mode=${1:-}
[ $# -gt 0 ] && shift
case "$mode" in
    probe)
        exec "$PY" -c "$probe" "$PY"
        ;;
    run)
        if [ ! -f "$ROOT/code/.complete" ]; then
            echo 'GPUSESSION_FAILED {"stage":"runtime","error":"the runtime bundle in this container is incomplete"}'
            exit 4
        fi
        PYTHONPATH="$ROOT/code/lib${PYTHONPATH:+:$PYTHONPATH}"
        PYTHONUNBUFFERED=1
        export PYTHONPATH PYTHONUNBUFFERED
        # no locale (most images): Python's start would make it C.UTF-8 (PEP 538) in its own
        # environment only, which its kernel then gets; said here, the first step starts as that
        # kernel does, and its fork can be the kernel (gpusession.agent.kernelspawn.Spawned.forked)
        if [ -z "${LC_ALL:-}${LC_CTYPE:-}${LANG:-}" ]; then
            LC_CTYPE=C.UTF-8
            export LC_CTYPE
        fi
        # `-c`, not `-m`: runpy and its imports (~3 ms of CPU) are not on the way to the kernel
        exec "$PY" -c 'from gpusession.agent.firststep import main; raise SystemExit(main())' run "$@"
        ;;
    *)
        echo "usage: sh boot.sh probe | run ARGS..." >&2
        exit 2
        ;;
esac
