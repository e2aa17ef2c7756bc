"""Feature vocabulary logic (pure pandas/NumPy): counting, windows, admission, eviction.

A vocabulary for day D decides which keys get their own embedding:

- day counts: how often each (non-missing) key occurs in D's events;
- windowed counts: the sum of the day counts of the last `window_days` days
  ending at D.  Each day is counted once, ever: the stage keeps day counts and
  a daily run only counts D and merges;
- score: the windowed count with optional decay, sum of count_d * decay**(D - d)
  (decay = 1: score == count);
- admission is sticky: a key is admitted once its score reaches its field's
  min_count (`min_count_per_field` overrides `min_count`), and stays admitted
  (its embedding stays in the store) until it has been unseen for more than
  `ttl_days`, when it is evicted;
- a per-field cap (`max_keys_per_field`) keeps only the highest-scoring
  admitted keys (ties: smaller key); keys pushed out are evicted too;
- first_seen / last_seen carry over from the previous vocabulary, so both
  decisions are incremental.

The vocabulary table holds every key with a windowed count > 0 plus every key
still admitted; keys that are neither are forgotten.

Every step below is per key except the cap, so the stage runs them on one
bucket of keys at a time (`pipeline.vocab_merge`); `update_vocab` runs them on
a whole table at once and is the specification the bucketed run must match.
The steps work on `Columns` (name -> NumPy array, no pandas: a bucket task
spends its time in NumPy and Parquet, not in building frames).  Dates are day
numbers (days since 1970-01-01, int64) inside this module and YYYY-MM-DD
strings in the tables it returns.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa

from pipeline.config import VocabConfig
from pipeline.keys import FIELD_SHIFT, MAX_FIELDS, factorize_keys, field_of

Columns = dict[str, np.ndarray]
"""A table as name -> equally long NumPy arrays."""
VOCAB_COLUMNS = ("field", "key", "count", "score", "first_seen", "last_seen", "admitted")
NO_DAY_MIN = np.iinfo(np.int64).max
"""Placeholder first day of a key absent from one side of a merge (loses every min)."""
NO_DAY_MAX = np.iinfo(np.int64).min
"""Placeholder last day of a key absent from one side of a merge (loses every max)."""


@dataclass(frozen=True, slots=True)
class VocabUpdate:
    vocab: pd.DataFrame
    """field int16, key int64, count int64 (windowed), score float64 (decayed count), first_seen,
    last_seen (YYYY-MM-DD), admitted bool; sorted by key."""
    evicted: pd.DataFrame
    """field int16, key int64, last_seen: keys admitted before D and dropped by the TTL or the cap."""


@dataclass(frozen=True, slots=True)
class FieldTotals:
    """Per-field sums behind the report, one int64 entry per field index; buckets add up."""

    seen: np.ndarray
    admitted: np.ndarray
    evicted: np.ndarray
    covered: np.ndarray
    """Today's occurrences of admitted keys."""
    present: np.ndarray
    """Today's occurrences of non-missing values."""

    @staticmethod
    def zeros(n_fields: int) -> FieldTotals:
        return FieldTotals(*(np.zeros(n_fields, np.int64) for _ in range(5)))

    def __add__(self, other: FieldTotals) -> FieldTotals:
        return FieldTotals(*(a + b for a, b in zip(self._parts(), other._parts(), strict=True)))

    def _parts(self) -> tuple[np.ndarray, ...]:
        return (self.seen, self.admitted, self.evicted, self.covered, self.present)


def count_keys(events: pd.DataFrame, fields: Sequence[str]) -> pd.DataFrame:
    """(field, key, count) of the non-missing values of `fields` (field index = position in `fields`).

    Missing values are not counted: their key always exists.

    Args:
        events: events rows (a partition or a whole day), or any mapping of column
            name -> values; a multi-valued field is passed flattened (one entry per value).
        fields: categorical column names in field-index order.

    Returns:
        One row per distinct key, sorted by key.
    """
    frames = []
    for j, name in enumerate(fields):
        codes, keys = factorize_keys(j, events[name])
        counts = np.bincount(codes[codes >= 0], minlength=len(keys)).astype(np.int64)
        frames.append(pd.DataFrame({"key": keys, "count": counts}))
    return merge_counts(frames)


def merge_counts(frames: Iterable[pd.DataFrame]) -> pd.DataFrame:
    """Sum (field, key, count) frames, e.g. per-partition counts into a day's, sorted by key."""
    frames = [f[["key", "count"]] for f in frames if len(f)]
    if not frames:
        return _counts_frame(np.empty(0, np.int64), np.empty(0, np.int64))
    keys, counts = sum_counts(
        np.concatenate([f["key"].to_numpy(np.int64) for f in frames]),
        np.concatenate([f["count"].to_numpy(np.int64) for f in frames]),
    )
    positive = counts > 0
    return _counts_frame(keys[positive], counts[positive])


