"""Rank entry point: `torchrun ... -m trainer.main --spec SPEC.json`.

Single node, 2 CPU ranks (what `trainer.launch.torchrun.run_training` runs)::

    python -m torch.distributed.run --standalone --nproc_per_node 2 -m trainer.main --spec spec.json

Two nodes x 8 GPUs (run on each node, node_rank 0 and 1)::

    python -m torch.distributed.run --nnodes 2 --node_rank 0 --rdzv_backend c10d \\
        --rdzv_endpoint host0:29400 --nproc_per_node 8 -m trainer.main --spec spec.json

`main()` owns the lifecycle: init the process groups, open and warm the store
shard, train, write the model directory (`trainer.commit.write_model`), and always close the store and
destroy the process groups.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import logging
import os
import sys
from typing import NoReturn

import torch

from storage.embedding.base import EmbeddingStore
from storage.io import fsio
from storage.io.layout import NodeLayout
from storage.warm import ensure_warm, load_working_set
from trainer.commit import write_model
from trainer.config import TrainerConfig
from trainer.distributed.context import DistContext, init_distributed
from trainer.launch.lifetime import exit_when_orphaned
from trainer.launch.spec import TrainSpec
from trainer.malloc import tune_malloc
from trainer.train import StepHook, Trainer

log = logging.getLogger("trainer.main")

HOOKS_ENV = "CTRPIPE_TRAINER_HOOKS"
"""Step hooks the ranks install (`trainer.train.StepHook`): comma-separated `module:factory` names, each
factory called with no arguments in every rank, returning a hook or None (none for this rank).  The ranks
inherit it from the launcher's environment; e.g. the crash tests' fault, `tests.helpers.faults:crash_at_step`."""


def _setup_logging() -> None:
    rank = os.environ.get("RANK", "0")
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stdout,
        force=True,
        format=f"[rank {rank}] %(asctime)s %(name)s %(levelname)s %(message)s",
    )


def report_environment(ctx: DistContext, cfg: TrainerConfig) -> None:
    """Log the topology, the two-phase groups and the NCCL settings this rank runs with.

    A world of one creates no process group: a run configured for NCCL then exercises nothing of
    NCCL, and says so (its model.json records backend `none`).
    """
    nccl = {k: v for k, v in sorted(os.environ.items()) if k.startswith(("NCCL_", "TORCH_NCCL_"))}
    log.info(
        "rank %d/%d local %d/%d backend %s device %s place %s",
        ctx.rank,
        ctx.world_size,
        ctx.local_rank,
        ctx.local_world_size,
        ctx.backend,
        ctx.device,
        ctx.places[ctx.rank],
    )
    if ctx.rank == 0:
        log.info("two-phase groups %s leaders %s", list(ctx.topology.groups), list(ctx.topology.leaders))
        log.info("NCCL env %s", nccl or "{}")
        if ctx.backend == "none" and cfg.backend == "nccl":
            log.info("one rank: no process group, so NCCL is not exercised (backend none)")
        if ctx.backend == "nccl":
            log.info(
                "NCCL version %s; NCCL_DEBUG=INFO lines of the ranks say which transport (NET/IB, GDR) it uses",
                ".".join(map(str, torch.cuda.nccl.version())),
            )
    affinity = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    log.info("cpu affinity %s (socket %d)", affinity, ctx.socket)


def open_store(spec: TrainSpec, ctx: DistContext) -> EmbeddingStore:
    """Open this rank's shard (`storage.embedding.tiered`), warmed for the spec's plan, with its working
    set loaded into the fast levels."""
    from storage.embedding.tiered import open_shard

    node = NodeLayout(spec.local_dir, spec.model_name)
    ensure_warm(spec.warm, node, rank=ctx.rank, store=spec.store, storage_options=spec.storage_options)
    shard_dir = node.shard(ctx.rank, ctx.world_size)
    store = open_shard(
        shard_dir, spec.store, optimizer=spec.optim.sparse_optimizer, device=ctx.device, seed=spec.optim.seed
    )
    if loaded := load_working_set(store, shard_dir):
        log.info("warmed %d working-set rows of %s", loaded, shard_dir)
    return store


def step_hooks(names: str | None = None) -> list[StepHook]:
    """The hooks `names` (default: `$CTRPIPE_TRAINER_HOOKS`) asks for, in its order (see `HOOKS_ENV`).

    Raises:
        ValueError: a name that is not `module:factory`.
        ImportError, AttributeError: its module or factory does not exist.
    """
    names = os.environ.get(HOOKS_ENV, "") if names is None else names
    hooks: list[StepHook] = []
    for name in filter(None, (n.strip() for n in names.split(","))):
        module, _, attr = name.partition(":")
        if not module or not attr:
            raise ValueError(f"{HOOKS_ENV}: {name!r} is not module:factory")
        hook = getattr(importlib.import_module(module), attr)()
        if hook is not None:
            log.info("step hook %s", name)
            hooks.append(hook)
    return hooks


def run(spec: TrainSpec) -> None:
    """Train one rank of `spec` inside an initialised torchrun environment."""
    so = spec.storage_options  # committed directories -> their files (an object store's data prefix)
    carried = spec.carried and dataclasses.replace(
        spec.carried, features_url=fsio.data_url(spec.carried.features_url, so)
    )
    spec = dataclasses.replace(
        spec,
        features_url=fsio.data_url(spec.features_url, so),
        init_model_url=spec.init_model_url and fsio.data_url(spec.init_model_url, so),
        carried=carried,
    )
    ctx = init_distributed(spec.trainer)
    store: EmbeddingStore | None = None
    try:
        report_environment(ctx, spec.trainer)
        store = open_store(spec, ctx)
        trainer = Trainer(spec, ctx=ctx, store=store, step_hooks=step_hooks())
        stats = trainer.train()
        write_model(spec, ctx, store, trainer, stats)
    finally:
        if store is not None:
            store.close()
        ctx.destroy()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer.main", description=__doc__.splitlines()[0])
    parser.add_argument("--spec", required=True, help="train spec JSON written by trainer.launch.torchrun")
    args = parser.parse_args(argv)
    _setup_logging()
    exit_when_orphaned()  # a torchrun agent SIGKILLed with its launcher must not leave this rank training
    torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
    spec = TrainSpec.read(args.spec)
    log.info("malloc settings (mallopt param, bytes): %s", tune_malloc() or "glibc defaults")
    run(spec)
    return 0


def exit_now(code: int) -> NoReturn:
    """End the rank with `code` once its output is flushed, skipping the interpreter's teardown.

    Everything the rank owes is done when `main` returns: the model is committed, the store closed, the
    process groups destroyed, and no thread holds work (the reader and I/O threads end with the store).
    What is left is Python freeing torch's (and, since the optimizer's first step, torch._dynamo's)
    modules one object at a time: one to three seconds of every day's train stage, for nothing.  A rank
    that raises exits the ordinary way (`sys.exit`, its traceback printed)."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_now(main())
