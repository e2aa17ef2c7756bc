"""`trainer.model_dir`: a config change that reshapes the model starts the affected part cold instead of
failing every day (`warm_start`), and model.json is read by code of other releases (`ModelMeta`)."""

import json
from dataclasses import replace

import pytest

from flows.config import with_overrides
from flows.presets import demo
from storage.io import codec, fsio
from storage.io.records import FormatError
from tests.helpers.formats import newer, sample
from trainer.companion.model import INPUTS
from trainer.model_dir import MODEL_FORMAT, ModelMeta, read_meta, warm_start
from trainer.models.config import ModelConfig
from trainer.models.ctr_model import CTRModel


def _meta(cfg) -> ModelMeta:
    return ModelMeta.of(
        model_name=cfg.model_name,
        model_config=cfg.model,
        dim=cfg.store.embedding_dim,
        init_std=0.01,
        num_dense=13,
        num_fields=26,
        fields=(),
        dense_columns=(),
        key_columns=(),
        vocab_date="2026-01-01",
        run_tag="t",
        features_url="f",
        init_model_url=None,
        optim=cfg.optim,
        het=cfg.het,
        trainer=cfg.trainer,
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


def test_a_model_json_from_before_attention_input_attends_over_every_token_and_either_value_keeps_its_warm_start():
    data = sample("model-v2.json")
    data["model_config"].pop("attention_input", None)
    meta = ModelMeta.from_dict(data)
    assert meta.model_cfg().attention_input == "tokens"  # what it was trained with
    cfg = demo("/tmp/x")
    for value in ("tokens", "fields"):
        ws = warm_start(
            meta,
            replace(cfg.model, cross_input="tokens", attention_input=value),
            replace(cfg.store, embedding_dim=meta.dim),
        )
        assert "model.attention_input" not in ws.reason


def test_new_mlp_widths_start_dense_cold_but_keep_the_rows():
    cfg = demo("/tmp/x")
    new = with_overrides(cfg, {"model.mlp_dims": [16]})
    ws = warm_start(_meta(cfg), new.model, new.store)
    assert (ws.dense, ws.sparse) == (False, True) and ws.changed == ("model.mlp_dims",)
    assert ws.reason == "architecture changed: model.mlp_dims [64, 32] -> [16]"  # the key, its saved and new values


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


# ---- model.json outlives the code that wrote it --------------------------------------------------
def test_a_model_json_as_written_today_is_read():
    meta = ModelMeta.from_dict(sample("model-v2.json"))
    assert meta.format == "ctr-pipeline-model/2" and meta.dim == 8 and len(meta.key_columns) == 26
    assert meta.model_cfg().arch == meta.model_config["arch"] == meta.arch
    assert meta.optim["epochs"] >= 1 and meta.train["steps"] > 0


def test_a_model_json_with_retired_keys_and_unknown_fields_is_read_and_still_builds_its_network():
    data = newer(
        sample("model-v2.json"), optim="retired_lr", trainer="retired_key", het="gone", model_config="retired_model_key"
    )
    meta = ModelMeta.from_dict(data, where="/r/model.json")
    assert meta.optim["retired_lr"] == "retired value"  # kept as recorded, never decoded
    assert meta.model_cfg() == ModelMeta.from_dict(sample("model-v2.json")).model_cfg()
    del data["model_config"]["num_heads"]  # a key added after the model was written: its default
    assert ModelMeta.from_dict(data).model_cfg().num_heads == ModelConfig().num_heads
    cfg = demo("/tmp/x")
    assert warm_start(meta, cfg.model, cfg.store).reason  # a retired model key may have shaped it: start cold


def test_a_model_json_from_before_a_key_whose_default_changed_builds_the_network_it_saved() -> None:
    """A model saved before `model.cross_input` crossed every token: it is rebuilt so (its weights fit), and
    today's default, the field tokens alone, is another shape: its next day starts the dense part cold."""
    data = sample("model-v2.json")
    data["model_config"].pop("cross_input", None)
    meta = ModelMeta.from_dict(data)
    assert meta.model_cfg().cross_input == "tokens" != ModelConfig().cross_input
    tokens = CTRModel(meta.model_cfg(), num_dense=meta.num_dense, num_fields=meta.num_fields, dim=meta.dim).state_dict()
    fields = CTRModel(
        replace(meta.model_cfg(), cross_input="fields"),
        num_dense=meta.num_dense,
        num_fields=meta.num_fields,
        dim=meta.dim,
    ).state_dict()
    assert tokens["cross.head.weight"].shape != fields["cross.head.weight"].shape
    cfg = demo("/tmp/x")
    ws = warm_start(meta, cfg.model, replace(cfg.store, embedding_dim=meta.dim))
    assert not ws.dense and ws.sparse and "model.cross_input" in ws.reason
    kept = warm_start(meta, replace(cfg.model, cross_input="tokens"), replace(cfg.store, embedding_dim=meta.dim))
    assert "model.cross_input" not in kept.reason
    data["model_config"].pop("cross")  # a model from before the cross term: rebuilt without it
    older = ModelMeta.from_dict(data).model_cfg()
    assert older.cross is False and not hasattr(
        CTRModel(older, num_dense=meta.num_dense, num_fields=meta.num_fields, dim=meta.dim), "cross"
    )


def test_a_model_with_a_companion_is_version_4_one_without_stays_version_2_and_version_3_is_read():
    data = sample("model-v4.json")
    meta = ModelMeta.from_dict(data)
    assert meta.companion is not None and meta.companion["kind"] == "poly2" and meta.companion["inputs"] == INPUTS
    assert [s["split"] for s in meta.companion["sources"]] == ["train", "eval", "train"]
    assert meta.to_dict()["format"] == "ctr-pipeline-model/4" and meta.model_cfg().companion == "auto"
    without = replace(meta, companion=None)
    assert without.to_dict()["format"] == MODEL_FORMAT == "ctr-pipeline-model/2"
    older = ModelMeta.from_dict(sample("model-v3.json"))  # a companion of the pairs alone (before the counts)
    assert older.companion is not None and "inputs" not in older.companion and older.model_cfg().companion == "poly2"


def test_a_model_json_of_a_newer_version_is_refused_naming_it():
    with pytest.raises(
        FormatError,
        match=r"/r/model.json has format 'ctr-pipeline-model/5', written by a newer "
        r"ctr-pipeline; this code reads ctr-pipeline-model/2, ctr-pipeline-model/3, "
        r"ctr-pipeline-model/4: upgrade",
    ):
        ModelMeta.from_dict({**sample("model-v2.json"), "format": "ctr-pipeline-model/5"}, where="/r/model.json")
    with pytest.raises(FormatError, match="ctr-pipeline-model/1', too old .*: retrain the model"):
        ModelMeta.from_dict({**sample("model-v2.json"), "format": "ctr-pipeline-model/1"})


def test_the_writer_round_trips_and_stores_the_sections_as_plain_data():
    cfg = demo("/tmp/x")
    meta = _meta(cfg)
    data = json.loads(json.dumps(meta.to_dict()))
    assert data["format"] == MODEL_FORMAT and data["optim"] == codec.encode(cfg.optim)
    back = ModelMeta.from_dict(data)
    assert back.model_cfg() == cfg.model and json.loads(json.dumps(back.to_dict())) == data
    assert set(data) >= set(sample("model-v2.json"))  # every field today's readers know is written


def test_read_meta_of_a_committed_directory_with_a_retired_trainer_key(tmp_path):
    """What `read_published` does at the start of every day: one retired `trainer.*` key must not stop it."""
    fs, path = fsio.get_fs(str(tmp_path / "m"))
    with fsio.staged(fs, path) as stage:
        fsio.write_json(fs, f"{stage}/model.json", newer(sample("model-v2.json"), trainer="retired_key"))
        fsio.commit_dir(fs, stage, path, {"ok": True})
    meta = read_meta(str(tmp_path / "m"))
    assert meta.trainer["retired_key"] == "retired value" and meta.dim == 8


def test_the_blend_weight_trained_with_is_recorded_with_the_companion_and_an_older_record_reads_the_mean():
    cfg = demo("/tmp/x")
    model = replace(cfg.model, companion_blend_weight=0.3)
    meta = ModelMeta.of(
        **{
            **_meta(cfg).__dict__,
            "model_config": model,
            "optim": cfg.optim,
            "het": cfg.het,
            "trainer": cfg.trainer,
            "companion": {"kind": "poly2", "C": 0.01},
        }
    )
    assert meta.companion == {"kind": "poly2", "C": 0.01, "blend_weight": 0.3}
    assert ModelMeta.from_dict(json.loads(json.dumps(meta.to_dict()))).companion_blend_weight == 0.3
    assert _meta(cfg).companion is None  # no companion, no weight: the network scores alone
    assert "blend_weight" not in sample("model-v4.json")["companion"]
    assert ModelMeta.from_dict(sample("model-v4.json")).companion_blend_weight == 0.5  # before it was recorded
    with pytest.raises(ValueError, match=r"companion.blend_weight must be a number in \[0, 1\]"):
        _ = replace(meta, companion={**meta.companion, "blend_weight": 2.0}).companion_blend_weight
