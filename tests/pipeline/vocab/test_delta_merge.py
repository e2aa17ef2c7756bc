"""The delta merge (previous + today - the dropped day) equals re-summing the window, fused or not."""

import numpy as np
import pytest

from pipeline.vocab.admission import split_vocab
from pipeline.vocab.delta_merge import delta_combine, delta_vocab
from pipeline.vocab.report import field_totals
from pipeline.vocab.window_merge import combine, window_table


@pytest.mark.parametrize("seed", range(4))
def test_the_delta_merge_equals_combining_the_summed_window(seed):
    """previous + today - dropped, merged as sorted arrays, equals re-summing the window's day counts."""
    rng = np.random.default_rng(seed)
    date, window_days = 20100, 3

    def day(n: int) -> tuple[np.ndarray, np.ndarray]:
        keys = np.unique((rng.integers(0, 3, n) << 56) | rng.integers(2, 400, n))
        return keys, rng.integers(1, 4, len(keys)).astype(np.int64)

    days = {date - k: day(int(rng.integers(0, 300))) for k in range(window_days + 1)}  # D - 3 .. D
    thresholds = np.full(128, 3.0)
    # the vocabulary of D - 1: its window D - 3 .. D - 1 on top of an older vocabulary with admitted keys
    older = {"key": np.unique((rng.integers(0, 3, 50) << 56) | rng.integers(2, 400, 50))}
    older |= {
        "count": np.zeros(len(older["key"]), np.int64),
        "first": rng.integers(date - 40, date - 8, len(older["key"])),
        "last": rng.integers(date - 7, date - 4, len(older["key"])),  # ttl 5: some expire at D - 1, some at D
        "admitted": rng.random(len(older["key"])) < 0.7,
    }
    window = window_table([(d, *days[d]) for d in range(date - window_days, date)], end=date - 1, decay=1.0)
    prev = combine(date=date - 1, window=window, previous=older, thresholds=thresholds, ttl_days=5)
    keep = (prev["count"] > 0) | prev["admitted"]
    previous = {
        "key": prev["key"][keep],
        "count": prev["count"][keep],
        "first": prev["first_seen"][keep],
        "last": prev["last_seen"][keep],
        "admitted": prev["admitted"][keep],
    }

    want = combine(
        date=date,
        window=window_table([(d, *days[d]) for d in range(date - window_days + 1, date + 1)], end=date, decay=1.0),
        previous=previous,
        thresholds=thresholds,
        ttl_days=5,
    )
    got = delta_combine(
        date=date,
        previous=previous,
        today=days[date],
        dropped=days[date - window_days],
        thresholds=thresholds,
        ttl_days=5,
    )
    assert got.keys() == want.keys()
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    assert (
        (want["count"] == 0).any() and want["was_admitted"].any() and (want["was_admitted"] & ~want["admitted"]).any()
    )

    with pytest.raises(ValueError, match="went negative"):  # a dropped day the previous vocabulary never counted
        delta_combine(
            date=date,
            previous=previous,
            today=days[date],
            dropped=(np.array([5]), np.array([1])),
            thresholds=thresholds,
            ttl_days=5,
        )


@pytest.mark.parametrize("seed", range(6))
def test_the_fused_delta_merge_equals_the_delta_merge_split_and_summed(seed):
    """`delta_vocab` (no cap: straight to the kept rows, dates as dictionary
    indices) = delta_combine + split + totals."""
    rng = np.random.default_rng(100 + seed)
    date, ttl = 20100, 4

    def keys(n: int) -> np.ndarray:
        return np.unique((rng.integers(0, 4, n) << 56) | rng.integers(2, 300, n))

    prev_keys = keys(int(rng.integers(0, 500)))
    n = len(prev_keys)
    count = rng.integers(0, 5, n)
    last = rng.integers(date - 9, date, n)
    previous = {
        "key": prev_keys,
        "count": count,
        "first": last - rng.integers(0, 30, n),
        "last": last,
        "admitted": (rng.random(n) < 0.5) | (count >= 3),
    }
    today = keys(int(rng.integers(0, 200)))
    today = (today, rng.integers(1, 4, len(today)).astype(np.int64))
    some = prev_keys[(count > 0) & (rng.random(n) < 0.3)]  # the dropped day: keys the window counted
    dropped = (some, np.minimum(rng.integers(1, 3, len(some)), count[np.searchsorted(prev_keys, some)]))
    if seed == 0:
        dropped = None
    thresholds = np.full(128, 3.0)
    thresholds[1] = 2.0  # a per-field override
    want = split_vocab_with_totals(
        delta_combine(date=date, previous=previous, today=today, dropped=dropped, thresholds=thresholds, ttl_days=ttl),
        today,
        n_fields=4,
    )
    # the previous dates as a part stores them: indices into a dictionary, here with unused and unsorted days
    days = np.unique(np.r_[previous["first"], previous["last"], date - 50])[::-1]
    if seed % 2:
        days = np.r_[days, date]  # the run date already in the dictionary
    indexed = {
        **previous,
        "first": np.searchsorted(-days, -previous["first"]).astype(np.int32),
        "last": np.searchsorted(-days, -previous["last"]).astype(np.int32),
    }
    got = delta_vocab(
        date=date,
        previous=indexed,
        days=days,
        today=today,
        dropped=dropped,
        thresholds=thresholds,
        ttl_days=ttl,
        n_fields=4,
    )
    vocab = {
        **got.vocab,
        "first_seen": got.days[got.vocab["first_seen"]],
        "last_seen": got.days[got.vocab["last_seen"]],
    }
    for name, column in want[0].items():
        np.testing.assert_array_equal(vocab[name], column, err_msg=name)
        assert vocab[name].dtype == column.dtype or name in ("first_seen", "last_seen"), name
    for name, column in want[1].items():
        np.testing.assert_array_equal(got.evicted[name], column, err_msg=f"evicted {name}")
    for name in ("seen", "admitted", "evicted", "covered", "present", "known", "distinct"):
        np.testing.assert_array_equal(getattr(got.totals, name), getattr(want[2], name), err_msg=name)
    if seed == 1:
        assert len(want[1]["key"]) and (want[0]["count"] == 0).any() and len(want[0]["key"]) < len(prev_keys) + 200


def split_vocab_with_totals(merged, today, *, n_fields):
    vocab, gone = split_vocab(merged, merged["admitted"])
    on = np.zeros(len(merged["key"]), np.int64)
    on[np.searchsorted(merged["key"], today[0])] = today[1]
    totals = field_totals(
        field=merged["field"],
        count=merged["count"],
        admitted=merged["admitted"],
        evicted=merged["was_admitted"] & ~merged["admitted"],
        today=on,
        was_admitted=merged["was_admitted"],
        n_fields=n_fields,
    )
    return vocab, gone, totals
