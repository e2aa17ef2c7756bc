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
only field and key get min/max statistics; every column is required (no
definition levels) and uncompressed (random keys do not compress; the
dictionary-encoded columns are small); no Arrow schema is stored, so every
reader sees plain string dates.

The delta merge without a cap (`pipeline.vocab_delta_merge.delta_vocab`) keeps the previous
part's date dictionary: it reads the dates as dictionary indices, sets today's
index where a key was seen, and writes the indices back with the dictionary
plus the run date, so no date is converted per row either way.

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
from pipeline.vocab_admission import Columns, previous_state, split_vocab
from pipeline.vocab_buckets import bucket_bounds, bucket_of, hx_of, source_buckets
from pipeline.vocab_cap import Histogram, cap_histograms, cap_mask, score_bits
from pipeline.vocab_counts import count_keys, sum_counts
from pipeline.vocab_dates import date_indices, day_dictionary, day_strings
from pipeline.vocab_delta_merge import delta_combine, delta_vocab
from pipeline.vocab_report import FieldTotals, field_totals
from pipeline.vocab_window_merge import combine, window_table
from storage.io.fsio import join

SCRATCH = "_scratch"
COUNT_ROW_GROUP = 1 << 16
VOCAB_SCHEMA = pa.schema([("field", pa.int16(), False), ("key", pa.int64(), False), ("count", pa.int64(), False),
                          ("score", pa.float64(), False), ("first_seen", pa.dictionary(pa.int32(), pa.string()), False),
                          ("last_seen", pa.dictionary(pa.int32(), pa.string()), False),
                          ("admitted", pa.bool_(), False)])  # fmt: skip
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
SCRATCH_COUNTS_SCHEMA = pa.schema([("hx", pa.uint32(), False), ("key", pa.int64(), False), ("count", pa.int64(), False)])
MERGED_SCHEMA = pa.schema([("key", pa.int64()), ("field", pa.int16()), ("count", pa.int64()), ("score", pa.float64()),
                           ("first_seen", pa.int64()), ("last_seen", pa.int64()), ("was_admitted", pa.bool_()),
                           ("admitted", pa.bool_()), ("today", pa.int64())])  # fmt: skip


@dataclass(frozen=True, slots=True)
class Bucketed:
    """A table stored as per-bucket parts `<path>/part-BBBBB.parquet`."""

    path: str
    buckets: int

    def part(self, bucket: int) -> str:
        return join(self.path, part_name(bucket))


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
    evicted_rows: int = 0
    """Rows of the bucket's `_scratch/evicted` part (none is written when 0)."""


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
    table = pa.table({"hx": hx[order].astype(np.uint32), "key": keys[order],
                      "count": counts["count"].to_numpy(np.int64)[order]}, schema=SCRATCH_COUNTS_SCHEMA)  # fmt: skip
    _write(fs, out, table, row_group_size=COUNT_ROW_GROUP, use_dictionary=["count"], write_statistics=["hx"])
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
    hx = t.column("hx").to_numpy()
    mask = (hx >= lo) & (hx < hi)
    keys, counts = t.column("key").to_numpy()[mask].astype(np.int64), t.column("count").to_numpy()[mask].astype(np.int64)
    # Rows are in hx order, keys of equal hx in key order (`count_part` sorts key-sorted counts stably by hx).
    # Key order is field, then hx: a stable sort on the (8-bit) field, a radix sort, puts them in key order,
    # so the per-file runs `sum_counts` merges are already sorted.
    order = np.argsort(field_of(keys).astype(np.uint8), kind="stable")
    return keys[order], counts[order]


