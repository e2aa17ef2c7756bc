"""Exact AUC (equal to a brute-force pairwise count with ties as 1/2), log loss, calibration."""

from __future__ import annotations

import math

import numpy as np
import pytest

from trainer.metrics import auc, average_ranks, calibration, logloss


def brute_force_auc(y: np.ndarray, s: np.ndarray) -> float:
    pos, neg = s[y == 1], s[y == 0]
    wins = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    return wins / (pos.size * neg.size)


@pytest.mark.parametrize("seed", range(20))
def test_auc_equals_pairwise_count_with_ties(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 300))
    y = rng.integers(0, 2, n)
    y[0], y[1] = 0, 1
    s = rng.integers(0, 6, n).astype(np.float64) if seed % 2 else rng.random(n)  # many ties half the time
    assert auc(y, s) == pytest.approx(brute_force_auc(y, s), abs=1e-12)


def test_auc_known_values() -> None:
    assert auc([0, 0, 1, 1], [0.1, 0.4, 0.35, 0.8]) == 0.75
    assert auc([0, 1], [0.5, 0.5]) == 0.5
    assert auc([1, 0], [1.0, 0.0]) == 1.0
    assert auc([1, 0], [0.0, 1.0]) == 0.0
    with pytest.raises(ValueError, match="1 positives and 0 negatives"):
        auc([1], [0.3])
    with pytest.raises(ValueError, match="0 or 1"):
        auc([0, 2], [0.1, 0.2])


def test_average_ranks() -> None:
    np.testing.assert_array_equal(average_ranks(np.array([3.0, 1.0, 3.0, 2.0])), [3.5, 1.0, 3.5, 2.0])


def test_logloss_and_calibration() -> None:
    y, p = np.array([1, 0, 1, 0]), np.array([0.9, 0.2, 0.6, 0.1])
    want = -np.mean([math.log(0.9), math.log(0.8), math.log(0.6), math.log(0.9)])
    assert logloss(y, p) == pytest.approx(want)
    assert math.isfinite(logloss([1, 0], [0.0, 1.0]))  # clipped
    c = calibration(y, p)
    assert c["mean_prediction"] == pytest.approx(0.45) and c["click_rate"] == 0.5
    assert c["calibration"] == pytest.approx(0.9)
    assert math.isnan(calibration([0, 0], [0.1, 0.2])["calibration"])
