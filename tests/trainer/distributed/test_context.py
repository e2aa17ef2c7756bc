"""The process context: a world of one needs no process group; the backend follows the device."""

from __future__ import annotations

import pytest
import torch

from tests.helpers.ranks import cpu_trainer_config
from trainer.config import TrainerConfig
from trainer.distributed.context import init_distributed, pick_backend_and_device


def test_a_world_of_one_has_no_process_group_and_one_group_of_itself() -> None:
    ctx = init_distributed(cpu_trainer_config())
    assert ctx.world_size == 1 and ctx.rank == 0 and ctx.backend == "none"
    assert ctx.intra_group is None and ctx.leader_group is None and not ctx.initialized_pg
    assert ctx.topology.groups == ((0,),) and ctx.leader == 0
    assert ctx.device == ctx.comm_device == torch.device("cpu")
    ctx.barrier()  # no-ops with one rank
    ctx.destroy()


def test_cpu_means_gloo_and_cuda_or_nccl_without_cuda_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    assert pick_backend_and_device(TrainerConfig(device="cpu"), 0) == ("gloo", torch.device("cpu"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert pick_backend_and_device(TrainerConfig(), 0) == ("gloo", torch.device("cpu"))
    with pytest.raises(ValueError, match="trainer.device='cuda' but CUDA is not available"):
        pick_backend_and_device(TrainerConfig(device="cuda"), 0)
    with pytest.raises(ValueError, match="trainer.backend='nccl' needs CUDA"):
        pick_backend_and_device(TrainerConfig(backend="nccl"), 0)


def test_a_rank_refuses_more_nccl_ranks_on_its_node_than_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a job started outside trainer.launch.torchrun (Slurm, Kubernetes) meets before NCCL's own error."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ValueError, match="nproc_per_node=2 ranks on a node with 1 visible GPU"):
        pick_backend_and_device(TrainerConfig(backend="nccl", device="cuda"), 1, 2)
    backend, device = pick_backend_and_device(TrainerConfig(backend="gloo", device="cuda"), 1, 2)
    assert (backend, str(device)) == ("gloo", "cuda:0"), "gloo ranks may share a GPU"
