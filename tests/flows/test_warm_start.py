"""A config change that reshapes the model starts the affected part cold instead of failing every day."""

from dataclasses import asdict

from flows.config import with_overrides
from flows.recipes import demo
from flows.stages import warm_start_compatible


def _meta(cfg):
    model = {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(cfg.model).items()}
    return {"model_config": model, "dim": cfg.store.embedding_dim}


def test_same_shapes_warm_start_both_parts():
    cfg = demo("/tmp/x")
    assert warm_start_compatible(_meta(cfg), cfg) == (True, True, "")


def test_dropout_changes_no_shape():
    cfg = demo("/tmp/x")
    assert warm_start_compatible(_meta(cfg), with_overrides(cfg, {"model.dropout": 0.3}))[:2] == (True, True)


def test_new_mlp_widths_start_dense_cold_but_keep_the_rows():
    cfg = demo("/tmp/x")
    ok_dense, ok_sparse, why = warm_start_compatible(_meta(cfg), with_overrides(cfg, {"model.mlp_dims": [16]}))
    assert (ok_dense, ok_sparse) == (False, True) and "model.mlp_dims" in why


def test_new_embedding_width_starts_both_cold():
    cfg = demo("/tmp/x")
    ok_dense, ok_sparse, why = warm_start_compatible(_meta(cfg), with_overrides(cfg, {"store.embedding_dim": 16}))
    assert (ok_dense, ok_sparse) == (False, False) and "store.embedding_dim" in why


def test_a_model_from_before_a_new_config_field_starts_dense_cold():
    cfg = demo("/tmp/x")
    meta = _meta(cfg)
    del meta["model_config"]["dense_buckets"]
    assert warm_start_compatible(meta, cfg)[0] is False
