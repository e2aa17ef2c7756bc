"""The ingest stage's two manifests: `events/date=D/_SUCCESS.json` and `quarantine/date=D/_SUCCESS.json`.

`pipeline.ingest.stage` writes both (quarantine first, then events: the commit point of the pair) and
reads them back (a rerun's skip, `read_quarantine`); the vocab and encode stages read the events
manifest's parts and run id.  All go through `EventsManifest` / `QuarantineManifest` and their readers
here.  Their readers all import `pipeline`, so they live here rather than in `storage`.

Format: `manifest_format` names each (`"ctr-pipeline-events/<version>"`, `"ctr-pipeline-quarantine/<version>"`;
the events manifest's own `format` field is the input log format, e.g. `criteo`).  A manifest written
before the field existed is version 1.  Fields this code does not know are ignored and missing ones take
their defaults; a newer version is refused with a `storage.io.records.FormatError` naming the file and
what to do (docs/formats.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import fsspec

from storage.io import fsio
from storage.io.layout import Layout
from storage.io.records import (
    MANIFEST_FORMAT_KEY,
    CommittedManifest,
    FormatError,
    RecordFormat,
    read_manifest,
    read_record,
)

__all__ = [
    "EVENTS_FORMAT",
    "QUARANTINE_FORMAT",
    "EventsManifest",
    "FormatError",
    "Part",
    "QuarantineManifest",
    "committed_events",
    "read_events_manifest",
    "read_quarantine_manifest",
]

_FIX = "run the ingest stage again for that date (`--force`)"
_NEWER = "upgrade ctr-pipeline here to read it, or run the ingest stage of this version again for that date (`--force`)"

EVENTS_FORMAT = RecordFormat("ctr-pipeline-events", 1, absent=1, fix=_FIX, newer=_NEWER)
"""The events manifest's format: version 1 is what `pipeline.ingest.stage` has always written."""

QUARANTINE_FORMAT = RecordFormat("ctr-pipeline-quarantine", 1, absent=1, fix=_FIX, newer=_NEWER)
"""The quarantine manifest's format: version 1 is what `pipeline.ingest.stage` has always written."""


@dataclass(frozen=True)
class Part:
    """A Parquet part of the directory and its rows (`<name>` under the directory's data dir)."""

    name: str
    rows: int = 0


@dataclass(frozen=True, kw_only=True)
class EventsManifest(CommittedManifest):
    """`_SUCCESS.json` of a committed events directory: the day's rows, parts and row accounting.

    rows_read = rows_written + rows_quarantined + rows_other_dates (`pipeline.ingest.stage`).
    """

    manifest_format: str = EVENTS_FORMAT.tag
    date: str = ""
    format: str | None = None
    """The input log format the rows were parsed with (`pipeline.schema`), e.g. `criteo`."""
    schema_digest: str = ""
    """`LogSchema.digest()` of that format: a rerun after the schema file changed ingests again ("": not recorded)."""
    rows_read: int = 0
    """Every non-header line of the inputs."""
    rows_written: int = 0
    rows_quarantined: int = 0
    rows_other_dates: int = 0
    """Rows of a valid timestamp of another date (a file of several days): counted here, written by their date's
    ingest."""
    rows_padded: int = 0
    """Written rows that had fewer fields than the format's columns."""
    stats: dict[str, Any] = field(default_factory=dict)
    """Label, missing-value and dense-value counts of the written rows (`pipeline.ingest.day_stats`)."""
    parts: tuple[Part, ...] = ()
    """The events parts, in name order (the order of the rows)."""
    reasons: dict[str, int] = field(default_factory=dict)
    """Quarantined rows by reason, most common first."""
    inputs: tuple[dict[str, Any], ...] = ()
    """Fingerprints (url, size, mtime or etag) of the files read: a rerun on the same inputs is skipped."""
    slow_chunks: int = 0
    run_id: str = ""
    """Identifies the committed content (a new one each time the day is ingested)."""
    quarantine_run_id: str | None = None
    """The run of the quarantine committed with these events (its manifest's `events_run_id`)."""
    code_version: str = ""
    rows_per_partition: int = 0
    blocks: int = 0
    """The ingest tasks (files, or byte ranges of large plain files)."""
    data: str | None = None
    """The data prefix of a directory committed on an object store (`storage.io.fsio`); set by the
    commit, never by the writer."""

    def part_urls(self, final: str) -> list[str]:
        """The events parts of the directory `final`, in order."""
        files = self.data_dir(final)
        return [fsio.join(files, p.name) for p in self.parts]

    @classmethod
    def from_dict(cls, data: Any, *, where: str) -> EventsManifest:
        """The manifest of the file `where` (parsed JSON), of any version this code reads.

        Raises:
            FormatError: not a JSON object, or a version this code does not read (the message says what to do).
            codec.ConfigError: a known field of the wrong type (named in the message).
        """
        return read_record(cls, data, fmt=EVENTS_FORMAT, where=where, format_key=MANIFEST_FORMAT_KEY)


@dataclass(frozen=True, kw_only=True)
class QuarantineManifest(CommittedManifest):
    """`_SUCCESS.json` of a committed quarantine directory: the day's bad rows, why, and one row of each reason."""

    manifest_format: str = QUARANTINE_FORMAT.tag
    date: str = ""
    rows_quarantined: int = 0
    parts: tuple[Part, ...] = ()
    reasons: dict[str, int] = field(default_factory=dict)
    samples: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Reason -> its first row (file, line, raw, reason) (`pipeline.ingest.bad_rows`)."""
    run_id: str = ""
    events_run_id: str | None = None
    """The run of the events committed with this quarantine: readers refuse a quarantine of another run."""
    code_version: str = ""
    data: str | None = None
    """The data prefix of a directory committed on an object store; set by the commit, never by the writer."""

    @classmethod
    def from_dict(cls, data: Any, *, where: str) -> QuarantineManifest:
        """The manifest of the file `where` (parsed JSON), of any version this code reads.

        Raises:
            FormatError, codec.ConfigError: see `EventsManifest.from_dict`.
        """
        return read_record(cls, data, fmt=QUARANTINE_FORMAT, where=where, format_key=MANIFEST_FORMAT_KEY)


def read_events_manifest(fs: fsspec.AbstractFileSystem, path: str) -> EventsManifest | None:
    """The manifest of the events directory `path` (on `fs`), or None when it is not committed.

    Raises:
        FormatError, codec.ConfigError: see `EventsManifest.from_dict`.
    """
    return read_manifest(EventsManifest, fs, path, fmt=EVENTS_FORMAT)


def read_quarantine_manifest(fs: fsspec.AbstractFileSystem, path: str) -> QuarantineManifest | None:
    """The manifest of the quarantine directory `path` (on `fs`), or None when it is not committed.

    Raises:
        FormatError, codec.ConfigError: see `QuarantineManifest.from_dict`.
    """
    return read_manifest(QuarantineManifest, fs, path, fmt=QUARANTINE_FORMAT)


def committed_events(layout: Layout, date: str) -> tuple[fsspec.AbstractFileSystem, str, EventsManifest]:
    """(filesystem, path, manifest) of the committed events of `date`, what the later stages read.

    Raises:
        FileNotFoundError: the events of `date` are not committed (run the ingest first).
        FormatError, codec.ConfigError: see `EventsManifest.from_dict`.
    """
    fs, path = layout.fs(layout.events(date))
    manifest = read_events_manifest(fs, path)
    if manifest is None:
        raise FileNotFoundError(f"no committed events for {date} at {layout.events(date)}: run ingest first")
    return fs, path, manifest
