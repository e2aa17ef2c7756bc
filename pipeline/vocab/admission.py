"""Which keys get their own embedding: sticky admission by score, eviction by TTL.

A key is admitted once its score (windowed count, optionally decayed) reaches
its field's min_count, and stays admitted, its embedding kept in the store,
until it has been unseen for more than `ttl_days` while below its threshold.
The per-field cap (`pipeline.vocab.cap`) may then push admitted keys out.  The
vocabulary keeps every key with a windowed count > 0 plus every key still
admitted; the rest are forgotten.

Every rule here is per key, so a bucket of keys is decided alone.  Tables are
`Columns` (name -> NumPy array, no pandas: a bucket task spends its time in
NumPy and Parquet, not in building frames); dates are day numbers.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from pipeline.config import VocabConfig
from pipeline.encode.keys import MAX_FIELDS, field_of
from pipeline.vocab.dates import day_numbers

Columns = dict[str, np.ndarray]
"""A table as name -> equally long NumPy arrays."""


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


def admit(
    *,
    date: int,
    keys: np.ndarray,
    count: np.ndarray,
    score: np.ndarray,
    first: np.ndarray,
    last: np.ndarray,
    was: np.ndarray,
    thresholds: np.ndarray,
    ttl_days: int,
) -> Columns:
    """Every key's state before the cap: admitted by score, or kept while within the TTL.

    Returns:
        key, field, count, score, first_seen, last_seen (day numbers), was_admitted, admitted.
    """
    field = field_of(keys).astype(np.int16)
    by_count = score >= (thresholds - 1e-9)[field]  # decayed sums are floats
    expired = was & (last < date - ttl_days) & ~by_count  # unseen for more than ttl_days
    return {
        "key": keys,
        "field": field,
        "count": count,
        "score": score,
        "first_seen": first,
        "last_seen": last,
        "was_admitted": was,
        "admitted": by_count | (was & ~expired),
    }


def split_vocab(merged: Columns, admitted: np.ndarray) -> tuple[Columns, Columns]:
    """The vocabulary and evicted rows of `admit`'s columns with the final (capped) admission.

    Kept: keys with a windowed count > 0 or admitted; evicted: admitted before, not now.

    Returns:
        (field, key, count, score, first_seen, last_seen, admitted) of the kept keys and
        (field, key, last_seen) of the evicted ones; dates are day numbers.
    """
    count = merged["count"]
    evicted = merged["was_admitted"] & ~admitted
    keep = (count > 0) | admitted
    vocab = {
        "field": merged["field"][keep],
        "key": merged["key"][keep],
        "count": count[keep],
        "score": merged["score"][keep],
        "first_seen": merged["first_seen"][keep],
        "last_seen": merged["last_seen"][keep],
        "admitted": admitted[keep],
    }
    gone = {"field": merged["field"][evicted], "key": merged["key"][evicted], "last_seen": merged["last_seen"][evicted]}
    return vocab, gone


def previous_state(previous: pa.Table | None) -> Columns:
    """key, count, first, last (day numbers), admitted of a stored vocabulary table (None: empty)."""
    if previous is None:
        return {
            "key": np.empty(0, np.int64),
            "count": np.empty(0, np.int64),
            "first": np.empty(0, np.int64),
            "last": np.empty(0, np.int64),
            "admitted": np.empty(0, bool),
        }
    return {
        "key": previous.column("key").to_numpy().astype(np.int64, copy=False),
        "count": previous.column("count").to_numpy().astype(np.int64, copy=False),
        "first": day_numbers(previous.column("first_seen")),
        "last": day_numbers(previous.column("last_seen")),
        "admitted": previous.column("admitted").to_numpy().astype(bool, copy=False),
    }
