"""Reading raw inputs: gzip through ISA-L, chunks of whole lines, and the read-ahead thread."""

from __future__ import annotations

import bz2
import gzip
import io
import threading
import time
import zlib

import pytest

from pipeline.readers import DECOMPRESS_ERRORS, line_chunks, open_input, read_ahead

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


def test_read_ahead_yields_the_same_items_in_order():
    items = [bytes([i]) * 10 for i in range(50)]
    for depth in (0, 1, 3):
        assert list(read_ahead(iter(items), depth)) == items


def test_read_ahead_raises_the_producers_error_after_the_items_before_it():
    def source():
        yield 1
        yield 2
        raise EOFError("truncated")

    items = read_ahead(source(), 1)
    assert (next(items), next(items)) == (1, 2)
    with pytest.raises(EOFError, match="truncated"):
        next(items)


def test_a_consumer_that_stops_early_stops_the_producer_and_closes_its_source():
    closed = threading.Event()
    produced = []

    def source():
        try:
            for i in range(1000):
                produced.append(i)
                yield i
        finally:
            closed.set()  # where a reader's `with open(...)` would close its file

    reader = read_ahead(source(), 2)
    assert next(reader) == 0
    reader.close()  # what a failed parse does to the task's chunk iterator
    assert closed.is_set()  # set before close() returned: the thread is done
    assert len(produced) <= 5  # it never ran ahead more than `depth` (+ the ones in hand)
    assert not [t for t in threading.enumerate() if t.name == "read-ahead"]


@pytest.mark.parametrize("lazy", [False, True])
def test_read_ahead_bounds_the_items_made_and_not_yet_taken(lazy):
    made = []

    def source():
        for i in range(20):
            made.append(i)  # runs when the producer starts item i
            yield i

    depth = 2
    reader = read_ahead(source(), depth, lazy=lazy)
    for taken, item in enumerate(reader, start=1):
        assert item == taken - 1
        time.sleep(0.01)  # give the producer time to run as far ahead as it may
        # lazy: the one being made counts (ingest's chunks); otherwise one more is made while `depth` wait
        assert len(made) - taken <= (depth if lazy else depth + 1)
    assert made == list(range(20))


def test_line_chunks_of_a_byte_budget_end_on_the_line_that_starts_in_range():
    f = io.BytesIO(TEXT)
    cut = TEXT.index(b"\n", 1000) - 3  # inside a line: that line is completed past the budget
    chunks = list(line_chunks(f, 100, budget=cut, read_size=64))
    data = b"".join(c for c, _ in chunks)
    assert data == TEXT[: TEXT.index(b"\n", cut) + 1]
    assert sum(n for _, n in chunks) == data.count(b"\n")
