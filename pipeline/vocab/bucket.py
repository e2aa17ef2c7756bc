"""One bucket's vocabulary update: the rule the stage runs per bucket and the rule tests run on one table.

Pure (arrays in, a typed result out; no files, no Dask): `pipeline.vocab.tasks`
reads a bucket's inputs, calls these and writes its parts.  Every rule is per
key, so a bucket of keys is decided alone, except the per-field cap, whose cut
is searched across buckets (`CapSearch`).  So with a cap the stage runs
`merge_rows`, the cut search over every bucket, then `finish_rows`;
`update_bucket` runs the three with the cut searched over its own rows, which
is the stage's cut when one bucket holds every key.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pipeline.config import VocabConfig
from pipeline.encode.keys import MAX_FIELDS
from pipeline.vocab.admission import Columns, admission_thresholds, split_vocab
from pipeline.vocab.cap import CapSearch, cap_histograms, cap_mask, score_bits
from pipeline.vocab.delta_merge import delta_combine, delta_vocab
from pipeline.vocab.report import FieldTotals, field_totals
from pipeline.vocab.window_merge import combine, window_table

Counts = tuple[np.ndarray, np.ndarray]
"""(keys sorted, counts) of one day."""


@dataclass(frozen=True, slots=True)
class BucketRule:
    """The vocab config as a bucket applies it (small: it travels in every task's plan)."""

    thresholds: tuple[float, ...]
    """Admission score per field index (length MAX_FIELDS; `admission_thresholds`)."""
    ttl_days: int
    n_fields: int
    """Fields 0..n_fields-1 are reported."""
    decay: float = 1.0
    cap: int = 0
    """max_keys_per_field (0: none)."""

    @staticmethod
    def of(config: VocabConfig, fields: Sequence[str]) -> BucketRule:
        """Raises ValueError when `config.min_count_per_field` names a field not in `fields`."""
        return BucketRule(
            thresholds=tuple(admission_thresholds(config, fields).tolist()),
            ttl_days=config.ttl_days,
            n_fields=len(fields),
            decay=config.decay,
            cap=config.max_keys_per_field,
        )


@dataclass(frozen=True, slots=True)
class MergedRows:
    """A bucket's keys before the cap (`merge_rows`): what a capped stage keeps in `_scratch/merged`."""

    rows: Columns
    """`pipeline.vocab.admission.admit`'s columns, sorted by key."""
    today: np.ndarray
    """D's count per row (0: not seen on D)."""


@dataclass(frozen=True, slots=True)
class BucketUpdate:
    """A bucket's vocabulary at D: its vocabulary part, its evicted keys and its report sums."""

    vocab: Columns
    """field, key, count, score, first_seen, last_seen, admitted, sorted by key (`split_vocab`)."""
    days: np.ndarray | None
    """None: vocab's dates are day numbers; else they are int32 indices into these day numbers (`delta_vocab`)."""
    evicted: Columns
    """field, key, last_seen (day number) of the keys admitted before D and not now."""
    totals: FieldTotals
    admitted: np.ndarray
    """Admitted keys per field before the cap (what `CapSearch` starts from)."""
    day_keys: int
    """Distinct keys of D in the bucket."""


def update_bucket(
    *,
    date: int,
    today: Counts,
    previous: Columns,
    rule: BucketRule,
    days: np.ndarray | None = None,
    window: Sequence[tuple[int, np.ndarray, np.ndarray]] = (),
    dropped: Counts | None = None,
    delta: bool = False,
) -> BucketUpdate:
    """The vocabulary of one bucket at D from D's counts, the previous vocabulary and the window.

    Args:
        date: D as a day number.
        today: D's counts of the bucket.
        previous: key (sorted), count, first, last, admitted of the previous vocabulary's bucket.
        days: None when previous's first/last are day numbers; else they index these day numbers
            (a delta merge without a cap then keeps this date dictionary: `delta_vocab`).
        window: window merge: (day number, keys, counts) of the window's other days.
        dropped: delta merge: the counts of the day that left the window (None: none left it).
        delta: window = previous count + today - dropped (decay 1 only) instead of the window's sum.
    """
    if delta and not rule.cap and days is not None:
        out = delta_vocab(
            date=date,
            previous=previous,
            days=days,
            today=today,
            dropped=dropped,
            thresholds=np.asarray(rule.thresholds),
            ttl_days=rule.ttl_days,
            n_fields=rule.n_fields,
        )
        return BucketUpdate(
            vocab=out.vocab,
            days=out.days,
            evicted=out.evicted,
            totals=out.totals,
            admitted=out.totals.admitted,
            day_keys=len(today[0]),
        )
    if days is not None:
        previous = {**previous, "first": days[previous["first"]], "last": days[previous["last"]]}
    merged = merge_rows(
        date=date, today=today, previous=previous, rule=rule, window=window, dropped=dropped, delta=delta
    )
    admitted = merged.rows["admitted"]
    if rule.cap:
        admitted = _cap_alone(merged.rows, rule.cap)
    return finish_rows(merged, admitted, n_fields=rule.n_fields, day_keys=len(today[0]))


def merge_rows(
    *,
    date: int,
    today: Counts,
    previous: Columns,
    rule: BucketRule,
    window: Sequence[tuple[int, np.ndarray, np.ndarray]] = (),
    dropped: Counts | None = None,
    delta: bool = False,
) -> MergedRows:
    """Every key's state before the cap (`update_bucket`'s arguments; previous's dates are day numbers)."""
    keys, counts = today
    thresholds = np.asarray(rule.thresholds)
    if delta:
        rows = delta_combine(
            date=date, previous=previous, today=today, dropped=dropped, thresholds=thresholds, ttl_days=rule.ttl_days
        )
    else:
        summed = window_table([(date, keys, counts), *window], end=date, decay=rule.decay)
        rows = combine(date=date, window=summed, previous=previous, thresholds=thresholds, ttl_days=rule.ttl_days)
    on_day = np.zeros(len(rows["key"]), np.int64)
    on_day[np.searchsorted(rows["key"], keys)] = counts
    return MergedRows(rows=rows, today=on_day)


def pre_cap(rows: Columns, n_fields: int) -> np.ndarray:
    """Admitted keys per field 0..n_fields-1 before the cap."""
    return np.bincount(rows["field"][rows["admitted"]], minlength=n_fields)[:n_fields]


def finish_rows(merged: MergedRows, admitted: np.ndarray, *, n_fields: int, day_keys: int) -> BucketUpdate:
    """The bucket's vocabulary, evicted keys and report sums, given its final (capped) admission."""
    rows = merged.rows
    vocab, gone = split_vocab(rows, admitted)
    totals = field_totals(
        field=rows["field"],
        count=rows["count"],
        admitted=admitted,
        evicted=rows["was_admitted"] & ~admitted,
        today=merged.today,
        was_admitted=rows["was_admitted"],
        n_fields=n_fields,
    )
    return BucketUpdate(
        vocab=vocab, days=None, evicted=gone, totals=totals, admitted=pre_cap(rows, n_fields), day_keys=day_keys
    )


def _cap_alone(rows: Columns, cap: int) -> np.ndarray:
    """`rows["admitted"]` after the per-field cap, its cut searched over these rows as the only bucket."""
    field, admitted, bits = rows["field"], rows["admitted"], score_bits(rows["score"])
    search = CapSearch(cap=cap, admitted=np.bincount(field[admitted], minlength=MAX_FIELDS), buckets=1)
    while not search.done:
        search.absorb(
            [cap_histograms(field=field, bits=bits, admitted=admitted, query=search.query(), shift=search.shift)]
        )
    return cap_mask(
        field=field, bits=bits, admitted=admitted, cuts={f: (c.bits, c.take[0]) for f, c in search.cuts.items()}
    )
