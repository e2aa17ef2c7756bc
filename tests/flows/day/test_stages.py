"""flows.day.stages.train_plan: the day's optim values are derived from the rows it trains (a small day's
sparse_lr chosen on them), the parent's eval rows come first, and the run identity hashes the values
and the rows trained with."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from flows.config import RunConfig, with_overrides
from flows.day.results import WarmResult
from flows.day.stages import train_plan
from flows.day.state import DayState
from pipeline.encode.stage import EncodeResult
from storage.warm import WarmPlan
from tests.helpers.model_dirs import committed_feature_day
from trainer.config import HetConfig, OptimConfig, TrainerConfig
from trainer.launch.world import resolve_world
from trainer.model_dir import ModelMeta
from trainer.plan.day_recipe import SEARCHED
from trainer.plan.published import Published
from trainer.plan.recipe import derive
from trainer.plan.sparse_lr_search import FACTORS

DATE = "2026-01-05"


@pytest.fixture()
def features(tmp_path: Path) -> str:
    """A committed features directory of 3,600 train rows (the search reads them)."""
    return committed_feature_day(tmp_path / "features", train_rows=3_600)


def _spec(cfg: RunConfig, state: DayState):
    plan = train_plan(cfg, state)
    return plan.spec, plan.recipe


def _state(cfg: RunConfig, rows_train: int, features: str) -> DayState:
    plan = WarmPlan(
        date=DATE,
        world_size=resolve_world(cfg.trainer).world_size,
        sparse_optimizer=cfg.optim.sparse_optimizer,
        published_version=None,
        snapshot_url=None,
        snapshot_tag=None,
        evict_url=None,
        working_set_url=None,
    )
    encoded = EncodeResult(date=DATE, rows_train=rows_train, rows_eval=400, skipped=False, run_id="r1", url=features)
    state = DayState(date=DATE, layout=cfg.layout())
    return state.with_result("encode", encoded).with_result("warm", WarmResult(plan, "flow", "cold"))


def test_the_spec_holds_the_values_derived_for_the_days_rows(tmp_path: Path, features: str) -> None:
    cfg = RunConfig(root=str(tmp_path))
    spec, recipe = _spec(cfg, _state(cfg, 3_600, features))
    assert spec.optim.unresolved() == [] and spec.model.unresolved() == []
    assert spec.optim == recipe.optim and spec.model == recipe.model and spec.recipe == recipe.record()
    assert spec.optim.epochs > 1 and spec.model.dropout > 0  # a small day takes several regularised passes
    big, _ = _spec(cfg, _state(cfg, 10**8, "/not-read"))
    assert (big.optim.epochs, big.optim.batch_size, big.model.dropout) == (1, 1024, 0.0)
    # ranks computing on CUDA (here set, with gloo, on a machine without one) take the GPU's batch bounds
    gpu = with_overrides(cfg, {"trainer.device": "cuda", "trainer.backend": "gloo"})
    on_gpu, _ = _spec(gpu, _state(gpu, 10**8, "/not-read"))
    assert on_gpu.optim.batch_size == 8192


def test_the_run_identity_hashes_the_resolved_values_not_auto(tmp_path: Path, features: str) -> None:
    cfg = RunConfig(root=str(tmp_path))
    derived, recipe = _spec(cfg, _state(cfg, 3_600, features))
    values = dict(recipe.record()["values"])
    explicit = with_overrides(cfg, values)  # the same numbers, set by hand
    same, again = _spec(explicit, _state(explicit, 3_600, features))
    assert again.derived == () and same.identity() == derived.identity() and same.run_tag == derived.run_tag
    other, _ = _spec(cfg, _state(cfg, 360_000, "/not-read"))  # another day size: other values, another identity
    assert other.identity() != derived.identity()
    assert dataclasses.replace(derived, recipe={}).identity() == derived.identity()  # the reasons are not hashed


def test_a_small_days_sparse_lr_is_chosen_on_its_train_rows_and_a_set_one_is_kept(
    tmp_path: Path, features: str
) -> None:
    cfg = with_overrides(RunConfig(root=str(tmp_path)), {"optim.sparse_optimizer": "adam"})
    _, recipe = _spec(cfg, _state(cfg, 3_600, features))
    why = recipe.why["optim.sparse_lr"]
    assert "5-fold validation" in why and "3,600 train rows" in why, why
    # the search's choice is one of its candidates, FACTORS x the rule's value (`Recipe.searched` keeps the factor)
    rule = derive(cfg.optim, cfg.model, rows=3_600, world_size=recipe.world_size).optim.sparse_lr
    factor = recipe.searched["optim.sparse_lr"]
    assert recipe.optim.sparse_lr in {float(f"{rule * f:.3g}") for f in FACTORS}, (rule, recipe.optim.sparse_lr)
    assert factor == float(f"{recipe.optim.sparse_lr / rule:.3g}")  # what a warm-started day reuses
    assert "optim.sparse_lr" in recipe.derived
    _, kept = _spec(with_overrides(cfg, {"optim.sparse_lr": 0.03}), _state(cfg, 3_600, features))
    assert kept.optim.sparse_lr == 0.03 and kept.why["optim.sparse_lr"] == "set in the config"
    assert "optim.sparse_lr" not in kept.searched
    _, large = _spec(cfg, _state(cfg, 10**6, "/not-read"))  # over MAX_ROWS: the rule's value, nothing read
    assert large.why["optim.sparse_lr"].endswith("/ sqrt(epochs)")
    # row-wise AdaGrad (the default) keeps the rule's value on a small day too: the search's proxy misleads it
    adagrad = with_overrides(RunConfig(root=str(tmp_path)), {"optim.sparse_optimizer": "rowwise_adagrad"})
    assert adagrad.optim.sparse_optimizer not in SEARCHED
    _, kept_rule = _spec(adagrad, _state(adagrad, 3_600, "/not-read"))
    assert kept_rule.optim.sparse_lr == rule and "optim.sparse_lr" not in kept_rule.searched


def test_a_warm_day_trains_the_parents_eval_rows_first_and_its_identity_names_them(
    tmp_path: Path, features: str
) -> None:
    cfg = RunConfig(root=str(tmp_path))
    parent = committed_feature_day(tmp_path / "parent", train_rows=2_000, eval_rows=300, date="2026-01-04")
    meta = ModelMeta.of(
        model_name="ctr",
        model_config=cfg.model,
        dim=cfg.store.embedding_dim,
        init_std=0.01,
        num_dense=1,
        num_fields=2,
        fields=("k_0", "k_1"),
        dense_columns=("d_0",),
        key_columns=("k_0", "k_1"),
        vocab_date="2026-01-04",
        run_tag="t",
        features_url=parent,
        init_model_url=None,
        optim=OptimConfig(),
        het=HetConfig(),
        trainer=TrainerConfig(),
    )
    state = dataclasses.replace(_state(cfg, 3_600, features), published=Published("v00004", "/m/v00004", meta))
    plan = train_plan(cfg, state)
    assert (
        plan.spec.carried is not None
        and plan.spec.carried.rows == 300
        and plan.parent_eval.carried == plan.spec.carried
    )
    assert plan.recipe.rows == 3_900  # the recipe sizes the day to every row it trains
    off = with_overrides(cfg, {"optim.train_parent_eval": False})
    alone = train_plan(off, state)
    assert alone.spec.carried is None and alone.recipe.rows == 3_600
    assert alone.parent_eval.reason == "optim.train_parent_eval is false"
    assert (
        dataclasses.replace(plan.spec, carried=None).identity() != plan.spec.identity()
    )  # the carried rows are hashed
    cold = dataclasses.replace(state, published=None)  # nothing to carry: the option alone changes no identity
    assert train_plan(cfg, cold).spec.identity() == train_plan(off, cold).spec.identity()


def test_a_sampled_day_is_sized_for_the_rows_its_keep_rate_keeps(tmp_path: Path, features: str) -> None:
    from trainer.sampling import kept_rows

    cfg = with_overrides(RunConfig(root=str(tmp_path)), {"optim.negative_sampling": 0.25})
    spec, recipe = _spec(cfg, _state(cfg, 3_600, features))
    kept = kept_rows([f"{features}/train"], 0.25, seed=cfg.optim.seed)
    assert spec.optim.negative_sampling == 0.25 and 900 < kept < 3_600
    assert recipe.rows == kept == derive(cfg.optim, cfg.model, rows=kept, world_size=1).rows
