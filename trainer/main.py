"""Rank entry point: `torchrun ... -m trainer.main --spec SPEC.json`.

Single node, 2 CPU ranks (what `trainer.launch.run_training` runs)::

    python -m torch.distributed.run --standalone --nproc_per_node 2 -m trainer.main --spec spec.json

Two nodes x 8 GPUs (run on each node, node_rank 0 and 1)::

    python -m torch.distributed.run --nnodes 2 --node_rank 0 --rdzv_backend c10d \\
        --rdzv_endpoint host0:29400 --nproc_per_node 8 -m trainer.main --spec spec.json

`main()` owns the lifecycle: init the process groups, open and warm the store
shard, train, write the model directory, and always close the store and
destroy the process groups.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import logging
import os
import sys
from contextlib import AbstractContextManager
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from storage.embedding.base import EmbeddingStore
from storage.features_manifest import read_features_manifest
from storage.io import fsio, version
from storage.io.layout import NodeLayout
from storage.warm import ensure_warm, load_working_set
from trainer import checkpoint, companion, model_dir
from trainer.config import TrainerConfig
from trainer.data import FeatureSchema
from trainer.distributed.context import DistContext, init_distributed
from trainer.lifetime import exit_when_orphaned
from trainer.malloc import tune_malloc
from trainer.model_dir import ModelMeta
from trainer.spec import TrainSpec
from trainer.summary import TrainSummary
from trainer.threads import core_count, torch_threads
from trainer.train import StepHook, Trainer, TrainStats

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
    store = open_shard(shard_dir, spec.store, optimizer=spec.optim.sparse_optimizer, device=ctx.device)
    if loaded := load_working_set(store, shard_dir):
        log.info("warmed %d working-set rows of %s", loaded, shard_dir)
    return store


def _gather(obj: Any, ctx: DistContext) -> list[Any]:
    if ctx.world_size == 1:
        return [obj]
    out: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(out, obj)
    return out


def _broadcast(obj: Any, ctx: DistContext) -> Any:
    if ctx.world_size == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def write_model(spec: TrainSpec, ctx: DistContext, store: EmbeddingStore, trainer: Trainer, stats: TrainStats) -> None:
    """Every rank writes its sparse part into a shared staging dir; rank 0 writes the dense files and commits."""
    so = spec.storage_options
    fs, final = fsio.get_fs(spec.output_url, so)
    staging = None
    if ctx.rank == 0:
        fsio.remove_stale_staging(fs, final)
        staging = fsio.staging_dir(fs, final)
        fs.makedirs(fsio.join(staging, model_dir.SPARSE), exist_ok=True)
    staging = _broadcast(staging, ctx)
    staging_url = fs.unstrip_protocol(staging) if "://" in spec.output_url else staging

    store.flush()
    store.set_tag(spec.run_tag)
    part = fsio.join(staging_url, model_dir.SPARSE, model_dir.sparse_part_name(ctx.rank))
    sparse_rows = store.snapshot(part, storage_options=so)

    mine = {
        "rows": sparse_rows,
        "sparse_bytes": trainer.sparse.sparse_bytes,
        "sparse_s": trainer.sparse.seconds,
        "dense_sync_bytes": trainer.opt.sync_bytes,
        "dense_sync_s": trainer.opt.sync_seconds,
        "examples": stats.examples,
        "loss_sum": stats.loss_sum,
        "final_loss": stats.final_loss,
        "train_s": stats.train_s,
        "store": store.stats(),
        "cache": trainer.sparse.cache.stats() if trainer.sparse.cache is not None else None,
        "sparse_comm": trainer.sparse.comm_stats(),
    }
    everyone = _gather(mine, ctx)
    if ctx.rank == 0:
        examples = sum(r["examples"] for r in everyone)
        train_s = max(r["train_s"] for r in everyone)
        steps = stats.steps
        sparse_rows = sum(r["rows"] for r in everyone)
        summary = TrainSummary(
            steps=steps,
            epochs=spec.optim.epochs,
            examples=examples,
            dropped_rows=stats.dropped_rows,
            carried={"date": spec.carried.date, "rows": spec.carried.rows} if spec.carried else None,
            final_loss=float(np.mean([r["final_loss"] for r in everyone])),
            mean_loss=sum(r["loss_sum"] for r in everyone) / max(1, steps * ctx.world_size),
            train_s=train_s,
            examples_per_s=examples / train_s if train_s > 0 else 0.0,
            world_size=ctx.world_size,
            backend=ctx.backend,
            device=str(ctx.device),
            resumed_from_step=stats.resumed_from,
            prefetch_depth=stats.prefetch_depth,
            stats={
                "dense_sync_bytes": sum(r["dense_sync_bytes"] for r in everyone),
                "dense_sync_s": max(r["dense_sync_s"] for r in everyone),
                "dense_merges": trainer.opt.merges,
                "sparse_bytes": sum(r["sparse_bytes"] for r in everyone),
                "sparse_s": max(r["sparse_s"] for r in everyone),
                "sparse_rows": sparse_rows,
                "sparse_bytes_per_step": sum(r["sparse_bytes"] for r in everyone) / max(1, steps),
                "staleness_bound": spec.het.staleness_bound,
                "stale_cache": [r["cache"] for r in everyone],
                **_sparse_comm_stats([r["sparse_comm"] for r in everyone], steps),
                "groups": [list(g) for g in ctx.topology.groups],
                "store_stats": [r["store"] for r in everyone],
            },
        )
        schema = trainer.schema
        companion_record = None
        with _every_core():  # the node's other ranks wait at the barrier below: the fit may take their cores
            fitted = fit_companion(spec, schema)
        if fitted is not None:
            companion.save(fsio.join(staging_url, companion.FILE), fitted[0], so)
            companion_record = fitted[1]
        meta = ModelMeta.of(
            model_name=spec.model_name,
            model_config=spec.model,
            dim=spec.store.embedding_dim,
            init_std=spec.store.init_std,
            num_dense=schema.num_dense,
            num_fields=schema.num_fields,
            fields=schema.fields,
            dense_columns=schema.dense_columns,
            key_columns=schema.key_columns,
            bag_columns=schema.bag_columns,
            vocab_date=spec.vocab_date,
            run_tag=spec.run_tag,
            features_url=spec.features_url,
            init_model_url=spec.init_model_url,
            optim=spec.optim,
            het=spec.het,
            trainer=spec.trainer,
            train=summary.to_dict(),
            recipe=spec.recipe,
            companion=companion_record,
        )
        model_dir.write_tensors(fsio.join(staging_url, model_dir.DENSE), trainer.model.state_dict(), so)
        model_dir.write_tensors(fsio.join(staging_url, model_dir.DENSE_OPTIM), trainer.opt.state_tensors(), so)
        model_dir.write_meta(fs, staging, meta)
    ctx.barrier()  # every sparse part is written before the commit
    if ctx.rank == 0:
        manifest = {
            "run_tag": spec.run_tag,
            "vocab_date": spec.vocab_date,
            "world_size": ctx.world_size,
            "sparse_parts": ctx.world_size,
            "sparse_rows": sparse_rows,
            "steps": stats.steps,
            "code_version": version.code_version(),
        }
        fsio.commit_dir(fs, staging, final, manifest)
        log.info("committed %s (%d steps, %d examples)", spec.output_url, stats.steps, summary.examples)
        if spec.checkpoint_url:  # the committed model supersedes the run's checkpoints
            checkpoint.remove_checkpoints(spec.checkpoint_url, so)
    # no rank exits before the commit: the launcher of every node reads the committed model.json
    ctx.barrier()


def fit_companion(spec: TrainSpec, schema: FeatureSchema) -> tuple[companion.Companion, dict[str, Any]] | None:
    """The day's companion (`trainer.companion`) and its record, fit on its lineage's rows (the start model's
    record names them), or None when the day gets none (`companion.why_none`)."""
    so = spec.storage_options
    fs, path = fsio.get_fs(spec.features_url, so)
    features = read_features_manifest(fs, path)
    if features is None:
        raise FileNotFoundError(f"{spec.features_url} is not committed: run the encode stage first")
    why = companion.why_none(spec.model.companion, features)
    if why is not None:
        log.info("companion: none for this model: %s", why)
        return None
    parent = model_dir.read_meta(spec.init_model_url, so) if spec.init_model_url else None
    return companion.fit_for_spec(
        spec.features_url,
        schema,
        spec.model.companion_rows,
        parent=parent.companion if parent else None,
        parent_features_url=parent.features_url if parent else None,
        storage_options=so,
        auto=spec.model.companion == "auto",
    )


def _every_core() -> AbstractContextManager[None]:
    """torch's threads raised to every core this rank may run on, then put back.

    A rank trains on one thread (`trainer.launch.spec_env`); the companion's fit runs on rank 0 alone, and its
    sparse products take more threads (1.3-1.6x less time on two cores: docs/benchmarks.md).  The products' sums
    are per row, in a fixed order, so the fit's weights do not depend on how many threads there were."""
    return torch_threads(max(torch.get_num_threads(), core_count()))


