"""The `trainer`, `optim` and `het` sections: bad values are refused, naming the key."""

from __future__ import annotations

import pytest

from trainer.config import HetConfig, OptimConfig, TrainerConfig


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
