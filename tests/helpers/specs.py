"""Train specs for tests that launch torchrun or build a Trainer directly."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from storage.embedding.config import StoreConfig
from storage.features_manifest import read_features_manifest
from storage.io import fsio
from trainer.config import HetConfig, OptimConfig, TrainerConfig
from trainer.launch.spec import TrainSpec
from trainer.launch.world import resolve_world
from trainer.models.config import ModelConfig
from trainer.plan.recipe import derive

_OPTIM = {f.name for f in dataclasses.fields(OptimConfig)}
_HET = {"staleness_bound", "cache_rows"}
DAY_SIZED = {"batch_size": 1024, "epochs": 1, "lr": 1e-3, "sparse_lr": 2e-2, "embedding_l2": 0.0, "wide_loss": 0.0}
"""The optim values `trainer.plan.recipe.derive` gives a production day: a test spec uses them unless the test
sets them, so its steps do not grow with the recipe's small-day values; the warm-up stays derived."""


def split_configs(**kw: Any) -> tuple[TrainerConfig, OptimConfig, HetConfig]:
    """The three training sections from one set of keyword arguments (each key goes to its section)."""
    optim = {k: v for k, v in kw.items() if k in _OPTIM}
    het = {k: v for k, v in kw.items() if k in _HET}
    rest = {k: v for k, v in kw.items() if k not in _OPTIM | _HET}
    return TrainerConfig(**rest), OptimConfig(**optim), HetConfig(**het)


def make_spec(
    features: str | Path,
    output: str | Path,
    local_dir: str | Path,
    *,
    store: StoreConfig,
    model: ModelConfig,
    run_tag: str,
    init: str | Path | None = None,
    vocab_date: str | None = "2024-01-01",
    **kw: Any,
) -> TrainSpec:
    """A spec over `features` committing to `output`; `kw` are trainer/optim/het keys (checkpoints beside `output`),
    with `DAY_SIZED` optim values unless given and the rest derived for the features' train rows."""
    trainer, optim, het = split_configs(**{**DAY_SIZED, **kw})
    trainer = resolve_world(trainer)
    fs, path = fsio.get_fs(str(features))
    manifest = read_features_manifest(fs, path)
    # features that are not there (a test of a failing job) have no rows: derive as for the smallest day
    rows = manifest.rows_train if manifest is not None and manifest.rows_train else 1
    recipe = derive(optim, model, rows=rows, world_size=trainer.world_size)
    return TrainSpec(
        features_url=str(features),
        output_url=str(output),
        init_model_url=str(init) if init else None,
        local_dir=str(local_dir),
        model_name="ctr",
        storage_options=None,
        store=store,
        model=recipe.model,
        optim=recipe.optim,
        het=het,
        trainer=trainer,
        run_tag=run_tag,
        vocab_date=vocab_date,
        checkpoint_url=f"{output}.checkpoint" if trainer.checkpoint_every else None,
    )
