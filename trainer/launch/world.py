"""How many ranks a node runs, checked against its GPUs before anything starts.

NCCL needs one GPU per rank: two ranks mapped to the same device (`cuda:{local_rank % count}`) fail
at init with "Duplicate GPU detected", after torchrun has started every process.  So the launcher
and each rank check `trainer.nproc_per_node` against the visible GPUs first, and
`nproc_per_node: auto` means one rank per visible GPU on a CUDA node (one rank on CPU).

`resolve_world` is called where a run's world is fixed: the flow's warm and train stages (the
world is part of the run identity and of the shard layout) and `trainer.launch.torchrun.run_training`.
"""

from __future__ import annotations

import torch

from trainer.config import ResolvedTrainer, TrainerConfig


def visible_gpus() -> int:
    """CUDA devices this process sees (0 without CUDA); does not create a CUDA context."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def uses_cuda(cfg: TrainerConfig, gpus: int) -> bool:
    """Whether the ranks of `cfg` compute on CUDA on a node with `gpus` visible GPUs."""
    return cfg.device == "cuda" or (cfg.device == "auto" and gpus > 0)


def uses_nccl(cfg: TrainerConfig, gpus: int) -> bool:
    """Whether the ranks of `cfg` communicate with NCCL (`backend=auto` picks it on CUDA)."""
    return cfg.backend == "nccl" or (cfg.backend == "auto" and uses_cuda(cfg, gpus))


def check_ranks_fit_gpus(cfg: TrainerConfig, nproc: int, gpus: int) -> None:
    """Refuse more NCCL ranks on a node than it has GPUs.

    Raises:
        ValueError: naming both numbers and the ways out.
    """
    if uses_nccl(cfg, gpus) and nproc > gpus:
        fix = f"set trainer.nproc_per_node to at most {gpus} (or auto), or" if gpus else "set"
        raise ValueError(
            f"trainer.nproc_per_node={nproc} ranks on a node with {gpus} visible GPU(s) and backend "
            f"{cfg.backend!r} (NCCL): NCCL needs one GPU per rank (it fails with 'Duplicate GPU detected'); "
            f"{fix} trainer.backend=gloo"
        )


def resolve_world(cfg: TrainerConfig, *, gpus: int | None = None) -> ResolvedTrainer:
    """`cfg` with `nproc_per_node` a number (the resolved type; `cfg` itself when it is one): `auto` is one rank
    per visible GPU on CUDA, else one.

    Args:
        cfg: the trainer section.
        gpus: visible GPUs (default: this process's `visible_gpus()`).

    Raises:
        ValueError: more NCCL ranks than GPUs (`check_ranks_fit_gpus`).
    """
    gpus = visible_gpus() if gpus is None else gpus
    nproc = cfg.nproc_per_node
    if nproc == "auto":
        nproc = max(1, gpus) if uses_cuda(cfg, gpus) else 1
    check_ranks_fit_gpus(cfg, int(nproc), gpus)
    if isinstance(cfg, ResolvedTrainer) and nproc == cfg.nproc_per_node:
        return cfg
    return cfg.with_nproc(int(nproc))
