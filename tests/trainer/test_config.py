"""The `trainer`, `optim` and `het` sections: bad values are refused, naming the key; their resolved types."""

from __future__ import annotations

import dataclasses

import pytest

from storage.io import codec
from storage.io.identity import declarations, identity_parts
from trainer.config import HetConfig, OptimConfig, ResolvedOptim, ResolvedTrainer, TrainerConfig
from trainer.models.config import ModelConfig, ResolvedModel


def test_trainer_fields_are_validated() -> None:
    with pytest.raises(ValueError, match="intra_group_size"):
        TrainerConfig(intra_group_size=-1)
    with pytest.raises(ValueError, match="prefetch_batches"):
        TrainerConfig(prefetch_batches=-1)
    with pytest.raises(ValueError, match="checkpoint_every"):
        TrainerConfig(checkpoint_every=-1)
    with pytest.raises(ValueError, match="max_restarts"):
        TrainerConfig(max_restarts=-1)
    assert TrainerConfig(prefetch_batches=0, checkpoint_every=0).prefetch_batches == 0
    assert TrainerConfig().prefetch_batches == "auto"
    assert TrainerConfig(prefetch_batches="3").prefetch_batches == 3  # YAML/CLI text of a number
    for bad in ("always", 1.5, True):
        with pytest.raises(ValueError, match="prefetch_batches must be 'auto' or an integer"):
            TrainerConfig(prefetch_batches=bad)
    with pytest.raises(ValueError, match="log_every"):
        TrainerConfig(log_every=0)


def test_optim_and_het_fields_are_validated() -> None:
    with pytest.raises(ValueError, match=r"optim.k_steps must be >= 1, got 0"):
        OptimConfig(k_steps=0)
    with pytest.raises(ValueError, match="optim.lr_decay must be one of"):
        OptimConfig(lr_decay="step")
    with pytest.raises(ValueError, match=r"het.staleness_bound must be >= 0, got -1"):
        HetConfig(staleness_bound=-1)
    with pytest.raises(ValueError, match="het.cache_rows must be >= 1"):
        HetConfig(cache_rows=0)


SET = {
    "batch_size": 256,
    "epochs": 2,
    "lr": 0.003,
    "sparse_lr": 0.01,
    "embedding_l2": 0.05,
    "warmup_steps": 10,
    "cross_lr_scale": 0.0,
    "wide_loss": 1.0,
}
"""Every `optim` field that may be `auto`, given."""


@pytest.mark.parametrize(
    ("section", "resolved"),
    [(OptimConfig, ResolvedOptim), (ModelConfig, ResolvedModel), (TrainerConfig, ResolvedTrainer)],
)
def test_a_resolved_type_declares_the_sections_fields_and_roles(section: type, resolved: type) -> None:
    """The run identity, the dense warm start and the codec read a resolved section as the section."""
    assert issubclass(resolved, section)
    assert [f.name for f in dataclasses.fields(resolved)] == [f.name for f in dataclasses.fields(section)]
    assert declarations(resolved) == declarations(section)


def test_a_section_resolves_once_nothing_is_auto_and_hashes_and_encodes_as_before() -> None:
    given = OptimConfig(**SET)
    resolved = given.resolved()
    assert isinstance(resolved, ResolvedOptim) and resolved.resolved() is resolved
    assert identity_parts(resolved) == identity_parts(given) and codec.encode(resolved) == codec.encode(given)
    assert ModelConfig(dropout=0.25).resolved().dropout == 0.25
    assert TrainerConfig(nproc_per_node=2).with_nproc(3).nproc_per_node == 3


def test_a_field_still_auto_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match=r"^optim.lr is 'auto': derive the day's values with trainer.plan.recipe"):
        OptimConfig(**{**SET, "lr": "auto"}).resolved()
    with pytest.raises(ValueError, match=r"optim.batch_size, optim.epochs.* are 'auto'"):
        OptimConfig().resolved()
    with pytest.raises(ValueError, match=r"model.dropout is 'auto'"):
        ModelConfig().resolved()
    with pytest.raises(ValueError, match=r"trainer.nproc_per_node is 'auto'"):
        ResolvedTrainer(nproc_per_node="auto")  # what a spec's JSON could hold