# ---- merging one bucket -----------------------------------------------------------------------------
def merge_bucket(bucket: int, *, plan: MergePlan, fs: fsspec.AbstractFileSystem) -> BucketResult:
    """Dask task: day counts of `bucket`, its window and previous state, admission; writes its parts.

    Without a cap the bucket is final here; with one, its rows go to
    `_scratch/merged` and `finish_bucket` applies the cut once `CapSearch` found it.
    """
    keys, counts = sum_counts(*_concat(read_count_range(fs, p, bucket, plan.buckets) for p in plan.count_parts))
    _write(fs, join(plan.stage, "day_counts.parquet", part_name(bucket)),
           pa.table({"field": field_of(keys).astype(np.int16), "key": keys, "count": counts}, schema=COUNTS_SCHEMA),
           use_dictionary=["field", "count"], write_statistics=["field", "key"])  # fmt: skip
    thresholds = np.asarray(plan.thresholds)
    dropped = None
    if plan.delta and plan.dropped is not None:
        d = read_bucket(fs, plan.dropped, bucket, plan.buckets, ["key", "count"])
        dropped = (d.column("key").to_numpy(), d.column("count").to_numpy())
    if plan.delta and not plan.capped:
        prev, days = _previous_stored(fs, plan.previous, bucket, plan.buckets)
        out = delta_vocab(date=plan.date, previous=prev, days=days, today=(keys, counts), dropped=dropped,
                          thresholds=thresholds, ttl_days=plan.ttl_days, n_fields=plan.n_fields)  # fmt: skip
        write_vocab_part(fs, join(plan.stage, "vocab.parquet", part_name(bucket)), out.vocab, days=out.days)
        return BucketResult(admitted=out.totals.admitted, totals=out.totals, vocab_rows=len(out.vocab["key"]),
                            day_keys=len(keys),
                            evicted_rows=_write_evicted(fs, scratch(plan.stage, "evicted", bucket), out.evicted))  # fmt: skip
    prev = _previous_state(fs, plan.previous, bucket, plan.buckets)
    if plan.delta:
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
    evicted_rows = _write_evicted(fs, scratch(plan.stage, "evicted", bucket), gone)
    totals = field_totals(field=merged["field"], count=merged["count"], admitted=admitted,
                          evicted=merged["was_admitted"] & ~admitted, today=today, n_fields=plan.n_fields)  # fmt: skip
    pre_cap = np.bincount(merged["field"][merged["admitted"]], minlength=plan.n_fields)[: plan.n_fields]
    return BucketResult(admitted=pre_cap, totals=totals, vocab_rows=len(vocab["key"]), day_keys=day_keys,
                        evicted_rows=evicted_rows)


def write_vocab_part(fs: fsspec.AbstractFileSystem, path: str, vocab: Columns, days: np.ndarray | None = None) -> None:
    """One vocabulary part (`split_vocab` columns) in the layout the module docstring gives.

    Args:
        days: None: the dates are day numbers; else they are int32 indices into these day numbers
            (`pipeline.vocab_delta_merge.DeltaVocab`), written as the dictionary they already are.
    """
    if days is None:
        first, last = day_dictionary(vocab["first_seen"]), day_dictionary(vocab["last_seen"])
    else:
        names = pa.array(np.asarray(days, np.int64).astype("datetime64[D]")).cast(pa.string())
        first, last = (pa.DictionaryArray.from_arrays(pa.array(vocab[c]), names) for c in DATE_COLUMNS)
    table = pa.table({**vocab, "first_seen": first, "last_seen": last}, schema=VOCAB_SCHEMA)
    with fs.open(path, "wb") as f:
        pq.write_table(table, f, use_dictionary=VOCAB_DICTIONARY, write_statistics=["field", "key"], **WRITE_OPTIONS)


def _write_evicted(fs: fsspec.AbstractFileSystem, path: str, gone: Columns) -> int:
    """A bucket's evicted keys (field, key, last_seen day numbers), one row group per field; no file when none."""
    if not len(gone["key"]):
        return 0
    evicted = pa.table({"field": gone["field"], "key": gone["key"], "last_seen": day_strings(gone["last_seen"])},
                       schema=EVICTED_SCHEMA)  # fmt: skip
    with fs.open(path, "wb") as f, pq.ParquetWriter(f, EVICTED_SCHEMA) as w:
        fields = gone["field"]
        starts = np.flatnonzero(np.r_[True, fields[1:] != fields[:-1]])
        for s, e in zip(starts, np.r_[starts[1:], len(fields)], strict=True):  # a row group per field
            w.write_table(evicted.slice(int(s), int(e - s)))
    return len(fields)


