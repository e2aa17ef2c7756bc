"""Ingest stage: raw log files of a date -> events/date=D/ and quarantine/date=D/.

Wiring only: resolving the input URL, fanning files out to Dask tasks, and
committing.  Parsing rules live in `pipeline.parse`.  Each task streams one
file in chunks of `ingest.rows_per_partition` lines and writes each chunk's
events and quarantine parts straight into the staging directories, so no
process ever holds a whole day.  Part names `part-FFFFF-CCCCC.parquet` (file
index, chunk index) sort in time order.

Row accounting (in the manifest): rows_read = rows_written + rows_quarantined
+ rows_other_dates, where rows_read counts every non-header line.
"""

from __future__ import annotations

import gzip
import lzma
import uuid
import zlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
from distributed import Client
from fsspec.implementations.local import LocalFileSystem
from fsspec.utils import infer_compression

from pipeline.config import IngestConfig, InputConfig
from pipeline.parse import QUARANTINE_SCHEMA, parse_chunk, reason_category
from pipeline.schema import LogSchema, get_schema
from storage.fsio import (
    code_version,
    commit_dir,
    get_fs,
    join,
    read_manifest,
    remove_stale_staging,
    staging_dir,
    validate_date,
)

_GLOB_CHARS = "*?["
_FINGERPRINT_KEYS = ("size", "mtime", "ETag", "etag", "LastModified", "last_modified", "updated", "md5Hash", "checksum")


class IngestError(RuntimeError):
    """The date cannot be ingested as it stands; nothing was committed.

    `kind` is one of "corrupt_input" (a compressed file is truncated or corrupt),
    "too_many_bad_rows" (quarantined share over ingest.max_bad_fraction) and
    "no_rows" (the inputs hold no valid row of the date).
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


@dataclass(frozen=True, slots=True)
class _FileTask:
    url: str
    file_index: int
    fmt: str
    input_options: dict | None
    out_fs: fsspec.AbstractFileSystem
    events_dir: str
    quarantine_dir: str
    rows_per_partition: int
    date: str


def ingest_date(
    date: str,
    *,
    root: str,
    input: InputConfig,
    ingest: IngestConfig,
    client: Client,
    force: bool = False,
    storage_options: dict | None = None,
) -> IngestResult:
    """Ingest the raw logs of `date` into `<root>/events/date=D/` and `<root>/quarantine/date=D/`.

    Args:
        date: YYYY-MM-DD.
        root: the pipeline's root URL.
        input: where the raw logs are and their format.
        ingest: partition size and the bad-row limit.
        client: Dask client the files are parsed on.
        force: redo a date already committed from unchanged inputs.
        storage_options: fsspec options of `root`.

    Raises:
        FileNotFoundError: no input file for the date.
        IngestError: a corrupt compressed input, too many bad rows, or no rows of the date.
    """
    validate_date(date)
    schema = get_schema(input.format)
    url = input_url(input, root, date)
    if schema.timestamp is None and input.url and not any(p in input.url for p in ("{date}", "{yyyymmdd}")):
        raise ValueError(
            f"input.url {input.url!r} has no {{date}}/{{yyyymmdd}} placeholder and {schema.name} rows carry no "
            "timestamp, so every date would read the same rows; put the date in the URL"
        )
    inputs = find_inputs(url, input.storage_options)
    if not inputs:
        raise FileNotFoundError(f"no input for {date} at {url}")

    fs, root_path = get_fs(root, storage_options)
    events_final = join(root_path, "events", f"date={date}")
    quarantine_final = join(root_path, "quarantine", f"date={date}")
    done = read_manifest(fs, events_final)
    if done and not force and done.get("inputs") == inputs and done.get("format") == schema.name:
        return _result(date, done, skipped=True)

    for final in (events_final, quarantine_final):
        remove_stale_staging(fs, final)
    events_stage, quarantine_stage = staging_dir(fs, events_final), staging_dir(fs, quarantine_final)
    try:
        tasks = [
            _FileTask(
                url=item["url"],
                file_index=i,
                fmt=schema.name,
                input_options=input.storage_options,
                out_fs=fs,
                events_dir=events_stage,
                quarantine_dir=quarantine_stage,
                rows_per_partition=ingest.rows_per_partition,
                date=date,
            )
            for i, item in enumerate(inputs)
        ]
        futures = client.map(ingest_file, tasks, pure=False)
        try:
            per_file = client.gather(futures)
        except BaseException:
            client.cancel(futures)
            raise
        manifest = summarize(date, schema, inputs, per_file)
        check_quality(manifest, per_file, ingest.max_bad_fraction)
        run_id = uuid.uuid4().hex
        manifest.update(run_id=run_id, code_version=code_version(), rows_per_partition=ingest.rows_per_partition)
        quarantine_manifest = {
            "date": date,
            "rows_quarantined": manifest["rows_quarantined"],
            "parts": manifest.pop("quarantine_parts"),
            "reasons": manifest["reasons"],
            "events_run_id": run_id,
            "code_version": manifest["code_version"],
        }
        commit_dir(fs, quarantine_stage, quarantine_final, quarantine_manifest)
        commit_dir(fs, events_stage, events_final, manifest)
    except BaseException:
        for stage in (events_stage, quarantine_stage):
            if fs.exists(stage):
                fs.rm(stage, recursive=True)
        raise
    return _result(date, manifest, skipped=False)


def input_url(input: InputConfig, root: str, date: str) -> str:
    """The URL (maybe a glob) of `date`'s raw logs: input.url with placeholders filled."""
    if not input.url:
        return join(root, "raw", f"day_{date}.tsv.gz")
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
    """Dask task: stream one file chunk by chunk, write its parts, return its counts."""
    schema = get_schema(task.fmt)
    events_schema = schema.events_schema()
    counts = Counter()
    reasons: Counter = Counter()
    parts, quarantine_parts = [], []
    first_line = 1
    for chunk_index, data, n_lines in _read_chunks(task):
        parsed = parse_chunk(
            data, schema=schema, file=task.url, file_index=task.file_index, first_line=first_line, date=task.date
        )
        first_line += n_lines
        name = f"part-{task.file_index:05d}-{chunk_index:05d}.parquet"
        if len(parsed.events):
            _write(task.out_fs, join(task.events_dir, name), parsed.events, events_schema)
            parts.append({"name": name, "rows": len(parsed.events)})
        if len(parsed.quarantine):
            _write(task.out_fs, join(task.quarantine_dir, name), parsed.quarantine, QUARANTINE_SCHEMA)
            quarantine_parts.append({"name": name, "rows": len(parsed.quarantine)})
            reasons.update(reason_category(r) for r in parsed.quarantine["reason"])
        counts["rows_read"] += parsed.rows_read
        counts["rows_written"] += len(parsed.events)
        counts["rows_quarantined"] += len(parsed.quarantine)
        counts["rows_other_dates"] += parsed.rows_other_dates
    return {"file": task.url, **counts, "parts": parts, "quarantine_parts": quarantine_parts, "reasons": dict(reasons)}


