"""trainer.plan.recipe.derive: the optim values a day's size decides, over day sizes from 10^3 to 10^8 rows."""

from __future__ import annotations

import dataclasses
import math

import pytest

from trainer.config import AUTO, DERIVED_FLOATS, DERIVED_INTS, OptimConfig
from trainer.models.config import ModelConfig
from trainer.plan import recipe
from trainer.plan.recipe import CROSS_MIN_ROWS, derive

SIZES = [10**3, 2_500, 3_600, 10**4, 18_000, 5 * 10**4, 10**5, 3 * 10**5, 10**6, 10**7, 10**8]
WORLDS = [1, 2, 8]


def _steps(rows: int, world: int, batch: int, epochs: int) -> int:
    return -(-(rows // world) // batch) * epochs


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("rows", SIZES)
def test_every_auto_field_is_resolved_and_the_day_is_never_all_warm_up(rows: int, world: int) -> None:
    r = derive(OptimConfig(), ModelConfig(), rows=rows, world_size=world)
    o = r.optim
    assert o.unresolved() == [] and r.model.unresolved() == []
    assert set(r.derived) == {f"optim.{n}" for n in (*DERIVED_INTS, *DERIVED_FLOATS)} | {"model.dropout"}
    assert r.steps == _steps(rows, world, o.batch_size, o.epochs)
    assert 0 <= o.warmup_steps <= r.steps // 10 and o.warmup_steps <= recipe.WARMUP_CAP
    assert recipe.MIN_BATCH <= o.batch_size <= recipe.MAX_BATCH["cpu"] and 1 <= o.epochs <= recipe.MAX_EPOCHS
    assert recipe.BASE_LR <= o.lr <= recipe.MAX_LR and o.sparse_lr <= recipe.BASE_SPARSE_LR
    # enough steps, unless the day is too small for MIN_STEPS even at the smallest batch and the most passes
    too_small = _steps(rows, world, recipe.MIN_BATCH, recipe.MAX_EPOCHS) < recipe.MIN_STEPS
    assert r.steps >= recipe.MIN_STEPS or (
        too_small and o.batch_size == recipe.MIN_BATCH and o.epochs == recipe.MAX_EPOCHS
    )
    assert (o.embedding_l2 == 0) == (o.epochs == 1) == (r.model.dropout == 0)  # extra passes come with regularisation


@pytest.mark.parametrize("rows", SIZES)
def test_smaller_days_get_no_fewer_passes_and_no_lower_learning_rate(rows: int) -> None:
    small, large = (
        derive(OptimConfig(), ModelConfig(), rows=rows, world_size=1),
        derive(OptimConfig(), ModelConfig(), rows=rows * 10, world_size=1),
    )
    assert small.optim.epochs >= large.optim.epochs and small.optim.batch_size <= large.optim.batch_size
    assert small.optim.lr >= large.optim.lr and small.optim.embedding_l2 >= large.optim.embedding_l2
    assert small.model.dropout >= large.model.dropout


@pytest.mark.parametrize("world", WORLDS)
def test_a_production_day_trains_with_the_production_values(world: int) -> None:
    r = derive(OptimConfig(), ModelConfig(), rows=10**8, world_size=world)
    o = r.optim
    assert (o.batch_size, o.epochs, o.lr, o.sparse_lr, o.embedding_l2, o.warmup_steps) == (
        1024,
        1,
        1e-3,
        2e-2,
        0.0,
        100,
    )
    assert r.model == ModelConfig(dropout=0.0).resolved()


@pytest.mark.parametrize("rows", SIZES)
def test_a_gpu_rank_gets_larger_batches_only_where_a_pass_keeps_its_steps(rows: int) -> None:
    cpu = derive(OptimConfig(), ModelConfig(), rows=rows, world_size=1)
    gpu = derive(OptimConfig(), ModelConfig(), rows=rows, world_size=1, device="cuda")
    assert gpu.optim.batch_size <= recipe.MAX_BATCH["cuda"] and "on cuda" in gpu.why["optim.batch_size"]
    if cpu.optim.batch_size < recipe.MAX_BATCH["cpu"]:  # a day too small for the CPU's largest batch: the same
        assert gpu.optim == cpu.optim
    else:
        assert gpu.optim.batch_size >= cpu.optim.batch_size and gpu.steps >= recipe.BATCH_STEPS
    assert derive(OptimConfig(), ModelConfig(), rows=10**8, world_size=1, device="cuda").optim.batch_size == 8192
    with pytest.raises(ValueError, match="tpu"):
        derive(OptimConfig(), ModelConfig(), rows=rows, world_size=1, device="tpu")


def test_a_small_day_takes_several_passes_at_a_higher_dense_learning_rate() -> None:
    r = derive(OptimConfig(), ModelConfig(), rows=1_800, world_size=1)  # a 2,000-row day, a tenth held out
    assert r.optim.batch_size == recipe.MIN_BATCH and r.optim.epochs == recipe.MAX_EPOCHS
    assert r.optim.lr == recipe.MAX_LR and r.optim.embedding_l2 > 0 and r.model.dropout > 0
    assert r.steps > 10 * 4  # not 4 steps


@pytest.mark.parametrize("rows", SIZES)
def test_explicit_values_are_kept_and_the_rest_follow_from_them(rows: int) -> None:
    given = {
        "batch_size": 64,
        "epochs": 2,
        "lr": 0.5,
        "sparse_lr": 0.25,
        "embedding_l2": 0.125,
        "warmup_steps": 7,
        "cross_lr_scale": 0.5,
        "wide_loss": 0.25,
    }
    for name, value in given.items():
        r = derive(OptimConfig(**{name: value}), ModelConfig(), rows=rows, world_size=2)
        if name == "warmup_steps":
            assert r.optim.warmup_steps == min(7, r.steps)
        else:
            assert getattr(r.optim, name) == value and r.why[f"optim.{name}"] == "set in the config"
        assert f"optim.{name}" not in r.derived and len(r.derived) == 8
    r = derive(OptimConfig(batch_size=64), ModelConfig(), rows=rows, world_size=1)
    assert r.steps == _steps(rows, 1, 64, r.optim.epochs)  # epochs derived from the given batch
    everything = derive(OptimConfig(**given), ModelConfig(dropout=0.25), rows=rows, world_size=1)
    assert (
        everything.derived == ()
        and everything.optim
        == dataclasses.replace(OptimConfig(**given), warmup_steps=min(7, everything.steps)).resolved()
    )
    assert everything.model.dropout == 0.25


@pytest.mark.parametrize("rows", SIZES)
def test_the_cross_term_trains_only_on_days_with_the_rows_to_estimate_it(rows: int) -> None:
    for world in (1, 8):  # the rule counts the day's rows, whatever the ranks
        r = derive(OptimConfig(), ModelConfig(), rows=rows, world_size=world)
        assert r.optim.cross_lr_scale == (1.0 if rows >= CROSS_MIN_ROWS else 0.0)
        assert f"{CROSS_MIN_ROWS:,}" in r.why["optim.cross_lr_scale"]
    assert derive(OptimConfig(cross_lr_scale=0.25), ModelConfig(), rows=rows, world_size=1).optim.cross_lr_scale == 0.25


@pytest.mark.parametrize("rows", SIZES)
def test_the_wide_term_learns_to_predict_alone_exactly_on_the_days_too_small_for_the_cross_term(rows: int) -> None:
    for world in (1, 8):
        r = derive(OptimConfig(), ModelConfig(), rows=rows, world_size=world)
        assert r.optim.wide_loss == (recipe.WIDE_LOSS if rows < CROSS_MIN_ROWS else 0.0) and recipe.WIDE_LOSS > 0
        assert (r.optim.wide_loss > 0) == (r.optim.cross_lr_scale == 0)
        assert f"{CROSS_MIN_ROWS:,}" in r.why["optim.wide_loss"] and "optim.wide_loss" in r.derived
    assert derive(OptimConfig(wide_loss=0.0), ModelConfig(), rows=rows, world_size=1).optim.wide_loss == 0.0


@pytest.mark.parametrize("epochs", [2, 3, 10, 50])
def test_the_derived_dropout_of_any_number_of_passes_is_a_valid_one(epochs: int) -> None:
    r = derive(OptimConfig(epochs=epochs), ModelConfig(), rows=3_600, world_size=1)
    assert 0 < r.model.dropout <= recipe.MAX_DROPOUT < 1  # 10 passes once asked for dropout 1.35
    assert r.model.dropout == min(recipe.MAX_DROPOUT, recipe.DROPOUT_PER_EXTRA_EPOCH * (epochs - 1))


def test_an_explicit_warm_up_longer_than_the_day_is_cut_to_the_day() -> None:
    r = derive(OptimConfig(warmup_steps=10_000, batch_size=256, epochs=1), ModelConfig(), rows=2_560, world_size=1)
    assert r.optim.warmup_steps == r.steps == 10 and "cut to the day's 10 steps" in r.why["optim.warmup_steps"]


def test_the_record_and_summary_name_values_and_reasons() -> None:
    r = derive(OptimConfig(epochs=2), ModelConfig(), rows=3_600, world_size=1)
    rec = r.record()
    assert rec["rows"] == 3_600 and rec["steps"] == r.steps and rec["values"]["optim.epochs"] == 2
    assert "optim.epochs" not in rec["derived"] and "optim.lr" in rec["derived"]
    assert set(rec["why"]) == set(rec["values"]) and all(rec["why"].values())
    line = r.summary()
    assert "3,600 rows" in line and "epochs=2 " in line and f"lr={r.optim.lr:g}*" in line and "\n" not in line
    assert f"dropout={r.model.dropout:g}*" in line and rec["values"]["model.dropout"] == r.model.dropout


def test_derive_refuses_an_empty_day() -> None:
    with pytest.raises(ValueError, match="rows >= 1"):
        derive(OptimConfig(), ModelConfig(), rows=0, world_size=1)


def test_auto_and_numbers_in_the_config() -> None:
    assert ModelConfig().unresolved() == ["model.dropout"] and ModelConfig(dropout="0.5").dropout == 0.5
    assert OptimConfig().unresolved() and all(
        getattr(OptimConfig(), n) == AUTO for n in (*DERIVED_INTS, *DERIVED_FLOATS)
    )
    o = OptimConfig(lr="1e-2", epochs="3")  # what YAML and --set hand over as text
    assert o.lr == 0.01 and o.epochs == 3 and math.isclose(o.lr, 1e-2)
    with pytest.raises(ValueError, match=r"optim.epochs must be 'auto' or an integer, got 'three'"):
        OptimConfig(epochs="three")
    with pytest.raises(ValueError, match=r"optim.batch_size must be >= 1 or 'auto', got 0"):
        OptimConfig(batch_size=0)


def test_a_search_may_replace_a_derived_value_but_never_a_set_one() -> None:
    r = derive(OptimConfig(), ModelConfig(), rows=3_600, world_size=1)
    searched = r.with_value("optim.sparse_lr", 0.023, "chosen by a search")
    assert searched.optim.sparse_lr == 0.023 and searched.record()["why"]["optim.sparse_lr"] == "chosen by a search"
    assert searched.optim.lr == r.optim.lr and "optim.sparse_lr" in searched.derived
    given = derive(OptimConfig(sparse_lr=0.03), ModelConfig(), rows=3_600, world_size=1)
    with pytest.raises(ValueError, match=r"only a derived optim value.*optim.sparse_lr \(set in the config\)"):
        given.with_value("optim.sparse_lr", 0.023, "chosen by a search")
