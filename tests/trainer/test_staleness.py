"""HET bounded staleness: bound 0 is the synchronous path bit for bit; bound s serves copies s steps."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from spawn_ranks import cpu_trainer_config, run_ranks

from storage.memory import MemoryStore
from trainer.comm import ShardedEmbedding, init_distributed
from trainer.staleness import StaleRowCache

pytestmark = pytest.mark.distributed

DIM = 4


def _keys(rank: int, step: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(10 * step + rank)
    return torch.randint(0, 40, (30,), generator=g)


def _grads(rank: int, step: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 + 10 * step + rank)
    return torch.randn(30, DIM, generator=g)


def _rank(rank: int, world: int, out_dir: str) -> None:
    ctx = init_distributed(cpu_trainer_config())
    try:
        # 1) the cache path with bound 0 computes exactly what the synchronous path computes
        sync = ShardedEmbedding(MemoryStore(DIM, init_std=0.1), ctx, lr=0.05)
        cached0 = ShardedEmbedding(MemoryStore(DIM, init_std=0.1), ctx, lr=0.05, use_cache=True)
        assert sync.cache is None and cached0.cache is not None
        for step in range(4):
            k, g = _keys(rank, step), _grads(rank, step)
            assert torch.equal(sync.pull(k), cached0.pull(k))
            sync.push(k, g)
            cached0.push(k, g)
        assert len(cached0.cache) == 0 and cached0.cache.hits == 0
        everything = torch.arange(40)
        mine = everything[everything % world == rank]
        assert torch.equal(sync.store.lookup(mine), cached0.store.lookup(mine))
        assert sync.sparse_bytes == cached0.sparse_bytes

        # 2) bound 2: a remote copy fetched at step 0 serves steps 0..2, is refetched at step 3
        keys = torch.arange(20)
        remote = keys % world != rank
        stale = ShardedEmbedding(MemoryStore(DIM, init_std=0.1), ctx, lr=0.05, staleness_bound=2)
        fresh = ShardedEmbedding(MemoryStore(DIM, init_std=0.1), ctx, lr=0.05)
        pulled = []
        for step in range(6):
            pulled.append(stale.pull(keys))
            fresh.pull(keys)
            g = torch.full((20, DIM), 0.1 * (rank + 1))
            stale.push(keys, g)
            fresh.push(keys, g)
        for step in (1, 2):
            assert torch.equal(pulled[step][remote], pulled[0][remote])  # served from the cache
            assert not torch.equal(pulled[step][~remote], pulled[0][~remote])  # own rows are always fresh
        assert not torch.equal(pulled[3][remote], pulled[0][remote])  # expired: refetched with the owner's updates
        assert stale.cache is not None
        n_remote = int(remote.sum())
        # fetched at steps 0 and 3, pending gradients pushed at steps 2 and 5 (the copies expire then)
        assert stale.cache.stats() == {
            "rows": 0, "hits": 4 * n_remote, "misses": 2 * n_remote, "evictions": 0, "flushed_rows": 2 * n_remote,
        }
        assert stale.sparse_bytes < 0.7 * fresh.sparse_bytes  # remote keys, rows and grads move every 3rd step
        stale.flush()  # collective: every rank; nothing pending here
        assert len(stale.cache) == 0 and stale.cache.flushed_rows == 2 * n_remote
        torch.save({"bytes": (stale.sparse_bytes, fresh.sparse_bytes)}, Path(out_dir) / f"r{rank}.pt")
    finally:
        ctx.destroy()


def test_bounded_staleness_on_two_ranks(tmp_path: Path, free_port: int) -> None:
    run_ranks(_rank, 2, free_port, str(tmp_path))


def test_cache_evicts_the_oldest_copies_and_queues_their_gradients() -> None:
    cache = StaleRowCache(2, bound=5, capacity=3)
    cache.insert(torch.tensor([4, 8]), torch.ones(2, 2), step=0)
    assert cache.accumulate(torch.tensor([4, 9]), torch.full((2, 2), 2.0)).tolist() == [True, False]
    cache.insert(torch.tensor([1, 6]), torch.zeros(2, 2), step=1)  # 4 rows > 3: key 4 or 8 (step 0) goes
    assert len(cache) == 3 and cache.evictions == 1
    keys, grads = cache.take_outgoing()
    if keys.numel():  # key 4 (dirty) was evicted and its pending gradient queued; key 8 had none
        assert keys.tolist() == [4] and torch.equal(grads, torch.full((1, 2), 2.0))
    cache.expire(6)  # step 6 - fetched 1 >= 5: every copy expires
    assert len(cache) == 0
    found, rows = cache.lookup(torch.tensor([1]), torch.tensor([True]))
    assert not found.any() and rows.shape == (0, 2)
