"""Ingest stage: raw log files of a date -> events/date=D/ and quarantine/date=D/.

Wiring only: resolving the input URL, planning one Dask task per file or byte
range (`pipeline.ingest.tasks`), the totals and their quality check
(`pipeline.ingest.totals`) and the commit of the two manifests
(`pipeline.ingest.manifest`).  Parsing rules live in `pipeline.ingest.parse`.

Large plain files: a file over `ingest.block_size` bytes is cut into byte
ranges.  Block i owns the lines that *start* in its range [s_i, s_i+1).  A
first cheap pass counts the newlines of [s_k - 1, s_k+1 - 1) per block k in
parallel, so block i knows its first line number (2 + the newlines before
s_i - 1) and quarantine rows and `order` carry true line numbers.
Compressed files are not seekable and are read whole by one task.

Row accounting (in the events manifest): rows_read = rows_written + rows_quarantined
+ rows_other_dates, where rows_read counts every non-header line; rows_padded
counts the written rows with missing trailing fields, and `stats` the labels,
missing values and dense-value histograms of the written rows
(`pipeline.ingest.day_stats`), for the data checks.

A late input is waited for (`input.wait_s`, `pipeline.ingest.input_wait`).  Several
models on one root share the events of a date: a run that finds them
committed from the same inputs reuses them, and one that ingested at the same
time as another keeps the first commit.

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
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from distributed import Client
from fsspec.implementations.local import LocalFileSystem
from fsspec.utils import infer_compression

from pipeline.cluster import finished, gather
from pipeline.config import IngestConfig, InputConfig
from pipeline.ingest.error import IngestError
from pipeline.ingest.input_wait import wait_for_input
from pipeline.ingest.manifest import (
    EventsManifest,
    committed_events,
    read_events_manifest,
    read_quarantine_manifest,
)
from pipeline.ingest.parse import QUARANTINE_SCHEMA
from pipeline.ingest.tasks import FileTask, count_newlines, ingest_file
from pipeline.ingest.totals import check_quality, per_file, summarize
from pipeline.schema import LogSchema, get_schema
from storage.io.dates import validate_date
from storage.io.fsio import (
    commit_dir,
    committed_data_url,
    get_fs,
    join,
    remove_stale_staging,
    staging_dir,
)
from storage.io.layout import Layout
from storage.io.progress import Bar
from storage.io.version import code_version

_GLOB_CHARS = "*?["
_FINGERPRINT_KEYS = ("size", "mtime", "ETag", "etag", "LastModified", "last_modified", "updated", "md5Hash", "checksum")


@dataclass(frozen=True, slots=True)
class IngestResult:
    """The committed events of a date, in numbers (rows read, written, quarantined, of other dates)."""

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
    rows_padded: int = 0
    """Written rows that had fewer fields than the format's columns (read as missing trailing fields)."""
    stats: dict = field(default_factory=dict)
    """Label, missing-value and dense-value counts of the written rows (`pipeline.ingest.day_stats`)."""
    run_id: str = ""
    """The committed events' run id."""
    url: str = ""
    """The files of the committed `events/date=D` (`storage.io.fsio.data_url`)."""

    def summary(self) -> str:
        """One line for the run log: every row read is written, quarantined or dated elsewhere."""
        done = " (already committed)" if self.skipped else ""
        share = f" ({self.rows_quarantined / self.rows_read:.2%})" if self.rows_quarantined else ""
        return (
            f"ingest {self.date}: {self.rows_read} rows read = {self.rows_written} written + "
            f"{self.rows_quarantined} quarantined{share} + {self.rows_other_dates} dated elsewhere{done}"
        )


def check_input_url(input: InputConfig) -> LogSchema:
    """The input's schema, once `input.url` can tell the dates apart (`ctrpipe` checks it before anything starts).

    Raises:
        ValueError: the URL has no {date}/{yyyymmdd} placeholder and the format's rows carry no timestamp.
    """
    schema = get_schema(input.format)
    if schema.timestamp is None and input.url and not any(p in input.url for p in ("{date}", "{yyyymmdd}")):
        raise ValueError(
            f"input.url {input.url!r} has no {{date}}/{{yyyymmdd}} placeholder and {schema.name} rows carry no "
            "timestamp, so every date would read the same rows; put the date in the URL"
        )
    return schema


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
    schema = check_input_url(input)
    url = input_url(input, layout, date)
    inputs = wait_for_input(lambda: find_inputs(url, input.storage_options), url=url, date=date, input=input)

    fs, events_final = layout.fs(layout.events(date))
    _, quarantine_final = layout.fs(layout.quarantine(date))
    if not force and (done := _committed(fs, events_final, quarantine_final, inputs, schema)) is not None:
        return _result(date, done, skipped=True, url=done.data_dir(layout.events(date)))

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
        files = per_file(_run_tasks(client, tasks, f"ingest {date}: files"), schema)
        day = summarize(date, schema, inputs, files)
        check_quality(day, files, ingest.max_bad_fraction, schema=schema, fmt=input.format)
        if not force and (done := _committed(fs, events_final, quarantine_final, inputs, schema)) is not None:
            # another model's run on this root committed the same input meanwhile: the first commit wins,
            # so runs that started on its events keep reading them
            for stage in (events_stage, quarantine_stage):
                fs.rm(stage, recursive=True)
            return _result(date, done, skipped=True, url=done.data_dir(layout.events(date)))
        run_id, version = uuid.uuid4().hex, code_version()
        manifest = day.events_manifest(
            run_id=run_id, code_version=version, rows_per_partition=ingest.rows_per_partition, blocks=len(tasks)
        )
        quarantine = day.quarantine_manifest(run_id=run_id, code_version=version)
        commit_dir(fs, quarantine_stage, quarantine_final, quarantine.to_dict())
        commit_dir(fs, events_stage, events_final, manifest.to_dict())  # the commit point of the pair
    except BaseException:
        for stage in (events_stage, quarantine_stage):
            if fs.exists(stage):
                fs.rm(stage, recursive=True)
        raise
    return _result(date, manifest, skipped=False, url=committed_data_url(layout.events(date), fs, events_stage))


