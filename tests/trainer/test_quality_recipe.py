"""bench.quality trains the default model with the project's defaults on day-sized data."""

from __future__ import annotations

import dataclasses

import pytest

from bench.quality import (
    BENCH_OPTIM,
    BENCH_TRAINER,
    SMALL_ROWS,
    SMALL_SAMPLE,
    SMALL_SAMPLE_DEFAULT_ARCH,
    recipe,
)
from pipeline.config import VocabConfig
from storage.embedding.config import StoreConfig
from trainer.config import OptimConfig, TrainerConfig
from trainer.models.config import ModelConfig


def test_day_sized_recipe_is_the_project_defaults() -> None:
    rec = recipe("attention", SMALL_ROWS)
    assert rec.model == ModelConfig() and rec.store == StoreConfig()
    assert rec.trainer == dataclasses.replace(TrainerConfig(), **BENCH_TRAINER)
    assert rec.optim == dataclasses.replace(OptimConfig(), **BENCH_OPTIM)
    assert rec.min_count == VocabConfig().min_count
    assert recipe("dnn", 10**6).model == ModelConfig(arch="dnn", mlp_dims=(400, 400, 400))


def test_small_sample_recipe_and_overrides() -> None:
    rec = recipe("attention", 8_000, epochs=2)
    assert rec.optim.epochs == 2 and rec.model.dropout == SMALL_SAMPLE_DEFAULT_ARCH["dropout"]
    assert rec.optim.embedding_l2 == SMALL_SAMPLE_DEFAULT_ARCH["embedding_l2"]
    assert rec.min_count == SMALL_SAMPLE_DEFAULT_ARCH["min_count"] and rec.optim.lr == SMALL_SAMPLE_DEFAULT_ARCH["lr"]
    ref = recipe("dcn_v2", 8_000)  # the reference archs keep the shared small-sample recipe
    assert ref.optim.lr == OptimConfig().lr and ref.optim.embedding_l2 == SMALL_SAMPLE["embedding_l2"]
    assert ref.min_count == SMALL_SAMPLE["min_count"] and ref.model.wide_scale == ModelConfig().wide_scale
    assert ref.model.dropout == SMALL_SAMPLE["dropout"] and ref.model.num_heads == ModelConfig().num_heads
    with pytest.raises(ValueError, match="unknown recipe override"):
        recipe("attention", 8_000, nonsense=1)
