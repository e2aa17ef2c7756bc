"""The argument checks every tier shares: finiteness in one reduction, sortedness in one pass."""

from __future__ import annotations

import numpy as np
import torch

from storage.embedding.rows.checks import all_finite, strictly_increasing


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
