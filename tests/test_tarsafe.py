"""The tar stream of a download or an upload, read forward as its chunks arrive
(tarsafe.ForwardReader, issue 35): every file lands whole whatever the chunks' sizes (a header or
a file's bytes split across chunks, empty files, files of whole blocks), folders and links keep
their rules, and a stream cut short writes nothing. Real files, real tar streams."""

from __future__ import annotations

import io
import os
import tarfile

import pytest

from gpusession.transport.tarsafe import Extraction, ForwardReader, whole_seconds

SIZES = {"empty.bin": 0, "odd.bin": 511, "block.bin": 512, "big.bin": (4 << 20) + 3}


def _stream(src) -> bytes:
    (src / "sub").mkdir(parents=True)
    for name, size in SIZES.items():
        (src / "sub" / name).write_bytes(os.urandom(size))
    os.symlink("odd.bin", src / "sub" / "link")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(src / "sub", arcname="sub", filter=whole_seconds)
    return buf.getvalue()


def _extract(data: bytes, chunk: int, dest, extraction: Extraction | None = None) -> Extraction:
    chunks = iter([data[i : i + chunk] for i in range(0, len(data), chunk)])
    reader = ForwardReader(lambda: next(chunks, None))
    extraction = extraction or Extraction(str(dest), links=True)
    with tarfile.open(fileobj=reader, mode="r:") as tar:
        extraction.run(tar)
    reader.drain()
    return extraction


@pytest.mark.parametrize("chunk", [1000, 512, 4 << 20, 1 << 30])
def test_every_file_lands_whole_whatever_the_chunks(tmp_path, chunk):
    data = _stream(tmp_path / "src")
    extraction = _extract(data, chunk, tmp_path / "dest")
    extraction.commit()
    for name in SIZES:
        got = (tmp_path / "dest" / "sub" / name).read_bytes()
        assert got == (tmp_path / "src" / "sub" / name).read_bytes(), name
    assert os.readlink(tmp_path / "dest" / "sub" / "link") == "odd.bin"
    assert extraction.files == len(SIZES) and not extraction.refused
    mtime = int((tmp_path / "src" / "sub" / "big.bin").stat().st_mtime)
    assert (tmp_path / "dest" / "sub" / "big.bin").stat().st_mtime == mtime


def test_a_stream_cut_short_writes_nothing(tmp_path):
    data = _stream(tmp_path / "src")
    extraction = Extraction(str(tmp_path / "dest"), links=True)
    with pytest.raises((OSError, tarfile.TarError)):
        _extract(data[: len(data) // 2], 1 << 20, tmp_path / "dest", extraction)
    extraction.discard()  # what download() does when the stream did not arrive whole
    assert not any(p.is_file() for p in (tmp_path / "dest").rglob("*")), "nothing under its name"


def test_the_reader_seeks_forward_only():
    reader = ForwardReader(iter([b"abc", b"defg", None]).__next__)
    assert reader.read(2) == b"ab" and reader.seek(4) == 4 and reader.read(10) == b"efg"
    with pytest.raises(OSError, match="forward only"):
        reader.seek(1)
