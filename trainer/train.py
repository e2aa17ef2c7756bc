"""The training loop of one rank: batches -> pull rows -> model -> push row grads -> local Adam -> k-step merge."""

from __future__ import annotations

import itertools
import logging
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from storage.base import EmbeddingStore
from trainer import checkpoint
from trainer.comm import DistContext, ShardedEmbedding, broadcast_tensors
from trainer.data import Batch, Prefetcher, RankReader, read_schema, split_dir
from trainer.kstep_adam import KStepAdam
from trainer.model import CTRModel
from trainer.spec import TrainSpec
from trainer.topology import bind_io_threads

log = logging.getLogger(__name__)


class NonFiniteLossError(FloatingPointError):
    """The loss of a step was NaN or infinite; nothing of that step was applied."""


def train_step(
    model: CTRModel, sparse: ShardedEmbedding, opt: KStepAdam, batch: Batch, *, step: int
) -> torch.Tensor:
    """One synchronous step on this rank's batch; returns the batch's mean loss (detached).

    The pushed row gradients are those of the GLOBAL mean loss: every rank's
    batch has the same size, so d(global mean)/d row = sum over ranks of
    d(local mean)/d row / world.

    Raises:
        NonFiniteLossError: the loss is NaN/Inf (checked before any update is applied).
    """
    dev = sparse.ctx.device
    B, Fn = batch.keys.shape
    keys = batch.keys.reshape(-1)  # (B*F,)
    rows = sparse.pull(keys).view(B, Fn, sparse.dim).requires_grad_(True)  # (B, F, D) leaf
    logits = model(batch.dense.to(dev), rows)  # (B,)
    loss = F.binary_cross_entropy_with_logits(logits, batch.labels.to(dev))
    if not math.isfinite(loss.item()):
        raise NonFiniteLossError(f"non-finite loss {loss.item()} at step {step} on rank {sparse.ctx.rank}")
    opt.zero_grad()
    loss.backward()
    if rows.grad is None:  # cannot happen for a leaf that requires grad; guards refactors
        raise RuntimeError("embedding rows received no gradient")
    sparse.push(keys, rows.grad.reshape(B * Fn, sparse.dim) / sparse.ctx.world_size)
    opt.step()
    return loss.detach()


@dataclass
class TrainStats:
    steps: int = 0
    examples: int = 0
    """Examples of this rank."""
    loss_sum: float = 0.0
    final_loss: float = float("nan")
    train_s: float = 0.0
    dropped_rows: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


