"""A vocabulary directory's manifest (`vocab/date=D/_SUCCESS.json`): what the vocab stage committed.

`pipeline.vocab.stage` writes it and reads earlier days' (the window, the
previous vocabulary, a rerun's skip); the encode stage, the serving export
(`flows.serving.export`) and `bench/vocab.py` read its run id, merge and
buckets.  All go through `VocabManifest` and `read_vocab_manifest` here.  Its
readers all import `pipeline`, so it lives here rather than in `storage`.

Format: `manifest_format` names it (`"ctr-pipeline-vocab/<version>"`; the
manifest's own `format` field is the input log format, e.g. `criteo`).  A
manifest written before the field existed is version 1.  Fields this code does
not know are ignored and missing ones take their defaults; a newer version is
refused with a `storage.io.records.FormatError` naming the file and what to do.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import fsspec

from storage.io.records import (
    MANIFEST_FORMAT_KEY,
    CommittedManifest,
    FormatError,
    RecordFormat,
    read_manifest,
    read_record,
)

__all__ = ["VOCAB_FORMAT", "DayFieldStats", "FieldStats", "FormatError", "VocabManifest", "read_vocab_manifest"]

VOCAB_FORMAT = RecordFormat(
    "ctr-pipeline-vocab",
    1,
    absent=1,
    fix="run the vocab stage again for that date (`--force`)",
    newer="upgrade ctr-pipeline here to read it, or run the vocab stage of this version again for that date"
    " (`--force`)",
)
"""The manifest's format: version 1 is what `pipeline.vocab.stage` has always written."""


@dataclass(frozen=True)
class FieldStats:
    """One field's line of `per_field` (`pipeline.vocab.report.stats_from_totals`)."""

    field: str
    seen: int = 0
    admitted: int = 0
    evicted: int = 0
    coverage: float = 0.0
    oov_rate: float = 0.0
    missing_rate: float | None = None
    """None for a multi-valued field."""


@dataclass(frozen=True)
class DayFieldStats:
    """One field's line of `day_fields` (`pipeline.vocab.report.day_field_stats`)."""

    field: str
    day_keys: int = 0
    oov_rate_previous: float = 0.0


@dataclass(frozen=True, kw_only=True)
class VocabManifest(CommittedManifest):
    """`_SUCCESS.json` of a committed vocabulary directory (see the module docstring)."""

    manifest_format: str = VOCAB_FORMAT.tag
    date: str = ""
    format: str | None = None
    """The input log format (`pipeline.schema`), e.g. `criteo`."""
    config: dict[str, Any] = field(default_factory=dict)
    """The `VocabConfig` it was built with, as plain data (a rerun with an equal config is skipped)."""
    window_dates: tuple[str, ...] = ()
    window_runs: dict[str, str] = field(default_factory=dict)
    """Date -> run id of the day counts the window summed (D's own: `run_id`); the delta merge checks them."""
    previous_vocab_date: str | None = None
    merge: str = "window"
    """"delta" or "window" (`pipeline.vocab.stage`)."""
    buckets: int = 0
    """The parts of vocab.parquet/ and day_counts.parquet/."""
    day_rows: int = 0
    day_keys: int = 0
    vocab_rows: int = 0
    admitted: int = 0
    seen: int = 0
    evicted: int = 0
    per_field: tuple[FieldStats, ...] = ()
    day_fields: tuple[DayFieldStats, ...] = ()
    seconds: dict[str, float] = field(default_factory=dict)
    events_run_id: str | None = None
    run_id: str = ""
    """Identifies the committed content (a new one each time the day is built)."""
    code_version: str = ""
    data: str | None = None
    """The data prefix of a directory committed on an object store (`storage.io.fsio`); set by the
    commit, never by the writer."""

    @classmethod
    def from_dict(cls, data: Any, *, where: str) -> VocabManifest:
        """The manifest of the file `where` (parsed JSON), of any version this code reads.

        Raises:
            FormatError: not a JSON object, or a version this code does not read (the message says what to do).
            codec.ConfigError: a known field of the wrong type (named in the message).
        """
        return read_record(cls, data, fmt=VOCAB_FORMAT, where=where, format_key=MANIFEST_FORMAT_KEY)


def read_vocab_manifest(fs: fsspec.AbstractFileSystem, path: str) -> VocabManifest | None:
    """The manifest of the vocabulary directory `path` (on `fs`), or None when it is not committed.

    Raises:
        FormatError, codec.ConfigError: see `VocabManifest.from_dict`.
    """
    return read_manifest(VocabManifest, fs, path, fmt=VOCAB_FORMAT)
