"""The companion as a scorer uses it (`trainer.companion.model`): its inputs, and the blend."""

from __future__ import annotations

import numpy as np

from storage.key_layout import FIELD_SHIFT
from trainer.companion.key_counts import KeyCounts
from trainer.companion.model import blend, inputs


def test_the_inputs_bucket_the_dense_columns_after_the_key_fields_and_add_each_keys_count_token_alone():
    keys = np.array([[2, (1 << FIELD_SHIFT) | 5]], dtype=np.int64)
    ids, d = inputs(keys, np.array([[np.log1p(3.0)]], dtype=np.float32), 20, None)
    assert ids.shape == (1, 3 + 3) and d.dtype == np.float64  # 2 keys and 1 bucket token, and their 3 pairs
    no_dense, d0 = inputs(keys, None, 20, None)
    assert no_dense.shape == (1, 2 + 1) and d0.shape == (1, 0)
    counted, _ = inputs(keys, np.array([[1.0]]), 20, KeyCounts.of(keys))
    assert counted.shape == (1, 6 + 2)  # and each key's count class, alone (no pairs)
    np.testing.assert_array_equal(counted[:, :6], ids)
    own_fields = KeyCounts.of(keys).tokens(keys, leave_one_out=False) >> FIELD_SHIFT
    np.testing.assert_array_equal(own_fields, [[0, 1]])


def test_the_blend_is_the_mean_logit():
    np.testing.assert_allclose(blend(np.array([1.0, -3.0]), np.array([3.0, 1.0])), [2.0, -1.0])
