"""The companion as a scorer uses it (`trainer.companion.model`): its inputs, and the blend at its recorded weight."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from storage.key_layout import FIELD_SHIFT
from trainer.companion.key_counts import KeyCounts
from trainer.companion.model import UNRECORDED_BLEND_WEIGHT, Companion, blend, blend_weight_of, inputs
from trainer.companion.poly2 import Poly2
from trainer.data import FeatureSchema
from trainer.eval.scoring import score_arrays


def test_the_inputs_bucket_the_dense_columns_after_the_key_fields_and_add_each_keys_count_token_alone():
    keys = np.array([[2, (1 << FIELD_SHIFT) | 5]], dtype=np.int64)
    ids, d = inputs(keys, np.array([[np.log1p(3.0)]], dtype=np.float32), 20, None)
    assert ids.shape == (1, 3 + 3) and d.dtype == np.float64  # 2 keys and 1 bucket token, and their 3 pairs
    no_dense, d0 = inputs(keys, None, 20, None)
    assert no_dense.shape == (1, 2 + 1) and d0.shape == (1, 0)
    counted, _ = inputs(keys, np.array([[1.0]]), 20, KeyCounts.of(keys))
    assert counted.shape == (1, 6 + 2)  # and each key's count class, alone (no pairs)
    np.testing.assert_array_equal(counted[:, :6], ids)
    own_fields = KeyCounts.of(keys).tokens(keys, leave_one_out=False) >> FIELD_SHIFT
    np.testing.assert_array_equal(own_fields, [[0, 1]])


def test_the_blend_weighs_the_networks_logit_by_w_and_the_companions_by_1_minus_w():
    net, second = np.array([1.0, -3.0]), np.array([3.0, 1.0])
    np.testing.assert_allclose(blend(net, second), [2.0, -1.0])  # the mean: the probe's blend, a record before w
    np.testing.assert_allclose(blend(net, second, 0.25), [2.5, 0.0])
    np.testing.assert_allclose(_constant(0.0, 0.25).blend(net, second), [2.5, 0.0])  # a companion's own weight


def test_a_record_without_a_blend_weight_reads_the_mean_and_a_bad_one_is_refused_naming_the_file():
    assert blend_weight_of({"kind": "poly2"}, "model.json") == UNRECORDED_BLEND_WEIGHT == 0.5
    assert blend_weight_of({"blend_weight": 0.3}, "model.json") == 0.3
    for bad in (1.5, -0.1, "0.3", True):
        with pytest.raises(ValueError, match=r"b/model.json: companion.blend_weight must be a number in \[0, 1\]"):
            blend_weight_of({"blend_weight": bad}, "b/model.json")


@pytest.mark.parametrize("weight", [0.3, 0.5, 0.7])
def test_every_score_blends_at_the_companions_recorded_weight(weight):
    """`score_arrays`, the one path of evaluation and serving: a network of logit 2 and a companion of logit -1
    score sigmoid(w * 2 + (1 - w) * -1)."""
    schema = FeatureSchema(dense_columns=(), key_columns=("k_0",), fields=("C1",))
    keys = np.array([[5], [6], [7]], dtype=np.int64)
    got = score_arrays(
        lambda dense, emb: torch.full((emb.shape[0],), 2.0),
        lambda k: torch.zeros(len(k), 4),
        schema,
        "mean",
        None,
        keys,
        [],
        companion=_constant(-1.0, weight),
        raw_all=keys,
    )
    np.testing.assert_allclose(got, 1 / (1 + np.exp(-(weight * 2.0 + (1 - weight) * -1.0))), rtol=1e-12)


def _constant(logit: float, weight: float) -> Companion:
    """A companion whose every logit is `logit` (no bucket weights, its bias alone), blended at `weight`."""
    empty = np.zeros(0)
    poly2 = Poly2(buckets=empty.astype(np.int64), weights=empty, dense_weights=empty, bias=logit, C=1.0)
    return Companion(poly2, 14, None, weight)
