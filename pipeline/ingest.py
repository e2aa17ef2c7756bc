"""Ingest stage: raw log files of a date -> events/date=D/ and quarantine/date=D/.

Wiring only: resolving the input URL, fanning files out to Dask tasks, and
committing.  Parsing rules live in `pipeline.parse`.  Each task streams one
file (or one byte range of a large plain file) in chunks of
`ingest.rows_per_partition` lines and writes each chunk's events and
quarantine parts straight into the staging directories, so no process ever
holds a whole day.  Part names `part-FFFFF-BBBBB-CCCCC.parquet` (file index,
byte-range block index, chunk index) sort in time order.  With
`ingest.overlap_io` a task reads (and decompresses) chunk k+1 in a reader
thread and writes chunk k-1 in a writer thread while it parses chunk k, so one
compressed file, which only one task can read, costs about its parse time
rather than read + parse + write; a task then holds at most 3 chunks (the one
being parsed, the next one's raw lines, the previous one's tables in the writer),
whatever its file's size.

Large plain files: a file over `ingest.block_size` bytes is cut into byte
ranges.  Block i owns the lines that *start* in its range [s_i, s_i+1).  A
first cheap pass counts the newlines of [s_k - 1, s_k+1 - 1) per block k in
parallel, so block i knows its first line number (2 + the newlines before
s_i - 1) and quarantine rows and `order` carry true line numbers.
Compressed files are not seekable and are read whole by one task.

Row accounting (in the manifest): rows_read = rows_written + rows_quarantined
+ rows_other_dates, where rows_read counts every non-header line.

One commit for events and quarantine: quarantine/date=D is committed first,
then events/date=D, whose manifest is the commit point of the pair.  Both
manifests carry the same `run_id` (events: `run_id` and `quarantine_run_id`,
quarantine: `run_id` and `events_run_id`).  A crash between the two renames
leaves a quarantine of a run whose events were never committed; readers
(`read_quarantine`) refuse such a mismatch and a rerun does not treat the
date as done, so it rewrites both.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import closing
from dataclasses import dataclass, field
from typing import Any

import fsspec
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from distributed import Client
from fsspec.implementations.local import LocalFileSystem
from fsspec.utils import infer_compression

from pipeline.config import IngestConfig, InputConfig
from pipeline.parse import QUARANTINE_SCHEMA, parse_table, reason_category
from pipeline.readers import (
    DECOMPRESS_ERRORS,
    READ_SIZE,
    line_chunks,
    open_input,
)
from pipeline.schema import LogSchema, get_schema
from storage.io.dates import validate_date
from storage.io.fsio import (
    commit_dir,
    committed_data_url,
    data_dir,
    get_fs,
    join,
    read_manifest,
    remove_stale_staging,
    staging_dir,
)
from storage.io.layout import Layout
from storage.io.read_ahead import read_ahead
from storage.io.version import code_version

_GLOB_CHARS = "*?["
_FINGERPRINT_KEYS = ("size", "mtime", "ETag", "etag", "LastModified", "last_modified", "updated", "md5Hash", "checksum")


class IngestError(RuntimeError):
    """The date cannot be ingested as it stands; nothing was committed.

    `kind` is one of "corrupt_input" (a compressed file is truncated or corrupt),
    "too_many_bad_rows" (quarantined share over ingest.max_bad_fraction),
    "no_rows" (the inputs hold no valid row of the date) and "inconsistent"
    (a committed quarantine does not belong to the committed events run).
    """

    def __init__(self, message: str, *, kind: str = "") -> None:
        super().__init__(message)
        self.kind = kind

    def __reduce__(self):  # keep `kind` when Dask ships the error from a worker
        return (_make_ingest_error, (str(self), self.kind))


def _make_ingest_error(message: str, kind: str) -> IngestError:
    return IngestError(message, kind=kind)


@dataclass(frozen=True, slots=True)
class IngestResult:
    date: str
    rows_read: int
    rows_written: int
    rows_quarantined: int
    rows_other_dates: int
    parts: int
    """Events parts written."""
    skipped: bool
    """True when the date was already committed from the same inputs and nothing was done."""
    inputs: list[dict] = field(default_factory=list)
    """Fingerprints (url, size, mtime or etag) of the files read."""
    run_id: str = ""
    """The committed events' run id."""
    url: str = ""
    """The files of the committed `events/date=D` (`storage.io.fsio.data_url`)."""

    def summary(self) -> str:
        done = " (already committed)" if self.skipped else ""
        return (f"ingest {self.date}: {self.rows_read} rows read, {self.rows_written} written, "
                f"{self.rows_quarantined} quarantined{done}")


