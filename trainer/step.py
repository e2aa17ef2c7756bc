"""One training step of a rank: pull the batch's rows, the model's loss forward and backward, push the row
gradients to their owners, the dense optimizer's local step.

The loop around it (`trainer.train.Trainer`) decides the step's learning rates, when the k-step merge runs and
when the loss is read on the host (`train_step`'s `check_loss`).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from trainer.bags import cells_l2_grad, expand_cells, pool_rows
from trainer.data import Batch
from trainer.distributed.sharded_embedding import ShardedEmbedding
from trainer.models.ctr_model import CTRModel
from trainer.optim.kstep_adam import KStepAdam
from trainer.precision import Precision
from trainer.staging import staged_inputs


class NonFiniteLossError(FloatingPointError):
    """The loss of a step was NaN or infinite; nothing of that step was applied."""


def ctr_loss(
    model: CTRModel, dense: torch.Tensor, emb: torch.Tensor, labels: torch.Tensor, *, wide_loss: float = 0.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """(the model's mean log loss, the objective a step minimises): the objective adds `wide_loss` times the
    log loss of the wide term's own logit (`CTRModel.logits_and_wide`), so the wide part learns to predict
    alone while the deep parts learn what it misses; the model's loss is what the step reports.  Without a wide
    term, or at `wide_loss` 0, the objective is the model's loss (the same tensor)."""
    if not wide_loss:
        loss = F.binary_cross_entropy_with_logits(model(dense, emb).float(), labels)
        return loss, loss
    logits, wide = model.logits_and_wide(dense, emb)  # (B,), (B,) or None
    loss = F.binary_cross_entropy_with_logits(logits.float(), labels)
    if wide is None:
        return loss, loss
    return loss, loss + wide_loss * F.binary_cross_entropy_with_logits(wide.float(), labels)


def train_step(
    model: CTRModel,
    sparse: ShardedEmbedding,
    opt: KStepAdam,
    batch: Batch,
    *,
    step: int,
    embedding_l2: float = 0.0,
    where: str = "",
    precision: Precision | None = None,
    check_loss: bool = True,
    wide_loss: float = 0.0,
) -> torch.Tensor:
    """One synchronous step on this rank's batch; returns the batch's mean loss (detached).

    The pushed row gradients are those of the GLOBAL mean loss: every rank's
    batch has the same size, so d(global mean)/d row = sum over ranks of
    d(local mean)/d row / world.

    Bags of keys (multi-valued fields, `batch.bags`) are pulled with the `k_*`
    keys in the same pull and pooled into their field's row (`trainer.bags`).

    Args:
        precision: the dense network's autocast and loss scaling (default fp32: `trainer.precision`).
        wide_loss: `optim.wide_loss`, the weight of the wide term's own loss in the objective (`ctr_loss`).
        check_loss: read the loss on the host and refuse a non-finite one before any update, and the store's
            deferred refusals after the push (the Trainer asks at its log points only: on CUDA the reads wait for
            the GPU; a non-finite loss between them still stops at the store, which refuses non-finite
            gradients: at once on the host, at this check or the next flush on a GPU tier).

    Raises:
        NonFiniteLossError: the loss is NaN/Inf (with `check_loss`: before any update is applied).
    """
    dev = sparse.ctx.device
    precision = precision or Precision("fp32", dev)
    pooling = model.config.bag_pooling
    cells = expand_cells(batch.keys, batch.bags if pooling != "none" else ())  # keys (N,), N >= B*F
    pulled = sparse.pull(cells.keys)  # one pull for k_* and bag keys
    if batch.upcoming_keys is not None:  # the SSD tier reads the next batch's missing rows while this one computes
        sparse.prefetch(batch.upcoming_keys)
    rows = pulled.rows.requires_grad_(True)  # (N, D) leaf
    emb = pool_rows(rows, cells, pooling)  # (B, F, D); a view of `rows` without bags
    dense, labels = staged_inputs(batch, dev)
    with precision.autocast():
        loss, objective = ctr_loss(model, dense, emb, labels, wide_loss=wide_loss)
    if check_loss:
        value = objective.item()  # host read: the loss, where the Trainer checks it (see `check_loss`)
        if not math.isfinite(value):
            raise NonFiniteLossError(
                f"non-finite loss {value} at step {step} on rank {sparse.ctx.rank}{' (' + where + ')' if where else ''}"
            )
    opt.zero_grad()
    precision.backward(objective)
    if rows.grad is None:  # cannot happen for a leaf that requires grad; guards refactors
        raise RuntimeError("embedding rows received no gradient")
    grad = cells_l2_grad(rows, precision.unscale(rows.grad), cells, pooling, embedding_l2)  # (N, D)
    world = sparse.ctx.world_size
    sparse.push(pulled, grad if world == 1 else grad / world)  # the pull's route and store lookup, reused
    if check_loss:  # the store's deferred refusal of non-finite gradients (a GPU tier's), read with the loss
        sparse.check_updates()
    precision.step(opt)
    return loss.detach()