def sum_counts(keys: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(distinct keys sorted, summed int64 counts) of parallel key/count arrays (exact integer sums)."""
    keys = np.asarray(keys, dtype=np.int64)
    if not len(keys):
        return keys, np.asarray(counts, dtype=np.int64)
    order = np.argsort(keys, kind="stable")
    k = keys[order]
    starts = np.flatnonzero(np.r_[True, k[1:] != k[:-1]])
    return k[starts], np.add.reduceat(np.asarray(counts, dtype=np.int64)[order], starts)


def window_counts(day_counts: Mapping[str, pd.DataFrame], *, date: str | None = None, decay: float = 1.0) -> pd.DataFrame:
    """Sum day counts over dates: (field, key, count, score, first_date, last_date) of the window.

    Args:
        day_counts: date (YYYY-MM-DD) -> that day's (field, key, count).
        date: the run date the decay counts from (default: the latest date given).
        decay: a day k days before `date` adds decay**k * count to `score`.
    """
    end = day_number(date or max(day_counts)) if day_counts else 0
    days = [(day_number(d), f["key"].to_numpy(np.int64), f["count"].to_numpy(np.int64)) for d, f in day_counts.items()]
    w = window_table(days, end=end, decay=decay)
    out = _counts_frame(w["key"], w["count"])
    out["score"] = w["score"]
    out["first_date"] = day_strings(w["first"])
    out["last_date"] = day_strings(w["last"])
    return out


def window_table(days: Iterable[tuple[int, np.ndarray, np.ndarray]], *, end: int, decay: float) -> Columns:
    """key, count, score, first, last (day numbers) of (day, keys, counts) day counts; sorted by key.

    With decay < 1 the scores are summed by pandas' groupby in day order, the
    way every earlier version did, so a bucket of keys gets bit-identical
    floats to the whole table (the cap compares them for equality).
    """
    chunks = [(int(d), np.asarray(k, np.int64), np.asarray(c, np.int64)) for d, k, c in sorted(days, key=lambda t: t[0])]
    chunks = [c for c in chunks if len(c[1])]
    if not chunks:
        return {"key": np.empty(0, np.int64), "count": np.empty(0, np.int64), "score": np.empty(0, np.float64),
                "first": np.empty(0, np.int64), "last": np.empty(0, np.int64)}  # fmt: skip
    keys = np.concatenate([k for _, k, _ in chunks])
    counts = np.concatenate([c for _, _, c in chunks])
    day = np.concatenate([np.full(len(k), d, np.int64) for d, k, _ in chunks])
    order = np.argsort(keys, kind="stable")  # stable: each key's days stay in date order
    k = keys[order]
    starts = np.flatnonzero(np.r_[True, k[1:] != k[:-1]])
    total = np.add.reduceat(counts[order], starts)
    if decay == 1.0:
        score = total.astype(np.float64)  # integer sums below 2**53 are exact whatever the order
    else:
        weighted = np.concatenate([c.astype(np.float64) * decay ** (end - d) for d, _, c in chunks])
        score = pd.Series(weighted).groupby(keys, sort=True).sum().to_numpy(np.float64)
    return {"key": k[starts], "count": total, "score": score, "first": np.minimum.reduceat(day[order], starts),
            "last": np.maximum.reduceat(day[order], starts)}  # fmt: skip


def delta_combine(
    *,
    date: int,
    previous: Columns,
    today: tuple[np.ndarray, np.ndarray],
    dropped: tuple[np.ndarray, np.ndarray] | None,
    thresholds: np.ndarray,
    ttl_days: int,
) -> Columns:
    """`combine` for a window of previous count + today - the day that left it (decay = 1 only).

    Valid only when the previous vocabulary is of date - 1 and its window held
    the same day counts as this one except `dropped` (the stage checks the run
    ids).  Every input is sorted by key, so this is one merge of sorted arrays:
    the previous vocabulary's rows are placed into the union with today's keys,
    today's counts added and the dropped day's subtracted, without sorting or
    searching the previous rows.  Equal to `combine(window_table(...), previous)`
    (`tests/pipeline/test_vocab_buckets.py`).

    Args:
        date: the run date D (day number).
        previous: key (sorted), count, first, last (day numbers), admitted of the vocabulary of D - 1.
        today: (sorted keys, counts) of D.
        dropped: (sorted keys, counts) of D - window_days, or None when that day was not in the window.
        thresholds, ttl_days: as in `combine`.

    Returns:
        The same columns as `combine`.

    Raises:
        ValueError: a count went negative, or the dropped day holds a key the previous
            vocabulary lacks: the day counts do not match the previous vocabulary.
    """
    pk = np.asarray(previous["key"], np.int64)
    tk, tc = np.asarray(today[0], np.int64), np.asarray(today[1], np.int64)
    at = np.searchsorted(pk, tk)  # today's keys are few: searching them in the previous keys is cheap
    found = _found(pk, tk, at)
    # The union is the previous keys with the keys new today inserted before pk[new_at] (as np.insert
    # does): the new keys land at inew, the previous ones fill the rest (`old`) in their order.
    new_at = at[~found]
    inew = new_at + np.arange(len(new_at))
    n = len(pk) + len(new_at)
    old = np.ones(n, bool)
    old[inew] = False

    def spread(prev: np.ndarray, new, dtype) -> np.ndarray:
        out = np.empty(n, dtype)
        out[old] = prev
        out[inew] = new
        return out

    def union_at(positions: np.ndarray) -> np.ndarray:  # previous-key positions -> union positions
        return positions + np.searchsorted(new_at, positions, side="right")

    it = np.empty(len(tk), np.int64)  # where today's keys are in the union
    it[found] = union_at(at[found])
    it[~found] = inew
    keys = spread(pk, tk[~found], np.int64)
    count = spread(previous["count"], 0, np.int64)
    count[it] += tc
    if dropped is not None and len(dropped[0]):
        dk = np.asarray(dropped[0], np.int64)
        dat = np.searchsorted(pk, dk)
        if not _found(pk, dk, dat).all():
            raise _negative(date)
        count[union_at(dat)] -= np.asarray(dropped[1], np.int64)
    if (count < 0).any():
        raise _negative(date)
    first = spread(previous["first"], date, np.int64)
    first[it] = np.minimum(first[it], date)
    last = spread(previous["last"], date, np.int64)
    last[it] = np.maximum(last[it], date)
    was = spread(previous["admitted"], False, bool)
    return _admit(date=date, keys=keys, count=count, score=count.astype(np.float64), first=first, last=last, was=was,
                  thresholds=thresholds, ttl_days=ttl_days)  # fmt: skip


@dataclass(frozen=True, slots=True)
class DeltaVocab:
    """One bucket's final (uncapped) vocabulary from `delta_vocab`, dates as indices into `days`."""

    vocab: Columns
    """field, key, count, score, first_seen, last_seen, admitted (as `split_vocab`); the two dates are
    int32 indices into `days`, the way a dictionary-encoded Parquet column stores them."""
    days: np.ndarray
    """int64 day numbers of the date indices (the dictionary)."""
    evicted: Columns
    """field, key, last_seen (day numbers) of the keys evicted at the run date."""
    totals: FieldTotals


def date_indices(dates: pa.ChunkedArray | pa.Array | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(int32 indices, int64 day numbers they point to) of a date column.

    A dictionary column as a vocabulary part is read (one chunk) costs no per-row
    parsing; anything else (plain or large strings, date32, day numbers, several
    chunks) goes through its day numbers.
    """
    if isinstance(dates, pa.ChunkedArray) and dates.num_chunks == 1:
        dates = dates.chunk(0)
    if isinstance(dates, pa.Array) and pa.types.is_dictionary(dates.type) and dates.null_count == 0:
        return dates.indices.to_numpy(zero_copy_only=False).astype(np.int32, copy=False), day_numbers(dates.dictionary)
    numbers = dates if isinstance(dates, np.ndarray) and dates.dtype == np.int64 else day_numbers(dates)
    d = day_dictionary(numbers)
    return d.indices.to_numpy(zero_copy_only=False), day_numbers(d.dictionary)


def delta_vocab(
    *,
    date: int,
    previous: Columns,
    days: np.ndarray,
    today: tuple[np.ndarray, np.ndarray],
    dropped: tuple[np.ndarray, np.ndarray] | None,
    thresholds: np.ndarray,
    ttl_days: int,
    n_fields: int,
) -> DeltaVocab:
    """`delta_combine` + `split_vocab` + `field_totals` in one pass, for a merge without a cap.

    Works in the previous vocabulary's row order: today's and the dropped day's
    counts are added at their (searched) rows, admission is decided per field
    slice, and only then the kept rows and today's new keys are laid out once per
    output column.  Dates stay indices into `days` (the previous part's date
    dictionary, plus the run date), so no date is parsed or formatted per row.
    Equal to `split_vocab(delta_combine(...))` (`tests/pipeline/test_vocab_buckets.py`).

    Args:
        date: the run date D (day number).
        previous: key (sorted), count, first, last (int32 indices into `days`), admitted of D - 1's vocabulary.
        days: int64 day numbers of the date indices.
        today, dropped, thresholds, ttl_days: as in `delta_combine`.
        n_fields: fields 0..n_fields-1 are reported in `totals`.

    Raises:
        ValueError: as `delta_combine`.
    """
    pk = np.asarray(previous["key"], np.int64)
    tk, tc = np.asarray(today[0], np.int64), np.asarray(today[1], np.int64)
    at = np.searchsorted(pk, tk)
    found = _found(pk, tk, at)
    seen_at = at[found]  # previous rows seen today
    new = ~found & (tc > 0)  # (a count of 0 would be neither seen nor kept)
    new_at, nk, nc = at[new], tk[new], tc[new]
    count = np.array(previous["count"], np.int64)  # a copy: updated in place
    count[seen_at] += tc[found]
    if dropped is not None and len(dropped[0]):
        dk = np.asarray(dropped[0], np.int64)
        dat = np.searchsorted(pk, dk)
        if not _found(pk, dk, dat).all():
            raise _negative(date)
        count[dat] -= np.asarray(dropped[1], np.int64)
        if count[dat].min() < 0:  # only these rows went down
            raise _negative(date)

    days = np.asarray(days, np.int64)
    hit = np.flatnonzero(days == date)
    if len(hit):
        today_index = int(hit[0])
    else:
        days, today_index = np.append(days, date), len(days)
    first = np.asarray(previous["first"], np.int32)
    last = np.array(previous["last"], np.int32)
    if len(seen_at):
        later = days[first[seen_at]] > date  # never for a previous vocabulary of D - 1; kept for equality
        if later.any():
            first = first.copy()
            first[seen_at[later]] = today_index
        earlier = days[last[seen_at]] <= date
        last[seen_at[earlier]] = today_index

    # admission, per field slice (keys sorted: a field is a contiguous range)
    limit = np.asarray(thresholds, np.float64) - 1e-9  # decayed sums are floats (here: exact integer counts)
    starts = _field_starts(pk)
    by_count = np.empty(len(pk), bool)
    for f, s, e in starts:
        np.greater_equal(count[s:e], limit[f], out=by_count[s:e])
    was = np.asarray(previous["admitted"], bool)
    stale = days < date - ttl_days  # unseen for more than ttl_days
    if stale.any():
        expired = was & stale[last] & ~by_count
        admitted = by_count | (was & ~expired)
    else:
        expired, admitted = None, by_count | was
    new_field = field_of(nk)
    new_admitted = nc >= limit[new_field]

    keep = (count > 0) | admitted
    kept = None if keep.all() else np.flatnonzero(keep)
    n_kept = len(pk) if kept is None else len(kept)
    inew = (new_at if kept is None else np.searchsorted(kept, new_at)) + np.arange(len(nk))
    placed = np.ones(n_kept + len(nk), bool)
    placed[inew] = False
    dest = np.flatnonzero(placed)  # where the kept previous rows go

    def lay_out(prev: np.ndarray, fresh, dtype) -> np.ndarray:
        out = np.empty(len(placed), dtype)
        out[dest] = prev if kept is None else prev[kept]
        out[inew] = fresh
        return out

    keys = lay_out(pk, nk, np.int64)
    out_count = lay_out(count, nc, np.int64)
    vocab = {"field": field_of(keys).astype(np.int16), "key": keys, "count": out_count,
             "score": out_count.astype(np.float64), "first_seen": lay_out(first, today_index, np.int32),
             "last_seen": lay_out(last, today_index, np.int32),
             "admitted": lay_out(admitted, new_admitted, bool)}  # fmt: skip

    gone = np.empty(0, np.int64) if expired is None else np.flatnonzero(expired)  # no cap: evicted = expired
    evicted = {"field": field_of(pk[gone]).astype(np.int16), "key": pk[gone], "last_seen": days[last[gone]]}
    on_field = field_of(tk)
    today_admitted = np.zeros(len(tk), bool)
    today_admitted[found] = admitted[seen_at]
    today_admitted[new] = new_admitted
    weights = tc.astype(np.float64)
    totals = FieldTotals(
        seen=_per_field(starts, count > 0, n_fields) + _by_field(new_field, None, n_fields),
        admitted=_per_field(starts, admitted, n_fields) + _by_field(new_field, new_admitted, n_fields),
        evicted=_by_field(evicted["field"], None, n_fields),
        covered=_by_field(on_field, today_admitted, n_fields, weights),
        present=_by_field(on_field, None, n_fields, weights),
    )
    return DeltaVocab(vocab=vocab, days=days, evicted=evicted, totals=totals)


def _field_starts(sorted_keys: np.ndarray) -> list[tuple[int, int, int]]:
    """(field, start, end) of each field's range of rows in sorted keys (fields present only)."""
    if not len(sorted_keys):
        return []
    lo, hi = int(field_of(int(sorted_keys[0]))), int(field_of(int(sorted_keys[-1])))
    edges = np.searchsorted(sorted_keys, np.arange(lo + 1, hi + 1, dtype=np.int64) << FIELD_SHIFT)
    bounds = [0, *edges.tolist(), len(sorted_keys)]
    return [(f, bounds[i], bounds[i + 1]) for i, f in enumerate(range(lo, hi + 1)) if bounds[i + 1] > bounds[i]]


def _per_field(starts: list[tuple[int, int, int]], mask: np.ndarray, n_fields: int) -> np.ndarray:
    """True entries of `mask` per field 0..n_fields-1, given `_field_starts` of its rows."""
    out = np.zeros(n_fields, np.int64)
    for f, s, e in starts:
        if f < n_fields:
            out[f] = np.count_nonzero(mask[s:e])
    return out


def _found(sorted_keys: np.ndarray, keys: np.ndarray, at: np.ndarray) -> np.ndarray:
    """Whether each of `keys` is in `sorted_keys`, given at = np.searchsorted(sorted_keys, keys)."""
    found = at < len(sorted_keys)
    found[found] = sorted_keys[at[found]] == keys[found]
    return found


def _negative(date: int) -> ValueError:
    return ValueError(f"vocabulary of {day_strings(np.array([date]))[0]}: a windowed count went negative; the kept "
                      "day counts do not match the previous vocabulary; rebuild with incremental=False")  # fmt: skip


def combine(*, date: int, window: Columns, previous: Columns, thresholds: np.ndarray, ttl_days: int) -> Columns:
    """Window counts + the previous vocabulary -> every key's state before the cap.

    Args:
        date: the run date D (day number).
        window: `window_table` rows: key, count, score, first, last.
        previous: key, first, last (day numbers), admitted of the previous vocabulary.
        thresholds: admission score per field index (length MAX_FIELDS).
        ttl_days: an admitted key unseen for more days than this (and below its threshold) is evicted.

    Returns:
        key (sorted), field, count, score, first_seen, last_seen (day numbers), was_admitted, admitted.
    """
    wk, pk = np.asarray(window["key"], np.int64), np.asarray(previous["key"], np.int64)
    keys = _union(wk, pk)
    iw, ip = np.searchsorted(keys, wk), np.searchsorted(keys, pk)
    count = np.zeros(len(keys), np.int64)
    count[iw] = window["count"]
    score = np.zeros(len(keys), np.float64)
    score[iw] = window["score"]
    first = np.full(len(keys), NO_DAY_MIN, np.int64)
    first[iw] = window["first"]
    first[ip] = np.minimum(first[ip], previous["first"])
    last = np.full(len(keys), NO_DAY_MAX, np.int64)
    last[iw] = window["last"]
    last[ip] = np.maximum(last[ip], previous["last"])
    was = np.zeros(len(keys), bool)
    was[ip] = previous["admitted"]
    return _admit(date=date, keys=keys, count=count, score=score, first=first, last=last, was=was,
                  thresholds=thresholds, ttl_days=ttl_days)  # fmt: skip


def _admit(*, date: int, keys: np.ndarray, count: np.ndarray, score: np.ndarray, first: np.ndarray, last: np.ndarray,
           was: np.ndarray, thresholds: np.ndarray, ttl_days: int) -> Columns:  # fmt: skip
    """`combine`'s columns: admission by score, kept while within the TTL."""
    field = field_of(keys).astype(np.int16)
    by_count = score >= (thresholds - 1e-9)[field]  # decayed sums are floats
    expired = was & (last < date - ttl_days) & ~by_count  # unseen for more than ttl_days
    return {"key": keys, "field": field, "count": count, "score": score, "first_seen": first, "last_seen": last,
            "was_admitted": was, "admitted": by_count | (was & ~expired)}  # fmt: skip


def admission_thresholds(config: VocabConfig, fields: Sequence[str]) -> np.ndarray:
    """min_count per field index (per-field overrides applied), length MAX_FIELDS.

    Raises:
        ValueError: `min_count_per_field` names a field not in `fields`.
    """
    unknown = sorted(set(config.min_count_per_field) - set(fields))
    if unknown:
        raise ValueError(f"vocab.min_count_per_field names unknown fields {unknown}; fields are {list(fields)}")
    thresholds = np.full(MAX_FIELDS, config.min_count, dtype=np.float64)
    for j, name in enumerate(fields):
        thresholds[j] = config.min_count_of(name)
    return thresholds


def split_vocab(merged: Columns, admitted: np.ndarray) -> tuple[Columns, Columns]:
    """The vocabulary and evicted rows of `combine`'s columns with the final (capped) admission.

    Kept: keys with a windowed count > 0 or admitted; evicted: admitted before, not now.

    Returns:
        (field, key, count, score, first_seen, last_seen, admitted) of the kept keys and
        (field, key, last_seen) of the evicted ones; dates are day numbers.
    """
    count = merged["count"]
    evicted = merged["was_admitted"] & ~admitted
    keep = (count > 0) | admitted
    vocab = {"field": merged["field"][keep], "key": merged["key"][keep], "count": count[keep],
             "score": merged["score"][keep], "first_seen": merged["first_seen"][keep],
             "last_seen": merged["last_seen"][keep], "admitted": admitted[keep]}  # fmt: skip
    gone = {"field": merged["field"][evicted], "key": merged["key"][evicted], "last_seen": merged["last_seen"][evicted]}
    return vocab, gone


def dated_frame(columns: Columns) -> pd.DataFrame:
    """`split_vocab` columns as a frame with YYYY-MM-DD dates (the tables `update_vocab` returns)."""
    return pd.DataFrame({name: day_strings(v) if name in ("first_seen", "last_seen") else v
                         for name, v in columns.items()})  # fmt: skip


def update_vocab(
    *,
    date: str,
    window: pd.DataFrame,
    previous: pd.DataFrame | None,
    config: VocabConfig,
    fields: Sequence[str] = (),
) -> VocabUpdate:
    """The vocabulary of `date` from its window counts and the previous vocabulary, in one table.

    Args:
        date: the run date D.
        window: `window_counts` of the days of the window ending at D.
        previous: the most recent vocabulary before D, or None on the first day.
        config: min_count (+ per-field overrides), ttl_days, max_keys_per_field.
        fields: categorical column names in field-index order (needed for
            `min_count_per_field`; a name there that is not a field is an error).

    Returns:
        The new vocabulary and the keys evicted at D: previously admitted keys
        no longer admitted, because their last_seen is more than ttl_days
        before D and their score is below min_count, or because the per-field
        cap pushed them out.

    Raises:
        ValueError: `min_count_per_field` names a field not in `fields`.
    """
    thresholds = admission_thresholds(config, fields)
    if "score" not in window:
        window = window.assign(score=window["count"].astype(np.float64))
    w = {"key": window["key"].to_numpy(np.int64), "count": window["count"].to_numpy(np.int64),
         "score": window["score"].to_numpy(np.float64), "first": day_numbers(window["first_date"]),
         "last": day_numbers(window["last_date"])}  # fmt: skip
    merged = combine(date=day_number(date), window=w, previous=previous_state(previous), thresholds=thresholds,
                     ttl_days=config.ttl_days)  # fmt: skip
    admitted = merged["admitted"]
    if config.max_keys_per_field:
        admitted = admitted & _within_cap(merged["field"], merged["key"], merged["score"], admitted,
                                          config.max_keys_per_field)  # fmt: skip
    vocab, evicted = split_vocab(merged, admitted)
    return VocabUpdate(vocab=dated_frame(vocab), evicted=dated_frame(evicted))


def previous_state(previous: pd.DataFrame | pa.Table | None) -> Columns:
    """key, count, first, last (day numbers), admitted of a stored vocabulary table (None: empty)."""
    if previous is None:
        return {"key": np.empty(0, np.int64), "count": np.empty(0, np.int64), "first": np.empty(0, np.int64),
                "last": np.empty(0, np.int64), "admitted": np.empty(0, bool)}  # fmt: skip
    if isinstance(previous, pa.Table):
        def col(name: str) -> np.ndarray:
            return previous.column(name).to_numpy()
    else:
        def col(name: str) -> np.ndarray:
            return previous[name].to_numpy()
    return {"key": col("key").astype(np.int64, copy=False), "count": col("count").astype(np.int64, copy=False),
            "first": day_numbers(previous["first_seen"]), "last": day_numbers(previous["last_seen"]),
            "admitted": col("admitted").astype(bool, copy=False)}  # fmt: skip


def _within_cap(field: np.ndarray, keys: np.ndarray, score: np.ndarray, admitted: np.ndarray, cap: int) -> np.ndarray:
    """Mask of the keys that are among the `cap` highest-scoring admitted keys of their field."""
    idx = np.flatnonzero(admitted)
    order = np.lexsort((keys[idx], -score[idx], field[idx]))  # by field, score desc, key asc
    ranked = idx[order]
    f = field[ranked]
    starts = np.flatnonzero(np.r_[True, f[1:] != f[:-1]]) if len(f) else np.empty(0, np.int64)
    rank = np.arange(len(ranked)) - np.repeat(starts, np.diff(np.r_[starts, len(ranked)]))
    out = np.zeros(len(keys), dtype=bool)
    out[ranked[rank < cap]] = True
    return out


def field_totals(
    *, field: np.ndarray, count: np.ndarray, admitted: np.ndarray, evicted: np.ndarray, today: np.ndarray, n_fields: int
) -> FieldTotals:
    """Report sums of a set of keys (a bucket or the whole table) for fields 0..n_fields-1.

    Args:
        field, count, admitted, evicted: per key (after the cap).
        today: the key's count on the run date (0 when not seen today).
    """
    on = np.flatnonzero(today)  # the keys seen today: few, so today's sums only look at them
    weights, today_field = today[on].astype(np.float64), field[on]
    return FieldTotals(seen=_by_field(field, count > 0, n_fields), admitted=_by_field(field, admitted, n_fields),
                       evicted=_by_field(field, evicted, n_fields),
                       covered=_by_field(today_field, admitted[on], n_fields, weights),
                       present=_by_field(today_field, None, n_fields, weights))  # fmt: skip


def _by_field(field: np.ndarray, mask: np.ndarray | None, n_fields: int, weights: np.ndarray | None = None) -> np.ndarray:
    """Keys (or the sum of `weights`) per field 0..n_fields-1 among `mask`, int64."""
    if mask is not None:
        field, weights = field[mask], None if weights is None else weights[mask]
    return np.bincount(field, weights=weights, minlength=n_fields)[:n_fields].astype(np.int64)


def field_stats(
    *,
    vocab: pd.DataFrame,
    evicted: pd.DataFrame,
    day_counts: pd.DataFrame,
    day_rows: int,
    fields: Sequence[str],
    multi_valued: Sequence[str] = (),
) -> list[dict]:
    """Per-field summary of a whole vocabulary table (see `stats_from_totals`)."""
    keys = vocab["key"].to_numpy(np.int64)
    idx = np.searchsorted(keys, day_counts["key"].to_numpy(np.int64)) if len(keys) else np.zeros(0, np.int64)
    today = np.zeros(len(keys), np.int64)
    today[idx] = day_counts["count"].to_numpy(np.int64)  # every key counted today is in the vocabulary
    totals = field_totals(field=vocab["field"].to_numpy(), count=vocab["count"].to_numpy(np.int64),
                          admitted=vocab["admitted"].to_numpy(bool), evicted=np.zeros(len(keys), bool), today=today,
                          n_fields=len(fields))  # fmt: skip
    n_evicted = np.bincount(evicted["field"].to_numpy(np.int64), minlength=len(fields))[: len(fields)]
    totals = FieldTotals(totals.seen, totals.admitted, n_evicted.astype(np.int64), totals.covered, totals.present)
    return stats_from_totals(totals, day_rows=day_rows, fields=fields, multi_valued=multi_valued)


def stats_from_totals(
    totals: FieldTotals, *, day_rows: int, fields: Sequence[str], multi_valued: Sequence[str] = ()
) -> list[dict]:
    """Per-field summary of a vocabulary for the manifest, the report and the flow's metrics.

    seen: keys with a windowed count > 0; admitted / evicted: key counts;
    coverage: share of the day's rows whose value is admitted; oov_rate: share
    whose non-missing value is not; missing_rate: the rest.  For a
    multi-valued field coverage and oov_rate are shares of the day's values
    (not rows) and missing_rate is None.
    """
    rows = max(day_rows, 1)
    out = []
    for j, name in enumerate(fields):
        covered, present = int(totals.covered[j]), int(totals.present[j])
        if name in multi_valued:
            values = max(present, 1)
            cov, pres, missing = covered / values, 1.0, None
        else:
            cov, pres = covered / rows, present / rows
            missing = round(1.0 - pres, 6)
        out.append({"field": name, "seen": int(totals.seen[j]), "admitted": int(totals.admitted[j]),
                    "evicted": int(totals.evicted[j]), "coverage": round(cov, 6),
                    "oov_rate": round(pres - cov, 6), "missing_rate": missing})  # fmt: skip
    return out


def report_markdown(date: str, stats: Sequence[dict], *, window_dates: Sequence[str], config: VocabConfig) -> str:
    """A short markdown summary of a vocabulary (`report.md`) for the flow to publish."""
    admitted = sum(s["admitted"] for s in stats)
    seen = sum(s["seen"] for s in stats)
    evicted = sum(s["evicted"] for s in stats)
    worst = sorted(stats, key=lambda s: s["oov_rate"], reverse=True)[:5]
    lines = [
        f"# Vocabulary {date}",
        "",
        f"Window: {', '.join(window_dates)} (window_days={config.window_days}, decay={config.decay}); "
        f"min_count={config.min_count}"
        + (f", per field {dict(config.min_count_per_field)}" if config.min_count_per_field else "")
        + f"; ttl_days={config.ttl_days}"
        + (f"; max_keys_per_field={config.max_keys_per_field}" if config.max_keys_per_field else ""),
        "",
        f"**{admitted:,}** keys admitted of {seen:,} seen; **{evicted:,}** evicted.",
        "",
        "| field | seen | admitted | evicted | coverage | OOV rate | missing |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for s in stats:
        missing = "-" if s["missing_rate"] is None else f"{s['missing_rate']:.2%}"
        lines.append(
            f"| {s['field']} | {s['seen']:,} | {s['admitted']:,} | {s['evicted']:,} | {s['coverage']:.2%} "
            f"| {s['oov_rate']:.2%} | {missing} |"
        )
    lines += ["", "Highest OOV rates: " + ", ".join(f"{s['field']} {s['oov_rate']:.2%}" for s in worst), ""]
    return "\n".join(lines)


def day_number(date: str) -> int:
    """YYYY-MM-DD -> days since 1970-01-01."""
    return int(np.datetime64(date, "D").astype(np.int64))


def day_numbers(dates) -> np.ndarray:
    """YYYY-MM-DD dates -> int64 day numbers.

    Accepts strings (a Series, array or Arrow column; Arrow parses them in C++),
    dictionary-encoded strings (each distinct date parsed once: how vocabulary
    parts are read) and Arrow date32.
    """
    if isinstance(dates, pa.ChunkedArray):
        parts = [day_numbers(c) for c in dates.chunks]
        return np.concatenate(parts) if parts else np.empty(0, np.int64)
    arr = dates if isinstance(dates, pa.Array) else pa.array(np.asarray(dates, dtype=object), type=pa.large_string())
    if len(arr) == 0:
        return np.empty(0, np.int64)
    if pa.types.is_dictionary(arr.type):
        return day_numbers(arr.dictionary)[arr.indices.to_numpy(zero_copy_only=False)]
    if not pa.types.is_date32(arr.type):
        arr = arr.cast(pa.date32())
    return arr.to_numpy(zero_copy_only=False).astype("datetime64[D]").astype(np.int64)


def day_dictionary(days: np.ndarray) -> pa.DictionaryArray:
    """int64 day numbers -> YYYY-MM-DD strings as an Arrow dictionary array (one string per distinct day).

    Parquet stores it as a plain string column; writing it costs no string
    building or hashing per row (a vocabulary part has a few dozen distinct dates).
    """
    days = np.asarray(days, dtype=np.int64)
    if not len(days):
        return pa.DictionaryArray.from_arrays(pa.array([], pa.int32()), pa.array([], pa.string()))
    lo, hi = int(days.min()), int(days.max())
    if hi - lo < 1 << 16:
        names, indices = np.arange(lo, hi + 1), days - lo
    else:
        names, indices = np.unique(days, return_inverse=True)
    text = pa.array(names.astype("datetime64[D]")).cast(pa.string())
    return pa.DictionaryArray.from_arrays(pa.array(indices.astype(np.int32)), text)


def day_strings(days: np.ndarray) -> pd.Series:
    """int64 day numbers -> YYYY-MM-DD strings (a pandas str Series)."""
    days = np.asarray(days, dtype=np.int64)
    if len(days) and int(days.max()) - int(days.min()) < 1 << 16:  # few distinct days: format each once, then take
        lo = int(days.min())
        names = pa.array(np.arange(lo, int(days.max()) + 1).astype("datetime64[D]")).cast(pa.large_string())
        return names.take(pa.array(days - lo)).to_pandas()
    return pa.array(days.astype("datetime64[D]")).cast(pa.large_string()).to_pandas()


def _union(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Sorted distinct keys of two arrays (np.union1d's hash-based unique is ~15x slower on int64 keys)."""
    c = np.sort(np.concatenate([a, b]), kind="stable")  # two sorted runs: a merge
    return c[np.r_[True, c[1:] != c[:-1]]] if len(c) else c


def _counts_frame(keys: np.ndarray, counts: np.ndarray) -> pd.DataFrame:
    return pd.DataFrame({"field": field_of(keys).astype(np.int16), "key": keys, "count": counts})
