"""The vocab stage's files: where each part lives, how it is written, and how a bucket is read back.

Under the stage's staging directory (`_scratch/` is deleted before the commit):

    _scratch/counts/part-NNNNN.parquet   one events partition's (hx, key, count), sorted by hx,
                                         64k-row row groups: a bucket is a row range found from
                                         the row groups' hx statistics
    _scratch/merged/part-BBBBB.parquet   a bucket's keys before the cap (only when there is a cap)
    _scratch/evicted/part-BBBBB.parquet  a bucket's evicted keys, one row group per field
    day_counts.parquet/part-BBBBB.parquet, vocab.parquet/part-BBBBB.parquet
                                         the committed parts, each sorted by key
    evicted.parquet                      one file, sorted by key (`concat_evicted`)

A vocabulary part is written for cheap reading and writing, since the daily
merge reads and rewrites every part: first_seen / last_seen are written from
Arrow dictionaries (a few dozen distinct dates) and read back as dictionaries
(their strings are parsed once per distinct date, not per row); only those and
the small-domain columns are dictionary-encoded (the unique keys are not);
only field and key get min/max statistics; every column is required (no
definition levels) and uncompressed (random keys do not compress; the
dictionary-encoded columns are small); no Arrow schema is stored, so every
reader sees plain string dates.

The delta merge without a cap (`pipeline.vocab.delta_merge.delta_vocab`) keeps the previous
part's date dictionary: it reads the dates as dictionary indices, sets today's
index where a key was seen, and writes the indices back with the dictionary
plus the run date, so no date is converted per row either way.
"""

from __future__ import annotations

from dataclasses import dataclass

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.encode.keys import field_of
from pipeline.vocab.admission import Columns, previous_state
from pipeline.vocab.buckets import bucket_bounds, bucket_of, hx_of, source_buckets
from pipeline.vocab.dates import date_indices, day_dictionary, day_strings
from storage.io.fsio import join

SCRATCH = "_scratch"
COUNT_ROW_GROUP = 1 << 16
VOCAB_SCHEMA = pa.schema(
    [
        ("field", pa.int16(), False),
        ("key", pa.int64(), False),
        ("count", pa.int64(), False),
        ("score", pa.float64(), False),
        ("first_seen", pa.dictionary(pa.int32(), pa.string()), False),
        ("last_seen", pa.dictionary(pa.int32(), pa.string()), False),
        ("admitted", pa.bool_(), False),
    ]
)
"""A vocabulary part as written (readers see the dates as plain strings: no Arrow schema is stored).
Columns are required (never null): Parquet then stores no definition levels for them."""
VOCAB_DICTIONARY = ["field", "count", "score", "first_seen", "last_seen", "admitted"]
"""The columns of a vocabulary part written with dictionary encoding (few distinct values; not the unique keys)."""
DATE_COLUMNS = ["first_seen", "last_seen"]
WRITE_OPTIONS = {"compression": "none", "store_schema": False}
"""How the stage's own parts are written: uncompressed (hash keys do not compress; the small-domain
columns are dictionary-encoded already, so compression costs write CPU for few bytes), no Arrow schema."""
EVICTED_SCHEMA = pa.schema([("field", pa.int16()), ("key", pa.int64()), ("last_seen", pa.large_string())])
COUNTS_SCHEMA = pa.schema([("field", pa.int16(), False), ("key", pa.int64(), False), ("count", pa.int64(), False)])
SCRATCH_COUNTS_SCHEMA = pa.schema(
    [("hx", pa.uint32(), False), ("key", pa.int64(), False), ("count", pa.int64(), False)]
)
MERGED_SCHEMA = pa.schema(
    [
        ("key", pa.int64()),
        ("field", pa.int16()),
        ("count", pa.int64()),
        ("score", pa.float64()),
        ("first_seen", pa.int64()),
        ("last_seen", pa.int64()),
        ("was_admitted", pa.bool_()),
        ("admitted", pa.bool_()),
        ("today", pa.int64()),
    ]
)


@dataclass(frozen=True, slots=True)
class Bucketed:
    """A table stored as per-bucket parts `<path>/part-BBBBB.parquet`."""

    path: str
    buckets: int

    def part(self, bucket: int) -> str:
        """The path of `bucket`'s part."""
        return join(self.path, part_name(bucket))


