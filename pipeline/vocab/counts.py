"""Counting keys: (field, key, count) of the non-missing values of a set of events.

A day is counted once, ever: one Dask task counts each events partition, the
bucket tasks sum the partitions' counts, and the day's counts are kept with its
vocabulary so later windows only add them up.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import pandas as pd

from pipeline.encode.keys import factorize_keys, field_of


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
        return counts_frame(np.empty(0, np.int64), np.empty(0, np.int64))
    keys, counts = sum_counts(
        np.concatenate([f["key"].to_numpy(np.int64) for f in frames]),
        np.concatenate([f["count"].to_numpy(np.int64) for f in frames]),
    )
    positive = counts > 0
    return counts_frame(keys[positive], counts[positive])


def sum_counts(keys: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(distinct keys sorted, summed int64 counts) of parallel key/count arrays (exact integer sums)."""
    keys = np.asarray(keys, dtype=np.int64)
    if not len(keys):
        return keys, np.asarray(counts, dtype=np.int64)
    order = np.argsort(keys, kind="stable")
    k = keys[order]
    starts = np.flatnonzero(np.r_[True, k[1:] != k[:-1]])
    return k[starts], np.add.reduceat(np.asarray(counts, dtype=np.int64)[order], starts)


def counts_frame(keys: np.ndarray, counts: np.ndarray) -> pd.DataFrame:
    """(field, key, count) frame of parallel key/count arrays."""
    return pd.DataFrame({"field": field_of(keys).astype(np.int16), "key": keys, "count": counts})
