"""Buckets are ranges of the key hash: key order within a field, readable from any other bucket count."""

import numpy as np
import pytest

from pipeline.config import VocabConfig
from pipeline.encode.keys import field_of
from pipeline.vocab.buckets import (
    MERGE_ROWS_PER_BUCKET,
    auto_buckets,
    bucket_bounds,
    bucket_of,
    hx_of,
    source_buckets,
)


def test_buckets_are_hash_ranges_in_key_order_within_a_field():
    rng = np.random.default_rng(0)
    keys = np.sort((rng.integers(0, 3, 5000) << 56) | rng.integers(2, 1 << 56, 5000))
    for buckets in (1, 3, 7, 64):
        b = bucket_of(keys, buckets)
        assert b.min() >= 0 and b.max() < buckets
        for f in range(3):
            assert np.all(np.diff(b[field_of(keys) == f]) >= 0)  # sorted keys of a field: buckets ascend
        for i in range(buckets):
            lo, hi = bucket_bounds(i, buckets)
            hx = hx_of(keys[b == i]).astype(np.int64)
            assert np.all((hx >= lo) & (hx < hi))
            for source in (1, 2, 5, 64):  # data bucketed another way: the overlapping source buckets hold them all
                assert set(bucket_of(keys[b == i], source)) <= set(source_buckets(i, buckets, source))


def test_the_bucket_count_follows_the_data_unless_configured():
    assert auto_buckets(0) == 1 and auto_buckets(MERGE_ROWS_PER_BUCKET) == 1
    assert auto_buckets(MERGE_ROWS_PER_BUCKET + 1) == 2 and auto_buckets(30 * MERGE_ROWS_PER_BUCKET) == 32
    assert VocabConfig(merge_buckets=7).merge_buckets == 7
    with pytest.raises(ValueError, match=r"vocab.merge_buckets must be in \[0, 65536\]"):
        VocabConfig(merge_buckets=-1)
