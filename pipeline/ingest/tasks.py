"""Dask tasks of the ingest stage: one raw file (or one byte range of a plain file) -> Parquet parts.

A task streams its file in chunks of `ingest.rows_per_partition` lines and
writes each chunk's events and quarantine parts straight into the staging
directories, so no process ever holds a whole day.  Part names
`part-FFFFF-BBBBB-CCCCC.parquet` (file index, byte-range block index, chunk
index) sort in time order.

With `ingest.overlap_io` a task reads (and decompresses) chunk k+1 in a reader
thread and writes chunk k-1 in a writer thread while it parses chunk k: a
compressed file can be read by one task only, so it then costs about its parse
time rather than read + parse + write.  A task holds at most 3 chunks (the one
being parsed, the next one's raw lines, the previous one's tables in the
writer), whatever its file's size.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Generator, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import closing
from dataclasses import dataclass
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
from fsspec.utils import infer_compression

from pipeline.ingest import bad_rows
from pipeline.ingest.day_stats import add_stats, chunk_stats, empty_stats
from pipeline.ingest.error import IngestError
from pipeline.ingest.parse import parse_table
from pipeline.ingest.readers import (
    DECOMPRESS_ERRORS,
    READ_SIZE,
    line_chunks,
    open_input,
)
from pipeline.schema import LogSchema
from storage.io.fsio import join
from storage.io.read_ahead import read_ahead


@dataclass(frozen=True, slots=True)
class FileTask:
    """One ingest task: a file (or one byte range of a plain file) and where its parts go."""

    url: str
    file_index: int
    schema: LogSchema
    input_options: dict | None
    out_fs: fsspec.AbstractFileSystem
    events_dir: str
    quarantine_dir: str
    rows_per_partition: int
    date: str
    block_index: int = 0
    start: int = 0
    """First byte of the block's range (plain files only)."""
    end: int | None = None
    """End of the block's byte range; None reads to the end of the file."""
    first_line: int = 1
    """Line number of the block's first line."""
    overlap_io: bool = True
    """Read ahead and write behind in background threads (`IngestConfig.overlap_io`)."""


def count_newlines(item: tuple[str, int, int], *, storage_options: dict | None = None) -> int:
    """Dask task: the number of b"\\n" in bytes [a, b) of a plain file."""
    url, a, b = item
    n = 0
    with fsspec.open(url, "rb", **(storage_options or {})) as f:
        f.seek(a)
        left = b - a
        while left > 0:
            data = f.read(min(READ_SIZE, left))
            if not data:
                break
            n += data.count(b"\n")
            left -= len(data)
    return n


def ingest_file(task: FileTask) -> dict[str, Any]:
    """Dask task: stream one file (or byte range) chunk by chunk, write its parts, return its counts."""
    schema = task.schema
    counts: Counter[str] = Counter()
    reasons: Counter = Counter()
    samples: dict[str, dict] = {}
    parts, quarantine_parts = [], []
    stats = empty_stats(schema)
    first_line = task.first_line
    with _PartWriter(task.out_fs, background=task.overlap_io) as writer, closing(_read_chunks(task)) as chunks:
        for chunk_index, data, n_lines in chunks:
            parsed = parse_table(
                data, schema=schema, file=task.url, file_index=task.file_index, first_line=first_line, date=task.date
            )
            first_line += n_lines
            name = f"part-{task.file_index:05d}-{task.block_index:05d}-{chunk_index:05d}.parquet"
            tables = []
            if parsed.events.num_rows:
                tables.append((join(task.events_dir, name), parsed.events))
                parts.append({"name": name, "rows": parsed.events.num_rows})
            if parsed.quarantine.num_rows:
                tables.append((join(task.quarantine_dir, name), parsed.quarantine))
                quarantine_parts.append({"name": name, "rows": parsed.quarantine.num_rows})
                bad_rows.tally(parsed.quarantine, reasons, samples)
            writer.write(tables)
            counts["rows_read"] += parsed.rows_read
            counts["rows_written"] += parsed.events.num_rows
            counts["rows_quarantined"] += parsed.quarantine.num_rows
            counts["rows_other_dates"] += parsed.rows_other_dates
            counts["slow_chunks"] += not parsed.fast_path
            counts["rows_padded"] += parsed.rows_padded
            stats = add_stats(stats, chunk_stats(parsed.events, schema))
            # the writer holds what it still needs: free the rest (the raw chunk too) before the next read
            del parsed, tables, data
    return {
        "file": task.url,
        **counts,
        "parts": parts,
        "quarantine_parts": quarantine_parts,
        "reasons": dict(reasons),
        "stats": stats,
        "samples": samples,
    }


