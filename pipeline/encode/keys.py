"""Feature keys: a categorical value of field j becomes one non-negative int64.

key = j << 56 | h, where h is xxhash64 of the value's UTF-8 text masked to 56
bits.  h = 0 is the field's out-of-vocabulary key and h = 1 its missing-value
key; real hashes 0 and 1 are moved to 2 and 3.  No central id assignment is
needed, so every machine and every day agrees on a value's key (see
docs/formats.md, "Feature keys").  The layout's constants (and `to_oov`, which a rank uses) live
in `storage.key_layout`, so that a rank does not import this package.
"""

from __future__ import annotations

from typing import overload

import numpy as np
import pandas as pd
import xxhash

from storage.key_layout import (
    FIELD_SHIFT,
    HASH_MASK,
    MAX_FIELDS,
    MISSING_HASH,
    OOV_HASH,
)


def _check_field(field_index: int) -> int:
    if not 0 <= int(field_index) < MAX_FIELDS:
        raise ValueError(f"field_index must be in [0, {MAX_FIELDS}), got {field_index}")
    return int(field_index)


def oov_key(field_index: int) -> int:
    """The key of every value of field `field_index` that is not in the vocabulary."""
    return _check_field(field_index) << FIELD_SHIFT | OOV_HASH


def missing_key(field_index: int) -> int:
    """The key of a missing (null, NaN or empty) value of field `field_index`."""
    return _check_field(field_index) << FIELD_SHIFT | MISSING_HASH


@overload
def field_of(keys: int) -> int: ...
@overload
def field_of(keys: np.ndarray) -> np.ndarray: ...
def field_of(keys: np.ndarray | int) -> np.ndarray | int:
    """The field index encoded in the top bits of `keys`."""
    if isinstance(keys, int):
        return keys >> FIELD_SHIFT
    return np.right_shift(np.asarray(keys, dtype=np.int64), FIELD_SHIFT)


def hash_value(text: str) -> int:
    """The 56-bit hash part of the key of `text` (never 0 or 1)."""
    h = xxhash.xxh64_intdigest(text.encode("utf-8")) & HASH_MASK
    return h + 2 if h < 2 else h


def factorize_keys(field_index: int, values) -> tuple[np.ndarray, np.ndarray]:
    """Codes and distinct keys of `values`: `keys[codes]` are the values' keys.

    Only distinct values are hashed, which is what makes key computation cheap
    on skewed ad logs (a few values fill most rows).  Missing values get code
    -1 and are not in `keys`.

    Returns:
        (codes int64 array aligned with `values`, keys int64 array of the distinct values)
    """
    base = _check_field(field_index) << FIELD_SHIFT
    codes, uniques = pd.factorize(pd.Series(values, copy=False), use_na_sentinel=True)
    codes = codes.astype(np.int64, copy=False)
    hashes = np.fromiter(
        (MISSING_HASH if v == "" else hash_value(v if isinstance(v, str) else str(v)) for v in uniques),
        dtype=np.int64,
        count=len(uniques),
    )
    keys = hashes | base
    empty = hashes == MISSING_HASH
    if empty.any():  # "" is missing too: fold it into code -1
        codes = np.where(empty[codes] & (codes >= 0), -1, codes) if len(codes) else codes
    return codes, keys


def feature_keys(field_index: int, values) -> np.ndarray:
    """The int64 key of each value of field `field_index` (None/NaN/"" -> the missing key)."""
    codes, keys = factorize_keys(field_index, values)
    out = np.full(len(codes), missing_key(field_index), dtype=np.int64)
    present = codes >= 0
    out[present] = keys[codes[present]]
    return out
