"""Real gloo process groups: two-phase == flat allreduce, sharded embedding == one MemoryStore."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from storage.embedding.memory import MemoryStore
from tests.helpers.ranks import cpu_trainer_config, run_ranks
from trainer.distributed.comm import (
    ShardedEmbedding,
    flat_all_reduce,
    hierarchical_all_reduce,
    init_distributed,
    route_keys,
)

pytestmark = pytest.mark.distributed

DIM = 4


def _allreduce_rank(rank: int, world: int, out_dir: str) -> None:
    ctx = init_distributed(cpu_trainer_config(intra_group_size=2))  # 2 "nodes" x 2 ranks
    try:
        assert ctx.topology.groups == ((0, 1), (2, 3))
        assert ctx.topology.leaders == (0, 2)
        assert (ctx.intra_group is not None) and ((ctx.leader_group is not None) == (rank in (0, 2)))
        g = torch.Generator().manual_seed(100 + rank)
        a, b = torch.randn(3, 5, generator=g), torch.randn(7, generator=g)
        h = [a.clone(), b.clone()]
        f = [a.clone(), b.clone()]
        nbytes = hierarchical_all_reduce(h, ctx, op="avg")
        flat_all_reduce(f, ctx, op="avg")
        assert nbytes == (15 + 7) * 4
        for x, y in zip(h, f, strict=True):
            torch.testing.assert_close(x, y, rtol=1e-6, atol=1e-6)
        s = [a.clone()]
        hierarchical_all_reduce(s, ctx, op="sum")
        torch.save({"avg": h, "sum": s}, Path(out_dir) / f"r{rank}.pt")
    finally:
        ctx.destroy()


def test_hierarchical_equals_flat_allreduce_on_2_nodes_x_2(tmp_path: Path, free_port: int) -> None:
    run_ranks(_allreduce_rank, 4, free_port, str(tmp_path))
    results = [torch.load(tmp_path / f"r{r}.pt") for r in range(4)]
    inputs = []
    for r in range(4):
        g = torch.Generator().manual_seed(100 + r)
        inputs.append((torch.randn(3, 5, generator=g), torch.randn(7, generator=g)))
    want_a = torch.stack([i[0] for i in inputs]).mean(0)
    want_b = torch.stack([i[1] for i in inputs]).mean(0)
    for res in results:  # every rank holds the same, correct average
        torch.testing.assert_close(res["avg"][0], want_a, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(res["avg"][1], want_b, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(res["sum"][0], want_a * 4, rtol=1e-5, atol=1e-5)


def _keys_for(rank: int, step: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(10 * step + rank)
    return torch.randint(0, 40, (30,), generator=g)  # many duplicates, within and across ranks


def _grads_for(rank: int, step: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 + 10 * step + rank)
    return torch.randn(30, DIM, generator=g)


def _sharded_rank(rank: int, world: int, out_dir: str) -> None:
    ctx = init_distributed(cpu_trainer_config())
    try:
        store = MemoryStore(DIM, init_std=0.1)
        emb = ShardedEmbedding(store, ctx, lr=0.05)
        pulled = []
        for step in range(3):
            keys = _keys_for(rank, step)
            pulled.append(emb.pull(keys))
            emb.push(keys, _grads_for(rank, step))
        # the store only ever holds keys this rank owns
        owned = torch.tensor(sorted(k for ks in [_keys_for(r, s) for r in range(world) for s in range(3)] for k in ks.tolist()))
        mine = torch.unique(owned[owned % world == rank])
        assert len(store) == mine.numel()
        torch.save({"pulled": pulled, "keys": mine, "rows": store.lookup(mine).rows}, Path(out_dir) / f"r{rank}.pt")
        assert emb.sparse_bytes > 0
    finally:
        ctx.destroy()


def test_sharded_embedding_matches_single_store(tmp_path: Path, free_port: int) -> None:
    world = 2
    run_ranks(_sharded_rank, world, free_port, str(tmp_path))
    ref = MemoryStore(DIM, init_std=0.1)
    want_pulled = {r: [] for r in range(world)}
    for step in range(3):
        for r in range(world):
            want_pulled[r].append(ref.lookup(_keys_for(r, step)).rows)
        # one process applying the concatenated batch: duplicates summed, one Adam step per row
        keys = torch.cat([_keys_for(r, step) for r in range(world)])
        ref.update(keys, torch.cat([_grads_for(r, step) for r in range(world)]), lr=0.05)
    for r in range(world):
        got = torch.load(tmp_path / f"r{r}.pt")
        for a, b in zip(got["pulled"], want_pulled[r], strict=True):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(got["rows"], ref.lookup(got["keys"]).rows, rtol=1e-6, atol=1e-7)


def test_world_of_one_bypasses_collectives() -> None:
    ctx = init_distributed(cpu_trainer_config())
    assert ctx.world_size == 1 and ctx.backend == "none" and ctx.intra_group is None
    t = [torch.arange(4.0)]
    assert hierarchical_all_reduce(t, ctx) == 0 and flat_all_reduce(t, ctx) == 0
    torch.testing.assert_close(t[0], torch.arange(4.0))
    store, ref = MemoryStore(DIM), MemoryStore(DIM)
    emb = ShardedEmbedding(store, ctx, lr=0.01)
    keys = torch.tensor([5, 3, 5, 9])
    torch.testing.assert_close(emb.pull(keys), ref.lookup(keys).rows)
    grads = torch.randn(4, DIM)
    emb.push(keys, grads)
    ref.update(keys, grads, lr=0.01)
    torch.testing.assert_close(store.lookup(keys).rows, ref.lookup(keys).rows)
    assert emb.sparse_bytes == 0


def test_route_keys_groups_distinct_keys_by_owner() -> None:
    keys = torch.tensor([7, 2, 7, 4, 9, 2, 0])
    r = route_keys(keys, 3)
    assert r.unique.tolist() == [0, 2, 4, 7, 9]
    assert torch.equal(r.unique[r.inverse], keys)
    routed = r.unique[r.order].tolist()
    assert [k % 3 for k in routed] == sorted(k % 3 for k in routed)
    assert r.send_counts == [2, 2, 1]  # owners: 0 -> {0, 9}, 1 -> {4, 7}, 2 -> {2}
    assert np.sum(r.send_counts) == r.unique.numel()
