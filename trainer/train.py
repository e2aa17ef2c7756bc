"""The training loop of one rank: batches -> pull rows -> model -> push row grads -> local Adam -> k-step merge.

The step itself is `trainer.step.train_step`; this module builds what it runs on (`Trainer`), decides each
step's learning rates, merges, checkpoints and resumes, and tells the step hooks.

Every `trainer.checkpoint_every` steps, and at the end, the ranks write a
checkpoint (`trainer.checkpoint`): each rank's store shard, and the state of
its Stateful components (`Trainer.components`: model, optimizer, sparse
embedding, reader, the loop's totals, the RNG).  A Trainer built over a
checkpoint directory that holds a complete checkpoint of the same run resumes
from it and finishes with the model an uninterrupted run would have produced:
bit for bit on CPU, and on CUDA with `trainer.deterministic` (else within
float32 rounding: `trainer.reproducibility`).

Host reads of the step.  On CUDA a read of a device value on the host (`.item()`,
`.tolist()`, `.cpu()`) waits for the GPU; each one the step makes is marked
`# host read:` with its reason (tests/trainer/test_train.py counts them): the
all-to-all split sizes once per step, the owner's keys for the store's host
index, the loss only at log points (on CPU too: a step between them is the same
code on every device, and tests/trainer/test_step_host_reads.py counts what it
copies and reads, by kind); and a host-memory store's gradients reach it on the host
(`ShardedEmbedding._to_store`; none with the device tier, CUDA's default).  Between
log points a non-finite loss stops at the store, which refuses non-finite gradients
(on the host before the step's dense Adam step; a GPU tier's refusal is read at the
next log step or checkpoint, the refused updates having changed no row).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from storage.embedding.base import EmbeddingStore
from storage.warm import read_keys
from trainer import checkpoint, model_dir
from trainer.data import (
    RankReader,
    Source,
    prefetch_depth,
    read_schema,
    split_dir,
)
from trainer.distributed.collectives import broadcast_tensors
from trainer.distributed.context import DistContext
from trainer.distributed.sharded_embedding import ShardedEmbedding
from trainer.distributed.topology import bind_io_threads
from trainer.launch.spec import TrainSpec
from trainer.models import attention_cpu
from trainer.models.ctr_model import CROSS_PREFIX, CTRModel
from trainer.optim.kstep_adam import KStepAdam
from trainer.optim.schedule import set_step_lrs
from trainer.precision import Precision, resolve_precision
from trainer.reproducibility import TorchRNG, apply_determinism
from trainer.staging import BatchStager
from trainer.stateful import Stateful, require_keys
from trainer.step import train_step

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StepInfo:
    """What a step hook is told after each step: the rank, and the step just done (and checkpointed, if due)."""

    rank: int
    world_size: int
    step: int
    """The global step just done (1-based; a resumed run continues after its checkpoint's step)."""
    total_steps: int
    checkpointed: bool
    """A checkpoint of this step was written before the hook is called."""


StepHook = Callable[[StepInfo], None]
"""Called by `Trainer.train` on every rank after each step, once its checkpoint (if one is due) is written:
the place to observe the loop, or, in the crash tests (tests/helpers/faults.py), to end the rank there."""


@dataclass
class TrainStats:
    steps: int = 0
    examples: int = 0
    """Examples of this rank."""
    loss_sum: float = 0.0
    final_loss: float = float("nan")
    train_s: float = 0.0
    dropped_rows: int = 0
    sampled_out: int = 0
    """Negative rows the keep-rate left out (`optim.negative_sampling`)."""
    resumed_from: int = 0
    """Step of the checkpoint this run resumed from (0 = a fresh start)."""
    prefetch_depth: int = 0
    """Batches the reader thread ran ahead (`trainer.prefetch_batches` resolved; 0 = no thread)."""
    attention_forwards: dict[str, int] = field(default_factory=dict)
    """This run's training forwards of the attention by kernel (`trainer.models.attention_cpu.ran`)."""


class Progress:
    """The loop's totals: examples, loss sum, last loss, training seconds.

    Stateful, so a resumed run reports the totals of an uninterrupted one.  The losses stay tensors
    on the device between steps: reading one back every step would wait for the device.
    """

    def __init__(self, device: torch.device) -> None:
        self.examples = 0
        self.loss_sum = torch.zeros((), dtype=torch.float64, device=device)
        self.last = torch.full((), float("nan"), device=device)
        self.train_s = 0.0
        """Seconds trained before the current `start()` (by this process or the runs it resumes)."""
        self._t0 = time.perf_counter()

    def start(self) -> None:
        self._t0 = time.perf_counter()

    def seconds(self) -> float:
        return self.train_s + time.perf_counter() - self._t0

    def add(self, loss: torch.Tensor, examples: int) -> None:
        self.loss_sum += loss
        self.last = loss
        self.examples += examples

    def state_dict(self) -> dict[str, Any]:
        return {
            "examples": self.examples,
            "loss_sum": float(self.loss_sum),
            "last_loss": float(self.last),
            "train_s": self.seconds(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        require_keys(state, ("examples", "loss_sum", "last_loss", "train_s"), "progress")
        self.examples, self.train_s = state["examples"], state["train_s"]
        self.loss_sum.fill_(state["loss_sum"])
        self.last = torch.full((), state["last_loss"], device=self.last.device)


class Trainer:
    """Builds the model, optimizer, sharded embedding and reader of one rank, and runs the epochs.

    Args:
        spec: the run.
        ctx: the distributed context.
        store: this rank's embedding-store shard (already warmed).
        step_hooks: called in order after each step (`StepHook`); none by default.
    """

    def __init__(
        self, spec: TrainSpec, *, ctx: DistContext, store: EmbeddingStore, step_hooks: Sequence[StepHook] = ()
    ) -> None:
        # the spec read back from JSON: its optim values as numbers, or refused while one is still `auto`
        cfg, het = spec.optim.resolved(), spec.het
        if store.dim != spec.store.embedding_dim:
            raise ValueError(f"store dim {store.dim} != store.embedding_dim {spec.store.embedding_dim}")
        self.spec, self.ctx, self.store = spec, ctx, store
        self.optim = cfg
        """`spec.optim`, resolved: what this rank trains with."""
        self.step_hooks = tuple(step_hooks)
        self.schema = read_schema(spec.features_url, spec.storage_options).for_pooling(spec.model.bag_pooling)
        self.reader = RankReader(
            self.sources(),
            self.schema,
            rank=ctx.rank,
            world_size=ctx.world_size,
            batch_size=cfg.batch_size,
            storage_options=spec.storage_options,
            keep_rate=cfg.negative_sampling,
            seed=cfg.seed,
        )
        if self.reader.share.rows == 0:
            raise ValueError(
                f"no training rows for rank {ctx.rank}: {self.reader.share.total_rows} rows in "
                f"{spec.features_url} over {ctx.world_size} ranks"
            )
        apply_determinism(spec.trainer.deterministic)
        self.precision = Precision(resolve_precision(spec.trainer.precision, ctx.device.type), ctx.device)
        torch.manual_seed(cfg.seed)
        self.model = CTRModel(
            spec.model,
            num_dense=self.schema.num_dense,
            num_fields=self.schema.num_fields,
            dim=spec.store.embedding_dim,
        ).to(ctx.device)
        self.opt = KStepAdam(
            self.model.named_parameters(),
            ctx,
            k=cfg.k_steps,
            lr=cfg.lr,
            weight_decay=cfg.weight_decay,
            lr_scales={CROSS_PREFIX: cfg.cross_lr_scale},
        )
        if spec.init_model_url:
            self.load_warm_start(spec.init_model_url)
        # every rank starts from rank 0's parameters, whatever their RNG or device did
        broadcast_tensors([p.data for p in self.model.parameters()], ctx)
        self.sparse = ShardedEmbedding(
            store,
            ctx,
            lr=cfg.sparse_lr,
            weight_decay=cfg.weight_decay,
            staleness_bound=het.staleness_bound,
            cache_rows=het.cache_rows,
        )
        self.stats = TrainStats(dropped_rows=self.reader.share.dropped, sampled_out=self.reader.sampled_out)
        self.progress = Progress(ctx.device)
        self.start_step = self.resume() if spec.checkpoint_url else 0
        if cfg.cross_lr_scale == 0 and self.model.hold_cross() and ctx.rank == 0:
            log.info("cross term held still (optim.cross_lr_scale 0) and zero: its forward and backward are skipped")

    def sources(self) -> list[Source]:
        """The day's train rows, after the carried rows of the start model's day when the spec has them.

        Raises:
            ValueError: the carried rows have other columns than the day's.
        """
        so, carried = self.spec.storage_options, self.spec.carried
        train = Source(split_dir(self.spec.features_url, "train"))
        if carried is None:
            return [train]
        theirs = read_schema(carried.features_url, so, split="eval").for_pooling(self.spec.model.bag_pooling)
        if theirs != self.schema:
            raise ValueError(
                f"carried rows of {carried.date} ({carried.features_url}) have columns {theirs}, "
                f"the day's have {self.schema}: train without them (optim.train_parent_eval=false)"
            )
        evicted = np.sort(read_keys(carried.evicted_url, so))
        return [Source(split_dir(carried.features_url, "eval"), evicted), train]

    def load_warm_start(self, model_url: str) -> None:
        """Dense parameters and Adam moments from a previous model directory.

        Raises:
            ValueError: the previous model's architecture or columns differ from this run's.
        """
        so = self.spec.storage_options
        meta = model_dir.read_meta(model_url, so)
        want = {"num_dense": self.schema.num_dense, "num_fields": self.schema.num_fields, "dim": self.model.dim}
        have = {"num_dense": meta.num_dense, "num_fields": meta.num_fields, "dim": meta.dim}
        if have != want:
            raise ValueError(f"warm start from {model_url}: its shape {have} differs from this run's {want}")
        state = model_dir.read_tensors(model_dir.join(model_url, model_dir.DENSE), so)
        try:
            self.model.load_state_dict(state, strict=True)
        except RuntimeError as exc:
            raise ValueError(f"warm start from {model_url}: dense weights do not fit the model config: {exc}") from exc
        optim = model_dir.read_tensors(model_dir.join(model_url, model_dir.DENSE_OPTIM), so)
        self.opt.load_state_tensors(optim)
        log.info("warm start from %s (Adam step %d)", model_url, int(optim["step"].reshape(-1)[0]))

    # ------------------------------------------------------------------ checkpoints

    def _fingerprint(self) -> dict[str, Any]:
        """What must match for a checkpoint to belong to this run.

        The run tag names the trained result: it ends with `TrainSpec.identity()`, the hash of every field
        declared to change it (`TrainSpec.with_run_tag`; a tag named by hand, in tests or benchmarks, must
        name its config the same way).  The rest is what this rank sees of the run: the world and the rows
        it was split for, the files it reads (their data URLs, which the identity does not hash), and the
        precision `auto` resolved to on this device.  Older checkpoints carry every one of these keys, so a
        rerun after an upgrade resumes from them.
        """
        spec = self.spec
        return {
            "features_url": spec.features_url,
            "run_tag": spec.run_tag,
            "world_size": self.ctx.world_size,
            "carried": spec.carried.features_url if spec.carried else None,
            "rows_per_rank": self.reader.share.rows,
            "precision": self.precision.name,
        }

    def components(self) -> dict[str, Stateful]:
        """What a checkpoint saves beside the store shard, by name."""
        return {
            "model": self.model,
            "optim": self.opt,
            "sparse": self.sparse,
            "reader": self.reader,
            "progress": self.progress,
            "rng": TorchRNG(self.ctx.device),
        }

    def save_checkpoint(self, step: int) -> str:
        """Write the checkpoint of `step` (a collective: every rank calls it at the same step); returns its URL.

        The HET cache is flushed first, so the store shards hold every gradient.
        """
        assert self.spec.checkpoint_url is not None  # noqa: S101 - an invariant, for mypy
        so, rank = self.spec.storage_options, self.ctx.rank
        t0 = time.perf_counter()
        url = checkpoint.make_step_dir(self.spec.checkpoint_url, step, so)
        self.sparse.flush()
        self.store.flush()
        rows = self.store.snapshot(checkpoint.shard_url(url, rank), so)
        checkpoint.write_rank_state(url, rank, {n: c.state_dict() for n, c in self.components().items()}, so)
        self.ctx.barrier()  # every rank's files exist before the checkpoint is marked complete
        if rank == 0:
            checkpoint.write_checkpoint_json(url, {"step": step, **self._fingerprint()}, so)
            checkpoint.remove_checkpoints(self.spec.checkpoint_url, so, keep_step=step)
        log.info("checkpoint of step %d at %s (%d rows, %.2fs)", step, url, rows, time.perf_counter() - t0)
        return url

    def _find_checkpoint(self) -> tuple[int, str] | None:
        """Rank 0 picks the newest complete checkpoint of this run; every rank gets its choice."""
        found: tuple[int, str] | None = None
        if self.ctx.rank == 0:
            so = self.spec.storage_options
            done = checkpoint.complete_checkpoints(self.spec.checkpoint_url or "", so)
            if done:
                step, url = done[-1]
                meta = checkpoint.read_checkpoint_json(url, so)
                want = self._fingerprint()
                have = {k: meta.get(k) for k in want}
                if have == want:
                    found = (step, url)
                else:
                    diff = {k: (have[k], want[k]) for k in want if have[k] != want[k]}
                    log.warning("ignoring checkpoint %s of another run (checkpoint vs now: %s)", url, diff)
        if self.ctx.world_size > 1:
            box = [found]
            dist.broadcast_object_list(box, src=0)
            found = box[0]
        return found

    def resume(self) -> int:
        """Load the newest complete checkpoint of this run, if any; returns the step to continue after.

        Raises:
            ValueError: the checkpoint's state does not fit the components (another version wrote it).
        """
        found = self._find_checkpoint()
        if found is None:
            return 0
        step, url = found
        so, rank = self.spec.storage_options, self.ctx.rank
        state = checkpoint.read_rank_state(url, rank, so)
        components = self.components()
        require_keys(state, components, "checkpoint")
        for name, component in components.items():
            component.load_state_dict(state[name])
        if self.reader.position != step:
            raise ValueError(f"checkpoint {url} of step {step} holds reader position {self.reader.position}")
        rows = self.store.restore(
            checkpoint.shard_url(url, rank), owner=(rank, self.ctx.world_size), storage_options=so
        )
        self.stats.steps = self.stats.resumed_from = step
        log.info("resumed from the checkpoint of step %d at %s (%d store rows)", step, url, rows)
        return step

    # ------------------------------------------------------------------ the loop

    def _where(self, step: int) -> str:
        per_epoch, B = self.reader.steps_per_epoch, self.optim.batch_size
        epoch, b = divmod(step - 1, per_epoch)
        lo = self.reader.share.start + b * B
        hi = min(lo + B, self.reader.share.stop)
        c = self.spec.carried
        rows = f"the {c.rows} eval rows of {c.features_url}, then the train rows of " if c else "train rows of "
        return f"epoch {epoch}, batch {b} of this rank = rows [{lo}, {hi}) of {rows}{self.spec.features_url}"

    def _bind(self) -> None:
        if self.spec.trainer.bind_io_threads:
            cpus = bind_io_threads(self.ctx.socket)
            if cpus is not None:
                log.info("reader thread bound to NUMA node %d cpus %s", self.ctx.socket, sorted(cpus))

    def _prefetch_depth(self) -> int:
        """`trainer.prefetch_batches` resolved for this rank (`trainer.data.prefetch_depth`)."""
        depth = prefetch_depth(self.spec.trainer.prefetch_batches, device_type=self.ctx.device.type)
        if self.ctx.rank == 0:
            log.info(
                "reader thread: prefetch depth %d (trainer.prefetch_batches=%s on %s)",
                depth,
                self.spec.trainer.prefetch_batches,
                self.ctx.device.type,
            )
        return depth

    def train(self) -> TrainStats:
        """Run every epoch (from the resumed step), then merge so all ranks hold identical dense parameters."""
        cfg, run, ctx, stats = self.optim, self.spec.trainer, self.ctx, self.stats
        total_steps = self.reader.steps_per_epoch * cfg.epochs
        ckpt_every = run.checkpoint_every if self.spec.checkpoint_url else 0
        start = self.start_step
        if ctx.rank == 0:
            log.info(
                "training %d steps (%d rows/rank x %d epochs, batch %d, %d rows dropped), k=%d, staleness bound %d%s",
                total_steps,
                self.reader.share.rows,
                cfg.epochs,
                cfg.batch_size,
                stats.dropped_rows,
                cfg.k_steps,
                self.spec.het.staleness_bound,
                f", resuming after step {start}" if start else "",
            )
        self.model.train()
        depth = stats.prefetch_depth = self._prefetch_depth()
        progress = self.progress
        progress.start()
        stager = BatchStager(ctx.device)  # copies each batch's dense part to the GPU in the reader thread
        kernels_before = attention_cpu.ran.copy()
        with self.reader.stream(cfg.epochs, depth=depth, on_start=self._bind, prepare=stager) as batches:
            for batch in batches:
                step = self.reader.position
                set_step_lrs(self.opt, self.sparse, cfg, step=step, total_steps=total_steps)
                loss = train_step(
                    self.model,
                    self.sparse,
                    self.opt,
                    batch,
                    step=step,
                    embedding_l2=cfg.embedding_l2,
                    where=self._where(step),
                    precision=self.precision,
                    wide_loss=cfg.wide_loss,
                    check_loss=step % run.log_every == 0 or step == total_steps,
                )
                progress.add(loss, len(batch))
                self.opt.maybe_merge(step)
                stats.steps = step
                if ctx.rank == 0 and (step % run.log_every == 0 or step == total_steps):
                    log.info("step %d/%d loss %.5f", step, total_steps, loss.item())  # host read: the log line
                checkpointed = bool(ckpt_every) and step % ckpt_every == 0 and step < total_steps
                if checkpointed:
                    self.save_checkpoint(step)
                if self.step_hooks:
                    info = StepInfo(ctx.rank, ctx.world_size, step, total_steps, checkpointed)
                    for hook in self.step_hooks:
                        hook(info)
        self.sparse.flush()  # pending HET gradients reach their owners
        self.opt.merge()  # final merge: identical dense parameters and moments on every rank
        if ckpt_every and stats.steps > start:
            self.save_checkpoint(stats.steps)
        stats.examples, stats.train_s = progress.examples, progress.seconds()
        stats.attention_forwards = dict(attention_cpu.ran - kernels_before)
        stats.loss_sum, stats.final_loss = float(progress.loss_sum), float(progress.last)
        return stats
