"""The run configuration: YAML + --set overrides, typed and validated, errors naming the key."""

from dataclasses import replace

import pytest

from flows.config import (
    ConfigError,
    config_sources,
    from_dict,
    kept_line,
    lineage_config,
    load_config,
    shape_keys,
    with_overrides,
)
from flows.presets import by_name, demo
from tests.helpers.formats import sample
from trainer.model_dir import ModelMeta, warm_start


def test_defaults_are_valid_and_documented_keys_exist():
    cfg = load_config()
    assert cfg.root and cfg.input.format == "criteo"
    assert cfg.trainer.nproc_per_node == "auto" and cfg.optim.k_steps >= 1
    assert (cfg.registry.keep_versions, cfg.registry.keep_refused_days) == (14, 7)


def test_yaml_then_overrides(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("root: /data/ctr\noptim:\n  k_steps: 50\ntrainer:\n  nproc_per_node: 2\ninput:\n  format: avazu\n")
    cfg = load_config(f, ["optim.k_steps=20", "model.mlp_dims=[32, 16]", "input.url=s3://b/{yyyymmdd}.csv"])
    assert cfg.root == "/data/ctr"
    assert cfg.optim.k_steps == 20 and cfg.trainer.nproc_per_node == 2
    assert cfg.model.mlp_dims == (32, 16)
    assert cfg.input.format == "avazu" and cfg.input.url == "s3://b/{yyyymmdd}.csv"


def test_yaml_merges_into_a_preset(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("optim:\n  k_steps: 7\n")
    cfg = load_config(f, base=demo("/tmp/x"))
    assert cfg.optim.k_steps == 7
    assert cfg.optim.batch_size == demo("/tmp/x").optim.batch_size  # the rest of the preset is kept


@pytest.mark.parametrize(
    ("override", "names"),
    [
        ("optim.k_stepz=3", "optim.k_stepz"),
        ("optimm.k_steps=3", "optimm"),
        ("optim.k_steps=0", "optim.k_steps"),
        ("optim.k_steps=ten", "optim.k_steps"),
        ("input.format=parquet", "input.format"),
        ("trainer.nproc_per_node=-1", "trainer.nproc_per_node"),
        ("encode.eval_fraction=1.5", "encode.eval_fraction"),
        ("model.num_heads=3", "model.num_heads"),
        ("model_name=../etc", "model_name"),
        ("store.local_dir=s3://bucket/ssd", "store.local_dir"),
        ("trainer.nnodes=2", "trainer.rdzv_endpoint"),
        ("registry.keep_versions=0", "registry.keep_versions"),
        ("evaluate.next_day_rows=-5", "evaluate.next_day_rows"),
    ],
)
def test_bad_keys_and_values_name_the_key(override, names):
    with pytest.raises(ConfigError, match=names.replace(".", r"\.")):
        load_config(None, [override])


def test_bad_yaml_file_names_the_file(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text("- just\n- a list\n")
    with pytest.raises(ConfigError, match="bad.yaml"):
        load_config(f)
    f.write_text("optim:\n  k_steps: [1, 2\nmodel: {}\n")
    with pytest.raises(
        ConfigError, match=r"^config file \S*bad\.yaml: not valid YAML at line \d+, column \d+: [^\n]+$"
    ):
        load_config(f)


@pytest.mark.parametrize(
    ("schema_text", "message"),
    [
        (
            "seperator: ','\ncolumns: [a, b]\nlabel: a\ncategorical: [b]\n",
            r"input\.format: \S*shop\.yaml: unknown key 'seperator' \(did you mean 'separator'\?\)",
        ),
        (
            "columns: [a, b\nlabel: a\n",
            r"input\.format: schema file \S*shop\.yaml: not valid YAML at line 2, column \d+",
        ),
        (None, r"input\.format: schema file \S*shop\.yaml does not exist"),
    ],
)
def test_schema_file_mistakes_fail_at_load_naming_input_format(tmp_path, schema_text, message):
    path = tmp_path / "shop.yaml"
    if schema_text is not None:
        path.write_text(schema_text)
    with pytest.raises(ConfigError, match=message) as info:
        load_config(None, [f"input.format={path}"])
    assert "\n" not in str(info.value)  # one line


def test_the_shipped_production_example_loads():
    from pathlib import Path

    cfg = load_config(Path(__file__).resolve().parents[2] / "infra" / "prod.example.yaml")
    assert cfg.root.startswith("s3://") and "{yyyymmdd}" in cfg.input.url and cfg.dask.address.startswith("tcp://")


def test_unknown_preset():
    with pytest.raises(ValueError, match="unknown preset"):
        by_name("nope")


def test_a_companion_needs_the_values_own_keys_and_they_get_features_of_their_own():
    with pytest.raises(
        ConfigError, match="model.companion=poly2 reads each value's own key on every day: set encode.raw_keys=true"
    ):
        load_config(overrides=["model.companion=poly2"])
    assert load_config().model.companion == "auto"  # by default: on the days that have them
    on = load_config(overrides=["model.companion=poly2", "encode.raw_keys=true", "root=/r"])
    plain = load_config(overrides=["root=/r"])
    assert plain.layout().features_key == "05892cef4c"  # the key of before encode.raw_keys: the same features
    assert on.layout().features_key != plain.layout().features_key
    assert on.layout().vocab_key == plain.layout().vocab_key  # one vocabulary for both
    # which small days carry them is each day's manifest's: the threshold names no folder
    assert load_config(overrides=["root=/r", "encode.raw_keys_up_to=0"]).layout().features_key == "05892cef4c"


def test_words_that_yaml_1_1_made_booleans_stay_words_in_files_and_overrides(tmp_path):
    """`off`, `on`, `yes` and `no` are values of string keys (`model.companion`, a check's action): YAML 1.2's
    booleans, true and false alone, keep them what the user wrote."""
    (tmp_path / "c.yaml").write_text("model:\n  companion: off\nchecks:\n  volume:\n    action: off\n")
    cfg = load_config(tmp_path / "c.yaml", ["encode.raw_keys=true"])
    assert cfg.model.companion == "off" and cfg.checks.volume.action == "off" and cfg.encode.raw_keys is True
    assert load_config(overrides=["model.companion=off"]).model.companion == "off"
    with pytest.raises(ConfigError, match="encode.raw_keys must be true or false, got 'yes'"):
        load_config(overrides=["encode.raw_keys=yes"])


def test_the_keys_a_file_and_set_give_are_recorded_and_a_preset_s_are_not(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("model:\n  mlp_dims: [8]\noptim:\n  k_steps: 5\n")
    cfg = load_config(f, ["store.embedding_dim=16", "model.cross_input=tokens"], base=demo("/tmp/x"))
    assert cfg.set_keys == ("model.cross_input", "model.mlp_dims", "optim.k_steps", "store.embedding_dim")
    assert demo("/tmp/x").set_keys == () and load_config(base=demo("/tmp/x")).set_keys == ()  # a preset's: defaults
    assert from_dict(cfg.to_dict()).set_keys == cfg.set_keys  # kept in a deployment's frozen config
    assert "model.num_heads" in with_overrides(cfg, {"model.num_heads": 4}).set_keys  # as --set
    assert with_overrides(cfg, {"model.num_heads": 4}, given=False).set_keys == cfg.set_keys


def test_a_lineage_keeps_the_shape_keys_its_config_does_not_set_and_says_where_each_came_from():
    meta = ModelMeta.from_dict(sample("model-v2.json"))  # before cross_input (tokens then): mlp [32, 16], dim 8
    cfg = load_config(None, ["model.num_heads=4"], base=demo("/tmp/x"))  # demo: mlp [64, 32], dim 8
    assert lineage_config(cfg, None) == (cfg, {})  # a new lineage: the defaults
    pinned, kept = lineage_config(cfg, meta)
    assert (pinned.model.cross_input, pinned.model.mlp_dims, pinned.model.num_heads) == ("tokens", (32, 16), 4)
    assert kept == {"model.mlp_dims": ([32, 16], [64, 32]), "model.cross_input": ("tokens", "fields")}
    assert pinned.set_keys == cfg.set_keys  # what the lineage gave is not what the user set
    assert "model.cross_input=tokens (default fields)" in kept_line("v00002", kept)
    sources = config_sources(pinned, meta)
    assert set(sources) == set(shape_keys()) and sources["model.num_heads"] == "set"
    assert {k for k, v in sources.items() if v != "lineage"} == {"model.num_heads"}
    assert set(config_sources(cfg, None).values()) == {"set", "default"}
    ws = warm_start(meta, pinned.model, pinned.store)  # only the key set to another value starts the dense part cold
    assert not ws.dense and ws.changed == ("model.num_heads",) and "model.num_heads 2 -> 4" in ws.reason


def test_a_lineage_s_values_that_do_not_fit_the_set_keys_are_not_kept():
    meta = ModelMeta.from_dict(sample("model-v2.json"))
    meta = replace(meta, model_config={**meta.model_config, "num_heads": 8})
    cfg = load_config(None, ["store.embedding_dim=12"], base=demo("/tmp/x"))  # 8 heads do not divide 12
    assert lineage_config(cfg, meta) == (cfg, {})
