"""Dates of the vocabulary: day numbers inside the merges, YYYY-MM-DD strings on disk.

The merges compare and take min/max of dates per key, so they work on day
numbers (int64 days since 1970-01-01).  A vocabulary part holds a few dozen
distinct dates over millions of rows, so its dates are written and read as
Arrow dictionaries: each distinct date is formatted or parsed once, not per row.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa


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
    building or hashing per row.
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


def date_indices(dates: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(int32 indices, int64 day numbers they point to) of a date column.

    A dictionary column as a vocabulary part is read (one chunk) costs no
    per-row parsing; a column of several chunks (a bucket read from parts of
    another bucket count) goes through its day numbers.
    """
    if isinstance(dates, pa.ChunkedArray) and dates.num_chunks == 1:
        dates = dates.chunk(0)
    if isinstance(dates, pa.Array) and pa.types.is_dictionary(dates.type) and dates.null_count == 0:
        return dates.indices.to_numpy(zero_copy_only=False).astype(np.int32, copy=False), day_numbers(dates.dictionary)
    d = day_dictionary(day_numbers(dates))
    return d.indices.to_numpy(zero_copy_only=False), day_numbers(d.dictionary)
