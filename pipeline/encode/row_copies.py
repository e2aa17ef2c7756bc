"""Exact copies of rows within a day: one 64-bit hash per row, and what encode does with it.

A replayed upstream export (the day's file written twice) or a logging bug copies rows.  Copies
that fall on both sides of the train/eval split put training rows into the hold-out, and the AUC
gate then measures memorisation: a day repeated 10 times scores an AUC near 1.  So encode drops from
the eval part every row whose exact copy is a training row of the same day (`copies_in`), and
reports the day's duplicate share, which the data checks gate.

A row's hash mixes the hashes of its content, field by field in schema order (label, timestamp,
dense values' bits, categorical keys); `order` (its position in the files) is left out, so copies
at different lines hash alike.  The duplicate share is estimated on a consistent sample of hashes
(those below 2**64 >> bits): every copy of a sampled row is sampled too, so the share is unbiased,
and exact when `bits` is 0.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.encode.keys import feature_keys
from pipeline.schema import LogSchema

_MULTIPLIER = np.uint64(0x9E3779B97F4A7C15)
"""Odd 64-bit constant (2**64 / golden ratio): multiplying spreads every input bit over the hash."""
SAMPLE_TARGET = 1 << 20
"""About this many hashes (8 MiB) are kept for the duplicate share, whatever the day's size."""


def mix(acc: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Fold one column's per-row 64-bit values into the row hashes `acc` (uint64, same length)."""
    with np.errstate(over="ignore"):
        return (acc ^ np.asarray(values).view(np.uint64)) * _MULTIPLIER


def start(rows: int) -> np.ndarray:
    """The hashes of `rows` rows before any column is mixed in."""
    return np.full(rows, 0xCBF29CE484222325, dtype=np.uint64)


def sample_bits(rows: int, target: int = SAMPLE_TARGET) -> int:
    """The sample shift that keeps about `target` of `rows` hashes (0: all)."""
    return max(0, int(np.ceil(np.log2(rows / target)))) if rows > target else 0


def sample(hashes: np.ndarray, bits: int) -> np.ndarray:
    """The hashes in the consistent sample of 1 / 2**bits (all copies of a row, or none)."""
    if bits == 0:
        return hashes
    return hashes[(hashes >> np.uint64(64 - bits)) == 0]


def duplicate_share(sampled: np.ndarray) -> float:
    """Share of the (sampled) rows that are a copy of another one: 1 - distinct / rows (0 for no rows)."""
    if not len(sampled):
        return 0.0
    return 1.0 - len(np.unique(sampled)) / len(sampled)


def copies_in(eval_hashes: np.ndarray, train_hashes: np.ndarray) -> np.ndarray:
    """The distinct eval hashes that are also train hashes (sorted uint64)."""
    if not len(eval_hashes) or not len(train_hashes):
        return np.empty(0, np.uint64)
    return np.intersect1d(np.unique(eval_hashes), train_hashes)


def row_hashes(events: pd.DataFrame, schema: LogSchema, keys: dict[int, np.ndarray] | None = None) -> np.ndarray:
    """The content hash (uint64) of each events row (see the module docstring).

    Args:
        events: events rows (columns per `LogSchema.events_schema`).
        keys: per categorical field index, the rows' keys (missing key when missing) when the caller
            has them already (`pipeline.encode.frame.encode_rows` does); the others are computed here.
    """
    keys = dict(keys or {})
    acc = mix(start(len(events)), events["label"].to_numpy(np.int64))
    acc = mix(acc, events["ts"].to_numpy(np.float64, na_value=np.nan))
    for name in schema.dense:
        acc = mix(acc, events[name].to_numpy(np.float32, na_value=np.nan).view(np.uint32).astype(np.uint64))
    multi = schema.multi_separator
    for j, name in enumerate(schema.categorical):
        if j not in keys:
            values = events[name]
            if name in multi:  # a list of values: its joined text (null stays null)
                lists = pa.array(list(values), type=pa.list_(pa.string()))
                values = pc.binary_join(lists, "\x1f").to_pandas()
            keys[j] = feature_keys(j, values)
        acc = mix(acc, keys[j])
    return acc
