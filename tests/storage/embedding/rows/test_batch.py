"""`Rows`: selecting and overwriting rows by index and by mask, every state field with them."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from storage.embedding.rows.format import RowFormat


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
