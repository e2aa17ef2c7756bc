"""The delta merge: the window of D is the previous vocabulary's + D's counts - the day that left it.

Valid only when decay is 1, the previous vocabulary is of D - 1 and its window
held exactly the same day counts except the dropped day (the stage checks the
run ids).  A daily run then reads three inputs per bucket (previous part, D's
counts, the dropped day's counts) instead of every day of the window.  Every
input is sorted by key, so the merge places the previous rows into the union
with today's keys without sorting or searching them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.encode.keys import FIELD_SHIFT, field_of
from pipeline.vocab.admission import Columns, admit
from pipeline.vocab.dates import day_strings
from pipeline.vocab.report import FieldTotals, count_by_field


def delta_combine(
    *,
    date: int,
    previous: Columns,
    today: tuple[np.ndarray, np.ndarray],
    dropped: tuple[np.ndarray, np.ndarray] | None,
    thresholds: np.ndarray,
    ttl_days: int,
) -> Columns:
    """`vocab_window_merge.combine` for a window of previous count + today - the dropped day (decay = 1 only).

    The previous rows are placed into the union with today's keys, today's
    counts added and the dropped day's subtracted.  Equal to
    `combine(window_table(...), previous)` (`tests/pipeline/vocab/test_delta_merge.py`).

    Args:
        date: the run date D (day number).
        previous: key (sorted), count, first, last (day numbers), admitted of the vocabulary of D - 1.
        today: (sorted keys, counts) of D.
        dropped: (sorted keys, counts) of D - window_days, or None when that day was not in the window.
        thresholds, ttl_days: as in `combine`.

    Returns:
        `pipeline.vocab.admission.admit`'s columns, sorted by key.

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
    return admit(
        date=date,
        keys=keys,
        count=count,
        score=count.astype(np.float64),
        first=first,
        last=last,
        was=was,
        thresholds=thresholds,
        ttl_days=ttl_days,
    )


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
    Equal to `split_vocab(delta_combine(...))` (`tests/pipeline/vocab/test_delta_merge.py`).

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
    count = _window_counts(date, pk, previous["count"], seen_at, tc[found], dropped)
    days, today_index, first, last = _dates_seen(date, np.asarray(days, np.int64), previous, seen_at)

    # admission, per field slice (keys sorted: a field is a contiguous range)
    limit = np.asarray(thresholds, np.float64) - 1e-9  # decayed sums are floats (here: exact integer counts)
    starts = _field_starts(pk)
    was = np.asarray(previous["admitted"], bool)
    admitted, expired = _admit(date, count, was, days, last, starts, limit, ttl_days)
    new_field = field_of(nk)
    new_admitted = nc >= limit[new_field]

    vocab = _lay_out(
        pk,
        count,
        first,
        last,
        admitted,
        new_at=new_at,
        nk=nk,
        nc=nc,
        new_admitted=new_admitted,
        today_index=today_index,
    )

    gone = np.empty(0, np.int64) if expired is None else np.flatnonzero(expired)  # no cap: evicted = expired
    evicted: dict[str, np.ndarray] = {
        "field": field_of(pk[gone]).astype(np.int16),
        "key": pk[gone],
        "last_seen": days[last[gone]],
    }
    seen_today = _Today(tk, tc, found, new, admitted[seen_at], was[seen_at], new_admitted)
    totals = _totals(starts, count, admitted, new_field, new_admitted, evicted["field"], seen_today, n_fields)
    return DeltaVocab(vocab=vocab, days=days, evicted=evicted, totals=totals)


def _lay_out(
    pk: np.ndarray,
    count: np.ndarray,
    first: np.ndarray,
    last: np.ndarray,
    admitted: np.ndarray,
    *,
    new_at: np.ndarray,
    nk: np.ndarray,
    nc: np.ndarray,
    new_admitted: np.ndarray,
    today_index: int,
) -> Columns:
    """The vocabulary's columns: the previous rows kept (seen in the window, or admitted) and today's new keys
    (`nk`, `nc`, going before the previous rows at `new_at`), each column laid out once."""
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
    return {
        "field": field_of(keys).astype(np.int16),
        "key": keys,
        "count": out_count,
        "score": out_count.astype(np.float64),
        "first_seen": lay_out(first, today_index, np.int32),
        "last_seen": lay_out(last, today_index, np.int32),
        "admitted": lay_out(admitted, new_admitted, bool),
    }


