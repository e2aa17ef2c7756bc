"""Bags of keys: the cells of a batch, pooling equal to `nn.EmbeddingBag` on the same rows (an empty bag
uses its field's missing key), the embedding L2 of bag members, and jagged lists (`trainer.bags`)."""

from __future__ import annotations

import pyarrow as pa
import pytest
import torch
from torch import nn

from tests.helpers.bags import D, V, field_bags, random_bag_batch, reference_emb
from trainer.bags import Jagged, cells_l2_grad, expand_cells, pool_rows

# ---- pooling math ---------------------------------------------------------------------------------


def test_cells_list_each_field_key_and_each_nonempty_bag_in_row_major_order() -> None:
    keys = torch.tensor([[10, 11], [20, 21], [30, 31]])
    cells = expand_cells(keys, [field_bags([[5, 7, 9], [], [8]])])
    assert cells.keys.tolist() == [10, 5, 7, 9, 20, 21, 30, 8]  # the empty bag keeps k_1 = 21
    assert cells.cell.tolist() == [0, 1, 1, 1, 2, 3, 4, 5]
    assert cells.counts.tolist() == [1, 3, 1, 1, 1, 1] and cells.shape == (3, 2) and not cells.plain
    plain = expand_cells(keys)
    assert plain.plain and plain.keys.tolist() == keys.reshape(-1).tolist()


def test_bags_that_do_not_fit_the_batch_are_refused() -> None:
    keys = torch.zeros(2, 3, dtype=torch.int64)
    with pytest.raises(ValueError, match="do not fit a batch of 2 rows x 3 fields"):
        expand_cells(keys, [field_bags([[1], [2], [3]])])  # 3 bags for 2 rows
    with pytest.raises(ValueError, match="field 3"):
        expand_cells(keys, [field_bags([[1], [2]], field=3)])


@pytest.mark.parametrize("mode", ["mean", "sum"])
def test_pooling_equals_embedding_bag_on_the_same_rows_values_and_gradients(mode: str) -> None:
    torch.manual_seed(0)
    keys, lists = random_bag_batch(1)
    table = nn.Parameter(torch.randn(V, D))
    want = reference_emb(table, keys, lists, mode)
    weight = torch.randn(want.shape)
    (want * weight).sum().backward()

    cells = expand_cells(keys, [field_bags(lists)])
    rows = table.detach()[cells.keys].requires_grad_(True)  # what a pull returns: (N, D)
    got = pool_rows(rows, cells, mode)
    torch.testing.assert_close(got, want)
    (got * weight).sum().backward()
    per_key = torch.zeros(V, D).index_add_(0, cells.keys, rows.grad)  # what a push sums per key
    torch.testing.assert_close(per_key, table.grad)


def test_without_bags_pooling_is_a_view_of_the_pulled_rows() -> None:
    rows = torch.randn(6, D)
    cells = expand_cells(torch.arange(6).view(3, 2))
    assert pool_rows(rows, cells, "mean").data_ptr() == rows.data_ptr()
    with pytest.raises(ValueError, match="bag_pooling is none but the batch has bags"):
        pool_rows(
            torch.randn(4, D), expand_cells(torch.zeros(1, 2, dtype=torch.int64), [field_bags([[1, 2, 3]])]), "none"
        )


def test_embedding_l2_weights_bag_members_by_their_share_of_the_pooled_row() -> None:
    cells = expand_cells(torch.tensor([[3, 4], [6, 7]]), [field_bags([[1, 4, 7, 10], []])])
    rows = torch.ones(cells.keys.numel(), 1)
    zero = torch.zeros_like(rows)
    # B = 2: a plain cell gets l2 * row / 2; each of the 4 bag members a quarter of that under mean
    assert cells_l2_grad(rows, zero, cells, "mean", 0.5).view(-1).tolist() == [
        0.25,
        0.0625,
        0.0625,
        0.0625,
        0.0625,
        0.25,
        0.25,
    ]
    assert cells_l2_grad(rows, zero, cells, "sum", 0.5).view(-1).tolist() == [0.25] * 7
    plain = expand_cells(torch.tensor([[3, 4]]))
    assert cells_l2_grad(torch.ones(2, 1), torch.zeros(2, 1), plain, "mean", 0.5).view(-1).tolist() == [0.5, 0.5]


def test_jagged_concat_and_slice_keep_the_rows() -> None:
    a = Jagged.from_arrow(pa.chunked_array([pa.array([[1, 2], None, [3]], type=pa.list_(pa.int64()))]))
    assert a.offsets.tolist() == [0, 2, 2, 3]  # a null list is an empty bag
    b = Jagged.from_arrow(pa.array([[], [4, 5, 6]], type=pa.list_(pa.int64())).slice(1))
    both = Jagged.concat([a, b])
    assert both.values.tolist() == [1, 2, 3, 4, 5, 6] and both.offsets.tolist() == [0, 2, 2, 3, 6]
    mid = both.slice(1, 4)
    assert mid.offsets.tolist() == [0, 0, 1, 4] and mid.values.tolist() == [3, 4, 5, 6]
