"""One bucket's update: buckets add up to the whole table, and every merge the stage picks gives one vocabulary."""

import numpy as np
import pytest

from pipeline.vocab.bucket import (
    BucketRule,
    MergedRows,
    finish_rows,
    merge_rows,
    update_bucket,
)
from pipeline.vocab.buckets import bucket_of
from pipeline.vocab.cap import CapSearch, cap_histograms, cap_mask, score_bits

DATE = 20100
RULE = BucketRule(thresholds=(3.0,) * 128, ttl_days=1, n_fields=3)


def random_days(seed: int, n: int = 4) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """day number -> (sorted keys of fields 0..2, counts) for DATE - n + 1 .. DATE."""
    rng = np.random.default_rng(seed)
    out = {}
    for d in range(DATE - n + 1, DATE + 1):
        keys = np.unique((rng.integers(0, 3, 300) << 56) | rng.integers(2, 200, 300))
        out[d] = keys, rng.integers(1, 4, len(keys)).astype(np.int64)
    return out


def as_previous(vocab: dict) -> dict:
    """A bucket's vocabulary (dates as day numbers) as the next day's previous state."""
    return {
        "key": vocab["key"],
        "count": vocab["count"],
        "first": vocab["first_seen"],
        "last": vocab["last_seen"],
        "admitted": vocab["admitted"],
    }


def empty_previous() -> dict:
    return {
        "key": np.empty(0, np.int64),
        "count": np.empty(0, np.int64),
        "first": np.empty(0, np.int64),
        "last": np.empty(0, np.int64),
        "admitted": np.empty(0, bool),
    }


def select(columns: dict, mask: np.ndarray) -> dict:
    return {name: v[mask] for name, v in columns.items()}


def vocab_of(days: dict, date: int, previous: dict, rule: BucketRule, window_days: int = 2):
    window = [(d, *days[d]) for d in days if date - window_days < d < date]
    return update_bucket(date=date, today=days[date], previous=previous, rule=rule, window=window)


@pytest.mark.parametrize("seed", range(3))
def test_buckets_decided_alone_add_up_to_the_whole_table(seed):
    """Without a cap every rule is per key: the buckets' parts, evicted keys and sums are the whole table's."""
    days = random_days(seed)
    previous = as_previous(vocab_of(days, DATE - 1, empty_previous(), RULE).vocab)
    whole = vocab_of(days, DATE, previous, RULE)
    buckets = 5
    parts = []
    for b in range(buckets):
        mine = {d: (k[bucket_of(k, buckets) == b], c[bucket_of(k, buckets) == b]) for d, (k, c) in days.items()}
        parts.append(vocab_of(mine, DATE, select(previous, bucket_of(previous["key"], buckets) == b), RULE))
    for table in ("vocab", "evicted"):
        got = {name: np.concatenate([getattr(p, table)[name] for p in parts]) for name in getattr(whole, table)}
        order = np.argsort(got["key"])
        for name, want in getattr(whole, table).items():
            np.testing.assert_array_equal(got[name][order], want)
    assert whole.evicted["key"].size and whole.vocab["admitted"].any()  # the case is not vacuous
    total = sum((p.totals for p in parts[1:]), parts[0].totals)
    for got_sum, want_sum in zip(total._parts(), whole.totals._parts(), strict=True):
        np.testing.assert_array_equal(got_sum, want_sum)
    assert sum(p.day_keys for p in parts) == whole.day_keys == len(days[DATE][0])


@pytest.mark.parametrize("seed", range(3))
def test_the_delta_merge_with_a_date_dictionary_gives_the_window_merge_vocabulary(seed):
    """previous count + D - the dropped day, dates kept as dictionary indices, equals re-summing the window."""
    days = random_days(seed)
    v = vocab_of(days, DATE - 1, as_previous(vocab_of(days, DATE - 2, empty_previous(), RULE).vocab), RULE)
    previous = as_previous(v.vocab)
    want = vocab_of(days, DATE, previous, RULE)
    dictionary = np.unique(np.concatenate([previous["first"], previous["last"]]))
    indexed = {
        **previous,
        "first": np.searchsorted(dictionary, previous["first"]).astype(np.int32),
        "last": np.searchsorted(dictionary, previous["last"]).astype(np.int32),
    }
    got = update_bucket(
        date=DATE, today=days[DATE], previous=indexed, days=dictionary, dropped=days[DATE - 2], delta=True, rule=RULE
    )
    assert got.days is not None
    for name, column in want.vocab.items():
        np.testing.assert_array_equal(
            got.days[got.vocab[name]] if name in ("first_seen", "last_seen") else got.vocab[name], column
        )
    for name, column in want.evicted.items():
        np.testing.assert_array_equal(got.evicted[name], column)
    np.testing.assert_array_equal(got.totals.covered, want.totals.covered)


def test_with_a_cap_the_stage_split_across_buckets_equals_one_bucket_holding_every_key():
    """merge_rows per bucket, the cut searched across buckets, finish_rows: the whole-table capped vocabulary."""
    days = random_days(7)
    rule = BucketRule(thresholds=(2.0,) * 128, ttl_days=1, n_fields=3, cap=25, decay=0.8)
    whole = vocab_of(days, DATE, empty_previous(), rule)
    assert (np.bincount(whole.vocab["field"][whole.vocab["admitted"]]) == 25).all()
    buckets = 4
    merged: list[MergedRows] = []
    for b in range(buckets):
        mine = {d: (k[bucket_of(k, buckets) == b], c[bucket_of(k, buckets) == b]) for d, (k, c) in days.items()}
        merged.append(
            merge_rows(
                date=DATE,
                today=mine[DATE],
                previous=empty_previous(),
                rule=rule,
                window=[(d, *mine[d]) for d in (DATE - 1,)],
            )
        )
    search = CapSearch(
        cap=rule.cap,
        admitted=sum(np.bincount(m.rows["field"][m.rows["admitted"]], minlength=3) for m in merged),
        buckets=buckets,
    )
    while not search.done:
        search.absorb(
            [
                cap_histograms(
                    field=m.rows["field"],
                    bits=score_bits(m.rows["score"]),
                    admitted=m.rows["admitted"],
                    query=search.query(),
                    shift=search.shift,
                )
                for m in merged
            ]
        )
    parts = [
        finish_rows(
            m,
            cap_mask(
                field=m.rows["field"],
                bits=score_bits(m.rows["score"]),
                admitted=m.rows["admitted"],
                cuts={f: (c.bits, c.take[b]) for f, c in search.cuts.items()},
            ),
            n_fields=3,
            day_keys=0,
        )
        for b, m in enumerate(merged)
    ]
    got = np.sort(np.concatenate([p.vocab["key"][p.vocab["admitted"]] for p in parts]))
    np.testing.assert_array_equal(got, whole.vocab["key"][whole.vocab["admitted"]])
