"""AUC per group: equal to the plain AUC of each group's rows, ties and single-class groups included; GAUC."""

import math

import numpy as np
import pytest

from trainer.eval.group_metrics import group_auc, paired_group_se
from trainer.eval.metrics import auc


def test_each_groups_auc_is_the_auc_of_its_rows():
    rng = np.random.default_rng(1)
    y = rng.integers(0, 2, 3000)
    s = np.round(rng.random(3000), 2)  # many ties
    g = rng.integers(0, 7, 3000)
    got = group_auc(y, s, g)
    assert got.values.tolist() == list(range(7))
    for i, v in enumerate(got.values):
        rows = g == v
        assert got.rows[i] == rows.sum() and got.clicks[i] == y[rows].sum()
        assert got.auc[i] == pytest.approx(auc(y[rows], s[rows]), abs=1e-12)


def test_a_single_class_group_has_no_auc_and_gauc_weights_by_clicks():
    g = group_auc([0, 1, 1, 0, 1, 0, 0], [0.1, 0.9, 0.2, 0.3, 0.5, 0.4, 0.6], [7, 7, 8, 8, 8, 9, 9])
    assert g.auc[0] == 1.0 and g.auc[1] == 0.5 and math.isnan(g.auc[2])
    assert g.gauc() == pytest.approx((1.0 * 1 + 0.5 * 2) / 3)
    assert g.slices(min_rows=3) == {8: (3, 0.5)}


def test_no_rows_and_mismatched_lengths():
    assert math.isnan(group_auc([], [], []).gauc())
    with pytest.raises(ValueError, match="differ in length"):
        group_auc([0, 1], [0.5], [1, 1])


def _delong_se(y: np.ndarray, a: np.ndarray, b: np.ndarray) -> float:
    """DeLong's paired standard error of AUC(a) - AUC(b), written out pair by pair."""

    def parts(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        pos, neg = s[y == 1], s[y == 0]
        psi = (pos[:, None] > neg[None, :]) + 0.5 * (pos[:, None] == neg[None, :])
        return psi.mean(axis=1), psi.mean(axis=0)

    (a10, a01), (b10, b01) = parts(a), parts(b)
    d10, d01 = a10 - b10, a01 - b01
    return math.sqrt(d10.var(ddof=1) / len(d10) + d01.var(ddof=1) / len(d01))


def test_each_groups_paired_error_is_delongs_on_its_rows_ties_included():
    rng = np.random.default_rng(0)
    g = rng.integers(0, 4, 3_000)
    y = (rng.random(3_000) < 0.3).astype(float)
    a = np.round(rng.normal(y * 0.8, 1), 1)  # ties within and across classes
    b = a + rng.normal(0, 0.5, 3_000)
    values, se = paired_group_se(y, a, b, g)
    np.testing.assert_array_equal(values, group_auc(y, a, g).values)
    for v, e in zip(values, se, strict=True):
        rows = g == v
        assert e == pytest.approx(_delong_se(y[rows], a[rows], b[rows]), rel=1e-9)
    assert paired_group_se(y, a, a, g)[1] == pytest.approx(np.zeros(4))  # a model against itself: no spread


def test_a_group_with_fewer_than_two_clicks_or_non_clicks_has_no_paired_error():
    y = np.array([1, 0, 0, 0, 1, 1, 0, 0], float)
    g = np.array([7, 7, 7, 7, 8, 8, 8, 8])
    s = np.arange(8.0)
    _, se = paired_group_se(y, s, s[::-1], g)
    assert math.isnan(se[0]) and math.isfinite(se[1])
