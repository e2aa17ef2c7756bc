"""The process context of a rank: who it is, where it computes, and its two-phase process groups.

`init_distributed` builds every process group once and returns them in a
`DistContext` that callers pass down explicitly (no module globals).  With a
world of one no process group exists and every collective of this package
becomes a no-op.
"""

from __future__ import annotations

import datetime as _dt
import os
import socket as _socket
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from trainer.config import TrainerConfig
from trainer.distributed.topology import (
    RankPlace,
    TwoPhaseGroups,
    detect_socket,
    emulated_places,
    two_phase_groups,
)
from trainer.launch.world import check_ranks_fit_gpus


@dataclass
class DistContext:
    """Everything a rank knows about the job's processes; built once by `init_distributed`.

    Attributes:
        rank, world_size, local_rank, local_world_size: from the torchrun environment.
        backend: `nccl` or `gloo` (`none` when the world has one rank and no process group).
        device: where the model computes (`cuda:<local_rank>` or `cpu`).
        comm_device: where tensors must be for collectives (the device for NCCL, CPU for gloo).
        places: the (node, socket) of every rank.
        topology: the two-phase groups computed from `places`.
        intra_group: this rank's phase-1 process group (None when the group has one rank).
        leader_group: the phase-2 group of the leaders (None on non-leaders or with one group).
    """

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    backend: str
    device: torch.device
    comm_device: torch.device
    places: list[RankPlace]
    topology: TwoPhaseGroups
    intra_group: dist.ProcessGroup | None = None
    leader_group: dist.ProcessGroup | None = None
    initialized_pg: bool = field(default=False, repr=False)

    @property
    def leader(self) -> int:
        return self.topology.leader(self.rank)

    @property
    def socket(self) -> int:
        return self.places[self.rank].socket

    def barrier(self) -> None:
        if self.world_size > 1:
            dist.barrier()

    def destroy(self) -> None:
        """Destroy the process groups this context created (idempotent)."""
        if self.initialized_pg and dist.is_initialized():
            dist.destroy_process_group()
        self.initialized_pg = False
        self.intra_group = self.leader_group = None


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return default if value is None or value == "" else int(value)


def pick_backend_and_device(cfg: TrainerConfig, local_rank: int, local_world_size: int = 1) -> tuple[str, torch.device]:
    """NCCL + `cuda:<local_rank>` when CUDA is available and allowed by the config, else gloo + CPU.

    Ranks share a GPU (`local_rank % device_count`) only with gloo: NCCL refuses two ranks on one
    device at init, so more NCCL ranks on the node than GPUs is refused here, naming both numbers
    (the ranks of a job started without `trainer.launch.torchrun`, e.g. by infra/slurm, meet it first).

    Raises:
        ValueError: the config asks for CUDA or NCCL on a machine without CUDA, or for more NCCL
            ranks on this node than it has GPUs.
    """
    cuda = torch.cuda.is_available()
    if cuda and local_world_size > 1:
        check_ranks_fit_gpus(cfg, local_world_size, torch.cuda.device_count())
    if cfg.device == "cuda" and not cuda:
        raise ValueError("trainer.device='cuda' but CUDA is not available; use device='auto' or 'cpu'")
    if cfg.backend == "nccl" and (not cuda or cfg.device == "cpu" or not dist.is_nccl_available()):
        raise ValueError("trainer.backend='nccl' needs CUDA and an NCCL build of torch; use backend='auto' or 'gloo'")
    use_cuda = cuda and cfg.device != "cpu"
    device = torch.device(f"cuda:{local_rank % torch.cuda.device_count()}") if use_cuda else torch.device("cpu")
    backend = ("nccl" if use_cuda and dist.is_nccl_available() else "gloo") if cfg.backend == "auto" else cfg.backend
    return backend, device


def init_distributed(cfg: TrainerConfig, *, timeout_s: float | None = None) -> DistContext:
    """Join the job described by the torchrun environment and build the two-phase groups.

    Reads RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE (and MASTER_ADDR/PORT
    through `env://`).  Without WORLD_SIZE, or with a world of one, no process
    group is created and every collective becomes a no-op.

    Args:
        cfg: backend/device choice and `intra_group_size` (0 = detect node + socket).
        timeout_s: collective timeout; defaults to `cfg.timeout_s`.

    Returns:
        The context holding rank info, devices and the process groups.
    """
    rank = _env_int("RANK", 0)
    world = _env_int("WORLD_SIZE", 1)
    local_rank = _env_int("LOCAL_RANK", 0)
    local_world = _env_int("LOCAL_WORLD_SIZE", 1)
    backend, device = pick_backend_and_device(cfg, local_rank, local_world)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    comm_device = device if backend == "nccl" else torch.device("cpu")
    me = RankPlace(node=_socket.gethostname(), socket=detect_socket(device.type, device.index))

    if world == 1:
        places = emulated_places(1, 1) if cfg.intra_group_size else [me]
        return DistContext(
            rank=0,
            world_size=1,
            local_rank=local_rank,
            local_world_size=local_world,
            backend="none",
            device=device,
            comm_device=comm_device,
            places=places,
            topology=two_phase_groups(places),
        )

    timeout = _dt.timedelta(seconds=timeout_s if timeout_s is not None else cfg.timeout_s)
    _init_process_group(backend, device, rank=rank, world=world, timeout=timeout)
    ctx = DistContext(
        rank=rank,
        world_size=world,
        local_rank=local_rank,
        local_world_size=local_world,
        backend=backend,
        device=device,
        comm_device=comm_device,
        places=[],
        topology=two_phase_groups([me]),
        initialized_pg=True,
    )
    try:
        _build_groups(ctx, me, intra_group_size=cfg.intra_group_size)
    except BaseException:
        ctx.destroy()
        raise
    return ctx


def _init_process_group(backend: str, device: torch.device, *, rank: int, world: int, timeout: _dt.timedelta) -> None:
    """The default process group, through torchrun's store under a prefix of this restart attempt.

    torchrun keeps its store across worker restarts (trainer.max_restarts): without a per-attempt prefix
    a restarted rank can read a dead rank's address left by the previous attempt and fail to connect.
    """
    kwargs: dict[str, Any] = {"device_id": device} if backend == "nccl" else {}
    store, _, _ = next(dist.rendezvous("env://", rank, world, timeout=timeout))
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    store = dist.PrefixStore(f"ctrpipe/attempt-{attempt}", store)
    dist.init_process_group(backend=backend, store=store, rank=rank, world_size=world, timeout=timeout, **kwargs)


def _build_groups(ctx: DistContext, me: RankPlace, *, intra_group_size: int) -> None:
    """Every rank's place (gathered, or emulated with `intra_group_size` > 0) and the two-phase groups, into `ctx`.

    A collective: every rank calls `new_group` for every group, in the same order.
    """
    world, rank = ctx.world_size, ctx.rank
    if intra_group_size:
        places = emulated_places(world, intra_group_size)
    else:
        gathered: list[RankPlace | None] = [None] * world
        dist.all_gather_object(gathered, me)
        places = [p for p in gathered if p is not None]
    topo = two_phase_groups(places)
    ctx.places, ctx.topology = places, topo
    for g in topo.groups:
        if len(g) > 1:
            pg = dist.new_group(list(g))
            if rank in g:
                ctx.intra_group = pg
    if len(topo.leaders) > 1:
        pg = dist.new_group(list(topo.leaders))
        if rank in topo.leaders:
            ctx.leader_group = pg
