"""Reading raw inputs: gzip through ISA-L, chunks of whole lines."""

from __future__ import annotations

import bz2
import gzip
import io
import zlib

import pytest

from pipeline.ingest.readers import DECOMPRESS_ERRORS, line_chunks, open_input

TEXT = b"".join(f"{i}\tline {i}\r\n".encode() if i % 7 == 0 else f"{i}\tline {i}\n".encode() for i in range(5000))


def read_all(url: str) -> bytes:
    with open_input(url) as f:
        return f.read()


def test_gzip_bz2_and_plain_inputs_read_back_the_same_bytes(tmp_path):
    (tmp_path / "a.tsv").write_bytes(TEXT)
    (tmp_path / "a.tsv.gz").write_bytes(gzip.compress(TEXT))
    (tmp_path / "a.tsv.bz2").write_bytes(bz2.compress(TEXT))
    assert {read_all(str(tmp_path / n)) for n in ("a.tsv", "a.tsv.gz", "a.tsv.bz2")} == {TEXT}


def test_a_gzip_of_several_members_reads_as_their_concatenation(tmp_path):
    # what appending to a .gz file gives (bench.ingest writes its inputs so)
    path = tmp_path / "multi.tsv.gz"
    path.write_bytes(gzip.compress(TEXT[:1000]) + gzip.compress(TEXT[1000:]))
    assert read_all(str(path)) == TEXT


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda gz: gz[: len(gz) // 2], id="truncated"),
        pytest.param(lambda gz: gz[:40] + bytes(64) + gz[104:], id="corrupt-deflate"),
        pytest.param(lambda gz: gz[:-8] + (zlib.crc32(b"x")).to_bytes(4, "little") + gz[-4:], id="bad-crc"),
        pytest.param(lambda gz: b"not a gzip file at all" * 10, id="not-gzip"),
    ],
)
def test_a_damaged_gzip_raises_a_decompression_error(tmp_path, damage):
    path = tmp_path / "bad.tsv.gz"
    path.write_bytes(damage(gzip.compress(TEXT)))
    with pytest.raises(DECOMPRESS_ERRORS):
        read_all(str(path))


def test_line_chunks_cut_at_line_counts_whatever_the_read_size():
    for read_size in (7, 1000, 1 << 20):
        chunks = list(line_chunks(io.BytesIO(TEXT), 1234, read_size=read_size))
        assert [n for _, n in chunks] == [1234, 1234, 1234, 1234, 64]
        assert b"".join(c for c, _ in chunks) == TEXT and all(c.endswith(b"\n") for c, _ in chunks)


def test_line_chunks_of_a_byte_budget_end_on_the_line_that_starts_in_range():
    f = io.BytesIO(TEXT)
    cut = TEXT.index(b"\n", 1000) - 3  # inside a line: that line is completed past the budget
    chunks = list(line_chunks(f, 100, budget=cut, read_size=64))
    data = b"".join(c for c, _ in chunks)
    assert data == TEXT[: TEXT.index(b"\n", cut) + 1]
    assert sum(n for _, n in chunks) == data.count(b"\n")
