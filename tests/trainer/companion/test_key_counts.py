"""Key counts: how many fit rows had each key, as a count token per key: its field, and the class
floor(log2(1 + count)) above `COUNT_HASH`."""

from __future__ import annotations

import numpy as np
import pytest

from storage.key_layout import FIELD_SHIFT, HASH_MASK, MAX_FIELDS
from trainer.companion.key_counts import COUNT_HASH, KeyCounts

F1 = 1 << FIELD_SHIFT


def test_a_key_is_counted_once_per_row_that_has_it_and_an_unseen_key_counts_zero():
    rows = np.array([[5, F1 | 5], [5, F1 | 6], [7, F1 | 5]], dtype=np.int64)  # 5 in field 0 and in field 1 differ
    counts = KeyCounts.of(rows)
    np.testing.assert_array_equal(counts.count(rows), [[2, 2], [2, 1], [1, 2]])
    np.testing.assert_array_equal(counts.count(np.array([[9, F1 | 9]])), [[0, 0]])
    assert KeyCounts.of(np.zeros((0, 2), np.int64)).count(rows).sum() == 0  # no fit rows: nothing seen


def test_the_classes_are_log2_of_one_plus_the_count_and_a_fit_row_leaves_itself_out():
    keys = np.repeat(np.array([1, 2, 3], dtype=np.int64), [1, 3, 8])[:, None]  # counts 1, 3 and 8
    counts = KeyCounts.of(keys)
    probe = np.array([[1], [2], [3], [4]], dtype=np.int64)  # the last never seen
    later = counts.tokens(probe, leave_one_out=False)
    np.testing.assert_array_equal(later - COUNT_HASH, [[1], [2], [3], [0]])  # log2(2), log2(4), log2(9), 0
    fit = counts.tokens(probe[:3], leave_one_out=True)
    np.testing.assert_array_equal(fit - COUNT_HASH, [[0], [1], [3]])  # seen once: as if never seen


def test_a_token_keeps_its_keys_field_up_to_the_last_field():
    last = (MAX_FIELDS - 1) << FIELD_SHIFT
    keys = np.array([[7, F1 | 7, last | 7]], dtype=np.int64)
    tokens = KeyCounts.of(keys).tokens(keys, leave_one_out=False)
    np.testing.assert_array_equal(tokens >> FIELD_SHIFT, keys >> FIELD_SHIFT)
    np.testing.assert_array_equal(tokens & HASH_MASK, [[COUNT_HASH + 1] * 3])


def test_malformed_counts_are_refused():
    with pytest.raises(ValueError, match="one count per key"):
        KeyCounts(np.array([1, 2]), np.array([1]))
    with pytest.raises(ValueError, match="ascending"):
        KeyCounts(np.array([2, 1]), np.array([1, 1]))