def part_name(index: int) -> str:
    """The file name of part `index` (a bucket or an events partition)."""
    return f"part-{index:05d}.parquet"


def scratch(stage: str, kind: str, index: int) -> str:
    """The path of a scratch part: `kind` is counts, merged or evicted."""
    return join(stage, SCRATCH, kind, part_name(index))


def write_scratch_counts(fs: fsspec.AbstractFileSystem, path: str, keys: np.ndarray, counts: np.ndarray) -> None:
    """One events partition's (key, count) as `_scratch/counts` stores them: sorted by hx, 64k-row row groups."""
    hx = hx_of(keys)
    order = np.argsort(hx, kind="stable")
    table = pa.table(
        {"hx": hx[order].astype(np.uint32), "key": keys[order], "count": counts[order]}, schema=SCRATCH_COUNTS_SCHEMA
    )
    _write(fs, path, table, row_group_size=COUNT_ROW_GROUP, use_dictionary=["count"], write_statistics=["hx"])


def read_count_range(
    fs: fsspec.AbstractFileSystem, path: str, bucket: int, buckets: int
) -> tuple[np.ndarray, np.ndarray]:
    """(keys, counts) of `bucket` from one scratch counts file: only the row groups whose hx range overlaps."""
    lo, hi = bucket_bounds(bucket, buckets)
    with fs.open(path, "rb") as f:
        pf = pq.ParquetFile(f)
        groups = []
        for i in range(pf.metadata.num_row_groups):
            stats = pf.metadata.row_group(i).column(0).statistics
            if stats is None or not stats.has_min_max or (stats.max >= lo and stats.min < hi):
                groups.append(i)
        if not groups:
            return np.empty(0, np.int64), np.empty(0, np.int64)
        t = pf.read_row_groups(groups, columns=["hx", "key", "count"])
    hx = t.column("hx").to_numpy()
    mask = (hx >= lo) & (hx < hi)
    keys, counts = (
        t.column("key").to_numpy()[mask].astype(np.int64),
        t.column("count").to_numpy()[mask].astype(np.int64),
    )
    # Rows are in hx order, keys of equal hx in key order (`write_scratch_counts` sorts sorted keys stably by hx).
    # Key order is field, then hx: a stable sort on the (8-bit) field, a radix sort, puts them in key order,
    # so the per-file runs `sum_counts` merges are already sorted.
    order = np.argsort(field_of(keys).astype(np.uint8), kind="stable")
    return keys[order], counts[order]


def write_day_counts(fs: fsspec.AbstractFileSystem, path: str, keys: np.ndarray, counts: np.ndarray) -> None:
    """One bucket's part of `day_counts.parquet` (sorted keys)."""
    table = pa.table({"field": field_of(keys).astype(np.int16), "key": keys, "count": counts}, schema=COUNTS_SCHEMA)
    _write(fs, path, table, use_dictionary=["field", "count"], write_statistics=["field", "key"])


def write_merged(fs: fsspec.AbstractFileSystem, path: str, merged: Columns, today: np.ndarray) -> None:
    """A bucket's keys before the cap (`admit`'s columns + today's count), kept in scratch for the cap rounds."""
    _write(fs, path, pa.table({**merged, "today": today}, schema=MERGED_SCHEMA))


def write_vocab_part(fs: fsspec.AbstractFileSystem, path: str, vocab: Columns, days: np.ndarray | None = None) -> None:
    """One vocabulary part (`split_vocab` columns) in the layout the module docstring gives.

    Args:
        days: None: the dates are day numbers; else they are int32 indices into these day numbers
            (`pipeline.vocab.delta_merge.DeltaVocab`), written as the dictionary they already are.
    """
    if days is None:
        first, last = day_dictionary(vocab["first_seen"]), day_dictionary(vocab["last_seen"])
    else:
        names = pa.array(np.asarray(days, np.int64).astype("datetime64[D]")).cast(pa.string())
        first, last = (pa.DictionaryArray.from_arrays(pa.array(vocab[c]), names) for c in DATE_COLUMNS)
    table = pa.table({**vocab, "first_seen": first, "last_seen": last}, schema=VOCAB_SCHEMA)
    with fs.open(path, "wb") as f:
        pq.write_table(table, f, use_dictionary=VOCAB_DICTIONARY, write_statistics=["field", "key"], **WRITE_OPTIONS)


