"""The train spec: its JSON round trip, errors that name the key, and an identity of what changes the model,
read from the roles every config field declares (`storage.io.identity`), with the hashes of earlier tags kept."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from storage.embedding.config import StoreConfig
from storage.io import codec
from storage.io.identity import Role, declarations, result_field, unclassified
from trainer.config import HetConfig, OptimConfig, TrainerConfig
from trainer.launch.spec import CarriedRows, TrainSpec
from trainer.models.config import ModelConfig
from trainer.plan.recipe import WIDE_LOSS, derive

ADAM, FP32 = "adam", "fp32"
"""The sparse optimizer and row dtype of the releases before compact rows: the specs of `PINNED` use them."""
NO_WIDE_LOSS = 0.0
"""`optim.wide_loss` of the releases before it (the model's loss alone): the specs of `PINNED` use it."""
ALL_TOKENS = "tokens"
"""`model.cross_input` and `model.attention_input` of the releases before them (every token crossed and attended):
the specs of `PINNED` use it."""


def _spec(**kw) -> TrainSpec:
    base = {
        "features_url": "/f/date=2024-01-02",
        "output_url": "/r/model",
        "init_model_url": None,
        "local_dir": "/l",
        "model_name": "ctr",
        "storage_options": None,
        "store": StoreConfig(embedding_dim=8, row_dtype=FP32, state_dtype=FP32),
        "model": ModelConfig(mlp_dims=(32, 16), cross_input=ALL_TOKENS, attention_input=ALL_TOKENS, companion="off"),
        "optim": OptimConfig(k_steps=5, sparse_optimizer=ADAM, wide_loss=NO_WIDE_LOSS),
        "het": HetConfig(),
        "trainer": TrainerConfig(nccl_env={"NCCL_DEBUG": "WARN"}),
        "run_tag": "v00001",
        "vocab_date": "2024-01-01",
    }
    return TrainSpec(**(base | kw))


def test_spec_round_trip(tmp_path: Path) -> None:
    spec = _spec()
    spec.write(tmp_path / "s.json")
    back = TrainSpec.read(tmp_path / "s.json")
    assert back == spec and back.model.mlp_dims == (32, 16)


def test_spec_errors_name_the_key() -> None:
    d = _spec().to_dict()
    d["optim"]["k_step"] = 3
    with pytest.raises(ValueError, match=r"unknown config key spec\.optim\.k_step"):
        TrainSpec.from_dict(d)
    d = _spec().to_dict()
    del d["run_tag"]
    with pytest.raises(ValueError, match=r"missing keys \['run_tag'\]"):
        TrainSpec.from_dict(d)


def test_the_identity_names_what_changes_the_model_and_not_how_the_job_runs() -> None:
    spec = _spec()
    same = _spec(
        trainer=TrainerConfig(
            timeout_s=99,
            log_every=7,
            checkpoint_every=3,
            max_restarts=2,
            nccl_env={"NCCL_DEBUG": "INFO"},
            prefetch_batches=4,
        )
    )
    assert same.identity() == spec.identity()
    for other in (
        _spec(optim=OptimConfig(k_steps=6)),
        _spec(het=HetConfig(staleness_bound=1)),
        _spec(model=ModelConfig(mlp_dims=(32,))),
        _spec(trainer=TrainerConfig(nproc_per_node=2)),
        _spec(store=StoreConfig(embedding_dim=16)),
        _spec(features_id="another-encode-run"),
    ):
        assert other.identity() != spec.identity()


# ----------------------------------------------------------------------------- declared roles

SECTIONS = {
    "model": ModelConfig,
    "optim": OptimConfig,
    "het": HetConfig,
    "trainer": TrainerConfig,
    "store": StoreConfig,
}
"""Every config section a trained run reads (the `TrainSpec` fields of config type)."""

OTHER_VALUE: dict[str, Any] = {
    "model.arch": "dnn",
    "model.num_heads": 4,
    "model.attention_layers": 2,
    "model.mlp_dims": (8,),
    "model.dropout": 0.1,
    "model.dense_buckets": 0,
    "model.dense_bucket_max": 5.0,
    "model.cross": False,
    "model.cross_input": "fields",
    "model.attention_input": "fields",
    "model.cross_layers": 1,
    "model.cross_rank": 2,
    "model.wide": False,
    "model.wide_scale": 0.5,
    "model.bag_pooling": "sum",
    "model.companion": "poly2",
    "model.companion_rows": 1000,
    "model.companion_blend_weight": 0.7,
    "optim.batch_size": 256,
    "optim.epochs": 2,
    "optim.seed": 1,
    "optim.lr": 0.01,
    "optim.sparse_lr": 0.05,
    "optim.weight_decay": 1e-5,
    "optim.embedding_l2": 1e-4,
    "optim.warmup_steps": 7,
    "optim.cross_lr_scale": 0.0,
    "optim.lr_decay": "linear",
    "optim.min_lr_ratio": 0.0,
    "optim.k_steps": 1,
    "optim.negative_sampling": 0.5,
    "optim.train_parent_eval": False,
    "optim.sparse_optimizer": "rowwise_adagrad",
    "optim.wide_loss": 0.5,
    "het.staleness_bound": 2,
    "het.cache_rows": 10,
    "trainer.nproc_per_node": 2,
    "trainer.nnodes": 2,
    "trainer.node_rank": 1,
    "trainer.rdzv_endpoint": "h:29500",
    "trainer.backend": "gloo",
    "trainer.device": "cpu",
    "trainer.timeout_s": 5,
    "trainer.nccl_env": {"A": "B"},
    "trainer.intra_group_size": 2,
    "trainer.prefetch_batches": 0,
    "trainer.bind_io_threads": False,
    "trainer.log_every": 3,
    "trainer.checkpoint_every": 0,
    "trainer.max_restarts": 2,
    "trainer.precision": "bf16",
    "trainer.deterministic": True,
    "store.embedding_dim": 16,
    "store.init_std": 0.02,
    "store.host_budget_mb": 8,
    "store.device_cache_rows": 100,
    "store.cache_policy": "lru",
    "store.local_dir": "/tmp/ssd",
    "store.row_dtype": "bf16",
    "store.state_dtype": "log8",
}
"""A valid value other than `_spec()`'s for every field (a new field needs one here too)."""


def test_every_field_of_every_section_declares_its_role() -> None:
    """A field without a role would be left out of the identity (or silently change every tag): declare it
    with `shape_field`, `result_field` or `run_field` (storage/io/identity.py)."""
    missing = {name: unclassified(cls) for name, cls in SECTIONS.items() if unclassified(cls)}
    assert missing == {}


MULTI_NODE = {"nnodes": 2, "rdzv_endpoint": "h:29500"}
"""Where `node_rank` is compared: a world in which another node rank is valid."""


def _pair(key: str) -> tuple[TrainSpec, TrainSpec]:
    """`_spec()` (on two nodes for `trainer.node_rank`) and the same with `key` set to its `OTHER_VALUE`."""
    section, name = key.split(".")
    spec = _spec()
    if key == "trainer.node_rank":
        spec = _spec(trainer=dataclasses.replace(spec.trainer, **MULTI_NODE))
    new = {name: OTHER_VALUE[key]} | (MULTI_NODE if key == "trainer.nnodes" else {})
    return spec, dataclasses.replace(spec, **{section: dataclasses.replace(getattr(spec, section), **new)})


@pytest.mark.parametrize("key", [f"{s}.{f.name}" for s, cls in SECTIONS.items() for f in dataclasses.fields(cls)])
def test_a_field_changes_the_identity_exactly_when_it_declares_so(key: str) -> None:
    section, name = key.split(".")
    assert key in OTHER_VALUE, f"give {key} another valid value in OTHER_VALUE"
    spec, other = _pair(key)
    hashed = declarations(SECTIONS[section])[name].role is not Role.RUN
    assert (other.identity() != spec.identity()) == hashed


# ----------------------------------------------------------------------------- the hashes of earlier tags


def _identity_before_roles(spec: TrainSpec) -> str:
    """`TrainSpec.identity` as it was before the fields declared roles (verbatim): earlier run tags end with it."""
    t = spec.trainer
    optim = codec.encode(spec.optim)
    optim.pop("train_parent_eval")
    optim.pop("sparse_optimizer")  # added later (compact rows), with the old rule as its neutral value
    optim.pop("wide_loss")  # added later (issue 31), 0 (the model's loss alone) its neutral value
    optim.pop("negative_sampling")  # added later (issue 52), 1 (every negative) its neutral value
    model = codec.encode(spec.model)
    model.pop("cross_input")  # added later (issue 29), the earlier cross term's input its neutral value
    model.pop("attention_input", None)  # added later (issue 29), every token attended its neutral value
    model.pop("companion")  # added later (issue 31), none its neutral value
    model.pop("companion_rows")  # added with it, its default its neutral value
    model.pop("companion_blend_weight")  # added later (issue 51), the mean (0.5) its neutral value
    parts = {
        "model": model,
        "optim": optim,
        "het": codec.encode(spec.het),
        "rows": {"embedding_dim": spec.store.embedding_dim, "init_std": spec.store.init_std},
        "world": {"nnodes": t.nnodes, "nproc_per_node": t.nproc_per_node, "intra_group_size": t.intra_group_size},
        "features": spec.features_id or spec.features_url,
        "init_model_url": spec.init_model_url,
    }
    if spec.carried is not None:
        parts["carried"] = spec.carried.features_id or spec.carried.features_url
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:10]


