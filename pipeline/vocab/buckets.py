"""Buckets of keys: the vocab merge runs as one Dask task per range of key hashes.

Bucket b of B holds the keys whose top 32 hash bits `hx` satisfy
floor(hx * B / 2**32) == b, the same ranges in every field.  Keys are hashes, so
buckets are even; and because a bucket is a range,

- within a field, bucket order is key order, so the cap's tie-break ("smaller
  key first") is decided bucket by bucket (`pipeline.vocab.cap`);
- data bucketed with another B (an older day, the previous vocabulary) is read
  for bucket b by opening the few source buckets whose ranges overlap b's and
  filtering (`source_buckets`).
"""

from __future__ import annotations

from typing import overload

import numpy as np

from pipeline.encode.keys import HASH_MASK

HX_SHIFT = 24
"""hx = the top 32 bits of the 56-bit hash: key & HASH_MASK >> 24."""
MAX_BUCKETS = 1 << 16
MERGE_ROWS_PER_BUCKET = 1 << 20
"""The automatic bucket count keeps a bucket's merge input (window + previous rows) under this."""


def hx_of(keys: np.ndarray) -> np.ndarray:
    """The top 32 bits of each key's hash (uint64)."""
    return (np.asarray(keys, dtype=np.int64) & HASH_MASK).astype(np.uint64) >> np.uint64(HX_SHIFT)


@overload
def bucket_of_hx(hx: int, buckets: int) -> int: ...
@overload
def bucket_of_hx(hx: np.ndarray, buckets: int) -> np.ndarray: ...
def bucket_of_hx(hx: np.ndarray | int, buckets: int) -> np.ndarray | int:
    """The bucket of `hx` values among `buckets` (monotone in hx)."""
    if isinstance(hx, int):
        return (hx * buckets) >> 32
    return ((np.asarray(hx, dtype=np.uint64) * np.uint64(buckets)) >> np.uint64(32)).astype(np.int64)


def bucket_of(keys: np.ndarray, buckets: int) -> np.ndarray:
    """The merge bucket (0..buckets-1) of each key."""
    return bucket_of_hx(hx_of(keys), buckets)


def bucket_bounds(bucket: int, buckets: int) -> tuple[int, int]:
    """The hx range [lo, hi) of `bucket` among `buckets`."""
    return -(-(bucket << 32) // buckets), -(-((bucket + 1) << 32) // buckets)


def source_buckets(bucket: int, buckets: int, source: int) -> range:
    """The buckets of data bucketed `source` ways that hold keys of `bucket` among `buckets`."""
    lo, hi = bucket_bounds(bucket, buckets)
    if hi <= lo:
        return range(0)
    return range(bucket_of_hx(lo, source), bucket_of_hx(hi - 1, source) + 1)


def auto_buckets(rows: int) -> int:
    """The smallest power of two of buckets that keeps `rows` / buckets under MERGE_ROWS_PER_BUCKET."""
    buckets = 1
    while buckets < MAX_BUCKETS and rows > buckets * MERGE_ROWS_PER_BUCKET:
        buckets *= 2
    return buckets