def _read_chunks(task: FileTask) -> Generator[tuple[int, bytes, int], None, None]:
    """(chunk index, bytes of up to rows_per_partition whole lines, line count) of the task's file or range.

    With `overlap_io` the next chunk is read in a background thread while the caller parses this one
    (`storage.io.read_ahead(lazy=True)`: one chunk ahead, counting the one being read).
    """
    compression = infer_compression(task.url)
    chunk_index = 0
    try:
        for data, n_lines in read_ahead(_line_chunks_of(task), 1 if task.overlap_io else 0, lazy=True):
            yield chunk_index, data, n_lines
            del data  # not held while the next chunk is read
            chunk_index += 1
    except DECOMPRESS_ERRORS as exc:
        if compression is None:
            raise
        raise IngestError(
            f"{task.url}: cannot decompress ({compression}) after chunk {chunk_index}: {exc}; "
            "the file is truncated or corrupt, fetch it again",
            kind="corrupt_input",
        ) from exc


def _line_chunks_of(task: FileTask) -> Iterator[tuple[bytes, int]]:
    with open_input(task.url, task.input_options) as f:
        if task.start > 0:  # skip the line that started in the previous block
            f.seek(task.start - 1)
            f.readline()
        budget = None if task.end is None else task.end - f.tell()
        yield from line_chunks(f, task.rows_per_partition, budget=budget)


class _PartWriter:
    """Writes each chunk's Parquet parts, in a background thread when `background`.

    Why a thread: pyarrow releases the GIL while it encodes and compresses, so the
    task parses chunk k+1 while chunk k is written.  At most one chunk's writes are
    in flight (`write` waits for the previous chunk's first), so a task holds at
    most two chunks of parsed tables.  Leaving the `with` block waits for the last
    writes, also when the task failed: no part lands in staging after the task ended.
    """

    def __init__(self, fs: fsspec.AbstractFileSystem, *, background: bool) -> None:
        self._fs = fs
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="part-writer") if background else None
        self._pending: Future | None = None

    def write(self, tables: list[tuple[str, pa.Table]]) -> None:
        """Write `tables` ((path, table) pairs of one chunk) after the previous chunk's are written."""
        if self._pool is None:
            _write_all(self._fs, tables)
            return
        self._wait()
        self._pending = self._pool.submit(_write_all, self._fs, tables)

    def _wait(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def __enter__(self) -> _PartWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if exc_type is None:
                self._wait()  # a failed write fails the task
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True)  # after a failure: wait, the task's own error wins


def _write_all(fs: fsspec.AbstractFileSystem, tables: list[tuple[str, pa.Table]]) -> None:
    """Write each table as one Parquet file, with min/max statistics for its numeric columns only.

    Why not for strings: categorical values are hashes or ids whose min/max prunes nothing, and
    computing them is a sizeable share of the write time.  Readers do not need them.
    """
    for path, table in tables:
        numeric = [f.name for f in table.schema if pa.types.is_integer(f.type) or pa.types.is_floating(f.type)]
        with fs.open(path, "wb") as f:
            pq.write_table(table, f, write_statistics=numeric)