class Trainer:
    """Builds the model, optimizer, sharded embedding and reader of one rank, and runs the epochs.

    Args:
        spec: the run.
        ctx: the distributed context.
        store: this rank's embedding-store shard (already warmed).
    """

    def __init__(self, spec: TrainSpec, *, ctx: DistContext, store: EmbeddingStore) -> None:
        cfg = spec.trainer
        if cfg.staleness_bound:
            raise ValueError(
                f"trainer.staleness_bound={cfg.staleness_bound} (HET bounded staleness) is not implemented; use 0"
            )
        if store.dim != spec.store.embedding_dim:
            raise ValueError(f"store dim {store.dim} != store.embedding_dim {spec.store.embedding_dim}")
        self.spec, self.ctx, self.store = spec, ctx, store
        self.schema = read_schema(spec.features_url, spec.storage_options)
        self.reader = RankReader(
            split_dir(spec.features_url, "train"), self.schema, rank=ctx.rank, world_size=ctx.world_size,
            batch_size=cfg.batch_size, storage_options=spec.storage_options,
        )
        if self.reader.share.rows == 0:
            raise ValueError(
                f"no training rows for rank {ctx.rank}: {self.reader.share.total_rows} rows in "
                f"{spec.features_url} over {ctx.world_size} ranks"
            )
        torch.manual_seed(cfg.seed)
        self.model = CTRModel(
            spec.model, num_dense=self.schema.num_dense, num_fields=self.schema.num_fields,
            dim=spec.store.embedding_dim,
        ).to(ctx.device)
        self.names = {p: n for n, p in self.model.named_parameters()}
        self.opt = KStepAdam(
            self.model.parameters(), ctx, k=cfg.k_steps, lr=cfg.lr, weight_decay=cfg.weight_decay
        )
        if spec.init_model_url:
            self.load_warm_start(spec.init_model_url)
        # every rank starts from rank 0's parameters, whatever their RNG or device did
        broadcast_tensors([p.data for p in self.model.parameters()], ctx)
        self.sparse = ShardedEmbedding(store, ctx, lr=cfg.sparse_lr, weight_decay=cfg.weight_decay)

    def load_warm_start(self, model_url: str) -> None:
        """Dense parameters and Adam moments from a previous model directory.

        Raises:
            ValueError: the previous model's architecture or columns differ from this run's.
        """
        so = self.spec.storage_options
        meta = checkpoint.read_model_json(model_url, so)
        want = {"num_dense": self.schema.num_dense, "num_fields": self.schema.num_fields, "dim": self.model.dim}
        have = {k: meta.get(k) for k in want}
        if have != want:
            raise ValueError(f"warm start from {model_url}: its shape {have} differs from this run's {want}")
        state = checkpoint.read_tensors(checkpoint.join(model_url, checkpoint.DENSE), so)
        try:
            self.model.load_state_dict(state, strict=True)
        except RuntimeError as exc:
            raise ValueError(f"warm start from {model_url}: dense weights do not fit the model config: {exc}") from exc
        optim = checkpoint.read_tensors(checkpoint.join(model_url, checkpoint.DENSE_OPTIM), so)
        self.opt.load_state_tensors(optim, self.names)
        log.info("warm start from %s (Adam step %d)", model_url, int(optim["step"].reshape(-1)[0]))

    def _batches(self) -> Iterator[Batch]:
        return itertools.chain.from_iterable(self.reader.iter_batches() for _ in range(self.spec.trainer.epochs))

    def _bind(self) -> None:
        if self.spec.trainer.bind_io_threads:
            cpus = bind_io_threads(self.ctx.socket)
            if cpus is not None:
                log.info("reader thread bound to NUMA node %d cpus %s", self.ctx.socket, sorted(cpus))

    def train(self) -> TrainStats:
        """Run every epoch, then merge so all ranks hold identical dense parameters."""
        cfg, ctx = self.spec.trainer, self.ctx
        stats = TrainStats(dropped_rows=self.reader.share.dropped)
        total_steps = self.reader.steps_per_epoch * cfg.epochs
        if ctx.rank == 0:
            log.info(
                "training %d steps (%d rows/rank x %d epochs, batch %d, %d rows dropped), k=%d",
                total_steps, self.reader.share.rows, cfg.epochs, cfg.batch_size, stats.dropped_rows, cfg.k_steps,
            )
        self.model.train()
        loss_sum = torch.zeros((), dtype=torch.float64, device=ctx.device)
        last = torch.zeros((), device=ctx.device)
        t0 = time.perf_counter()
        with Prefetcher(self._batches, depth=cfg.prefetch_batches, on_start=self._bind) as batches:
            for step, batch in enumerate(batches, start=1):
                last = train_step(self.model, self.sparse, self.opt, batch, step=step)
                loss_sum += last
                stats.examples += len(batch)
                self.opt.maybe_merge(step)
                stats.steps = step
                if ctx.rank == 0 and (step % cfg.log_every == 0 or step == total_steps):
                    log.info("step %d/%d loss %.5f", step, total_steps, last.item())
        self.opt.merge()  # final merge: identical dense parameters and moments on every rank
        stats.train_s = time.perf_counter() - t0
        stats.loss_sum = float(loss_sum)
        stats.final_loss = float(last)
        return stats
