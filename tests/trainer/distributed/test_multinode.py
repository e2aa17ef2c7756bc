"""Two torchrun "nodes" on this machine (c10d rendezvous) train the same model as one node with 4 ranks."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from safetensors.torch import load_file

from storage.embedding.config import StoreConfig
from tests.helpers.criteo import write_criteo_features
from tests.helpers.specs import make_spec
from trainer.launch import TrainResult, run_training
from trainer.models.config import ModelConfig

pytestmark = [pytest.mark.slow, pytest.mark.distributed]

STORE = StoreConfig(embedding_dim=8, init_std=0.01, host_budget_mb=16)
MODEL = ModelConfig(num_heads=2, attention_layers=1, mlp_dims=(16,))


def _train(tmp: Path, features: Path, out: Path, tag: str, **kw) -> TrainResult:
    spec = make_spec(
        features, out, tmp / "local" / tag, store=STORE, model=MODEL, run_tag=tag, backend="gloo", device="cpu",
        k_steps=4, batch_size=250, epochs=1, lr=1e-2, sparse_lr=5e-2, timeout_s=240, log_every=5,
        intra_group_size=2, checkpoint_every=0, **kw,
    )
    return run_training(spec, work_dir=str(tmp / "work"))


def _sparse(model_dir: Path) -> tuple[np.ndarray, np.ndarray]:
    table = pq.read_table(sorted((model_dir / "sparse").iterdir()))
    keys = table.column("key").to_numpy()
    emb = np.stack(table.column("emb").to_numpy(zero_copy_only=False))
    order = np.argsort(keys)
    return keys[order], emb[order]


def test_two_nodes_of_two_equal_one_node_of_four(tmp_path: Path, shared_data: Path, free_port: int) -> None:
    features = write_criteo_features(shared_data / "criteo" / "train_head_10k.tsv", tmp_path / "features")
    single = _train(tmp_path, features, tmp_path / "single" / "model", "single", nproc_per_node=4)

    out = tmp_path / "multi" / "model"
    results: dict[int, TrainResult | BaseException] = {}

    def node(rank: int) -> None:
        try:
            results[rank] = _train(
                tmp_path, features, out, "multi", nproc_per_node=2, nnodes=2, node_rank=rank,
                rdzv_endpoint=f"127.0.0.1:{free_port}",
            )
        except BaseException as exc:  # re-raised below
            results[rank] = exc

    threads = [threading.Thread(target=node, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    for r in (0, 1):
        if isinstance(results.get(r), BaseException):
            raise results[r]  # type: ignore[misc]
    multi = results[0]
    assert isinstance(multi, TrainResult) and isinstance(results[1], TrainResult)
    assert results[1].model_url == multi.model_url  # node 1 returns once node 0 committed
    # 9000 train rows / 4 ranks, batch 250 -> 9 steps; the same groups (2 "nodes" x 2) in both runs
    assert multi.world_size == single.world_size == 4 and multi.steps == single.steps == 9
    assert multi.stats["groups"] == single.stats["groups"] == [[0, 1], [2, 3]]
    assert multi.stats["dense_merges"] == single.stats["dense_merges"] == 3  # steps 4, 8 and the final merge

    d_single, d_multi = load_file(Path(single.model_url) / "dense.safetensors"), load_file(out / "dense.safetensors")
    assert d_single.keys() == d_multi.keys()
    for name in d_single:
        torch.testing.assert_close(d_multi[name], d_single[name], rtol=1e-5, atol=1e-6)
    k_single, e_single = _sparse(Path(single.model_url))
    k_multi, e_multi = _sparse(out)
    np.testing.assert_array_equal(k_multi, k_single)
    np.testing.assert_allclose(e_multi, e_single, rtol=1e-5, atol=1e-6)
    assert abs(multi.final_loss - single.final_loss) < 1e-5 and multi.final_loss < 0.7
