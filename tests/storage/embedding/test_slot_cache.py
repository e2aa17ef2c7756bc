"""SlotCache: packed access scores, batched admission and eviction, and the hit-rate simulation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from storage.embedding.device_cache import DeviceCache
from storage.embedding.memory import MemoryStore
from storage.embedding.slot_cache import (
    SlotCache,
    simulate_hit_rate,
    simulate_hit_rates,
)
from tests.helpers.stores import DIM, STD


def test_touch_accesses_equals_touch_of_distinct_slots_with_counts() -> None:
    rng = np.random.default_rng(2)
    a, b = SlotCache(None), SlotCache(None)
    a.add(np.arange(50))
    b.add(np.arange(50))
    for _ in range(5):
        a.next_tick()
        b.next_tick()
        slots = rng.integers(0, 50, 200)
        uniq, counts = np.unique(slots, return_counts=True)
        assert a.touch_accesses(slots) == uniq.size
        b.touch(uniq, counts)
        np.testing.assert_array_equal(a.freq, b.freq)
        np.testing.assert_array_equal(a.last, b.last)


def test_plan_evicts_the_coldest_unprotected_residents_and_turns_away_colder_newcomers() -> None:
    cache = SlotCache(3, "lfu")
    cache.next_tick()
    slots = cache.add(np.array([10, 11, 12]))
    cache.touch(slots, np.array([5, 1, 3]))  # key 11 is the coldest resident
    cache.next_tick()
    victims, admit = cache.plan(np.array([2]), protect=np.empty(0, dtype=np.int64))
    assert cache.map.slot_keys[victims].tolist() == [11] and admit.tolist() == [True]
    # with every resident protected (used by the call), the newcomer is turned away instead
    victims, admit = cache.plan(np.array([9]), protect=slots)
    assert victims.size == 0 and admit.tolist() == [False]


def test_bad_arguments_name_the_value() -> None:
    with pytest.raises(ValueError, match="-1"):
        SlotCache(-1)
    with pytest.raises(ValueError, match="-0.1"):
        SlotCache(10, evict_extra=-0.1)
    with pytest.raises(ValueError, match="fifo"):
        SlotCache(10, "fifo")


def test_simulated_hit_rate_grows_with_the_cache_and_lfu_beats_lru_on_skew() -> None:
    rng = np.random.default_rng(0)
    zipf = rng.zipf(1.2, 200_000) % 50_000
    lfu = simulate_hit_rate(zipf, 2_000, "lfu", batch=1024)
    lru = simulate_hit_rate(zipf, 2_000, "lru", batch=1024)
    assert 0 < lru <= lfu < 1
    assert simulate_hit_rate(zipf, 60_000, "lfu", batch=1024) > lfu  # bigger cache, more hits
    assert simulate_hit_rate(np.arange(5000), 100, "lfu") == 0.0  # a scan never hits
    assert simulate_hit_rate(np.zeros(0, dtype=np.int64), 10) == 0.0
    with pytest.raises(ValueError):
        simulate_hit_rate(zipf, 10, "fifo")


def test_simulation_matches_the_device_cache_counters() -> None:
    rng = np.random.default_rng(1)
    stream = rng.zipf(1.3, 4000) % 300
    for policy in ("lfu", "lru"):
        below = MemoryStore(DIM, init_std=STD)
        below.warm(torch.from_numpy(np.unique(stream)))
        cache = DeviceCache(below, capacity_rows=50, policy=policy)
        for lo in range(0, stream.size, 100):
            cache.lookup(torch.from_numpy(stream[lo : lo + 100]))
        s = cache.stats()["device"]
        assert s["hits"] / (s["hits"] + s["misses"]) == pytest.approx(simulate_hit_rate(stream, 50, policy, batch=100))


def test_per_access_hit_rate_counts_every_occurrence() -> None:
    stream = np.array([1, 1, 1, 2, 1, 1, 3, 3], dtype=np.int64)
    rates = simulate_hit_rates(stream, 10, "lfu", batch=4)
    # batch 1: 1 misses then hits twice, 2 misses; batch 2: 1 hits twice, 3 misses then hits.
    assert rates == {"distinct": 1 / 4, "access": 5 / 8}
