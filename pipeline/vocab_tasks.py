"""Dask tasks of the vocab stage: each reads and writes one events partition or one bucket of keys.

Layout they work on (the stage's staging directory; `_scratch/` is deleted before the commit):

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
only field and key get min/max statistics; no Arrow schema is stored, so every
reader sees plain string dates as before.
Parts written before (large strings, any encoding) read the same way.

No task holds more than one events partition or one bucket (of every day in
the window plus the previous vocabulary); the driver gets back per-field sums
and cap histograms only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline.keys import field_of
from pipeline.vocab import (
    Columns,
    FieldTotals,
    combine,
    count_keys,
    day_dictionary,
    day_strings,
    delta_combine,
    field_totals,
    previous_state,
    split_vocab,
    sum_counts,
    window_table,
)
from pipeline.vocab_merge import (
    Histogram,
    bucket_bounds,
    bucket_of,
    cap_histograms,
    cap_mask,
    hx_of,
    score_bits,
    source_buckets,
)
from storage.fsio import join

SCRATCH = "_scratch"
COUNT_ROW_GROUP = 1 << 16
VOCAB_SCHEMA = pa.schema([("field", pa.int16()), ("key", pa.int64()), ("count", pa.int64()), ("score", pa.float64()),
                          ("first_seen", pa.dictionary(pa.int32(), pa.string())),
                          ("last_seen", pa.dictionary(pa.int32(), pa.string())), ("admitted", pa.bool_())])  # fmt: skip
"""A vocabulary part as written (readers see the dates as plain strings: no Arrow schema is stored)."""
VOCAB_DICTIONARY = ["field", "count", "score", "first_seen", "last_seen", "admitted"]
"""The columns of a vocabulary part written with dictionary encoding (few distinct values; not the unique keys)."""
DATE_COLUMNS = ["first_seen", "last_seen"]
EVICTED_SCHEMA = pa.schema([("field", pa.int16()), ("key", pa.int64()), ("last_seen", pa.large_string())])
COUNTS_SCHEMA = pa.schema([("field", pa.int16()), ("key", pa.int64()), ("count", pa.int64())])
MERGED_SCHEMA = pa.schema([("key", pa.int64()), ("field", pa.int16()), ("count", pa.int64()), ("score", pa.float64()),
                           ("first_seen", pa.int64()), ("last_seen", pa.int64()), ("was_admitted", pa.bool_()),
                           ("admitted", pa.bool_()), ("today", pa.int64())])  # fmt: skip


@dataclass(frozen=True, slots=True)
class Bucketed:
    """A table stored as per-bucket parts `<path>/part-BBBBB.parquet`, or (legacy) one file = one bucket."""

    path: str
    buckets: int
    single_file: bool = False

    def part(self, bucket: int) -> str:
        return self.path if self.single_file else join(self.path, part_name(bucket))


@dataclass(frozen=True, slots=True)
class MergePlan:
    """Everything a bucket task needs to know (small: paths and numbers)."""

    stage: str
    """The staging directory of vocab/date=D."""
    date: int
    """D as a day number."""
    buckets: int
    count_parts: tuple[str, ...]
    """The scratch counts of D's events partitions."""
    window: tuple[tuple[int, Bucketed], ...]
    """Full merge: (day number, day counts) of the other committed days of the window."""
    previous: Bucketed | None
    """The previous vocabulary."""
    dropped: Bucketed | None
    """Delta merge: the day counts of the day that left the window (None: no day left it)."""
    delta: bool
    """True: window = previous counts + D - dropped; False: the sum of the window's day counts."""
    thresholds: tuple[float, ...]
    ttl_days: int
    decay: float
    capped: bool
    """Whether the cap must be searched (the merged rows go to scratch before the cap)."""
    n_fields: int


@dataclass(frozen=True, slots=True)
class BucketResult:
    admitted: np.ndarray
    """Admitted keys per field before the cap."""
    totals: FieldTotals | None
    """The bucket's report sums (None until the cap is applied)."""
    vocab_rows: int = 0
    day_keys: int = 0


def part_name(index: int) -> str:
    return f"part-{index:05d}.parquet"


def scratch(stage: str, kind: str, index: int) -> str:
    return join(stage, SCRATCH, kind, part_name(index))


# ---- counting -------------------------------------------------------------------------------------
def count_part(
    path: str, out: str, *, fs: fsspec.AbstractFileSystem, fields: list[str], multi_valued: Sequence[str] = ()
) -> int:
    """Count one events partition's keys into `out` (scratch, sorted by hx); returns the distinct keys."""
    with fs.open(path, "rb") as f:
        table = pq.read_table(f, columns=fields)
    columns = {
        name: (pc.list_flatten(table.column(name)) if name in multi_valued else table.column(name)).to_pandas()
        for name in fields
    }
    counts = count_keys(columns, fields)
    keys = counts["key"].to_numpy(np.int64)
    hx = hx_of(keys)
    order = np.argsort(hx, kind="stable")
    _write(fs, out, pa.table({"hx": pa.array(hx[order].astype(np.uint32)), "key": keys[order],
                              "count": counts["count"].to_numpy(np.int64)[order]}), COUNT_ROW_GROUP)  # fmt: skip
    return len(keys)


