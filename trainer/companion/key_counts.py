"""How many of a fit's rows had each key, as tokens of the companion's Poly2: frequency encoding (issue 31).

Why: a hashed LR gives a value seen once the weight of nothing until its own weight is learnt, and one seen
thousands of times no more than its own.  A token per field for the value's count class, floor(log2(1 +
count)), lets every value of a class share what the class says: a device or an IP seen once behaves unlike
one seen a hundred times (the count features of the Avazu winners).  It gains on Avazu and changes nothing on
Criteo (`docs/reports/2026-12-05-companion.md`).

A fit row's count leaves that row out (`leave_one_out`): a value seen once in the fit rows is then a value
never seen, as it is for a row scored later, which is counted against the fit rows only.

A count token is a key of the value's own field whose hash part is `COUNT_HASH` plus the class: no new field
numbers, so a schema of up to `MAX_FIELDS` fields keeps working.  A real value's 56-bit hash is one of them
with odds of about 2^-52, and would then share a bucket, as hashed tokens do.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from storage.key_layout import FIELD_SHIFT

COUNT_HASH = 1 << (FIELD_SHIFT - 1)
"""The hash part of a count token of class 0; class c's is COUNT_HASH + c."""


@dataclass(frozen=True)
class KeyCounts:
    """The distinct keys of a fit's rows (sorted int64) and how many rows had each (int64, >= 1)."""

    keys: np.ndarray
    counts: np.ndarray

    def __post_init__(self) -> None:
        if self.keys.shape != self.counts.shape or self.keys.ndim != 1:
            raise ValueError(f"key counts need one count per key: keys {self.keys.shape}, counts {self.counts.shape}")
        if self.keys.size > 1 and not bool(np.all(self.keys[1:] > self.keys[:-1])):
            raise ValueError("key counts need distinct keys in ascending order")

    @classmethod
    def of(cls, keys: np.ndarray) -> KeyCounts:
        """The counts of every key of rows (N, F) (a key carries its field: `pipeline.encode.keys`)."""
        found, counts = np.unique(np.asarray(keys, dtype=np.int64).ravel(), return_counts=True)
        return cls(found, counts.astype(np.int64))

    def count(self, keys: np.ndarray) -> np.ndarray:
        """The count of each key (any shape), 0 for a key no fit row had."""
        keys = np.asarray(keys, dtype=np.int64)
        if self.keys.size == 0:
            return np.zeros(keys.shape, dtype=np.int64)
        pos = np.minimum(np.searchsorted(self.keys, keys), self.keys.size - 1)
        return np.where(self.keys[pos] == keys, self.counts[pos], 0)

    def tokens(self, keys: np.ndarray, *, leave_one_out: bool) -> np.ndarray:
        """The count token of each key (any shape): the key's field, and `COUNT_HASH` plus the count class
        floor(log2(1 + count)) as its hash part; `leave_one_out` for the fit's own rows (each is in its count)."""
        keys = np.asarray(keys, dtype=np.int64)
        n = self.count(keys) - (1 if leave_one_out else 0)
        cls = np.floor(np.log2(1.0 + np.maximum(n, 0))).astype(np.int64)
        return ((keys >> FIELD_SHIFT) << FIELD_SHIFT) | (COUNT_HASH + cls)
