"""KeyIndex / SlotMap against a Python dict on random batched workloads."""

from __future__ import annotations

import numpy as np
import pytest

from storage.embedding.index import INITIAL_SLOTS, KeyIndex, SlotMap
from storage.embedding.slot_cache import SlotCache


def test_key_index_matches_a_dict_through_inserts_and_removes() -> None:
    rng = np.random.default_rng(0)
    idx, ref = KeyIndex(), {}
    for step in range(60):
        cand = np.unique(rng.integers(0, 5000, 300) * (2**40 + 1))
        absent = np.array([k for k in cand.tolist() if k not in ref], dtype=np.int64)
        vals = rng.integers(0, 10**9, absent.size)
        idx.insert(absent, vals)
        ref.update(zip(absent.tolist(), vals.tolist(), strict=True))
        if step % 3 == 2:
            gone = np.unique(rng.choice(cand, 100))
            removed = idx.remove(gone)
            for k, r in zip(gone.tolist(), removed.tolist(), strict=True):
                assert r == ref.pop(k, -1)
        probe = rng.integers(0, 5000, 500) * (2**40 + 1)
        assert idx.get(probe).tolist() == [ref.get(k, -1) for k in probe.tolist()]
        assert len(idx) == len(ref)


def test_slot_map_reuses_slots_and_respects_capacity() -> None:
    sm = SlotMap(capacity=4)
    s = sm.add(np.array([10, 11, 12]))
    assert sorted(s.tolist()) == [0, 1, 2]
    ok, freed = sm.remove(np.array([11, 99]))
    assert ok.tolist() == [True, False] and freed.tolist() == [1]
    assert sm.free_slots == 2
    s2 = sm.add(np.array([13, 14]))
    assert sorted(s2.tolist()) == [1, 3]
    with pytest.raises(ValueError, match="full"):
        sm.add(np.array([15]))
    assert sm.lookup(np.array([14, 10, 11])).tolist()[1:] == [0, -1]
    assert sm.slot_keys[sm.lookup(np.array([10, 12, 13, 14]))].tolist() == [10, 12, 13, 14]


def test_a_large_capacity_is_not_allocated_up_front_and_still_bounds_the_keys() -> None:
    """A day of a few thousand keys under a budget of millions of rows fills no table for the millions; the slot map
    and its cache grow with the keys they hold, and the capacity still refuses a key past it."""
    capacity = INITIAL_SLOTS * 3
    cache = SlotCache(capacity)
    assert cache.map.slot_keys.size <= INITIAL_SLOTS and cache.map._index.table_size < 4 * INITIAL_SLOTS
    assert cache.freq.size <= INITIAL_SLOTS
    keys = np.arange(1, capacity + 1, dtype=np.int64) * 7919
    for chunk in np.array_split(keys, 5):
        slots = cache.add(chunk)
        assert cache.freq.size > slots.max() and cache.map.slot_keys.size > slots.max()
    assert len(cache) == capacity and cache.map.free_slots == 0 and cache.freq.size == capacity
    assert np.array_equal(cache.map.slot_keys[cache.map.lookup(keys)], keys)
    with pytest.raises(ValueError, match="full"):
        cache.add(np.array([5], dtype=np.int64))


def test_key_index_grows_when_a_probe_run_passes_the_overflow_cells(monkeypatch) -> None:
    # Two overflow cells only: probe runs pass them often, so inserts must grow and retry.
    monkeypatch.setattr("storage.embedding.index._PAD", 2)
    idx = KeyIndex(16)
    rng = np.random.default_rng(1)
    ref: dict[int, int] = {}
    for _ in range(30):
        ks = np.setdiff1d(rng.integers(0, 10**12, 200), np.fromiter(ref, dtype=np.int64, count=len(ref)))
        ks = rng.permutation(ks)
        idx.insert(ks, np.arange(len(ref), len(ref) + ks.size))
        ref.update(zip(ks.tolist(), range(len(ref), len(ref) + ks.size), strict=True))
    probe = np.array(list(ref)[:3000] + [10**13, 10**13 + 1], dtype=np.int64)
    assert idx.get(probe).tolist() == [ref.get(k, -1) for k in probe.tolist()]
    keys, vals = idx.items()
    assert dict(zip(keys.tolist(), vals.tolist(), strict=True)) == ref