@dataclass(frozen=True, slots=True)
class _FileTask:
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


def ingest_date(
    date: str,
    *,
    layout: Layout,
    input: InputConfig,
    ingest: IngestConfig,
    client: Client,
    force: bool = False,
) -> IngestResult:
    """Ingest the raw logs of `date` into `events/date=D/` and `quarantine/date=D/` (`Layout`).

    Args:
        date: YYYY-MM-DD.
        layout: where the outputs go.
        input: where the raw logs are and their format.
        ingest: partition size and the bad-row limit.
        client: Dask client the files are parsed on.
        force: redo a date already committed from unchanged inputs.

    Raises:
        FileNotFoundError: no input file for the date.
        IngestError: a corrupt compressed input, too many bad rows, or no rows of the date.
    """
    validate_date(date)
    schema = get_schema(input.format)
    url = input_url(input, layout, date)
    if schema.timestamp is None and input.url and not any(p in input.url for p in ("{date}", "{yyyymmdd}")):
        raise ValueError(
            f"input.url {input.url!r} has no {{date}}/{{yyyymmdd}} placeholder and {schema.name} rows carry no "
            "timestamp, so every date would read the same rows; put the date in the URL"
        )
    inputs = find_inputs(url, input.storage_options)
    if not inputs:
        raise FileNotFoundError(f"no input for {date} at {url}")

    fs, events_final = layout.fs(layout.events(date))
    _, quarantine_final = layout.fs(layout.quarantine(date))
    done = read_manifest(fs, events_final)
    if done and not force and done.get("inputs") == inputs and done.get("format") == schema.name:
        quarantine_done = read_manifest(fs, quarantine_final)
        if quarantine_done is not None and quarantine_done.get("events_run_id") == done.get("run_id"):
            return _result(date, done, skipped=True, url=data_dir(layout.events(date), done))

    for final in (events_final, quarantine_final):
        remove_stale_staging(fs, final)
    events_stage, quarantine_stage = staging_dir(fs, events_final), staging_dir(fs, quarantine_final)
    try:
        base = {
            "schema": schema,
            "input_options": input.storage_options,
            "out_fs": fs,
            "events_dir": events_stage,
            "quarantine_dir": quarantine_stage,
            "rows_per_partition": ingest.rows_per_partition,
            "date": date,
            "overlap_io": ingest.overlap_io,
        }
        tasks = plan_tasks(inputs, base, block_size=ingest.block_size, client=client)
        futures = client.map(ingest_file, tasks, pure=False)
        try:
            per_task = client.gather(futures)
        except BaseException:
            client.cancel(futures)
            raise
        per_file = _per_file(per_task)
        manifest = summarize(date, schema, inputs, per_file)
        check_quality(manifest, per_file, ingest.max_bad_fraction)
        run_id = uuid.uuid4().hex
        manifest.update(
            run_id=run_id,
            quarantine_run_id=run_id,
            code_version=code_version(),
            rows_per_partition=ingest.rows_per_partition,
            blocks=len(tasks),
        )
        quarantine_manifest = {
            "date": date,
            "rows_quarantined": manifest["rows_quarantined"],
            "parts": manifest.pop("quarantine_parts"),
            "reasons": manifest["reasons"],
            "run_id": run_id,
            "events_run_id": run_id,
            "code_version": manifest["code_version"],
        }
        commit_dir(fs, quarantine_stage, quarantine_final, quarantine_manifest)
        commit_dir(fs, events_stage, events_final, manifest)  # the commit point of the pair
    except BaseException:
        for stage in (events_stage, quarantine_stage):
            if fs.exists(stage):
                fs.rm(stage, recursive=True)
        raise
    return _result(date, manifest, skipped=False, url=committed_data_url(layout.events(date), fs, events_stage))


