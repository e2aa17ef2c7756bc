"""The train spec round trip, config validation, and the per-step loss check."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from storage.embedding.config import StoreConfig
from storage.embedding.memory import MemoryStore
from tests.helpers.ranks import cpu_trainer_config
from trainer.config import HetConfig, OptimConfig, TrainerConfig
from trainer.data import Batch
from trainer.distributed.comm import ShardedEmbedding, init_distributed
from trainer.models.config import ModelConfig
from trainer.models.ctr_model import CTRModel
from trainer.optim.kstep_adam import KStepAdam
from trainer.spec import TrainSpec
from trainer.train import NonFiniteLossError, train_step


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


def test_new_trainer_fields_are_validated() -> None:
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


def test_the_identity_names_what_changes_the_model_and_not_how_the_job_runs() -> None:
    spec = _spec()
    same = _spec(trainer=TrainerConfig(timeout_s=99, log_every=7, checkpoint_every=3, max_restarts=2,
                                       nccl_env={"NCCL_DEBUG": "INFO"}, prefetch_batches=4))
    assert same.identity() == spec.identity()
    for other in (_spec(optim=OptimConfig(k_steps=6)), _spec(het=HetConfig(staleness_bound=1)),
                  _spec(model=ModelConfig(mlp_dims=(32,))), _spec(trainer=TrainerConfig(nproc_per_node=2)),
                  _spec(store=StoreConfig(embedding_dim=16)), _spec(features_id="another-encode-run")):
        assert other.identity() != spec.identity()


def test_non_finite_loss_raises_naming_the_step_before_any_update() -> None:
    ctx = init_distributed(cpu_trainer_config())
    torch.manual_seed(0)
    model = CTRModel(ModelConfig(num_heads=1, mlp_dims=(4,)), num_dense=1, num_fields=2, dim=2)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    store = MemoryStore(2)
    opt = KStepAdam(model.parameters(), ctx, k=1, lr=0.1)
    batch = Batch(labels=torch.ones(3), dense=torch.tensor([[0.0], [float("nan")], [1.0]]), keys=torch.tensor([[1, 2]] * 3))
    with pytest.raises(NonFiniteLossError, match="at step 7"):
        train_step(model, ShardedEmbedding(store, ctx, lr=0.1), opt, batch, step=7)
    assert len(store) == 0
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