CARRIED = CarriedRows(
    features_url="/f/date=2024-01-01", features_id="enc-0", date="2024-01-01", rows=10, evicted_url=None
)
FULL = {
    "model": ModelConfig(
        arch="dcn_v2",
        mlp_dims=(64, 32),
        dropout=0.1,
        cross=False,
        cross_rank=4,
        cross_input=ALL_TOKENS,
        attention_input=ALL_TOKENS,
        companion="off",
    ),
    "optim": OptimConfig(
        batch_size=512,
        epochs=2,
        lr=0.003,
        sparse_lr=0.01,
        embedding_l2=1e-4,
        warmup_steps=20,
        cross_lr_scale=0.0,
        seed=3,
        train_parent_eval=False,
        sparse_optimizer=ADAM,
        wide_loss=NO_WIDE_LOSS,
    ),
    "het": HetConfig(staleness_bound=2, cache_rows=1000),
    "trainer": TrainerConfig(nnodes=2, nproc_per_node=4, intra_group_size=2, rdzv_endpoint="h:1"),
    "store": StoreConfig(embedding_dim=16, init_std=0.02, row_dtype=FP32, state_dtype=FP32),
    "features_id": "enc-1",
    "init_model_url": "/m/v00003",
    "carried": CARRIED,
}
PINNED = {  # computed by the code before the roles (git HEAD bce5d75), before this change was made
    "default": (_spec, {}, "eee1caf9f2"),
    "full": (_spec, FULL, "a6fd8d91da"),
    "parent eval on": (
        _spec,
        FULL | {"optim": dataclasses.replace(FULL["optim"], train_parent_eval=True)},
        "a6fd8d91da",
    ),
    "carried by url": (
        _spec,
        {
            "model": ModelConfig(cross_input=ALL_TOKENS, attention_input=ALL_TOKENS, companion="off"),
            "trainer": TrainerConfig(nproc_per_node=1),
            "carried": dataclasses.replace(CARRIED, features_id="", evicted_url="/e"),
        },
        "c8af5b3610",
    ),
}


