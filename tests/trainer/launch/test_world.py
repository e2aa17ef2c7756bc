"""trainer.launch.world: `nproc_per_node: auto` is one rank per visible GPU, and NCCL never gets more ranks than
GPUs."""

from __future__ import annotations

import pytest

from trainer.config import TrainerConfig
from trainer.launch.world import resolve_world


@pytest.mark.parametrize(
    ("device", "backend", "gpus", "want"),
    [
        ("auto", "auto", 8, 8),  # a CUDA node: one rank per GPU
        ("cuda", "nccl", 2, 2),
        ("auto", "auto", 0, 1),  # CPU: one rank
        ("cpu", "auto", 8, 1),  # CPU asked for on a GPU node
    ],
)
def test_auto_is_one_rank_per_visible_gpu_on_cuda_and_one_on_cpu(
    device: str, backend: str, gpus: int, want: int
) -> None:
    cfg = resolve_world(TrainerConfig(device=device, backend=backend), gpus=gpus)
    assert cfg.nproc_per_node == want and cfg.world_size == want


def test_more_nccl_ranks_than_gpus_is_refused_naming_both_numbers() -> None:
    for cfg in (TrainerConfig(nproc_per_node=2, backend="nccl", device="cuda"), TrainerConfig(nproc_per_node=3)):
        with pytest.raises(ValueError, match=r"nproc_per_node=\d ranks on a node with 1 visible GPU.*backend=gloo"):
            resolve_world(cfg, gpus=1)


def test_gloo_ranks_may_share_a_gpu_and_explicit_counts_are_kept() -> None:
    shared = TrainerConfig(nproc_per_node=2, backend="gloo", device="cuda")
    resolved = resolve_world(shared, gpus=1)
    assert resolved.nproc_per_node == 2 and resolve_world(resolved, gpus=1) is resolved
    cpu = TrainerConfig(nproc_per_node=4, device="cpu")
    assert resolve_world(cpu, gpus=0).world_size == 4


def test_an_unresolved_world_has_no_size() -> None:
    with pytest.raises(ValueError, match="resolve_world"):
        _ = TrainerConfig().world_size
    assert TrainerConfig(nproc_per_node="2", nnodes=2, node_rank=0, rdzv_endpoint="h:1").world_size == 4
