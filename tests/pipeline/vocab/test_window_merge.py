"""The window merge: day counts summed (decayed) over the window, then combined with the previous vocabulary."""

import numpy as np
import pandas as pd

from pipeline.config import VocabConfig
from pipeline.vocab.counts import count_keys
from storage.io.dates import date_range, shift_date
from tests.helpers.vocab_days import counts, key, update_vocab, window_counts
from tests.helpers.vocab_reference import reference_update, reference_window_counts


def test_window_sums_days_and_records_first_and_last_date():
    w = window_counts({"2026-01-02": counts(a=1), "2026-01-01": counts(a=2, b=1), "2026-01-03": counts(b=5)})
    rows = w.set_index("key")
    assert rows.loc[key("a"), ["count", "first_date", "last_date"]].tolist() == [3, "2026-01-01", "2026-01-02"]
    assert rows.loc[key("b"), ["count", "first_date", "last_date"]].tolist() == [6, "2026-01-01", "2026-01-03"]


def test_decay_weighs_older_days_less():
    days = {"2026-01-01": counts(a=4), "2026-01-03": counts(b=2)}
    w = window_counts(days, date="2026-01-03", decay=0.5).set_index("key")
    assert w.loc[key("a"), ["count", "score"]].tolist() == [4, 1.0] and w.loc[key("b"), "score"] == 2.0
    v = update_vocab(date="2026-01-03", days=days, previous=None, config=VocabConfig(min_count=2, decay=0.5))
    assert v.vocab.set_index("key")["admitted"].to_dict() == {key("a"): False, key("b"): True}


def test_the_whole_table_merge_with_decay_ttl_and_cap_equals_the_reference():
    """`update_bucket` over one bucket holding every key (as the rule tests run it) gives the reference's tables."""
    rng = np.random.default_rng(5)
    frames = {
        d: count_keys(
            pd.DataFrame({c: rng.choice([f"v{i}" for i in range(30)] + [None], 400) for c in ("A", "B")}), ["A", "B"]
        )
        for d in date_range("2026-01-01", "2026-01-04")
    }
    cfg = VocabConfig(min_count=3, ttl_days=1, decay=0.9, max_keys_per_field=10)
    prev = ref_prev = None
    for d in frames:
        window = {k: v for k, v in frames.items() if k <= d and k > shift_date(d, -2)}
        got = update_vocab(date=d, days=window, previous=prev, config=cfg, fields=["A", "B"])
        want = reference_update(
            date=d,
            window=reference_window_counts(window, date=d, decay=0.9),
            previous=ref_prev,
            config=cfg,
            fields=["A", "B"],
        )
        pd.testing.assert_frame_equal(got.vocab, want[0], check_exact=True, check_dtype=False)
        pd.testing.assert_frame_equal(got.evicted, want[1], check_exact=True, check_dtype=False)
        prev, ref_prev = got.vocab, want[0]
