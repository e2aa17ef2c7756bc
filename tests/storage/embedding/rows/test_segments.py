"""Sums by key: `sum_duplicates` and `segment_sum`."""

from __future__ import annotations

import numpy as np
import torch

from storage.embedding.rows.segments import segment_sum, sum_duplicates
from tests.helpers.stores import DIM


def test_sum_duplicates_passes_sorted_distinct_keys_through() -> None:
    keys, grads = np.array([2, 5, 7]), torch.randn(3, DIM)
    uniq, summed = sum_duplicates(keys, grads)
    assert uniq is keys and summed is grads
    uniq, summed = sum_duplicates(np.array([7, 2, 7]), grads)
    assert uniq.tolist() == [2, 7]
    torch.testing.assert_close(summed, torch.stack([grads[1], grads[0] + grads[2]]), rtol=0, atol=0)


def test_segment_sum_is_index_add_on_cpu_and_differentiable() -> None:
    g = torch.Generator().manual_seed(0)
    values = torch.randn(50, DIM, generator=g, requires_grad=True)
    index = torch.randint(0, 7, (50,), generator=g)
    got = segment_sum(values, index, 9)
    assert torch.equal(got, torch.zeros(9, DIM).index_add(0, index, values)), "bit for bit the sequential sums"
    assert torch.equal(got[7:], torch.zeros(2, DIM))
    got.sum().backward()
    assert torch.equal(values.grad, torch.ones(50, DIM))
