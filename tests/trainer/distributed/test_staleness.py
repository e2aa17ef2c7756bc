"""The HET cache alone: which copies serve under the bound, when their pending gradients leave, and LFU eviction."""

from __future__ import annotations

import torch

from trainer.distributed.staleness import StaleRowCache


def test_a_copy_serves_while_owner_updates_plus_local_updates_stay_within_the_bound() -> None:
    cache = StaleRowCache(2, bound=3, capacity=10)
    cache.insert(torch.tensor([7]), torch.ones(1, 2), torch.tensor([5]), step=0)  # owner's clock 5 at the fetch
    cache.accumulate(torch.tensor([7]), torch.full((1, 2), 0.5), lr=0.1)  # 1 local update
    assert not torch.equal(cache.rows, torch.ones(1, 2))  # the rank sees its own update
    valid, rows = cache.serve(torch.tensor([7]), torch.tensor([7]), step=1)  # owner +2, local 1: 3 <= 3
    assert valid.tolist() == [True] and rows.shape == (1, 2)
    cache.accumulate(torch.tensor([7]), torch.full((1, 2), 0.25), lr=0.1)  # local 2: 2 + 2 > 3
    cache.expire(step=1)  # cannot serve the next pull even if the owner does not move: pushed
    keys, grads, counts = cache.take_outgoing()
    assert keys.tolist() == [7] and counts.tolist() == [2] and torch.allclose(grads, torch.full((1, 2), 0.75))
    assert len(cache) == 0


def test_a_clock_check_past_the_bound_drops_the_copy_and_queues_its_gradient() -> None:
    cache = StaleRowCache(2, bound=2, capacity=10)
    cache.insert(torch.tensor([3, 9]), torch.zeros(2, 2), torch.tensor([0, 4]), step=0)
    cache.accumulate(torch.tensor([3]), torch.ones(1, 2), lr=0.1)
    valid, rows = cache.serve(torch.tensor([3, 9]), torch.tensor([2, 4]), step=1)  # key 3: 2 + 1 > 2
    assert valid.tolist() == [False, True] and rows.shape == (1, 2) and cache.keys.tolist() == [9]
    keys, grads, counts = cache.take_outgoing()
    assert keys.tolist() == [3] and counts.tolist() == [1] and torch.equal(grads, torch.ones(1, 2))
    assert cache.stale == 1 and cache.hits == 1


def test_dirty_copies_are_pushed_after_bound_steps_even_when_unused() -> None:
    cache = StaleRowCache(2, bound=4, capacity=10)
    cache.insert(torch.tensor([1, 2]), torch.zeros(2, 2), torch.tensor([0, 0]), step=0)
    cache.accumulate(torch.tensor([1]), torch.ones(1, 2), lr=0.1)
    cache.expire(step=3)
    assert len(cache) == 2
    cache.expire(step=4)  # key 1 dirty and 4 steps old; key 2 clean: it stays
    assert cache.keys.tolist() == [2] and cache.take_outgoing()[0].tolist() == [1]


def test_eviction_is_lfu_and_flushes_the_evicted_gradients() -> None:
    cache = StaleRowCache(2, bound=50, capacity=3)
    cache.insert(torch.tensor([4, 8, 6]), torch.ones(3, 2), torch.zeros(3, dtype=torch.int64), step=0)
    cache.serve(torch.tensor([4, 6]), torch.zeros(2, dtype=torch.int64), step=1)  # 4 and 6 used twice, 8 once
    cache.serve(torch.tensor([4]), torch.zeros(1, dtype=torch.int64), step=2)
    cache.accumulate(torch.tensor([8, 6]), torch.full((2, 2), 2.0), lr=0.1)
    cache.insert(torch.tensor([1]), torch.zeros(1, 2), torch.zeros(1, dtype=torch.int64), step=3)
    assert (
        cache.keys.tolist() == [1, 4, 6] and cache.evictions == 1
    )  # 8 and the new 1 have the fewest uses; 8 was used longer ago
    keys, grads, counts = cache.take_outgoing()
    assert keys.tolist() == [8] and counts.tolist() == [1] and torch.equal(grads, torch.full((1, 2), 2.0))
    cache.drain()
    assert len(cache) == 0 and cache.take_outgoing()[0].tolist() == [6]
