"""The HET pull on one rank: rows and clocks of the keys without a copy, clocks of those with one, and
fresh rows only for the copies whose owner's clock passed their threshold."""

from __future__ import annotations

import torch

from storage.embedding.memory import MemoryStore
from tests.helpers.ranks import cpu_trainer_config
from trainer.distributed.context import init_distributed
from trainer.distributed.het_pull import pull_with_clocks

DIM = 3


def test_the_owner_sends_clocks_of_every_key_and_rows_only_where_needed() -> None:
    ctx = init_distributed(cpu_trainer_config())
    store = MemoryStore(DIM, init_std=0.1)
    for n, key in enumerate((4, 7, 9), start=1):  # key 4 updated once, 7 twice, 9 three times
        for _ in range(n):
            store.update(torch.tensor([key]), torch.ones(1, DIM), lr=0.1)
    need, check = torch.tensor([9, 2]), torch.tensor([7, 4])
    got = pull_with_clocks(store, need, check, torch.tensor([1, 1]), ctx)  # copies valid up to clock 1
    want = store.lookup(torch.tensor([9, 2, 7])).rows
    torch.testing.assert_close(got.need_rows, want[:2], rtol=0, atol=0)
    assert got.need_clocks.tolist() == [3, 0]  # a key the store never saw: clock 0
    assert got.check_clocks.tolist() == [2, 1] and got.stale.tolist() == [True, False]
    torch.testing.assert_close(got.stale_rows, want[2:], rtol=0, atol=0)  # key 7 only
    assert all(v == (0, 0) for v in got.nbytes.values())  # one rank: nothing crosses a link
    assert len(store) == 3  # the pull stored nothing
