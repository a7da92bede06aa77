"""Files written whole: a reader, or a second writer at the same moment, sees one whole version
(the old one or the last rename's), never a part of one."""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path


def write_whole(path: str | os.PathLike, data: bytes | str, *, mode: int = 0o600) -> Path:
    """Write `data` under a name of this writer's own beside `path` (the process and thread in
    it), then rename it over `path`. The file is made with `mode` (the owner's alone unless
    asked); OSError as open or write would raise it, with the part removed."""
    path = Path(path)
    part = path.with_name(f".{path.name}.{os.getpid()}-{threading.get_ident()}.part")
    raw = data.encode() if isinstance(data, str) else data
    fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(raw)
        os.replace(part, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(part)
        raise
    return path
