"""The window merge: re-sum the window's day counts, then combine with the previous vocabulary.

Used when the delta merge (`pipeline.vocab.delta_merge`) would not give the
exact window: a decay below 1, a gap in the chain of vocabularies, or a day of
the window rebuilt since.  It reads every kept day of the window, so it costs
more, and gives the same vocabulary.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pandas as pd

from pipeline.vocab.admission import Columns, admit

NO_DAY_MIN = np.iinfo(np.int64).max
"""Placeholder first day of a key absent from one side of a merge (loses every min)."""
NO_DAY_MAX = np.iinfo(np.int64).min
"""Placeholder last day of a key absent from one side of a merge (loses every max)."""


def window_table(days: Iterable[tuple[int, np.ndarray, np.ndarray]], *, end: int, decay: float) -> Columns:
    """key, count, score, first, last (day numbers) of (day, keys, counts) day counts; sorted by key.

    A day k days before `end` adds decay**k * count to the score.  With decay < 1
    the scores are summed by pandas' groupby in day order: a float sum depends on
    its order, and this one order gives a bucket of keys bit-identical scores to
    the whole table (the cap compares scores for equality).
    """
    chunks = [
        (int(d), np.asarray(k, np.int64), np.asarray(c, np.int64)) for d, k, c in sorted(days, key=lambda t: t[0])
    ]
    chunks = [c for c in chunks if len(c[1])]
    if not chunks:
        return {
            "key": np.empty(0, np.int64),
            "count": np.empty(0, np.int64),
            "score": np.empty(0, np.float64),
            "first": np.empty(0, np.int64),
            "last": np.empty(0, np.int64),
        }
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
    return {
        "key": k[starts],
        "count": total,
        "score": score,
        "first": np.minimum.reduceat(day[order], starts),
        "last": np.maximum.reduceat(day[order], starts),
    }


def combine(*, date: int, window: Columns, previous: Columns, thresholds: np.ndarray, ttl_days: int) -> Columns:
    """Window counts + the previous vocabulary -> every key's state before the cap.

    Args:
        date: the run date D (day number).
        window: `window_table` rows: key, count, score, first, last.
        previous: key, first, last (day numbers), admitted of the previous vocabulary.
        thresholds: admission score per field index (length MAX_FIELDS).
        ttl_days: an admitted key unseen for more days than this (and below its threshold) is evicted.

    Returns:
        `pipeline.vocab.admission.admit`'s columns, sorted by key.
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
    return admit(
        date=date,
        keys=keys,
        count=count,
        score=score,
        first=first,
        last=last,
        was=was,
        thresholds=thresholds,
        ttl_days=ttl_days,
    )


def _union(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Sorted distinct keys of two arrays; on two sorted runs the stable sort is a merge (np.union1d hashes)."""
    c = np.sort(np.concatenate([a, b]), kind="stable")  # two sorted runs: a merge
    return c[np.r_[True, c[1:] != c[:-1]]] if len(c) else c
