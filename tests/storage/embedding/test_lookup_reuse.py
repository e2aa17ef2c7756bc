"""A caching tier's `update` right after a `lookup` of the same keys reuses what the lookup resolved.

The sharded step looks its owned (sorted, distinct) keys up at the pull and updates the very same
tensor at the push; the update then skips hashing the keys and reading the misses below again.
These tests check that the shortcut changes nothing a caller can see: rows, this tier's counters,
and that any call in between (or an in-place change of the keys) turns it off.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from storage.embedding.host import HostStore, host_row_bytes
from storage.embedding.memory import MemoryStore
from storage.embedding.rows import Rows, all_finite, strictly_increasing, sum_duplicates
from tests.storage.embedding.conformance import DIM, STD, all_rows


def _host(capacity: int) -> HostStore:
    below = MemoryStore(DIM, init_std=STD)
    return HostStore(DIM, budget_bytes=capacity * host_row_bytes(DIM), below=below, init_std=STD, evict_extra=0.0)


def _steps(n: int, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        keys = torch.unique(torch.randint(0, 60, (25,), generator=g))  # sorted distinct, as a route's
        out.append((keys, torch.randn(keys.numel(), DIM, generator=g)))
    return out


@pytest.mark.parametrize("capacity", [8, 30, 1000])  # a batch larger than the cache, spills, no spills
def test_update_after_lookup_of_the_same_keys_changes_nothing(tmp_path: Path, capacity: int) -> None:
    reused, fresh = _host(capacity), _host(capacity)
    for keys, grads in _steps(12):
        looked = reused.lookup(keys)
        reused.update(looked, grads, lr=0.05)  # the lookup's handle: its resolution is reused
        b = fresh.lookup(keys).rows
        fresh.update(keys, grads, lr=0.05)  # plain keys: resolved again
        a = looked.rows
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert reused.stats()["host"] == fresh.stats()["host"]
    # ...while the tier below was really asked once per step instead of twice (the shortcut was taken)
    asked = [sum(t.below.stats()["memory"][k] for k in ("hits", "misses")) for t in (reused, fresh)]
    assert asked[0] < asked[1]
    got, want = all_rows(reused, str(tmp_path / "a")), all_rows(fresh, str(tmp_path / "b"))
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])


def test_a_call_in_between_turns_the_reuse_off_and_the_handle_owns_its_keys(tmp_path: Path) -> None:
    host, ref = _host(6), MemoryStore(DIM, init_std=STD)
    keys = torch.tensor([1, 2, 3, 4, 5], dtype=torch.int64)
    other = torch.tensor([7, 8, 9, 10, 11], dtype=torch.int64)
    ones = torch.ones(5, DIM)
    looked = host.lookup(keys)
    host.update(other, ones, lr=0.1)  # evicts some of `keys`' rows and admits others: the plan is stale
    ref.update(other, ones, lr=0.1)
    host.update(looked, ones, lr=0.1)  # resolved afresh
    ref.update(keys, ones, lr=0.1)
    looked = host.lookup(keys)
    keys.add_(20)  # the caller's tensor changes; the handle kept its own copy of the keys looked up
    host.update(looked, ones, lr=0.1)
    ref.update(keys - 20, ones, lr=0.1)
    assert torch.equal(looked.keys, keys - 20)
    probe = torch.arange(0, 30, dtype=torch.int64)
    torch.testing.assert_close(host.lookup(probe).rows, ref.lookup(probe).rows, rtol=0, atol=0)


def test_lookup_of_unsorted_keys_with_misses_still_matches_the_reference() -> None:
    host, ref = _host(10), MemoryStore(DIM, init_std=STD)
    host.update(torch.tensor([3, 9]), torch.ones(2, DIM), lr=0.1)
    ref.update(torch.tensor([3, 9]), torch.ones(2, DIM), lr=0.1)
    keys = torch.tensor([9, 40, 3, 40, 41])  # duplicates and misses: the de-duplicating path
    torch.testing.assert_close(host.lookup(keys).rows, ref.lookup(keys).rows, rtol=0, atol=0)


def test_all_finite_and_strictly_increasing() -> None:
    assert all_finite(torch.zeros(0)) and all_finite(torch.randn(100, 4))
    assert all_finite(torch.full((4,), 3e38))  # the sum overflows; every entry is still finite
    for bad in (float("nan"), float("inf"), -float("inf")):
        t = torch.randn(50, 3)
        t[17, 1] = bad
        assert not all_finite(t)
    assert strictly_increasing(np.array([], dtype=np.int64)) and strictly_increasing(np.array([5]))
    assert strictly_increasing(np.array([1, 4, 9]))
    assert not strictly_increasing(np.array([1, 4, 4])) and not strictly_increasing(np.array([4, 1]))


def test_sum_duplicates_passes_sorted_distinct_keys_through() -> None:
    keys, grads = np.array([2, 5, 7]), torch.randn(3, DIM)
    uniq, summed = sum_duplicates(keys, grads)
    assert uniq is keys and summed is grads
    uniq, summed = sum_duplicates(np.array([7, 2, 7]), grads)
    assert uniq.tolist() == [2, 7]
    torch.testing.assert_close(summed, torch.stack([grads[1], grads[0] + grads[2]]), rtol=0, atol=0)


def test_rows_select_and_put_by_index_and_by_mask() -> None:
    rows = Rows.fresh(torch.arange(12.0).reshape(4, 3))
    rows.clock += torch.arange(4)
    picked = rows.select(np.array([3, 1]))
    assert picked.emb[:, 0].tolist() == [9.0, 3.0] and picked.clock.tolist() == [3, 1]
    masked = rows.select(torch.tensor([False, True, False, True]))
    assert masked.emb[:, 0].tolist() == [3.0, 9.0]
    rows.put(np.array([0, 2]), picked)
    assert rows.emb[:, 0].tolist() == [9.0, 3.0, 3.0, 9.0] and rows.clock.tolist() == [3, 1, 1, 3]
    rows.put(torch.tensor([True, False, False, False]), Rows.empty(1, 3))
    assert rows.emb[0].tolist() == [0.0, 0.0, 0.0] and rows.clock[0] == 0
