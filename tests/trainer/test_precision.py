"""Mixed precision: fp32 is the step unchanged; bf16 and fp16 autocast keep float32 masters and rows; a bf16
day on CPU trains the shared Criteo sample to within 0.01 AUC of fp32."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from storage.embedding.config import StoreConfig
from storage.embedding.memory import MemoryStore
from tests.helpers.criteo import write_criteo_features
from tests.helpers.ranks import cpu_trainer_config
from tests.helpers.specs import make_spec
from trainer.data import Batch
from trainer.distributed.context import init_distributed
from trainer.distributed.sharded_embedding import ShardedEmbedding
from trainer.eval.scoring import evaluate_model
from trainer.main import run
from trainer.models.config import ModelConfig
from trainer.models.ctr_model import CTRModel
from trainer.optim.kstep_adam import KStepAdam
from trainer.precision import Precision, resolve_precision
from trainer.step import train_step


def test_auto_is_bf16_on_cuda_and_fp32_on_cpu() -> None:
    assert resolve_precision("auto", "cuda") == "bf16" and resolve_precision("auto", "cpu") == "fp32"
    assert resolve_precision("fp16", "cpu") == "fp16"
    with pytest.raises(ValueError, match="trainer.precision must be one of"):
        resolve_precision("int8", "cpu")


def _run(precision: Precision | None, steps: int = 6):
    ctx = init_distributed(cpu_trainer_config())
    torch.manual_seed(0)
    model = CTRModel(ModelConfig(num_heads=1, mlp_dims=(8,), dropout=0.0), num_dense=3, num_fields=4, dim=4)
    opt = KStepAdam(model.named_parameters(), ctx, k=1, lr=0.01)
    store = MemoryStore(4, init_std=0.1)
    sparse = ShardedEmbedding(store, ctx, lr=0.05)
    g = torch.Generator().manual_seed(1)
    losses = []
    for step in range(1, steps + 1):
        batch = Batch(
            labels=(torch.rand(64, generator=g) < 0.3).float(),
            dense=torch.rand(64, 3, generator=g),
            keys=torch.randint(0, 40, (64, 4), generator=g),
        )
        losses.append(train_step(model, sparse, opt, batch, step=step, precision=precision))
    keys = torch.arange(40)
    return losses, model, store.lookup(keys).rows


def test_fp32_is_the_step_without_precision_bit_for_bit() -> None:
    plain, fp32 = _run(None), _run(Precision("fp32", torch.device("cpu")))
    assert all(torch.equal(a, b) for a, b in zip(plain[0], fp32[0], strict=True))
    assert all(torch.equal(a, b) for a, b in zip(plain[1].parameters(), fp32[1].parameters(), strict=True))
    assert torch.equal(plain[2], fp32[2])


@pytest.mark.parametrize("name", ["bf16", "fp16"])
def test_half_precision_keeps_float32_masters_and_rows_and_stays_close(name: str) -> None:
    want, half = _run(None), _run(Precision(name, torch.device("cpu")))
    assert all(p.dtype == torch.float32 for p in half[1].parameters())
    assert half[2].dtype == torch.float32 and torch.isfinite(half[2]).all()
    assert all(torch.isfinite(x) for x in half[0])
    assert not torch.equal(want[2], half[2]), "autocast ran: the rows moved differently"
    assert abs(float(sum(half[0])) - float(sum(want[0]))) / len(want[0]) < 0.05


@pytest.mark.slow
def test_a_bf16_day_on_cpu_trains_within_0_01_auc_of_fp32(tmp_path: Path, shared_data: Path) -> None:
    features = write_criteo_features(shared_data / "criteo" / "train_head_10k.tsv", tmp_path / "features")
    auc = {}
    for precision in ("fp32", "bf16"):
        out = tmp_path / precision / "model"
        spec = make_spec(
            features,
            out,
            tmp_path / precision / "local",
            store=StoreConfig(embedding_dim=8, init_std=0.01),
            model=ModelConfig(num_heads=2, mlp_dims=(32, 16), dropout=0.0),
            run_tag=precision,
            device="cpu",
            precision=precision,
            batch_size=256,
            epochs=1,
            lr=2e-3,
            checkpoint_every=0,
            log_every=1000,
        )
        run(spec)
        auc[precision] = evaluate_model(str(out), str(features))["auc"]
    assert auc["fp32"] > 0.7, auc
    assert abs(auc["bf16"] - auc["fp32"]) < 0.01, auc
