"""What a run commits at the end of training: the model directory, written by every rank and committed by rank 0.

Every rank writes its store shard's rows as one sparse part into a shared staging directory; rank 0 gathers every
rank's counters into the run's `TrainSummary`, fits the companion (`trainer.companion.fit`), writes the dense
weights, their Adam state and model.json, and commits the directory once every part is there
(`storage.io.fsio.commit_dir`).  No rank returns before the commit: each node's launcher reads the committed
model.json.
"""

from __future__ import annotations

import logging
from contextlib import AbstractContextManager
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from storage.embedding.base import EmbeddingStore
from storage.features_manifest import read_features_manifest
from storage.io import fsio, version
from trainer import checkpoint, model_dir
from trainer.companion import file as companion_file
from trainer.companion.fit import fit_for_spec, why_none
from trainer.companion.model import Companion
from trainer.data import FeatureSchema
from trainer.distributed.context import DistContext
from trainer.launch.spec import TrainSpec
from trainer.launch.summary import TrainSummary
from trainer.model_dir import ModelMeta
from trainer.threads import core_count, torch_threads
from trainer.train import Trainer, TrainStats

log = logging.getLogger("trainer.main")  # the rank's log lines, as they were before this module was split out


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
    everyone = _gather(rank_counters(trainer, stats, store, sparse_rows), ctx)
    if ctx.rank == 0:
        summary = train_summary(spec, ctx, trainer, stats, everyone)
        write_dense(spec, trainer, summary, fs, staging, staging_url)
    ctx.barrier()  # every sparse part is written before the commit
    if ctx.rank == 0:
        manifest = {
            "run_tag": spec.run_tag,
            "vocab_date": spec.vocab_date,
            "world_size": ctx.world_size,
            "sparse_parts": ctx.world_size,
            "sparse_rows": sum(r["rows"] for r in everyone),
            "steps": stats.steps,
            "code_version": version.code_version(),
        }
        fsio.commit_dir(fs, staging, final, manifest)
        log.info("committed %s (%d steps, %d examples)", spec.output_url, stats.steps, summary.examples)
        if spec.checkpoint_url:  # the committed model supersedes the run's checkpoints
            checkpoint.remove_checkpoints(spec.checkpoint_url, so)
    # no rank exits before the commit: the launcher of every node reads the committed model.json
    ctx.barrier()


def rank_counters(trainer: Trainer, stats: TrainStats, store: EmbeddingStore, sparse_rows: int) -> dict[str, Any]:
    """What this rank counted, for rank 0's summary: its rows, traffic, totals and its store's and cache's stats."""
    return {
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
        "attention_forwards": stats.attention_forwards,
    }


def train_summary(
    spec: TrainSpec, ctx: DistContext, trainer: Trainer, stats: TrainStats, everyone: list[dict[str, Any]]
) -> TrainSummary:
    """The job's totals over every rank's counters (`rank_counters`, in rank order): model.json `train`."""
    examples = sum(r["examples"] for r in everyone)
    train_s = max(r["train_s"] for r in everyone)
    steps = stats.steps
    forwards = _summed([r["attention_forwards"] for r in everyone])
    return TrainSummary(
        steps=steps,
        epochs=trainer.optim.epochs,
        examples=examples,
        dropped_rows=stats.dropped_rows,
        sampled_out=stats.sampled_out,
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
        attention_kernel=attention_kernel(forwards),
        stats={
            "dense_sync_bytes": sum(r["dense_sync_bytes"] for r in everyone),
            "dense_sync_s": max(r["dense_sync_s"] for r in everyone),
            "dense_merges": trainer.opt.merges,
            "sparse_bytes": sum(r["sparse_bytes"] for r in everyone),
            "sparse_s": max(r["sparse_s"] for r in everyone),
            "sparse_rows": sum(r["rows"] for r in everyone),
            "sparse_bytes_per_step": sum(r["sparse_bytes"] for r in everyone) / max(1, steps),
            "staleness_bound": spec.het.staleness_bound,
            "stale_cache": [r["cache"] for r in everyone],
            **_sparse_comm_stats([r["sparse_comm"] for r in everyone], steps),
            "groups": [list(g) for g in ctx.topology.groups],
            "store_stats": [r["store"] for r in everyone],
            "attention_forwards": forwards,
        },
    )


def _summed(counts: list[dict[str, int]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in counts:
        for k, n in c.items():
            out[k] = out.get(k, 0) + n
    return out


def attention_kernel(forwards: dict[str, int]) -> str:
    """The kernels that ran the training forwards, most forwards first, joined by `+` (`none`: no attention)."""
    ran = sorted((k for k, n in forwards.items() if n), key=lambda k: -forwards[k])
    return "+".join(ran) or "none"


def write_dense(
    spec: TrainSpec, trainer: Trainer, summary: TrainSummary, fs: Any, staging: str, staging_url: str
) -> None:
    """Rank 0's files of the model directory: the companion (when the day gets one), the dense weights and their
    Adam state, and model.json last."""
    so = spec.storage_options
    schema = trainer.schema
    companion_record = None
    with _every_core():  # the node's other ranks wait at the commit's barrier: the fit may take their cores
        fitted = fit_companion(spec, schema)
    if fitted is not None:
        companion_file.save(fsio.join(staging_url, companion_file.FILE), fitted[0], so)
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
        config_sources=spec.config_sources,
        companion=companion_record,
        negative_sampling=trainer.optim.negative_sampling,
    )
    model_dir.write_tensors(fsio.join(staging_url, model_dir.DENSE), trainer.model.state_dict(), so)
    model_dir.write_tensors(fsio.join(staging_url, model_dir.DENSE_OPTIM), trainer.opt.state_tensors(), so)
    model_dir.write_meta(fs, staging, meta)


def fit_companion(spec: TrainSpec, schema: FeatureSchema) -> tuple[Companion, dict[str, Any]] | None:
    """The day's companion (`trainer.companion`) and its record, fit on its lineage's rows (the start model's
    record names them), or None when the day gets none (`trainer.companion.fit.why_none`)."""
    so = spec.storage_options
    fs, path = fsio.get_fs(spec.features_url, so)
    features = read_features_manifest(fs, path)
    if features is None:
        raise FileNotFoundError(f"{spec.features_url} is not committed: run the encode stage first")
    why = why_none(spec.model.companion, features)
    if why is not None:
        log.info("companion: none for this model: %s", why)
        return None
    parent = model_dir.read_meta(spec.init_model_url, so) if spec.init_model_url else None
    return fit_for_spec(
        spec.features_url,
        schema,
        spec.model.companion_rows,
        parent=parent.companion if parent else None,
        parent_features_url=parent.features_url if parent else None,
        storage_options=so,
        auto=spec.model.companion == "auto",
        blend_weight=spec.model.companion_blend_weight,
    )


def _every_core() -> AbstractContextManager[None]:
    """torch's threads raised to every core this rank may run on, then put back.

    A rank trains on one thread (`trainer.launch.torchrun.spec_env`); the companion's fit runs on rank 0 alone, and
    its sparse products run faster on more threads.  The products'
    sums are per row, in a fixed order, so the fit's weights do not depend on how many threads there were."""
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
