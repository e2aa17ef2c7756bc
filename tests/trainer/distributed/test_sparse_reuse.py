"""One rank: the push of the keys just pulled reuses the pull's routing, with the same result as routing afresh."""

from __future__ import annotations

import pytest
import torch

from storage.embedding.host import HostStore, host_row_bytes
from storage.embedding.memory import MemoryStore
from tests.helpers.ranks import cpu_trainer_config
from trainer.distributed.comm import (
    ShardedEmbedding,
    init_distributed,
    route_keys,
    unique_keys,
)

DIM = 4


@pytest.mark.parametrize("n", [0, 1, 7, 500])
def test_unique_keys_is_torch_unique(n: int) -> None:
    keys = torch.randint(0, 50, (n,), generator=torch.Generator().manual_seed(n)) << 50  # large, field-tagged keys
    want_u, want_inv = torch.unique(keys, return_inverse=True)
    got_u, got_inv = unique_keys(keys)
    assert torch.equal(got_u, want_u) and torch.equal(got_inv, want_inv)
    assert got_u.dtype == got_inv.dtype == torch.int64


def test_route_of_one_rank_is_the_identity() -> None:
    r = route_keys(torch.tensor([9, 2, 9, 4]), 1)
    assert r.unique.tolist() == [2, 4, 9] and r.order.tolist() == [0, 1, 2] and r.send_counts == [3]


def _host() -> HostStore:
    return HostStore(DIM, budget_bytes=12 * host_row_bytes(DIM), below=MemoryStore(DIM, init_std=0.1), init_std=0.1)


def test_push_of_the_pulled_tensor_equals_a_push_routed_afresh() -> None:
    ctx = init_distributed(cpu_trainer_config())
    reused, fresh = ShardedEmbedding(_host(), ctx, lr=0.05), ShardedEmbedding(_host(), ctx, lr=0.05)
    ref = MemoryStore(DIM, init_std=0.1)
    g = torch.Generator().manual_seed(3)
    for _ in range(6):
        keys = torch.randint(0, 30, (20,), generator=g)
        grads = torch.randn(20, DIM, generator=g)
        a, b = reused.pull(keys), fresh.pull(keys.clone())
        torch.testing.assert_close(a, b, rtol=0, atol=0)
        torch.testing.assert_close(a, ref.lookup(keys).rows, rtol=0, atol=0)
        reused.push(keys, grads)  # the pulled tensor: its route (and the store's resolution) are reused
        fresh.push(keys.clone(), grads)
        ref.update(keys, grads, lr=0.05)
    # the reuse was taken: the host tier asked the tier below about its misses once per step, not twice
    asked = [sum(e.store.below.stats()["memory"][k] for k in ("hits", "misses")) for e in (reused, fresh)]
    assert asked[0] < asked[1]
    probe = torch.arange(30)
    torch.testing.assert_close(reused.store.lookup(probe).rows, fresh.store.lookup(probe).rows, rtol=0, atol=0)
    torch.testing.assert_close(reused.store.lookup(probe).rows, ref.lookup(probe).rows, rtol=1e-6, atol=1e-7)


def test_keys_changed_in_place_after_the_pull_are_routed_afresh() -> None:
    ctx = init_distributed(cpu_trainer_config())
    emb, ref = ShardedEmbedding(_host(), ctx, lr=0.05), MemoryStore(DIM, init_std=0.1)
    keys = torch.tensor([1, 5, 5, 8])
    emb.pull(keys)
    keys[1:3] = torch.tensor([20, 21])  # now other keys: the pull's route no longer applies
    grads = torch.randn(4, DIM, generator=torch.Generator().manual_seed(0))
    emb.push(keys, grads)
    ref.update(keys, grads, lr=0.05)
    probe = torch.tensor([1, 5, 8, 20, 21])
    torch.testing.assert_close(emb.store.lookup(probe).rows, ref.lookup(probe).rows, rtol=1e-6, atol=1e-7)
