"""A marker line stays whole when another process writes to the same stdout (the kernel and the
runtime share a container's): `say_line` writes the line and its newline at once.

A CI run read `GPUSESSION_READY {...}NOTE: When using the ipython kernel entry point, Ctrl-C
will not work.`: with PYTHONUNBUFFERED (as the runtime runs), `print` writes the text and the
newline apart, and the kernel's own first line landed between them, after the JSON."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from gpusession.backends.base import marker_lines
from gpusession.core.protocol import Marker, parse_marker

pytestmark = pytest.mark.integration  # starts Python processes (tests/conftest.py)

LINES = 3000

SAYER = f"""
import sys
from gpusession.core.protocol import Marker, marker_line, say_line
for i in range({LINES}):
    SAY(marker_line(Marker.READY, {{"i": i, "ports": {{"shell_port": 1}}}}))
"""

NOISE = """
import os, sys
while True:  # a kernel's output: bytes with no newline of their own, as often as it can
    os.write(1, b"noise ")
"""


def _shared_stdout(say: str) -> list:
    """What a reader of the shared pipe parses: each READY payload, or the line that failed."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    read, write = os.pipe()
    noise = subprocess.Popen([sys.executable, "-c", NOISE], stdout=write, env=env)
    sayer = subprocess.Popen(
        [sys.executable, "-c", SAYER.replace("SAY", say)], stdout=write, env=env
    )
    os.close(write)
    out = b""
    with os.fdopen(read, "rb") as pipe:
        while sayer.poll() is None or not out.endswith(b"\n"):
            chunk = pipe.read1(1 << 16)
            if not chunk:
                break
            out += chunk
            if sayer.poll() is not None and out.count(b"GPUSESSION_READY") >= LINES:
                break
        noise.kill()
        noise.wait()
        sayer.wait(timeout=60)
        out += pipe.read()
    found = []
    for line in marker_lines(out.decode()):
        parsed = parse_marker(line)
        if parsed is not None and parsed[0] is Marker.READY:
            found.append(parsed[1] if isinstance(parsed[1], dict) else line)
    return found


def test_a_marker_said_beside_another_writer_reads_back_whole():
    found = _shared_stdout("say_line")
    broken = [x for x in found if not isinstance(x, dict)]
    assert not broken, f"{len(broken)} of {len(found)} READY lines broken, e.g. {broken[0][:120]!r}"
    assert [x["i"] for x in found] == list(range(LINES))
