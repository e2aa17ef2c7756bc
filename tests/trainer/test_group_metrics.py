"""AUC per group: equal to the plain AUC of each group's rows, ties and single-class groups included; GAUC."""

import math

import numpy as np
import pytest

from trainer.group_metrics import group_auc
from trainer.metrics import auc


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
