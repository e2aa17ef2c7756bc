"""The per-field cap: the highest scores of each field stay admitted (ties: smaller key), found across buckets."""

import numpy as np
import pytest

from pipeline.config import VocabConfig
from pipeline.encode.keys import field_of
from pipeline.vocab.buckets import bucket_of
from pipeline.vocab.cap import CapSearch, cap_histograms, cap_mask, score_bits
from tests.helpers.vocab_days import counts, key, update_vocab
from tests.helpers.vocab_reference import reference_within_cap


def test_the_per_field_cap_keeps_the_highest_scores_and_evicts_the_rest():
    first = update_vocab(
        date="2026-01-01", days={"2026-01-01": counts(a=5, b=4, c=3)}, previous=None, config=VocabConfig(min_count=1)
    )
    assert first.vocab["admitted"].all()
    days = {"2026-01-01": counts(a=5, b=4, c=3), "2026-01-02": counts(c=9)}
    capped = update_vocab(
        date="2026-01-02", days=days, previous=first.vocab, config=VocabConfig(min_count=1, max_keys_per_field=2)
    )
    admitted = set(capped.vocab.loc[capped.vocab["admitted"], "key"])
    assert admitted == {key("c"), key("a")} and capped.evicted["key"].tolist() == [key("b")]


@pytest.mark.parametrize("decay", [1.0, 0.83])
@pytest.mark.parametrize("cap", [1, 7, 40])
def test_the_cap_search_over_buckets_keeps_exactly_the_single_table_top_keys(decay, cap):
    rng = np.random.default_rng(int(cap * 10 + decay * 100))
    n = 3000
    keys = np.unique((rng.integers(0, 4, n) << 56) | rng.integers(2, 1 << 56, n))
    field = field_of(keys).astype(np.int16)
    days = rng.integers(0, 3, (len(keys), 4))  # four days of small counts: many exact ties
    score = sum(days[:, k].astype(np.float64) * decay ** (3 - k) for k in range(4))
    admitted = rng.random(len(keys)) < 0.8
    want = admitted & reference_within_cap(field, keys, score, admitted, cap)

    buckets = 6
    b = bucket_of(keys, buckets)
    parts = [np.flatnonzero(b == i) for i in range(buckets)]  # each bucket's keys stay sorted
    bits = score_bits(score)
    per_field = np.bincount(field[admitted], minlength=4)
    search = CapSearch(cap=cap, admitted=per_field, buckets=buckets)
    rounds = 0
    while not search.done:
        search.absorb(
            [
                cap_histograms(
                    field=field[p], bits=bits[p], admitted=admitted[p], query=search.query(), shift=search.shift
                )
                for p in parts
            ]
        )
        rounds += 1
    assert rounds <= 5 and set(search.cuts) == {f for f in range(4) if per_field[f] > cap}
    got = np.zeros(len(keys), bool)
    for i, p in enumerate(parts):
        cuts = {f: (c.bits, c.take[i]) for f, c in search.cuts.items()}
        got[p] = cap_mask(field=field[p], bits=bits[p], admitted=admitted[p], cuts=cuts)
    np.testing.assert_array_equal(got, want)


def test_negative_scores_are_refused():
    with pytest.raises(ValueError, match="scores must be >= 0"):
        score_bits(np.array([1.0, -0.5]))
