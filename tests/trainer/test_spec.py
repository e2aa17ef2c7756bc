"""The train spec: its JSON round trip, errors that name the key, and an identity of what changes the model."""

from __future__ import annotations

from pathlib import Path

import pytest

from storage.embedding.config import StoreConfig
from trainer.config import HetConfig, OptimConfig, TrainerConfig
from trainer.models.config import ModelConfig
from trainer.spec import TrainSpec


def _spec(**kw) -> TrainSpec:
    base = {
        "features_url": "/f/date=2024-01-02", "output_url": "/r/model", "init_model_url": None, "local_dir": "/l",
        "model_name": "ctr", "storage_options": None, "store": StoreConfig(embedding_dim=8),
        "model": ModelConfig(mlp_dims=(32, 16)), "optim": OptimConfig(k_steps=5), "het": HetConfig(),
        "trainer": TrainerConfig(nccl_env={"NCCL_DEBUG": "WARN"}), "run_tag": "v00001", "vocab_date": "2024-01-01",
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
    same = _spec(trainer=TrainerConfig(timeout_s=99, log_every=7, checkpoint_every=3, max_restarts=2,
                                       nccl_env={"NCCL_DEBUG": "INFO"}, prefetch_batches=4))
    assert same.identity() == spec.identity()
    for other in (_spec(optim=OptimConfig(k_steps=6)), _spec(het=HetConfig(staleness_bound=1)),
                  _spec(model=ModelConfig(mlp_dims=(32,))), _spec(trainer=TrainerConfig(nproc_per_node=2)),
                  _spec(store=StoreConfig(embedding_dim=16)), _spec(features_id="another-encode-run")):
        assert other.identity() != spec.identity()