def concat_evicted(out: str, *, stage: str, buckets: Sequence[int], fs: fsspec.AbstractFileSystem) -> int:
    """Dask task: the buckets' evicted parts into one file sorted by key, one (bucket, field) row group at a time.

    Within a field bucket order is key order, so field-major, then bucket order, is key order.

    Args:
        buckets: the buckets that wrote an evicted part (`BucketResult.evicted_rows` > 0), ascending.
    """
    groups: dict[int, list[tuple[int, int]]] = {}  # field -> [(bucket, row group)] in bucket order
    for b in buckets:
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

    Date columns come back dictionary-encoded (`pipeline.vocab_dates.day_numbers` reads them).
    """
    wanted = None if columns is None else list(dict.fromkeys(["key", *columns]))
    tables = [_read(fs, source.part(i), wanted) for i in source_buckets(bucket, buckets, source.buckets)]
    t = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
    if source.buckets == buckets:
        return t
    keys = t.column("key").to_numpy()
    t = t.filter(pa.array(bucket_of(keys, buckets) == bucket))
    return t.take(pa.array(np.argsort(t.column("key").to_numpy(), kind="stable")))


def _previous_state(fs, source: Bucketed | None, bucket: int, buckets: int) -> Columns:
    if source is None:
        return previous_state(None)
    return previous_state(read_bucket(fs, source, bucket, buckets, ["key", "count", "first_seen", "last_seen",
                                                                    "admitted"]))  # fmt: skip


def _previous_stored(fs, source: Bucketed | None, bucket: int, buckets: int) -> tuple[Columns, np.ndarray]:
    """`delta_vocab`'s previous state: key, count, first, last (int32 indices into the returned days), admitted."""
    if source is None:
        empty = previous_state(None)
        return {**empty, "first": np.empty(0, np.int32), "last": np.empty(0, np.int32)}, np.empty(0, np.int64)
    t = read_bucket(fs, source, bucket, buckets, ["key", "count", "first_seen", "last_seen", "admitted"])
    first, first_days = date_indices(t.column("first_seen"))
    last, last_days = date_indices(t.column("last_seen"))
    days = first_days
    if not np.array_equal(first_days, last_days):  # one dictionary for both (parts written here share theirs)
        days = np.union1d(first_days, last_days)
        first = np.searchsorted(days, first_days)[first].astype(np.int32)
        last = np.searchsorted(days, last_days)[last].astype(np.int32)
    return {"key": t.column("key").to_numpy().astype(np.int64, copy=False),
            "count": t.column("count").to_numpy().astype(np.int64, copy=False), "first": first, "last": last,
            "admitted": t.column("admitted").to_numpy(zero_copy_only=False).astype(bool, copy=False)}, days  # fmt: skip


def _concat(pairs) -> tuple[np.ndarray, np.ndarray]:
    pairs = list(pairs)
    if not pairs:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    return np.concatenate([k for k, _ in pairs]), np.concatenate([c for _, c in pairs])


def _read(fs: fsspec.AbstractFileSystem, path: str, columns: list[str] | None) -> pa.Table:
    dates = [c for c in DATE_COLUMNS if columns is None or c in columns]
    with fs.open(path, "rb") as f:  # ParquetFile.read: one chunk per row group (read_table splits them in batches)
        return pq.ParquetFile(f, read_dictionary=dates).read(columns=columns)


def _write(fs: fsspec.AbstractFileSystem, path: str, table: pa.Table, **options) -> None:
    with fs.open(path, "wb") as f:
        pq.write_table(table, f, **{**WRITE_OPTIONS, **options})
