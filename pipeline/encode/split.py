"""The day's train/eval split in time order: the first (1 - eval_fraction) of the rows train, the rest evaluate.

Time order is `order` for formats without a timestamp, and (`ts`, `order`) for Avazu, whose rows are only
roughly sorted by hour; the split point is found exactly from per-partition counts, so no process sorts
the day.  A split rule per events partition says which of its rows train (`train_mask`):
("head", k) (its first k rows) or ("threshold", t, last_order) (rows with ts < t, and those with ts == t
up to `last_order`).  Pure: the encode stage gathers the counts on Dask (`pipeline.encode.tasks`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd


def eval_size(rows: int, eval_fraction: float) -> int:
    """Rows held out: round(rows * eval_fraction), at least 1 and leaving at least 1 to train."""
    if rows < 2:
        raise ValueError(f"cannot split {rows} rows into train and eval; the day needs at least 2 rows")
    return min(max(round(rows * eval_fraction), 1), rows - 1)


def positional_split(part_rows: list[int], rows_train: int) -> list[int]:
    """Train rows at the head of each partition when partitions are in time order."""
    starts = np.concatenate([[0], np.cumsum(part_rows)[:-1]]).astype(np.int64)
    return np.clip(rows_train - starts, 0, np.asarray(part_rows, dtype=np.int64)).tolist()


def ts_threshold(ts_counts: pd.Series, rows_train: int) -> tuple[int, int]:
    """(t, k): train = rows with ts < t, plus the k rows with ts == t of smallest `order`.

    Args:
        ts_counts: rows per timestamp over the day, indexed by ts.
        rows_train: rows to put in train.
    """
    counts = ts_counts.groupby(level=0).sum().sort_index()
    cum = counts.cumsum().to_numpy()
    i = int(np.searchsorted(cum, rows_train))
    before = int(cum[i - 1]) if i else 0
    return int(counts.index[i]), rows_train - before


def train_mask(events: pd.DataFrame, rule: tuple) -> np.ndarray:
    """Which rows of an events partition train (the rest evaluate), by its split rule (the module docstring)."""
    if rule[0] == "head":
        return np.arange(len(events)) < rule[1]
    _, t, last_order = rule
    ts, order = events["ts"].to_numpy(np.int64), events["order"].to_numpy(np.int64)
    return (ts < t) | ((ts == t) & (order <= last_order))
