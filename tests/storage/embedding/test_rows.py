"""Row building blocks: the finiteness and sortedness checks, duplicate summing, Rows indexing."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from storage.embedding.row_format import RowFormat
from storage.embedding.rows import (
    all_finite,
    host_to_device,
    segment_sum,
    strictly_increasing,
    sum_duplicates,
)
from tests.helpers.stores import DIM


def test_all_finite_and_strictly_increasing_spot_every_bad_entry() -> None:
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


@pytest.mark.parametrize("optimizer", ["adam", "rowwise_adagrad", "sgd"])
def test_rows_select_and_put_by_index_and_by_mask(optimizer: str) -> None:
    fmt = RowFormat(3, optimizer)
    rows = fmt.fresh(torch.arange(12.0).reshape(4, 3))
    rows.clock += torch.arange(4, dtype=torch.int32)
    for t in rows.state.values():
        t += torch.arange(4.0).reshape(4, *([1] * (t.dim() - 1)))
    picked = rows.select(np.array([3, 1]))
    assert picked.emb[:, 0].tolist() == [9.0, 3.0] and picked.clock.tolist() == [3, 1]
    masked = rows.select(torch.tensor([False, True, False, True]))
    assert masked.emb[:, 0].tolist() == [3.0, 9.0]
    assert all(t.reshape(2, -1)[:, 0].tolist() == [3.0, 1.0] for t in picked.state.values())
    rows.put(np.array([0, 2]), picked)
    assert rows.emb[:, 0].tolist() == [9.0, 3.0, 3.0, 9.0] and rows.clock.tolist() == [3, 1, 1, 3]
    assert all(t.reshape(4, -1)[:, 0].tolist() == [3.0, 1.0, 1.0, 3.0] for t in rows.state.values())
    rows.put(torch.tensor([True, False, False, False]), fmt.empty(1))
    assert rows.emb[0].tolist() == [0.0, 0.0, 0.0] and rows.clock[0] == 0


def test_segment_sum_is_index_add_on_cpu_and_differentiable() -> None:
    g = torch.Generator().manual_seed(0)
    values = torch.randn(50, DIM, generator=g, requires_grad=True)
    index = torch.randint(0, 7, (50,), generator=g)
    got = segment_sum(values, index, 9)
    assert torch.equal(got, torch.zeros(9, DIM).index_add(0, index, values)), "bit for bit the sequential sums"
    assert torch.equal(got[7:], torch.zeros(2, DIM))
    got.sum().backward()
    assert torch.equal(values.grad, torch.ones(50, DIM))


def test_host_to_device_leaves_a_cpu_tensor_alone() -> None:
    t = torch.arange(4)
    assert host_to_device(t, "cpu") is t


@pytest.mark.parametrize(
    "fmt", [RowFormat(DIM, o, d) for o in ("adam", "rowwise_adagrad") for d in ("fp32", "fp16")], ids=lambda f: f.name
)
def test_step_refuses_non_finite_gradients_without_a_separate_check(fmt: RowFormat) -> None:
    """What a GPU tier relies on when it skips `check_grads`' finiteness read: the same error, nothing changed."""
    rows = fmt.fresh(torch.ones(3, DIM))
    keys = torch.arange(3)
    for bad, match in (
        (float("nan"), "grads contain NaN or inf"),
        (float("inf"), "grads contain NaN or inf"),
        (1e30, "would make 1 row"),
    ):
        grads = torch.ones(3, DIM)
        grads[1, 0] = bad
        with pytest.raises(ValueError, match=match):
            fmt.step(keys, rows, grads, lr=0.1)
    assert torch.equal(rows.emb.float(), torch.ones(3, DIM)) and int(rows.clock.sum()) == 0