def read_count_range(fs: fsspec.AbstractFileSystem, path: str, bucket: int, buckets: int) -> tuple[np.ndarray, np.ndarray]:
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
    hx = t.column("hx").to_numpy().astype(np.int64)
    mask = (hx >= lo) & (hx < hi)
    return t.column("key").to_numpy()[mask].astype(np.int64), t.column("count").to_numpy()[mask].astype(np.int64)


# ---- merging one bucket -----------------------------------------------------------------------------
def merge_bucket(bucket: int, *, plan: MergePlan, fs: fsspec.AbstractFileSystem) -> BucketResult:
    """Dask task: day counts of `bucket`, its window and previous state, admission; writes its parts.

    Without a cap the bucket is final here; with one, its rows go to
    `_scratch/merged` and `finish_bucket` applies the cut once `CapSearch` found it.
    """
    keys, counts = sum_counts(*_concat(read_count_range(fs, p, bucket, plan.buckets) for p in plan.count_parts))
    _write(fs, join(plan.stage, "day_counts.parquet", part_name(bucket)),
           pa.table({"field": field_of(keys).astype(np.int16), "key": keys, "count": counts}, schema=COUNTS_SCHEMA))  # fmt: skip
    prev = _previous_state(fs, plan.previous, bucket, plan.buckets)
    thresholds = np.asarray(plan.thresholds)
    if plan.delta:
        dropped = None
        if plan.dropped is not None:
            d = read_bucket(fs, plan.dropped, bucket, plan.buckets, ["key", "count"])
            dropped = (d.column("key").to_numpy(), d.column("count").to_numpy())
        merged = delta_combine(date=plan.date, previous=prev, today=(keys, counts), dropped=dropped,
                               thresholds=thresholds, ttl_days=plan.ttl_days)  # fmt: skip
    else:
        days = [(plan.date, keys, counts)]
        for day, source in plan.window:
            t = read_bucket(fs, source, bucket, plan.buckets, ["key", "count"])
            days.append((day, t.column("key").to_numpy(), t.column("count").to_numpy()))
        merged = combine(date=plan.date, window=window_table(days, end=plan.date, decay=plan.decay), previous=prev,
                         thresholds=thresholds, ttl_days=plan.ttl_days)  # fmt: skip
    today = np.zeros(len(merged["key"]), np.int64)
    today[np.searchsorted(merged["key"], keys)] = counts
    admitted = np.bincount(merged["field"][merged["admitted"]], minlength=plan.n_fields)[: plan.n_fields]
    if plan.capped:
        _write(fs, scratch(plan.stage, "merged", bucket), pa.table({**merged, "today": today}, schema=MERGED_SCHEMA))
        return BucketResult(admitted=admitted, totals=None, day_keys=len(keys))
    return _finish(fs, plan, bucket, merged, today, merged["admitted"], len(keys))


def cap_round(bucket: int, *, plan: MergePlan, fs: fsspec.AbstractFileSystem, query: dict[int, tuple[int, int]],
              shift: int) -> dict[int, Histogram]:  # fmt: skip
    """Dask task: this bucket's histograms for one `CapSearch` round."""
    t = _read(fs, scratch(plan.stage, "merged", bucket), ["field", "score", "admitted"])
    return cap_histograms(field=t.column("field").to_numpy(), bits=score_bits(t.column("score").to_numpy()),
                          admitted=t.column("admitted").to_numpy(zero_copy_only=False), query=query, shift=shift)  # fmt: skip


def finish_bucket(bucket: int, cuts: dict[int, tuple[int, int]], *, plan: MergePlan,
                  fs: fsspec.AbstractFileSystem) -> BucketResult:  # fmt: skip
    """Dask task: apply the cap's cut to this bucket's merged rows and write its parts."""
    t = _read(fs, scratch(plan.stage, "merged", bucket), None)
    merged = {name: t.column(name).to_numpy() for name in t.column_names}
    admitted = cap_mask(field=merged["field"], bits=score_bits(merged["score"]), admitted=merged["admitted"], cuts=cuts)
    today = merged["today"]
    return _finish(fs, plan, bucket, merged, today, admitted, int((today > 0).sum()))


