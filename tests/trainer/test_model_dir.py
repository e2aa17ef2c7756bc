"""`trainer.model_dir.warm_start`: a config change that reshapes the model starts the affected part cold
instead of failing every day."""

from dataclasses import replace

from flows.config import with_overrides
from flows.recipes import demo
from trainer.model_dir import ModelMeta, warm_start


def _meta(cfg) -> ModelMeta:
    return ModelMeta(
        model_name=cfg.model_name, model_config=cfg.model, dim=cfg.store.embedding_dim, init_std=0.01,
        num_dense=13, num_fields=26, fields=(), dense_columns=(), key_columns=(), vocab_date="2026-01-01",
        run_tag="t", features_url="f", init_model_url=None, optim=cfg.optim, het=cfg.het, trainer=cfg.trainer,
    )


def test_same_shapes_warm_start_both_parts():
    cfg = demo("/tmp/x")
    ws = warm_start(_meta(cfg), cfg.model, cfg.store)
    assert (ws.dense, ws.sparse, ws.reason) == (True, True, "")


def test_dropout_and_bag_pooling_change_no_shape():
    cfg = demo("/tmp/x")
    new = with_overrides(cfg, {"model.dropout": 0.3, "model.bag_pooling": "sum"})
    ws = warm_start(_meta(cfg), new.model, new.store)
    assert (ws.dense, ws.sparse) == (True, True)


def test_new_mlp_widths_start_dense_cold_but_keep_the_rows():
    cfg = demo("/tmp/x")
    new = with_overrides(cfg, {"model.mlp_dims": [16]})
    ws = warm_start(_meta(cfg), new.model, new.store)
    assert (ws.dense, ws.sparse) == (False, True) and "model.mlp_dims" in ws.reason


def test_new_embedding_width_starts_both_cold():
    cfg = demo("/tmp/x")
    new = with_overrides(cfg, {"store.embedding_dim": 16})
    ws = warm_start(_meta(cfg), new.model, new.store)
    assert (ws.dense, ws.sparse) == (False, False) and "store.embedding_dim" in ws.reason


def test_another_arch_starts_dense_cold_naming_the_key():
    cfg = demo("/tmp/x")
    saved = _meta(replace(cfg, model=replace(cfg.model, arch="dnn")))
    ws = warm_start(saved, cfg.model, cfg.store)
    assert not ws.dense and "model.arch" in ws.reason
