"""A features directory's manifest (`features/<key>/date=D/_SUCCESS.json`) and its column names.

The encode stage (`pipeline.encode.stage`) writes a day's features and commits them with this manifest; the
trainer's ranks (`trainer.data.read_schema`), the train stage's parent-eval rows (`trainer.plan.parent_eval`),
the serving export (`flows.serving.export`) and the benchmarks read it.  They all go through
`FeaturesManifest` and `read_features_manifest` here, below the packages that write and read it, so a
rank (which imports only `trainer` and `storage`) reads it with the same code as the writer.

Column names: label, `d_<i>` (dense input i), `k_<j>` (the key of categorical field j), `bag_<j>` (every
key of multi-valued field j).  `dense_column` / `key_column` / `bag_column` write them and
`column_index` / `columns_of` parse them back: one rule, both directions.

Format: `manifest_format` names it (`"ctr-pipeline-features/<version>"`; the manifest's own `format`
field is the input log format, e.g. `criteo`).  A manifest written before the field existed is
version 1.  Fields this code does not know are ignored and missing ones take their defaults
(hand-made manifests of tests and benchmarks list only the columns); a newer version is refused with
a `storage.io.records.FormatError` naming the file and what to do.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

import fsspec

from storage.io.records import (
    MANIFEST_FORMAT_KEY,
    CommittedManifest,
    FormatError,
    RecordFormat,
    read_manifest,
    read_record,
)

__all__ = [
    "FEATURES_FORMAT",
    "FeaturesManifest",
    "FormatError",
    "Duplicates",
    "PartRows",
    "bag_column",
    "bag_key_column",
    "column_index",
    "columns_of",
    "dense_column",
    "key_column",
    "raw_column",
    "raw_columns",
    "read_features_manifest",
]

# ---- column names --------------------------------------------------------------------------------
ColumnKind = Literal["dense", "key", "bag", "raw"]
_PREFIX: dict[str, str] = {"dense": "d_", "key": "k_", "bag": "bag_", "raw": "r_"}
_PATTERN = {kind: re.compile(rf"^{prefix}(\d+)$") for kind, prefix in _PREFIX.items()}


def dense_column(i: int) -> str:
    """The column of dense input i: `d_<i>`."""
    return f"d_{i}"


def key_column(j: int) -> str:
    """The key column of categorical field j: `k_<j>` (int64; a multi-valued field's first value)."""
    return f"k_{j}"


def raw_column(j: int) -> str:
    """The raw key column of categorical field j: `r_<j>` (int64), the key of the value itself before the OOV rule
    (written with `encode.raw_keys`, the companion's input; a multi-valued field's first value)."""
    return f"r_{j}"


def raw_columns(key_columns: Iterable[str]) -> tuple[str, ...]:
    """The raw key columns of key columns: `k_<j>` -> `r_<j>`.

    Raises:
        ValueError: a name that is not a key column.
    """
    out = []
    for c in key_columns:
        j = column_index(c, "key")
        if j is None:
            raise ValueError(f"{c!r} is not a key column (k_<j>)")
        out.append(raw_column(j))
    return tuple(out)


def bag_column(j: int) -> str:
    """The bag column of multi-valued field j: `bag_<j>` (list<int64>, every value's key)."""
    return f"bag_{j}"


def column_index(name: str, kind: ColumnKind) -> int | None:
    """i of `d_<i>`, j of `k_<j>` or `bag_<j>` (by `kind`), or None when `name` is not such a column."""
    m = _PATTERN[kind].match(name)
    return int(m.group(1)) if m else None


def columns_of(names: Iterable[str], kind: ColumnKind) -> tuple[str, ...]:
    """The columns of `kind` among `names` (e.g. a Parquet file's), in index order."""
    found = [(i, n) for n in names if (i := column_index(n, kind)) is not None]
    return tuple(n for _, n in sorted(found))


def bag_key_column(bag: str) -> str:
    """The key column of the field a bag column belongs to: `bag_<j>` -> `k_<j>`.

    Raises:
        ValueError: `bag` is not a bag column name.
    """
    j = column_index(bag, "bag")
    if j is None:
        raise ValueError(f"{bag!r} is not a bag column (bag_<j>)")
    return key_column(j)


# ---- the manifest -------------------------------------------------------------------------------
FEATURES_FORMAT = RecordFormat(
    "ctr-pipeline-features",
    1,
    absent=1,
    fix="run the encode stage again for that date (`--force`)",
    newer="upgrade ctr-pipeline here to read it, or run the encode stage of this version again for that date"
    " (`--force`)",
)
"""The manifest's format: version 1 is what `pipeline.encode.stage` has always written."""


@dataclass(frozen=True)
class PartRows:
    """A Parquet part of a split and its rows (`train/<name>.parquet`)."""

    name: str
    rows: int


@dataclass(frozen=True)
class Duplicates:
    """The day's share of rows that copy another row exactly, from a hash sample (`pipeline.encode.row_copies`)."""

    share: float = 0.0
    sampled_rows: int = 0
    sample_bits: int = 0


@dataclass(frozen=True, kw_only=True)
class FeaturesManifest(CommittedManifest):
    """`_SUCCESS.json` of a committed features directory (see the module docstring)."""

    manifest_format: str = FEATURES_FORMAT.tag
    date: str | None = None
    format: str | None = None
    """The input log format the rows were parsed with (`pipeline.schema`), e.g. `criteo`."""
    rows_train: int = 0
    rows_eval: int = 0
    eval_copies_dropped: int = 0
    """Eval rows left out because a train row of the day is their exact copy."""
    duplicates: Duplicates = Duplicates()
    dense_columns: tuple[str, ...] | None = None
    """`d_<i>` in order; None: not listed (read them from the Parquet schema)."""
    key_columns: tuple[str, ...] | None = None
    """`k_<j>` in order; None: not listed (read them from the Parquet schema)."""
    bag_columns: tuple[str, ...] | None = None
    """`bag_<j>` of the multi-valued fields; None: not listed."""
    fields: tuple[str, ...] = ()
    """The categorical fields' names, in key-column order."""
    dense_fields: tuple[str, ...] = ()
    vocab_date: str | None = None
    train_parts: tuple[str, ...] = ()
    eval_parts: tuple[str, ...] = ()
    train_part_rows: tuple[PartRows, ...] = ()
    """The train parts with rows, in order: each rank's block is computed from them (`trainer.data.rank_share`)."""
    eval_part_rows: tuple[PartRows, ...] = ()
    distinct_train_keys: int = 0
    events_run_id: str | None = None
    vocab_run_id: str | None = None
    """The run of the vocabulary the keys were admitted by (its manifest's `run_id`)."""
    eval_fraction: float | None = None
    raw_keys: bool = False
    """The rows carry each value's own key `r_<j>` (`encode.raw_keys`, `encode.raw_keys_up_to`)."""
    run_id: str = ""
    """Identifies the committed content (a new one each time the day is encoded)."""
    code_version: str = ""
    data: str | None = None
    """The data prefix of a directory committed on an object store (`storage.io.fsio`); set by the
    commit, never by the writer."""

    def __post_init__(self) -> None:
        listed: tuple[tuple[ColumnKind, tuple[str, ...] | None], ...] = (
            ("dense", self.dense_columns),
            ("key", self.key_columns),
            ("bag", self.bag_columns),
        )
        for kind, columns in listed:
            bad = [c for c in columns or () if column_index(c, kind) is None]
            if bad:
                raise ValueError(f"{kind} columns {bad} are not named {_PREFIX[kind]}<index>")

    @property
    def source(self) -> dict[str, Any]:
        """What the features were made from: a committed day with the same source is not encoded again."""
        out: dict[str, Any] = {
            "events_run_id": self.events_run_id,
            "vocab_run_id": self.vocab_run_id,
            "eval_fraction": self.eval_fraction,
        }
        if self.raw_keys:  # absent otherwise: features encoded before the key existed are still these features
            out["raw_keys"] = True
        return out

    @classmethod
    def from_dict(cls, data: Any, *, where: str) -> FeaturesManifest:
        """The manifest of the file `where` (parsed JSON), of any version this code reads.

        Raises:
            FormatError: not a JSON object, or a version this code does not read (the message says what to do).
            codec.ConfigError: a known field of the wrong type, or misnamed columns (named in the message).
        """
        return read_record(cls, data, fmt=FEATURES_FORMAT, where=where, format_key=MANIFEST_FORMAT_KEY)


def read_features_manifest(fs: fsspec.AbstractFileSystem, path: str) -> FeaturesManifest | None:
    """The manifest of the features directory `path` (on `fs`), or None when it is not committed.

    Raises:
        FormatError, codec.ConfigError: see `FeaturesManifest.from_dict`.
    """
    return read_manifest(FeaturesManifest, fs, path, fmt=FEATURES_FORMAT)