@pytest.mark.parametrize("name", list(PINNED))
def test_the_identity_of_earlier_specs_is_unchanged(name: str) -> None:
    """A rerun after the upgrade must find its checkpoints and its committed candidate under the same tag."""
    make, kw, pinned = PINNED[name]
    spec = make(**kw)
    assert spec.identity() == _identity_before_roles(spec) == pinned


ADDED_LATER = (
    "trainer.precision",
    "optim.sparse_optimizer",
    "store.row_dtype",
    "store.state_dtype",
    "optim.wide_loss",
    "model.cross_input",
    "model.attention_input",
    "model.companion",
    "model.companion_rows",
    "model.companion_blend_weight",
    "optim.negative_sampling",
)
"""Fields added after the tags of `PINNED`: only their neutral value keeps those tags."""


@pytest.mark.parametrize("key", [k for k in OTHER_VALUE if k not in ADDED_LATER])
def test_the_identity_is_the_earlier_one_whatever_field_changes(key: str) -> None:
    for spec in _pair(key):
        assert spec.identity() == _identity_before_roles(spec)


def test_a_keep_rate_of_negatives_changes_the_tag_and_1_keeps_the_earlier_one() -> None:
    spec = _spec()
    sampled = _spec(optim=dataclasses.replace(spec.optim, negative_sampling=0.1))
    assert spec.optim.negative_sampling == 1.0 and spec.identity() == "eee1caf9f2" != sampled.identity()


def test_a_companion_changes_the_tag_and_none_keeps_the_earlier_one() -> None:
    spec = _spec()
    assert spec.model.companion == "off" and spec.identity() == "eee1caf9f2"
    on = _spec(model=dataclasses.replace(spec.model, companion="poly2"))
    fewer = _spec(model=dataclasses.replace(spec.model, companion="poly2", companion_rows=1000))
    auto = _spec(model=dataclasses.replace(spec.model, companion="auto"))  # the default since: its own tags
    assert len({spec.identity(), on.identity(), fewer.identity(), auto.identity()}) == 4
    assert ModelConfig().companion == "auto"