def write_evicted(fs: fsspec.AbstractFileSystem, path: str, gone: Columns) -> int:
    """A bucket's evicted keys (field, key, last_seen day numbers), one row group per field; no file when none."""
    if not len(gone["key"]):
        return 0
    evicted = pa.table(
        {"field": gone["field"], "key": gone["key"], "last_seen": day_strings(gone["last_seen"])}, schema=EVICTED_SCHEMA
    )
    with fs.open(path, "wb") as f, pq.ParquetWriter(f, EVICTED_SCHEMA) as w:
        fields = gone["field"]
        starts = np.flatnonzero(np.r_[True, fields[1:] != fields[:-1]])
        for s, e in zip(starts, np.r_[starts[1:], len(fields)], strict=True):  # a row group per field
            w.write_table(evicted.slice(int(s), int(e - s)))
    return len(fields)


def read_bucket(
    fs: fsspec.AbstractFileSystem, source: Bucketed, bucket: int, buckets: int, columns: list[str] | None
) -> pa.Table:
    """The rows of `bucket` (of `buckets`) from `source`, whatever its own bucket count; sorted by key.

    Date columns come back dictionary-encoded (`pipeline.vocab.dates.day_numbers` reads them).
    """
    wanted = None if columns is None else list(dict.fromkeys(["key", *columns]))
    tables = [read_part(fs, source.part(i), wanted) for i in source_buckets(bucket, buckets, source.buckets)]
    t = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
    if source.buckets == buckets:
        return t
    keys = t.column("key").to_numpy()
    t = t.filter(pa.array(bucket_of(keys, buckets) == bucket))
    return t.take(pa.array(np.argsort(t.column("key").to_numpy(), kind="stable")))


def read_previous(fs: fsspec.AbstractFileSystem, source: Bucketed | None, bucket: int, buckets: int) -> Columns:
    """The previous vocabulary's state of `bucket` for a merge: key, count, first, last (day numbers), admitted."""
    if source is None:
        return previous_state(None)
    return previous_state(
        read_bucket(fs, source, bucket, buckets, ["key", "count", "first_seen", "last_seen", "admitted"])
    )


def read_previous_indexed(
    fs: fsspec.AbstractFileSystem, source: Bucketed | None, bucket: int, buckets: int
) -> tuple[Columns, np.ndarray]:
    """`delta_vocab`'s previous state: key, count, first, last (int32 indices into the returned days), admitted."""
    if source is None:
        empty = previous_state(None)
        return {**empty, "first": np.empty(0, np.int32), "last": np.empty(0, np.int32)}, np.empty(0, np.int64)
    t = read_bucket(fs, source, bucket, buckets, ["key", "count", "first_seen", "last_seen", "admitted"])
    first, first_days = date_indices(t.column("first_seen"))
    last, last_days = date_indices(t.column("last_seen"))
    days = first_days
    if not np.array_equal(first_days, last_days):  # one dictionary for both (delta-merge parts share theirs)
        days = np.union1d(first_days, last_days)
        first = np.searchsorted(days, first_days)[first].astype(np.int32)
        last = np.searchsorted(days, last_days)[last].astype(np.int32)
    return {
        "key": t.column("key").to_numpy().astype(np.int64, copy=False),
        "count": t.column("count").to_numpy().astype(np.int64, copy=False),
        "first": first,
        "last": last,
        "admitted": t.column("admitted").to_numpy(zero_copy_only=False).astype(bool, copy=False),
    }, days


def read_part(fs: fsspec.AbstractFileSystem, path: str, columns: list[str] | None) -> pa.Table:
    """One part, its date columns as dictionaries (each distinct date parsed once)."""
    dates = [c for c in DATE_COLUMNS if columns is None or c in columns]
    with fs.open(path, "rb") as f:  # ParquetFile.read: one chunk per row group (read_table splits them in batches)
        return pq.ParquetFile(f, read_dictionary=dates).read(columns=columns)


def _write(fs: fsspec.AbstractFileSystem, path: str, table: pa.Table, **options) -> None:
    with fs.open(path, "wb") as f:
        pq.write_table(table, f, **{**WRITE_OPTIONS, **options})
