"""Start one process per rank on CPU (gloo) and fail unless every rank exits 0.

`fn(rank, world_size, *args)` must be a module-level function (the fork server's
child unpickles it by name).  Each rank gets the torchrun environment `init_distributed`
reads; `local_size` emulates several nodes on one machine through
`TrainerConfig.intra_group_size`, which the rank function passes itself.  The rest of a rank's environment is
the fork server's, as this process's was when its first ranks started: what a test varies goes in `args`, not in
os.environ.
"""

from __future__ import annotations

import multiprocessing as mp
import os
from collections.abc import Callable
from typing import Any

import torch


def _entry(fn: Callable[..., None], rank: int, world_size: int, port: int, args: tuple[Any, ...]) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world_size),
        OMP_NUM_THREADS="1",
    )
    torch.set_num_threads(1)
    # what torch.use_deterministic_algorithms(True) sets for eager ops; that function also imports torch._inductor to
    # set the compiler's flag, a second of every spawned rank, and these ranks compile nothing
    torch._C._set_deterministic_algorithms(True)
    assert torch.are_deterministic_algorithms_enabled()
    fn(rank, world_size, *args)


_CONTEXT = mp.get_context("forkserver")
# The fork server imports torch once; each rank is a fork of it, not a fresh interpreter importing torch again
# (a second or more of every rank).  It imports nothing else and runs no torch op before it forks: no thread
# pool (OpenMP's, gloo's) exists in it to be cut in half by the fork.
_CONTEXT.set_forkserver_preload(["torch", "torch.distributed"])


def run_ranks(fn: Callable[..., None], world_size: int, port: int, *args: Any, timeout_s: float = 120) -> None:
    """Run `fn` on `world_size` ranks forked from a fork server; raise AssertionError naming the ranks that failed or
    hung."""
    ctx = _CONTEXT
    procs = [ctx.Process(target=_entry, args=(fn, r, world_size, port, args), daemon=True) for r in range(world_size)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout_s)
    hung = [r for r, p in enumerate(procs) if p.is_alive()]
    for r in hung:
        procs[r].kill()
        procs[r].join()
    codes = {r: p.exitcode for r, p in enumerate(procs)}
    assert not hung, f"ranks {hung} did not finish in {timeout_s}s; exit codes {codes}"
    assert all(c == 0 for c in codes.values()), f"rank exit codes {codes}"


def cpu_trainer_config(**overrides: Any):  # -> TrainerConfig
    from trainer.config import TrainerConfig

    return TrainerConfig(backend="gloo", device="cpu", timeout_s=120, **overrides)
