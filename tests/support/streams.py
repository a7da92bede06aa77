"""A workspace's tar stream as a switch moves it (`workspace/new.txt` and a 3 MB `workspace/big`),
in 1 MB chunks, whose source can fail midway: what the backends' import_workspace tests feed."""

from __future__ import annotations

import io
import os
import tarfile


def workspace_chunks():
    """chunks(fail_at=None): the stream's 1 MB chunks; at byte `fail_at` the source fails with
    OSError("cannot read big: Input/output error")."""
    packed = io.BytesIO()
    with tarfile.open(fileobj=packed, mode="w") as tar:
        for name, data in (("workspace/new.txt", b"moved"), ("workspace/big", os.urandom(3 << 20))):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    stream = packed.getvalue()

    def chunks(fail_at: int | None = None):
        for i in range(0, len(stream), 1 << 20):
            if i == fail_at:
                raise OSError("cannot read big: Input/output error")
            yield stream[i : i + (1 << 20)]

    return chunks
