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


def test_a_hard_link_to_a_file_of_the_stream_lands_as_a_copy_and_any_other_is_refused(tmp_path):
    data = os.urandom(70_000)
    (tmp_path / "a.bin").write_bytes(data)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(tmp_path / "a.bin", arcname="a.bin", filter=whole_seconds)
        for name, target in (("b.bin", "a.bin"), ("c.bin", "elsewhere.bin"), ("d.bin", "../a.bin")):
            link = tarfile.TarInfo(name)
            link.type, link.linkname = tarfile.LNKTYPE, target
            tar.addfile(link)
    dest = tmp_path / "dest"
    extraction = _extract(buf.getvalue(), 4096, dest)
    assert not (dest / "a.bin").exists() and not (dest / "b.bin").exists()  # not before commit()
    extraction.commit()
    assert sorted(os.listdir(dest)) == ["a.bin", "b.bin"]
    assert (dest / "b.bin").read_bytes() == data and (dest / "a.bin").read_bytes() == data
    assert [r.split(" ")[0] for r in extraction.refused] == ["c.bin", "d.bin"]
    assert (extraction.files, extraction.bytes) == (2, 2 * len(data))


def test_thousands_of_files_land_under_their_names_in_the_streams_order(tmp_path):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for i in range(3000):
            member = tarfile.TarInfo(f"many/f{i:05d}")
            body = str(i).encode()
            member.size = len(body)
            tar.addfile(member, io.BytesIO(body))
        again = tarfile.TarInfo("many/f00007")  # the same name again: the later one wins
        again.size = 5
        tar.addfile(again, io.BytesIO(b"later"))
    extraction = _extract(buf.getvalue(), 1 << 16, tmp_path / "dest")
    extraction.commit()
    names = sorted(os.listdir(tmp_path / "dest" / "many"))
    assert names == [f"f{i:05d}" for i in range(3000)]  # no temporary name left
    assert (tmp_path / "dest" / "many" / "f02999").read_bytes() == b"2999"
    assert (tmp_path / "dest" / "many" / "f00007").read_bytes() == b"later"
