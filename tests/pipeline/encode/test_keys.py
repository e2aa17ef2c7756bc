"""Feature keys: field << 56 | xxhash64(text) masked to 56 bits, reserved OOV/missing keys."""

import numpy as np
import pandas as pd
import pytest
import xxhash

from pipeline.encode.keys import (
    HASH_MASK,
    factorize_keys,
    feature_keys,
    field_of,
    missing_key,
    oov_key,
)


def test_a_key_is_the_field_in_the_top_bits_and_the_masked_xxhash64_below():
    expected = 3 << 56 | (xxhash.xxh64_intdigest(b"68fd1e64") & HASH_MASK)
    assert feature_keys(3, ["68fd1e64"]).tolist() == [expected]


def test_keys_are_stable_non_negative_and_distinct_per_field():
    values = ["a", "b", "a", "ünïcode"]
    k0, k1 = feature_keys(0, values), feature_keys(1, values)
    assert k0.dtype == np.int64 and (k0 >= 0).all() and (k1 >= 0).all()
    assert k0[0] == k0[2] and len(set(k0.tolist())) == 3
    assert set(k0.tolist()).isdisjoint(k1.tolist())
    assert field_of(k0).tolist() == [0] * 4 and field_of(k1).tolist() == [1] * 4
    assert (feature_keys(0, values) == k0).all()  # same on every call (no per-process salt)


def test_none_nan_and_empty_text_are_the_missing_key():
    keys = feature_keys(5, pd.Series(["x", None, "", np.nan], dtype="object"))
    assert keys[1:].tolist() == [missing_key(5)] * 3
    assert keys[0] not in (missing_key(5), oov_key(5))


def test_reserved_keys_have_hash_0_and_1():
    assert oov_key(7) == 7 << 56 and missing_key(7) == 7 << 56 | 1
    assert int(field_of(oov_key(127))) == 127


def test_field_index_must_fit_7_bits():
    with pytest.raises(ValueError, match="field_index"):
        feature_keys(128, ["a"])


def test_factorize_keys_hashes_distinct_values_only():
    codes, keys = factorize_keys(2, pd.Series(["a", "b", "a", None, ""], dtype="str"))
    assert len(keys) == 3  # a, b, and "" (folded into missing by its code)
    assert codes.tolist()[3:] == [-1, -1]
    assert keys[codes[0]] == keys[codes[2]]


def test_a_million_values_key_quickly():
    import time

    values = pd.Series(np.random.default_rng(0).integers(0, 20_000, 1_000_000).astype(str))
    t0 = time.perf_counter()
    feature_keys(0, values)
    assert time.perf_counter() - t0 < 5.0