def plan_tasks(inputs: list[dict], base: dict[str, Any], *, block_size: int, client: Client) -> list[_FileTask]:
    """One task per compressed or small file; large plain files cut into byte ranges (module docstring)."""
    tasks: list[_FileTask] = []
    splits: list[tuple[int, list[int]]] = []  # (file index, block starts) of the files to split
    for i, item in enumerate(inputs):
        size = item.get("size")
        if infer_compression(item["url"]) is None and isinstance(size, int) and size > block_size:
            splits.append((i, list(range(0, size, block_size))))
        else:
            tasks.append(_FileTask(url=item["url"], file_index=i, **base))
    if splits:
        # pass 1: newlines of [s_k - 1, s_{k+1} - 1) for every block k (block 0 from byte 0)
        ranges = []
        for i, starts in splits:
            size = inputs[i]["size"]
            bounds = [max(s - 1, 0) for s in starts] + [size]
            ranges += [(inputs[i]["url"], a, b) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
        counts = iter(client.gather(client.map(
            count_newlines, ranges, storage_options=base["input_options"], pure=False
        )))  # fmt: skip
        for i, starts in splits:
            before = 0
            for b, start in enumerate(starts):
                end = starts[b + 1] if b + 1 < len(starts) else None
                first = 1 if b == 0 else 2 + before
                tasks.append(
                    _FileTask(url=inputs[i]["url"], file_index=i, block_index=b, start=start, end=end,
                              first_line=first, **base)
                )  # fmt: skip
                before += next(counts)
    return sorted(tasks, key=lambda t: (t.file_index, t.block_index))


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


def input_url(input: InputConfig, layout: Layout, date: str) -> str:
    """The URL (maybe a glob) of `date`'s raw logs: input.url with placeholders filled (default: the demo's
    `raw/day_D.tsv.gz` under the root)."""
    if not input.url:
        return join(layout.raw(), f"day_{date}.tsv.gz")
    return input.url.replace("{date}", date).replace("{yyyymmdd}", date.replace("-", ""))


def find_inputs(url: str, storage_options: dict | None = None) -> list[dict[str, Any]]:
    """Fingerprints of the files `url` names (a glob matches several), sorted by path.

    A fingerprint is the file's URL plus size and mtime/etag: what decides
    whether a committed date is still current.
    """
    fs, path = get_fs(url, storage_options)
    if any(c in path for c in _GLOB_CHARS):
        paths = sorted(fs.glob(path))
    else:
        paths = [path] if fs.exists(path) else []
    out = []
    for p in paths:
        info = fs.info(p)
        if info.get("type") == "directory":
            continue
        name = p if isinstance(fs, LocalFileSystem) else fs.unstrip_protocol(p)
        out.append({"url": name, **{k: _jsonable(info[k]) for k in _FINGERPRINT_KEYS if k in info}})
    return out


def ingest_file(task: _FileTask) -> dict[str, Any]:
    """Dask task: stream one file (or byte range) chunk by chunk, write its parts, return its counts."""
    schema = task.schema
    counts = Counter()
    reasons: Counter = Counter()
    parts, quarantine_parts = [], []
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
                reasons.update(reason_category(r) for r in parsed.quarantine.column("reason").to_pylist())
            writer.write(tables)
            counts["rows_read"] += parsed.rows_read
            counts["rows_written"] += parsed.events.num_rows
            counts["rows_quarantined"] += parsed.quarantine.num_rows
            counts["rows_other_dates"] += parsed.rows_other_dates
            counts["slow_chunks"] += not parsed.fast_path
            # the writer holds what it still needs: free the rest (the raw chunk too) before the next read
            del parsed, tables, data
    return {"file": task.url, **counts, "parts": parts, "quarantine_parts": quarantine_parts, "reasons": dict(reasons)}


def _read_chunks(task: _FileTask) -> Iterator[tuple[int, bytes, int]]:
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


def _line_chunks_of(task: _FileTask) -> Iterator[tuple[bytes, int]]:
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


def _per_file(per_task: list[dict]) -> list[dict]:
    """Task results (one per file or byte range) summed per file, in task order."""
    out: dict[str, dict] = {}
    for r in per_task:
        acc = out.setdefault(r["file"], {"file": r["file"], "parts": [], "quarantine_parts": [], "reasons": Counter()})
        for k, v in r.items():
            if isinstance(v, int):
                acc[k] = acc.get(k, 0) + v
        acc["parts"] += r["parts"]
        acc["quarantine_parts"] += r["quarantine_parts"]
        acc["reasons"].update(r["reasons"])
    return [{**v, "reasons": dict(v["reasons"])} for v in out.values()]


def read_quarantine(layout: Layout, date: str) -> pd.DataFrame:
    """The quarantined rows of `date` (file, line, raw, reason), checked against the committed events run.

    Raises:
        FileNotFoundError: the date's events are not committed.
        IngestError(kind="inconsistent"): the committed quarantine belongs to another run than the
            committed events (an ingest crashed between its two renames); rerun the ingest of the date.
    """
    fs, events_dir = layout.fs(layout.events(date))
    events = read_manifest(fs, events_dir)
    if events is None:
        raise FileNotFoundError(f"no committed events for {date} at {layout.events(date)}: run ingest first")
    _, qdir = layout.fs(layout.quarantine(date))
    quarantine = read_manifest(fs, qdir)
    expected = events.get("quarantine_run_id", events.get("run_id"))
    if quarantine is None or quarantine.get("events_run_id") != expected:
        raise IngestError(
            f"quarantine of {date} at {layout.quarantine(date)} does not belong to the committed "
            f"events run {expected}; an ingest stopped between its two commits: rerun the ingest of {date}",
            kind="inconsistent",
        )
    tables = []
    for p in quarantine["parts"]:
        with fs.open(join(data_dir(qdir, quarantine), p["name"]), "rb") as f:
            tables.append(pq.read_table(f, schema=QUARANTINE_SCHEMA))
    return pa.concat_tables(tables or [QUARANTINE_SCHEMA.empty_table()]).to_pandas()


def summarize(date: str, schema: LogSchema, inputs: list[dict], per_file: list[dict]) -> dict[str, Any]:
    """The events manifest (without run ids) from the per-file task results."""
    totals = Counter()
    reasons: Counter = Counter()
    for r in per_file:
        totals.update({k: r.get(k, 0) for k in ("rows_read", "rows_written", "rows_quarantined", "rows_other_dates")})
        reasons.update(r["reasons"])
    return {
        "date": date,
        "format": schema.name,
        **{k: int(totals[k]) for k in ("rows_read", "rows_written", "rows_quarantined", "rows_other_dates")},
        "parts": sorted((p for r in per_file for p in r["parts"]), key=lambda p: p["name"]),
        "quarantine_parts": sorted((p for r in per_file for p in r["quarantine_parts"]), key=lambda p: p["name"]),
        "reasons": dict(reasons.most_common()),
        "inputs": inputs,
        "slow_chunks": int(sum(r.get("slow_chunks", 0) for r in per_file)),
    }


def check_quality(manifest: dict[str, Any], per_file: list[dict], max_bad_fraction: float) -> None:
    """Raise IngestError when the date has no valid rows or too many bad ones.

    The bad share is quarantined / rows of the date (rows of other dates are
    not the date's concern).
    """
    date = manifest["date"]
    of_date = manifest["rows_read"] - manifest["rows_other_dates"]
    files = ", ".join(r["file"] for r in per_file)
    if manifest["rows_written"] == 0 and manifest["rows_quarantined"] == 0:
        raise IngestError(
            f"no rows of {date} in {files} ({manifest['rows_other_dates']} rows of other dates); "
            "check input.url and the date",
            kind="no_rows",
        )
    bad = manifest["rows_quarantined"]
    if of_date and bad / of_date > max_bad_fraction:
        worst = sorted(per_file, key=lambda r: r.get("rows_quarantined", 0), reverse=True)[:3]
        worst_text = "; ".join(
            f"{r['file']} ({r.get('rows_quarantined', 0)} bad of {r.get('rows_read', 0)})"
            for r in worst
            if r.get("rows_quarantined", 0)
        )
        top = ", ".join(f"{reason} x{n}" for reason, n in list(manifest["reasons"].items())[:3])
        raise IngestError(
            f"ingest of {date}: {bad} of {of_date} rows ({bad / of_date:.2%}) quarantined, over "
            f"ingest.max_bad_fraction={max_bad_fraction}; worst files: {worst_text}; top reasons: {top}. "
            "Nothing was committed: fix the inputs or raise ingest.max_bad_fraction",
            kind="too_many_bad_rows",
        )


def _write_all(fs: fsspec.AbstractFileSystem, tables: list[tuple[str, pa.Table]]) -> None:
    """Write each table as one Parquet file, with min/max statistics for its numeric columns only.

    Why not for strings: categorical values are hashes or ids whose min/max prunes nothing, and
    computing them is a fifth of the write time of a Criteo chunk.  Readers do not need them.
    """
    for path, table in tables:
        numeric = [f.name for f in table.schema if pa.types.is_integer(f.type) or pa.types.is_floating(f.type)]
        with fs.open(path, "wb") as f:
            pq.write_table(table, f, write_statistics=numeric)


def _jsonable(value: Any) -> Any:
    return value if isinstance(value, int | float | str) else str(value)


def _result(date: str, manifest: dict[str, Any], *, skipped: bool, url: str) -> IngestResult:
    return IngestResult(
        date=date,
        rows_read=manifest["rows_read"],
        rows_written=manifest["rows_written"],
        rows_quarantined=manifest["rows_quarantined"],
        rows_other_dates=manifest.get("rows_other_dates", 0),
        parts=len(manifest["parts"]),
        skipped=skipped,
        inputs=manifest["inputs"],
        run_id=manifest["run_id"],
        url=url,
    )