def _window_counts(
    date: int,
    pk: np.ndarray,
    previous_count: np.ndarray,
    seen_at: np.ndarray,
    seen_count: np.ndarray,
    dropped: tuple[np.ndarray, np.ndarray] | None,
) -> np.ndarray:
    """The previous rows' window counts: today's counts added at their rows, the dropped day's subtracted.

    Raises:
        ValueError: as `delta_combine`.
    """
    count = np.array(previous_count, np.int64)  # a copy: updated in place
    count[seen_at] += seen_count
    if dropped is not None and len(dropped[0]):
        dk = np.asarray(dropped[0], np.int64)
        dat = np.searchsorted(pk, dk)
        if not _found(pk, dk, dat).all():
            raise _negative(date)
        count[dat] -= np.asarray(dropped[1], np.int64)
        if count[dat].min() < 0:  # only these rows went down
            raise _negative(date)
    return count


def _dates_seen(
    date: int, days: np.ndarray, previous: Columns, seen_at: np.ndarray
) -> tuple[np.ndarray, int, np.ndarray, np.ndarray]:
    """(days with the run date, its index, first, last): the previous rows' date indices (`first`, `last`), moved
    to the run date for the rows seen today."""
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
    return days, today_index, first, last


def _admit(
    date: int,
    count: np.ndarray,
    was: np.ndarray,
    days: np.ndarray,
    last: np.ndarray,
    starts: list[tuple[int, int, int]],
    limit: np.ndarray,
    ttl_days: int,
) -> tuple[np.ndarray, np.ndarray | None]:
    """(admitted, expired or None when none can be) of the previous rows: a count at its field's limit admits,
    an admitted key stays until unseen for more than `ttl_days` below the limit."""
    by_count = np.empty(len(count), bool)
    for f, s, e in starts:
        np.greater_equal(count[s:e], limit[f], out=by_count[s:e])
    stale = days < date - ttl_days  # unseen for more than ttl_days
    if stale.any():
        expired = was & stale[last] & ~by_count
        return by_count | (was & ~expired), expired
    return by_count | was, None


@dataclass(frozen=True, slots=True)
class _Today:
    """Today's keys and what the merge decided for them, for the day's per-field totals."""

    keys: np.ndarray
    counts: np.ndarray
    found: np.ndarray
    """In the previous vocabulary."""
    new: np.ndarray
    """Not in it, with a count above 0."""
    found_admitted: np.ndarray
    found_known: np.ndarray
    """Admitted before today."""
    new_admitted: np.ndarray


def _totals(
    starts: list[tuple[int, int, int]],
    count: np.ndarray,
    admitted: np.ndarray,
    new_field: np.ndarray,
    new_admitted: np.ndarray,
    evicted_field: np.ndarray,
    today: _Today,
    n_fields: int,
) -> FieldTotals:
    """The bucket's per-field totals (`pipeline.vocab.report.FieldTotals`) of the merged rows and of today's keys."""
    on_field = field_of(today.keys)
    today_admitted = np.zeros(len(today.keys), bool)
    today_admitted[today.found] = today.found_admitted
    today_admitted[today.new] = today.new_admitted
    today_known = np.zeros(len(today.keys), bool)
    today_known[today.found] = today.found_known
    weights = today.counts.astype(np.float64)
    return FieldTotals(
        seen=_per_field(starts, count > 0, n_fields) + count_by_field(new_field, None, n_fields),
        admitted=_per_field(starts, admitted, n_fields) + count_by_field(new_field, new_admitted, n_fields),
        evicted=count_by_field(evicted_field, None, n_fields),
        covered=count_by_field(on_field, today_admitted, n_fields, weights),
        present=count_by_field(on_field, None, n_fields, weights),
        known=count_by_field(on_field, today_known, n_fields, weights),
        distinct=count_by_field(on_field, today.counts > 0, n_fields),
    )


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
    return ValueError(
        f"vocabulary of {day_strings(np.array([date]))[0]}: a windowed count went negative; the kept "
        "day counts do not match the previous vocabulary; rebuild with incremental=False"
    )
