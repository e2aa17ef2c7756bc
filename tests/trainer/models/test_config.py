"""The `model` section: bad values are refused, naming the key; which changes reshape the parameters."""

from __future__ import annotations

import pytest

from trainer.models.config import ModelConfig, reshaping_changes


def test_model_config_validation() -> None:
    with pytest.raises(ValueError, match="model.arch must be one of"):
        ModelConfig(arch="xgboost")
    with pytest.raises(ValueError, match="dense_buckets"):
        ModelConfig(dense_buckets=2)
    with pytest.raises(ValueError, match="wide_scale"):
        ModelConfig(wide_scale=0.0)


def test_only_changes_that_reshape_parameters_are_reported() -> None:
    from storage.io import codec

    saved = codec.encode(ModelConfig())
    assert reshaping_changes(saved, ModelConfig(dropout=0.3, bag_pooling="sum")) == []
    assert reshaping_changes(saved, ModelConfig(mlp_dims=(64,), arch="dnn")) == ["model.arch", "model.mlp_dims"]
    assert reshaping_changes({**saved, "gone": 1}, ModelConfig()) == ["model.gone"]  # a key of another version
