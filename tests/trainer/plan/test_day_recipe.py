"""trainer.plan.day_recipe: a small day whose rows start from zero has its sparse_lr searched on its train rows; a
day warm-started from a searched model keeps that model's factor; large days and set values keep the rule."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from flows.config import RunConfig, with_overrides
from tests.helpers.model_dirs import committed_feature_day
from trainer.config import HetConfig, OptimConfig, TrainerConfig
from trainer.model_dir import ModelMeta
from trainer.models.config import ModelConfig
from trainer.plan.day_recipe import day_recipe
from trainer.plan.published import Published
from trainer.plan.recipe import Recipe, derive

NOT_READ = "/features-that-must-not-be-read"


def _adam(root: Path) -> RunConfig:
    """A config with Adam rows (the default): the rule whose small-day sparse_lr is searched (`day_recipe.SEARCHED`)."""
    return with_overrides(RunConfig(root=str(root)), {"optim.sparse_optimizer": "adam"})


def _day_recipe(cfg: RunConfig, **kw: Any) -> Recipe:
    """`day_recipe` with the sections of `cfg`, as the train stage calls it."""
    return day_recipe(cfg.optim, cfg.model, cfg.store, storage_options=cfg.storage_options, **kw)


@pytest.fixture()
def features(tmp_path: Path) -> str:
    return committed_feature_day(tmp_path / "features", train_rows=3_600)


def _published(cfg: RunConfig, recipe: dict, *, dim: int | None = None) -> Published:
    meta = ModelMeta.of(
        model_name="ctr",
        model_config=cfg.model,
        dim=dim or cfg.store.embedding_dim,
        init_std=0.01,
        num_dense=1,
        num_fields=2,
        fields=("a", "b"),
        dense_columns=("d_0",),
        key_columns=("k_0", "k_1"),
        vocab_date="2026-01-04",
        run_tag="t",
        features_url="",
        init_model_url=None,
        optim=OptimConfig(),
        het=HetConfig(),
        trainer=TrainerConfig(),
        recipe=recipe,
    )
    return Published("v00007", "/models/ctr/v00007", meta)


def _rule(rows: int) -> float:
    return derive(OptimConfig(), ModelConfig(), rows=rows, world_size=1).optim.sparse_lr


def test_a_first_small_day_searches_its_rows_and_records_the_factor(tmp_path: Path, features: str) -> None:
    r = _day_recipe(_adam(tmp_path), rows=3_600, features_url=features, published=None, world_size=1)
    assert r.why["optim.sparse_lr"].startswith("5-fold validation")
    factor = r.record()["searched"]["optim.sparse_lr"]
    assert factor == pytest.approx(r.optim.sparse_lr / _rule(3_600), rel=1e-2)


def test_a_day_warm_started_from_a_searched_model_keeps_its_factor_without_reading_rows(tmp_path: Path) -> None:
    cfg = _adam(tmp_path)
    parent = _published(cfg, {"searched": {"optim.sparse_lr": 2.0}})
    r = _day_recipe(cfg, rows=3_600, features_url=NOT_READ, published=parent, world_size=1)
    assert r.optim.sparse_lr == pytest.approx(2 * _rule(3_600), rel=1e-2)
    assert "v00007" in r.why["optim.sparse_lr"] and r.searched == {"optim.sparse_lr": 2.0}  # its own children too
    unsearched = _day_recipe(cfg, rows=3_600, features_url=NOT_READ, published=_published(cfg, {}), world_size=1)
    assert unsearched.optim.sparse_lr == _rule(3_600) and unsearched.searched == {}


def test_rows_that_cannot_be_restored_start_from_zero_so_the_day_searches(tmp_path: Path, features: str) -> None:
    cfg = _adam(tmp_path)
    other_width = _published(cfg, {"searched": {"optim.sparse_lr": 4.0}}, dim=cfg.store.embedding_dim * 2)
    r = _day_recipe(cfg, rows=3_600, features_url=features, published=other_width, world_size=1)
    assert r.why["optim.sparse_lr"].startswith("5-fold validation")


def test_a_large_day_or_a_set_value_keeps_the_rule_or_the_config(tmp_path: Path) -> None:
    cfg = _adam(tmp_path)
    parent = _published(cfg, {"searched": {"optim.sparse_lr": 2.0}})
    large = _day_recipe(cfg, rows=10**6, features_url=NOT_READ, published=None, world_size=1)
    assert large.optim.sparse_lr == _rule(10**6) and large.searched == {}
    warm_large = _day_recipe(cfg, rows=10**6, features_url=NOT_READ, published=parent, world_size=1)
    assert warm_large.optim.sparse_lr == _rule(10**6)
    given = with_overrides(cfg, {"optim.sparse_lr": 0.03})
    for published in (None, parent):
        r = _day_recipe(given, rows=3_600, features_url=NOT_READ, published=published, world_size=1)
        assert r.optim.sparse_lr == 0.03 and r.why["optim.sparse_lr"] == "set in the config"


def test_rmsprop_rows_keep_the_rule_on_a_small_first_day(tmp_path: Path) -> None:
    """The search's proxy was validated against the product with Adam only: other rules keep the derived value."""
    cfg = with_overrides(RunConfig(root=str(tmp_path)), {"optim.sparse_optimizer": "rmsprop"})
    r = _day_recipe(cfg, rows=3_600, features_url=NOT_READ, published=None, world_size=1)
    assert r.optim.sparse_lr == _rule(3_600) and r.searched == {}