def _sparse_comm_stats(ranks: list[dict[str, Any]], steps: int) -> dict[str, Any]:
    """Sparse bytes per step by kind, what the synchronous path would have moved, and the HET cache hit rate."""
    per = 1 / max(1, steps)
    kinds = {k: sum(r["bytes_by_kind"][k] for r in ranks) * per for k in ranks[0]["bytes_by_kind"]}
    caches = [r["cache"] for r in ranks if r["cache"] is not None]
    looked = sum(c["hits"] + c["misses"] for c in caches)
    return {
        "sparse_bytes_per_step_by_kind": kinds,
        "sparse_bytes_per_step_uncached": sum(r["uncached_bytes"] for r in ranks) * per,
        "stale_cache_hit_rate": sum(c["hits"] for c in caches) / looked if looked else 0.0,
    }


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
    parser.add_argument("--spec", required=True, help="train spec JSON written by trainer.launch")
    args = parser.parse_args(argv)
    _setup_logging()
    exit_when_orphaned()  # a torchrun agent SIGKILLed with its launcher must not leave this rank training
    torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
    spec = TrainSpec.read(args.spec)
    log.info("malloc settings (mallopt param, bytes): %s", tune_malloc() or "glibc defaults")
    run(spec)
    return 0


if __name__ == "__main__":
    sys.exit(main())
