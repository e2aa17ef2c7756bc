"""The `model` section: bad values are refused, naming the key; which changes reshape the parameters (the
fields declared `Role.SHAPE` that the architecture reads)."""

from __future__ import annotations

import pytest

from storage.io import codec
from storage.io.identity import Role, declarations
from trainer.models.config import ModelConfig, reshaping_changes, unread_fields


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


def test_dropout_bag_pooling_attention_input_and_the_companion_are_the_fields_that_reshape_nothing() -> None:
    assert sorted(n for n, d in declarations(ModelConfig).items() if d.role is not Role.SHAPE) == [
        "attention_input",
        "bag_pooling",
        "companion",
        "companion_blend_weight",
        "companion_rows",
        "dropout",
    ]


@pytest.mark.parametrize(
    ("key", "value"),
    [("companion", "gbdt"), ("companion_rows", 10), ("companion_blend_weight", 1.5), ("companion_blend_weight", -0.1)],
)
def test_a_bad_companion_setting_is_refused_naming_the_key(key: str, value: object) -> None:
    with pytest.raises(ValueError, match=f"model.{key} must be"):
        ModelConfig(**{key: value})  # type: ignore[arg-type]


def test_a_model_saved_before_the_cross_term_lacks_it_only_where_it_is_read() -> None:
    def before_cross(cfg: ModelConfig) -> dict:
        return {k: v for k, v in codec.encode(cfg).items() if k != "cross"}

    assert reshaping_changes(before_cross(ModelConfig()), ModelConfig()) == ["model.cross"]  # new weights
    assert reshaping_changes(before_cross(ModelConfig()), ModelConfig(cross=False)) == []  # as before it
    for arch in ("lr", "dnn", "deepfm", "dcn_v2"):  # no cross term in these: nothing changed
        assert reshaping_changes(before_cross(ModelConfig(arch=arch)), ModelConfig(arch=arch)) == []


def test_fields_the_architecture_does_not_read_change_no_shape() -> None:
    dcn = ModelConfig(arch="dcn_v2")
    saved = codec.encode(dcn)
    assert reshaping_changes(saved, ModelConfig(arch="dcn_v2", wide=False, num_heads=1, attention_layers=3)) == []
    assert reshaping_changes(saved, ModelConfig(arch="dcn_v2", cross_layers=1)) == ["model.cross_layers"]
    assert reshaping_changes(codec.encode(ModelConfig(arch="lr")), ModelConfig(arch="lr", mlp_dims=(8,))) == []
    assert reshaping_changes(saved, ModelConfig(arch="dnn")) == ["model.arch"]
    no_cross = codec.encode(ModelConfig(cross=False))
    assert reshaping_changes(no_cross, ModelConfig(cross=False, cross_layers=1, cross_rank=2)) == []
    assert reshaping_changes(no_cross, ModelConfig(cross_layers=1)) == ["model.cross", "model.cross_layers"]
    assert reshaping_changes(codec.encode(ModelConfig(wide=False)), ModelConfig(wide=False, wide_scale=2.0)) == []
    assert (
        reshaping_changes(
            codec.encode(ModelConfig(dense_buckets=0)), ModelConfig(dense_buckets=0, dense_bucket_max=3.0)
        )
        == []
    )
    assert unread_fields(ModelConfig()) == ()  # the default attention model reads every field


def _reshaping_changes_before_roles(saved: dict | None, ours: ModelConfig) -> list[str]:
    """`reshaping_changes` as it was before the fields declared roles (verbatim, with its SHAPE_FREE list)."""
    import dataclasses

    shape_free = ("dropout", "bag_pooling", "attention_input")
    mine = {
        k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(ours).items() if k not in shape_free
    }
    theirs = {k: list(v) if isinstance(v, tuple) else v for k, v in (saved or {}).items() if k not in shape_free}
    return [f"model.{k}" for k in sorted(set(mine) | set(theirs)) if mine.get(k) != theirs.get(k)]


@pytest.mark.parametrize(
    "change",
    [
        {},
        {"num_heads": 4},
        {"attention_layers": 0},
        {"mlp_dims": (8,)},
        {"dropout": 0.2},
        {"dense_buckets": 3},
        {"dense_bucket_max": 3.0},
        {"cross_layers": 1},
        {"cross_rank": 2},
        {"wide_scale": 2.0},
        {"bag_pooling": "none"},
    ],
)
def test_the_attention_model_reshapes_as_before_the_roles(change: dict) -> None:
    """Where the saved config has every field and ours reads them all, the rule is the earlier one."""
    ours = ModelConfig(**change)
    assert unread_fields(ours) == ()
    for saved in (
        codec.encode(ModelConfig()),
        {**codec.encode(ModelConfig()), "gone": 1},
        {k: v for k, v in codec.encode(ModelConfig()).items() if k != "wide"},
    ):
        assert reshaping_changes(saved, ours) == _reshaping_changes_before_roles(saved, ours)