def test_the_rows_of_before_compact_rows_keep_the_earlier_tags_and_the_compact_default_gets_its_own() -> None:
    """A rerun of a day started before the upgrade, with adam + fp32 rows set, finds its checkpoints; the new default
    rows train another result, so they hash to another tag (whatever else is equal)."""
    spec = _spec()
    assert spec.identity() == "eee1caf9f2"
    compact = _spec(
        optim=dataclasses.replace(spec.optim, sparse_optimizer="rowwise_adagrad"),
        store=dataclasses.replace(spec.store, row_dtype="fp16"),
    )
    ids = {
        spec.identity(),
        compact.identity(),
        _spec(store=dataclasses.replace(spec.store, row_dtype="fp16")).identity(),
        _spec(optim=dataclasses.replace(spec.optim, sparse_optimizer="sgd")).identity(),
        _spec(store=dataclasses.replace(spec.store, state_dtype="log8")).identity(),
    }
    assert len(ids) == 5
    assert StoreConfig().row_dtype != FP32, "the default rows are compact: a default spec hashes to a new tag"


def test_a_cross_term_on_every_token_keeps_its_tag_and_the_default_on_the_fields_gets_another() -> None:
    """A day started before `model.cross_input` existed (every token crossed) finds its checkpoints; the default
    crosses the field tokens alone, another network, so it hashes to another tag."""
    spec = _spec()
    assert spec.model.cross_input == ALL_TOKENS and spec.identity() == "eee1caf9f2"
    assert ModelConfig().cross_input == "fields"
    assert _spec(model=dataclasses.replace(spec.model, cross_input="fields")).identity() != spec.identity()


def test_an_attention_over_every_token_keeps_its_tag_and_the_default_over_the_fields_gets_another() -> None:
    """A day started before `model.attention_input` existed (every token attended) finds its checkpoints; the
    default attends over the field tokens alone, another computation, so it hashes to another tag."""
    spec = _spec()
    assert spec.model.attention_input == ALL_TOKENS and spec.identity() == "eee1caf9f2"
    assert ModelConfig().attention_input == "fields"
    assert _spec(model=dataclasses.replace(spec.model, attention_input="fields")).identity() != spec.identity()


def test_a_day_without_the_wide_loss_keeps_its_tag_and_a_small_day_with_it_gets_another() -> None:
    """A day started before `optim.wide_loss` existed (the model's loss alone), and a large day (`auto` is 0 there),
    keep their tags on a rerun; a small day's objective (`auto`: WIDE_LOSS) trains another model: another tag."""
    spec = _spec()
    assert spec.optim.wide_loss == NO_WIDE_LOSS and spec.identity() == "eee1caf9f2"
    assert derive(OptimConfig(), ModelConfig(), rows=10**6, world_size=1).optim.wide_loss == NO_WIDE_LOSS
    small = derive(OptimConfig(), ModelConfig(), rows=2_000, world_size=1).optim.wide_loss
    assert small == WIDE_LOSS != NO_WIDE_LOSS
    assert _spec(optim=dataclasses.replace(spec.optim, wide_loss=small)).identity() != spec.identity()


def test_precision_is_hashed_but_its_default_keeps_the_earlier_tags() -> None:
    spec = _spec()
    assert spec.trainer.precision == "auto" and spec.identity() == _identity_before_roles(spec) == "eee1caf9f2"
    ids = {
        p: _spec(trainer=dataclasses.replace(spec.trainer, precision=p)).identity()
        for p in ("auto", "fp32", "bf16", "fp16")
    }
    assert len(set(ids.values())) == 4 and ids["auto"] == spec.identity()


@dataclass(frozen=True, kw_only=True, slots=True)
class _GrownOptim(OptimConfig):
    """`OptimConfig` after a release adds a field that was off before (its neutral value)."""

    label_smoothing: float = result_field(0.0, neutral=0.0)


def test_a_field_added_at_its_neutral_value_keeps_the_tags() -> None:
    spec = _spec()
    grown = _spec(optim=_GrownOptim(k_steps=5, sparse_optimizer=ADAM, wide_loss=NO_WIDE_LOSS))
    assert grown.identity() == spec.identity() == "eee1caf9f2"
    assert (
        _spec(
            optim=_GrownOptim(k_steps=5, sparse_optimizer=ADAM, wide_loss=NO_WIDE_LOSS, label_smoothing=0.1)
        ).identity()
        != spec.identity()
    )


def test_the_run_tag_is_date_parent_and_identity() -> None:
    spec = _spec()
    assert spec.with_run_tag("2024-01-02", "v00003").run_tag == f"2024-01-02:v00003:{spec.identity()}"
    assert spec.with_run_tag("2024-01-02", None).run_tag == f"2024-01-02:none:{spec.identity()}"
    assert spec.with_run_tag("2024-01-02", None).identity() == spec.identity()  # the tag itself is not hashed
