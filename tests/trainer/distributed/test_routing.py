"""Sparse routing on one rank: deduplication equals torch.unique, distinct keys grouped by owner,
and a pending sum of L updates applied as L Adam steps."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from storage.embedding.memory import MemoryStore
from tests.helpers.ranks import cpu_trainer_config
from trainer.distributed.context import init_distributed
from trainer.distributed.routing import (
    apply_updates,
    exchange_keys,
    exchange_rows,
    route_keys,
    send_grads,
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


def test_route_keys_groups_distinct_keys_by_owner() -> None:
    keys = torch.tensor([7, 2, 7, 4, 9, 2, 0])
    r = route_keys(keys, 3)
    assert r.unique.tolist() == [0, 2, 4, 7, 9]
    assert torch.equal(r.unique[r.inverse], keys)
    routed = r.unique[r.order].tolist()
    assert [k % 3 for k in routed] == sorted(k % 3 for k in routed)
    assert r.send_counts == [2, 2, 1]  # owners: 0 -> {0, 9}, 1 -> {4, 7}, 2 -> {2}
    assert np.sum(r.send_counts) == r.unique.numel()


def test_route_of_one_rank_is_the_identity() -> None:
    r = route_keys(torch.tensor([9, 2, 9, 4]), 1)
    assert r.unique.tolist() == [2, 4, 9] and r.order.tolist() == [0, 1, 2] and r.send_counts == [3]


def test_one_rank_serves_its_own_keys_and_sums_the_gradients_of_duplicates() -> None:
    ctx = init_distributed(cpu_trainer_config())
    keys = torch.tensor([5, 3, 5, 9])
    route, owned, recv = exchange_keys(keys, ctx)
    assert owned.tolist() == [3, 5, 9] and recv == [3]
    rows = torch.arange(3.0).repeat_interleave(DIM).view(3, DIM)
    assert torch.equal(exchange_rows(rows, route, recv, ctx), rows)  # (U, D) in `route.unique` order
    grads = torch.ones(4, DIM)
    got_keys, got_grads, counts, wire = send_grads(route, grads, ctx)
    assert got_keys.tolist() == [3, 5, 9] and got_grads[:, 0].tolist() == [1.0, 2.0, 1.0]
    assert counts is None and wire == (0, 0)  # a rank's own keys never leave it
    _, _, counts, _ = send_grads(route, grads, ctx, torch.tensor([1, 2, 3, 1]))
    assert counts.tolist() == [2, 4, 1]  # the counts of duplicates are summed too


def test_a_pending_sum_of_l_updates_moves_the_row_l_adam_steps() -> None:
    got, want = MemoryStore(DIM, init_std=0.1), MemoryStore(DIM, init_std=0.1)
    keys = torch.tensor([3, 5, 3])
    grads = torch.randn(3, DIM)
    counts = torch.tensor([4, 1, 2])
    apply_updates(got, keys, grads, counts, lr=0.05)
    # by hand: key 3 gets rounds 0-1 from both entries, rounds 2-3 from the first; key 5 one round
    for j in range(4):
        sel = counts > j
        want.update(keys[sel], grads[sel] / counts[sel, None], lr=0.05)
    u = torch.tensor([3, 5])
    torch.testing.assert_close(got.lookup(u).rows, want.lookup(u).rows, rtol=0, atol=0)
    _, rows = got.read_rows(u.numpy())
    assert rows.clock.tolist() == [4, 1]  # the clock counts updates