def _committed(
    fs: Any, events_final: str, quarantine_final: str, inputs: list[dict], schema: LogSchema
) -> EventsManifest | None:
    """The committed events manifest of the date when it was ingested from `inputs` in this format, else None
    (a manifest from before `schema_digest` was recorded matches any schema of the format's name)."""
    done = read_events_manifest(fs, events_final)
    if not done or list(done.inputs) != inputs or done.format != schema.name:
        return None
    if done.schema_digest and done.schema_digest != schema.digest():  # the schema file was edited since
        return None
    quarantine_done = read_quarantine_manifest(fs, quarantine_final)
    if quarantine_done is None or quarantine_done.events_run_id != done.run_id:
        return None
    return done


def _run_tasks(client: Client, tasks: list[FileTask], label: str) -> list[dict]:
    """The tasks' results in task order; a progress bar counts the files (or byte ranges) done."""
    futures = client.map(ingest_file, tasks, pure=False)
    index = {f.key: i for i, f in enumerate(futures)}
    results: list[dict] = [{}] * len(futures)
    try:
        with Bar(label, total=len(futures)) as bar:
            for future in finished(client, futures, what=label):
                results[index[future.key]] = future.result()
                bar.advance()
    except BaseException:
        client.cancel(futures)
        raise
    return results


def plan_tasks(inputs: list[dict], base: dict[str, Any], *, block_size: int, client: Client) -> list[FileTask]:
    """One task per compressed or small file; large plain files cut into byte ranges (module docstring)."""
    tasks: list[FileTask] = []
    splits: list[tuple[int, list[int]]] = []  # (file index, block starts) of the files to split
    for i, item in enumerate(inputs):
        size = item.get("size")
        if infer_compression(item["url"]) is None and isinstance(size, int) and size > block_size:
            splits.append((i, list(range(0, size, block_size))))
        else:
            tasks.append(FileTask(url=item["url"], file_index=i, **base))
    if splits:
        # pass 1: newlines of [s_k - 1, s_{k+1} - 1) for every block k (block 0 from byte 0)
        ranges = []
        for i, starts in splits:
            size = inputs[i]["size"]
            bounds = [max(s - 1, 0) for s in starts] + [size]
            ranges += [(inputs[i]["url"], a, b) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
        counts = iter(
            gather(
                client,
                client.map(count_newlines, ranges, storage_options=base["input_options"], pure=False),
                what="ingest: finding line starts",
            )
        )
        for i, starts in splits:
            before = 0
            for b, start in enumerate(starts):
                end = starts[b + 1] if b + 1 < len(starts) else None
                first = 1 if b == 0 else 2 + before
                tasks.append(
                    FileTask(
                        url=inputs[i]["url"],
                        file_index=i,
                        block_index=b,
                        start=start,
                        end=end,
                        first_line=first,
                        **base,
                    )
                )
                before += next(counts)
    return sorted(tasks, key=lambda t: (t.file_index, t.block_index))


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
    paths = sorted(fs.glob(path)) if any(c in path for c in _GLOB_CHARS) else [path] if fs.exists(path) else []
    out = []
    for p in paths:
        info = fs.info(p)
        if info.get("type") == "directory":
            continue
        name = p if isinstance(fs, LocalFileSystem) else fs.unstrip_protocol(p)
        out.append({"url": name, **{k: _jsonable(info[k]) for k in _FINGERPRINT_KEYS if k in info}})
    return out


def read_quarantine(layout: Layout, date: str) -> pd.DataFrame:
    """The quarantined rows of `date` (file, line, raw, reason), checked against the committed events run.

    Raises:
        FileNotFoundError: the date's events are not committed.
        IngestError(kind="inconsistent"): the committed quarantine belongs to another run than the
            committed events (an ingest crashed between its two renames); rerun the ingest of the date.
    """
    fs, _, events = committed_events(layout, date)
    _, qdir = layout.fs(layout.quarantine(date))
    quarantine = read_quarantine_manifest(fs, qdir)
    expected = events.quarantine_run_id
    if quarantine is None or expected is None or quarantine.events_run_id != expected:
        raise IngestError(
            f"quarantine of {date} at {layout.quarantine(date)} does not belong to the committed "
            f"events run {expected}; an ingest stopped between its two commits: rerun the ingest of {date}",
            kind="inconsistent",
        )
    tables = []
    for p in quarantine.parts:
        with fs.open(join(quarantine.data_dir(qdir), p.name), "rb") as f:
            tables.append(pq.read_table(f, schema=QUARANTINE_SCHEMA))
    return pa.concat_tables(tables or [QUARANTINE_SCHEMA.empty_table()]).to_pandas()


def _jsonable(value: Any) -> Any:
    return value if isinstance(value, int | float | str) else str(value)


def _result(date: str, manifest: EventsManifest, *, skipped: bool, url: str) -> IngestResult:
    return IngestResult(
        date=date,
        rows_read=manifest.rows_read,
        rows_written=manifest.rows_written,
        rows_quarantined=manifest.rows_quarantined,
        rows_other_dates=manifest.rows_other_dates,
        parts=len(manifest.parts),
        skipped=skipped,
        inputs=list(manifest.inputs),
        rows_padded=manifest.rows_padded,
        stats=manifest.stats,
        run_id=manifest.run_id,
        url=url,
    )