def _read_chunks(task: _FileTask) -> Iterator[tuple[int, bytes, int]]:
    """(chunk index, bytes of up to rows_per_partition whole lines, line count) of the task's file."""
    compression = infer_compression(task.url)
    with fsspec.open(task.url, "rb", compression=compression, **(task.input_options or {})) as f:
        chunk_index = 0
        while True:
            try:
                lines = list(islice(f, task.rows_per_partition))
            except (EOFError, zlib.error, gzip.BadGzipFile, lzma.LZMAError, OSError) as exc:
                if compression is None:
                    raise
                raise IngestError(
                    f"{task.url}: cannot decompress ({compression}) after chunk {chunk_index}: {exc}; "
                    "the file is truncated or corrupt, fetch it again",
                    kind="corrupt_input",
                ) from exc
            if not lines:
                return
            yield chunk_index, b"".join(lines), len(lines)
            chunk_index += 1


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


def _write(fs: fsspec.AbstractFileSystem, path: str, frame, schema: pa.Schema) -> None:
    table = pa.Table.from_pandas(frame, schema=schema, preserve_index=False)
    with fs.open(path, "wb") as f:
        pq.write_table(table, f)


def _jsonable(value: Any) -> Any:
    return value if isinstance(value, int | float | str) else str(value)


def _result(date: str, manifest: dict[str, Any], *, skipped: bool) -> IngestResult:
    return IngestResult(
        date=date,
        rows_read=manifest["rows_read"],
        rows_written=manifest["rows_written"],
        rows_quarantined=manifest["rows_quarantined"],
        rows_other_dates=manifest.get("rows_other_dates", 0),
        parts=len(manifest["parts"]),
        skipped=skipped,
        inputs=manifest["inputs"],
    )
