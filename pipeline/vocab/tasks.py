"""Dask tasks of the vocab stage: each reads and writes one events partition or one bucket of keys.

No task holds more than one events partition or one bucket (of every day in
the window plus the previous vocabulary); the driver gets back per-field sums
and cap histograms only.  The files they read and write are `pipeline.vocab.parts`;
the rule a bucket task applies between its reads and writes is `pipeline.vocab.bucket`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import fsspec
import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline.vocab.bucket import (
    BucketRule,
    BucketUpdate,
    MergedRows,
    finish_rows,
    merge_rows,
    pre_cap,
    update_bucket,
)
from pipeline.vocab.cap import Histogram, cap_histograms, cap_mask, score_bits
from pipeline.vocab.counts import count_keys, sum_counts
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
from pipeline.vocab.report import FieldTotals
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
    rule: BucketRule
    """The config as a bucket applies it; with a cap, the merged rows go to scratch before it."""


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
    """Dask task: read `bucket`'s day counts, window and previous state, `update_bucket`, write its parts.

    Without a cap the bucket is final here; with one, its rows (`merge_rows`) go to
    `_scratch/merged` and `finish_bucket` applies the cut once `CapSearch` found it.
    """
    keys, counts = sum_counts(*_concat(read_count_range(fs, p, bucket, plan.buckets) for p in plan.count_parts))
    write_day_counts(fs, join(plan.stage, "day_counts.parquet", part_name(bucket)), keys, counts)
    dropped = None
    if plan.delta and plan.dropped is not None:
        d = read_bucket(fs, plan.dropped, bucket, plan.buckets, ["key", "count"])
        dropped = (d.column("key").to_numpy(), d.column("count").to_numpy())
    window = []
    if not plan.delta:
        for day, source in plan.window:
            t = read_bucket(fs, source, bucket, plan.buckets, ["key", "count"])
            window.append((day, t.column("key").to_numpy(), t.column("count").to_numpy()))
    if plan.delta and not plan.rule.cap:  # delta_vocab keeps the previous part's date dictionary
        prev, days = read_previous_indexed(fs, plan.previous, bucket, plan.buckets)
    else:
        prev, days = read_previous(fs, plan.previous, bucket, plan.buckets), None
    if plan.rule.cap:
        merged = merge_rows(
            date=plan.date,
            today=(keys, counts),
            previous=prev,
            rule=plan.rule,
            window=window,
            dropped=dropped,
            delta=plan.delta,
        )
        write_merged(fs, scratch(plan.stage, "merged", bucket), merged.rows, merged.today)
        return BucketResult(admitted=pre_cap(merged.rows, plan.rule.n_fields), totals=None, day_keys=len(keys))
    out = update_bucket(
        date=plan.date,
        today=(keys, counts),
        previous=prev,
        rule=plan.rule,
        days=days,
        window=window,
        dropped=dropped,
        delta=plan.delta,
    )
    return _write_bucket(fs, plan, bucket, out)


def cap_round(
    bucket: int, *, plan: MergePlan, fs: fsspec.AbstractFileSystem, query: dict[int, tuple[int, int]], shift: int
) -> dict[int, Histogram]:
    """Dask task: this bucket's histograms for one `CapSearch` round."""
    t = read_part(fs, scratch(plan.stage, "merged", bucket), ["field", "score", "admitted"])
    return cap_histograms(
        field=t.column("field").to_numpy(),
        bits=score_bits(t.column("score").to_numpy()),
        admitted=t.column("admitted").to_numpy(zero_copy_only=False),
        query=query,
        shift=shift,
    )


def finish_bucket(
    bucket: int, cuts: dict[int, tuple[int, int]], *, plan: MergePlan, fs: fsspec.AbstractFileSystem
) -> BucketResult:
    """Dask task: apply the cap's cut to this bucket's merged rows (`finish_rows`) and write its parts."""
    t = read_part(fs, scratch(plan.stage, "merged", bucket), None)
    rows = {name: t.column(name).to_numpy() for name in t.column_names}
    today = rows.pop("today")
    admitted = cap_mask(field=rows["field"], bits=score_bits(rows["score"]), admitted=rows["admitted"], cuts=cuts)
    out = finish_rows(
        MergedRows(rows=rows, today=today), admitted, n_fields=plan.rule.n_fields, day_keys=int((today > 0).sum())
    )
    return _write_bucket(fs, plan, bucket, out)


def _write_bucket(fs: fsspec.AbstractFileSystem, plan: MergePlan, bucket: int, out: BucketUpdate) -> BucketResult:
    """The bucket's vocabulary and evicted parts; its numbers for the driver."""
    write_vocab_part(fs, join(plan.stage, "vocab.parquet", part_name(bucket)), out.vocab, days=out.days)
    evicted_rows = write_evicted(fs, scratch(plan.stage, "evicted", bucket), out.evicted)
    return BucketResult(
        admitted=out.admitted,
        totals=out.totals,
        vocab_rows=len(out.vocab["key"]),
        day_keys=out.day_keys,
        evicted_rows=evicted_rows,
    )


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
