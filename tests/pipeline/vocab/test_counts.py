"""Counting keys: one count per distinct non-missing value and field, partitions summed into days."""

import pandas as pd

from pipeline.vocab.counts import count_keys, merge_counts
from tests.helpers.vocab_days import counts, key


def test_count_keys_skips_missing_values_and_counts_each_field_apart():
    c = count_keys(pd.DataFrame({"a": ["x", "x", None, ""], "b": ["x", "y", "y", "y"]}), ["a", "b"])
    assert dict(zip(c["key"], c["count"], strict=True)) == {key("x"): 2, key("x", 1): 1, key("y", 1): 3}
    assert sorted(c["field"].tolist()) == [0, 1, 1]


def test_partition_counts_merge_into_the_day_counts():
    assert merge_counts([counts(a=1, b=2), counts(a=3)]).equals(counts(a=4, b=2))