def test_key_index_int32_values_refuse_overflow() -> None:
    idx = KeyIndex(value_dtype=np.int32)
    with pytest.raises(ValueError, match="int32"):
        idx.insert(np.array([1]), np.array([2**31]))
    idx.insert(np.array([1, 2]), np.array([2**31 - 1, 0]))
    assert idx.get(np.array([1, 2])).dtype == np.int64
    assert idx.get(np.array([1, 2])).tolist() == [2**31 - 1, 0]
    with pytest.raises(TypeError, match="float64"):
        KeyIndex(value_dtype=np.float64)


def _keys_with_hashes(hashes: np.ndarray) -> np.ndarray:
    """Keys whose Fibonacci hash (key * FIB mod 2^64) is each of `hashes` (dropping negative keys)."""
    from storage.embedding.ssd.compact_index import unmix

    keys = unmix(np.asarray(hashes, dtype=np.uint64))
    return keys[keys >= 0]


def test_filter_never_hides_a_key_and_misses_near_colliding_keys_stay_misses() -> None:
    # Keys built from their hashes: groups share the home-cell bits (top 32) and differ only in
    # the filter bits (29..31) or the bits below, so the filter and the probe runs are crowded
    # with near-collisions of the absent keys.
    rng = np.random.default_rng(3)
    tops = rng.integers(0, 2**32, 300, dtype=np.uint64) << np.uint64(32)
    low = np.arange(64, dtype=np.uint64) << np.uint64(26)  # varies the filter bits and 3 bits below
    hashes = (tops[:, None] | low[None, :]).ravel()
    keys = _keys_with_hashes(hashes)
    present = keys[::2]
    absent = keys[1::2]
    idx = KeyIndex(16)  # grows (rehash rebuilds the filter) while inserting
    for part in np.array_split(rng.permutation(present), 7):
        idx.insert(part, part // 3)
    for batch in (absent, present, np.concatenate([absent, present]), absent[:40], present[:40]):
        want = np.where(np.isin(batch, present), batch // 3, -1)
        np.testing.assert_array_equal(idx.get(batch), want)
    # Removed keys leave their filter bits set (stale bits only cost a probe): still misses.
    gone = present[:500]
    idx.remove(gone)
    np.testing.assert_array_equal(idx.get(gone), np.full(gone.size, -1))
    np.testing.assert_array_equal(idx.get(present[500:]), present[500:] // 3)
    idx.insert(gone[:100], np.arange(100))
    np.testing.assert_array_equal(idx.get(gone[:100]), np.arange(100))


@pytest.mark.parametrize("miss_share", [0.0, 0.1, 0.5, 0.9, 1.0])
def test_lookups_agree_whether_they_start_with_the_filter_or_the_table(miss_share: float) -> None:
    # A batch with many misses starts with the filter, one with few with the home cells; both
    # must give the dict's answer, whatever the batch size (small batches probe by windows).
    rng = np.random.default_rng(4)
    keys = np.unique(rng.integers(0, 2**62, 20_000))
    idx = KeyIndex()
    idx.insert(keys, np.arange(keys.size))
    for n in (1, 7, 64, 600, 5000):
        miss = rng.random(n) < miss_share
        batch = np.where(miss, rng.integers(0, 2**62, n), keys[rng.integers(0, keys.size, n)])
        ref = {int(k): i for i, k in enumerate(keys)}
        assert idx.get(batch).tolist() == [ref.get(int(k), -1) for k in batch]


def test_filter_bytes_are_counted_in_nbytes() -> None:
    idx = KeyIndex(1000, value_dtype=np.int32)
    assert idx.nbytes == idx.table_size * (8 + 4 + 1)