def _finish(fs, plan: MergePlan, bucket: int, merged: Columns, today: np.ndarray, admitted: np.ndarray,
            day_keys: int) -> BucketResult:  # fmt: skip
    vocab, gone = split_vocab(merged, admitted)
    write_vocab_part(fs, join(plan.stage, "vocab.parquet", part_name(bucket)), vocab)
    evicted = pa.table({"field": gone["field"], "key": gone["key"], "last_seen": day_strings(gone["last_seen"])},
                       schema=EVICTED_SCHEMA)  # fmt: skip
    with fs.open(scratch(plan.stage, "evicted", bucket), "wb") as f, pq.ParquetWriter(f, EVICTED_SCHEMA) as w:
        fields = gone["field"]
        if len(fields):
            starts = np.flatnonzero(np.r_[True, fields[1:] != fields[:-1]])
            for s, e in zip(starts, np.r_[starts[1:], len(fields)], strict=True):  # a row group per field
                w.write_table(evicted.slice(int(s), int(e - s)))
    totals = field_totals(field=merged["field"], count=merged["count"], admitted=admitted,
                          evicted=merged["was_admitted"] & ~admitted, today=today, n_fields=plan.n_fields)  # fmt: skip
    pre_cap = np.bincount(merged["field"][merged["admitted"]], minlength=plan.n_fields)[: plan.n_fields]
    return BucketResult(admitted=pre_cap, totals=totals, vocab_rows=len(vocab["key"]), day_keys=day_keys)


def write_vocab_part(fs: fsspec.AbstractFileSystem, path: str, vocab: Columns) -> None:
    """One vocabulary part (`split_vocab` columns, dates as day numbers) in the layout the module docstring gives."""
    table = pa.table({**vocab, "first_seen": day_dictionary(vocab["first_seen"]),
                      "last_seen": day_dictionary(vocab["last_seen"])}, schema=VOCAB_SCHEMA)  # fmt: skip
    with fs.open(path, "wb") as f:
        pq.write_table(table, f, use_dictionary=VOCAB_DICTIONARY, write_statistics=["field", "key"], store_schema=False)


def concat_evicted(out: str, *, stage: str, buckets: int, fs: fsspec.AbstractFileSystem) -> int:
    """Dask task: the buckets' evicted parts into one file sorted by key, one (bucket, field) row group at a time.

    Within a field bucket order is key order, so field-major, then bucket order, is key order.
    """
    groups: dict[int, list[tuple[int, int]]] = {}  # field -> [(bucket, row group)] in bucket order
    for b in range(buckets):
        with fs.open(scratch(stage, "evicted", b), "rb") as f:
            meta = pq.ParquetFile(f).metadata
        for i in range(meta.num_row_groups):
            if meta.row_group(i).num_rows:
                groups.setdefault(int(meta.row_group(i).column(0).statistics.min), []).append((b, i))
    rows = 0
    with fs.open(out, "wb") as f, pq.ParquetWriter(f, EVICTED_SCHEMA) as w:
        for field in sorted(groups):
            for b, i in groups[field]:
                with fs.open(scratch(stage, "evicted", b), "rb") as part:
                    t = pq.ParquetFile(part).read_row_group(i)
                w.write_table(t)
                rows += t.num_rows
        if rows == 0:
            w.write_table(EVICTED_SCHEMA.empty_table())
    return rows


# ---- reading committed buckets ------------------------------------------------------------------------
def read_bucket(fs: fsspec.AbstractFileSystem, source: Bucketed, bucket: int, buckets: int,
                columns: list[str] | None) -> pa.Table:  # fmt: skip
    """The rows of `bucket` (of `buckets`) from `source`, whatever its own bucket count; sorted by key.

    Date columns come back dictionary-encoded (`pipeline.vocab.day_numbers` reads them).
    """
    wanted = None if columns is None else list(dict.fromkeys(["key", *columns]))
    tables = [_read(fs, source.part(i), wanted) for i in source_buckets(bucket, buckets, source.buckets)]
    t = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
    if source.buckets == buckets and not source.single_file:
        return t
    keys = t.column("key").to_numpy()
    t = t.filter(pa.array(bucket_of(keys, buckets) == bucket))
    return t.take(pa.array(np.argsort(t.column("key").to_numpy(), kind="stable")))


def _previous_state(fs, source: Bucketed | None, bucket: int, buckets: int) -> Columns:
    if source is None:
        return previous_state(None)
    return previous_state(read_bucket(fs, source, bucket, buckets, ["key", "count", "first_seen", "last_seen",
                                                                    "admitted"]))  # fmt: skip


def _concat(pairs) -> tuple[np.ndarray, np.ndarray]:
    pairs = list(pairs)
    if not pairs:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    return np.concatenate([k for k, _ in pairs]), np.concatenate([c for _, c in pairs])


def _read(fs: fsspec.AbstractFileSystem, path: str, columns: list[str] | None) -> pa.Table:
    dates = [c for c in DATE_COLUMNS if columns is None or c in columns]
    with fs.open(path, "rb") as f:
        return pq.read_table(f, columns=columns, read_dictionary=dates)


def _write(fs: fsspec.AbstractFileSystem, path: str, table: pa.Table, row_group_size: int | None = None) -> None:
    with fs.open(path, "wb") as f:
        pq.write_table(table, f, row_group_size=row_group_size)
