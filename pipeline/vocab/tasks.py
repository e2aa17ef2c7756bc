"""Dask tasks of the vocab stage: each reads and writes one events partition or one bucket of keys.

No task holds more than one events partition or one bucket (of every day in
the window plus the previous vocabulary); the driver gets back per-field sums
and cap histograms only.  The files they read and write are `pipeline.vocab.parts`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import fsspec
import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline.vocab.admission import Columns, split_vocab
from pipeline.vocab.cap import Histogram, cap_histograms, cap_mask, score_bits
from pipeline.vocab.counts import count_keys, sum_counts
from pipeline.vocab.delta_merge import delta_combine, delta_vocab
from pipeline.vocab.parts import (
    EVICTED_SCHEMA,
    Bucketed,
    part_name,
    read_bucket,
    read_count_range,
    read_part,
    read_previous,
    read_previous_indexed,
    scratch,
    write_day_counts,
    write_evicted,
    write_merged,
    write_scratch_counts,
    write_vocab_part,
)
from pipeline.vocab.report import FieldTotals, field_totals
from pipeline.vocab.window_merge import combine, window_table
from storage.io.fsio import join


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
    """What a bucket task returns to the driver: per-field numbers and row counts, no keys."""

    admitted: np.ndarray
    """Admitted keys per field before the cap."""
    totals: FieldTotals | None
    """The bucket's report sums (None until the cap is applied)."""
    vocab_rows: int = 0
    """Rows of the bucket's vocabulary part."""
    day_keys: int = 0
    """Distinct keys of D in the bucket (with vocab_rows, the manifest's sizes for the next day's bucket count)."""
    evicted_rows: int = 0
    """Rows of the bucket's `_scratch/evicted` part (none is written when 0)."""


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
    write_scratch_counts(fs, out, counts["key"].to_numpy(np.int64), counts["count"].to_numpy(np.int64))
    return len(counts)


def merge_bucket(bucket: int, *, plan: MergePlan, fs: fsspec.AbstractFileSystem) -> BucketResult:
    """Dask task: day counts of `bucket`, its window and previous state, admission; writes its parts.

    Without a cap the bucket is final here; with one, its rows go to
    `_scratch/merged` and `finish_bucket` applies the cut once `CapSearch` found it.
    """
    keys, counts = sum_counts(*_concat(read_count_range(fs, p, bucket, plan.buckets) for p in plan.count_parts))
    write_day_counts(fs, join(plan.stage, "day_counts.parquet", part_name(bucket)), keys, counts)
    thresholds = np.asarray(plan.thresholds)
    dropped = None
    if plan.delta and plan.dropped is not None:
        d = read_bucket(fs, plan.dropped, bucket, plan.buckets, ["key", "count"])
        dropped = (d.column("key").to_numpy(), d.column("count").to_numpy())
    if plan.delta and not plan.capped:
        prev, days = read_previous_indexed(fs, plan.previous, bucket, plan.buckets)
        out = delta_vocab(date=plan.date, previous=prev, days=days, today=(keys, counts), dropped=dropped,
                          thresholds=thresholds, ttl_days=plan.ttl_days, n_fields=plan.n_fields)
        write_vocab_part(fs, join(plan.stage, "vocab.parquet", part_name(bucket)), out.vocab, days=out.days)
        return BucketResult(admitted=out.totals.admitted, totals=out.totals, vocab_rows=len(out.vocab["key"]),
                            day_keys=len(keys),
                            evicted_rows=write_evicted(fs, scratch(plan.stage, "evicted", bucket), out.evicted))
    prev = read_previous(fs, plan.previous, bucket, plan.buckets)
    if plan.delta:
        merged = delta_combine(date=plan.date, previous=prev, today=(keys, counts), dropped=dropped,
                               thresholds=thresholds, ttl_days=plan.ttl_days)
    else:
        window = [(plan.date, keys, counts)]
        for day, source in plan.window:
            t = read_bucket(fs, source, bucket, plan.buckets, ["key", "count"])
            window.append((day, t.column("key").to_numpy(), t.column("count").to_numpy()))
        merged = combine(date=plan.date, window=window_table(window, end=plan.date, decay=plan.decay), previous=prev,
                         thresholds=thresholds, ttl_days=plan.ttl_days)
    today = np.zeros(len(merged["key"]), np.int64)
    today[np.searchsorted(merged["key"], keys)] = counts
    admitted = np.bincount(merged["field"][merged["admitted"]], minlength=plan.n_fields)[: plan.n_fields]
    if plan.capped:
        write_merged(fs, scratch(plan.stage, "merged", bucket), merged, today)
        return BucketResult(admitted=admitted, totals=None, day_keys=len(keys))
    return _finish(fs, plan, bucket, merged, today, merged["admitted"], len(keys))


def cap_round(bucket: int, *, plan: MergePlan, fs: fsspec.AbstractFileSystem, query: dict[int, tuple[int, int]],
              shift: int) -> dict[int, Histogram]:
    """Dask task: this bucket's histograms for one `CapSearch` round."""
    t = read_part(fs, scratch(plan.stage, "merged", bucket), ["field", "score", "admitted"])
    return cap_histograms(field=t.column("field").to_numpy(), bits=score_bits(t.column("score").to_numpy()),
                          admitted=t.column("admitted").to_numpy(zero_copy_only=False), query=query, shift=shift)


def finish_bucket(bucket: int, cuts: dict[int, tuple[int, int]], *, plan: MergePlan,
                  fs: fsspec.AbstractFileSystem) -> BucketResult:
    """Dask task: apply the cap's cut to this bucket's merged rows and write its parts."""
    t = read_part(fs, scratch(plan.stage, "merged", bucket), None)
    merged = {name: t.column(name).to_numpy() for name in t.column_names}
    admitted = cap_mask(field=merged["field"], bits=score_bits(merged["score"]), admitted=merged["admitted"], cuts=cuts)
    today = merged["today"]
    return _finish(fs, plan, bucket, merged, today, admitted, int((today > 0).sum()))


def _finish(fs: fsspec.AbstractFileSystem, plan: MergePlan, bucket: int, merged: Columns, today: np.ndarray, admitted: np.ndarray,
            day_keys: int) -> BucketResult:
    vocab, gone = split_vocab(merged, admitted)
    write_vocab_part(fs, join(plan.stage, "vocab.parquet", part_name(bucket)), vocab)
    evicted_rows = write_evicted(fs, scratch(plan.stage, "evicted", bucket), gone)
    totals = field_totals(field=merged["field"], count=merged["count"], admitted=admitted,
                          evicted=merged["was_admitted"] & ~admitted, today=today,
                          was_admitted=merged["was_admitted"], n_fields=plan.n_fields)
    pre_cap = np.bincount(merged["field"][merged["admitted"]], minlength=plan.n_fields)[: plan.n_fields]
    return BucketResult(admitted=pre_cap, totals=totals, vocab_rows=len(vocab["key"]), day_keys=day_keys,
                        evicted_rows=evicted_rows)


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


def _concat(pairs) -> tuple[np.ndarray, np.ndarray]:
    pairs = list(pairs)
    if not pairs:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    return np.concatenate([k for k, _ in pairs]), np.concatenate([c for _, c in pairs])
