"""Learning-rate schedule and embedding L2: pure functions the training loop calls once per step.

    lr_at(step, base_lr=1e-3, total_steps=100, warmup_steps=10, decay="cosine", min_ratio=0.1)

- steps 1 .. warmup_steps: linear warm-up, lr * step / warmup_steps;
- then `none` keeps lr, `linear` / `cosine` decay from lr at the end of warm-up to
  min_ratio * lr at `total_steps` (and stay there if training runs longer).

`embedding_l2_grad` adds the gradient of (l2 / 2) * mean_b sum_f ||e_bf||^2 to the gradient of
the pulled rows, so only rows the batch touches are regularised, and a key is pulled towards 0
in proportion to how often the batch uses it (the same weighting as its data gradient).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from trainer.config import ResolvedOptim


def lr_at(
    step: int, *, base_lr: float, total_steps: int, warmup_steps: int = 0, decay: str = "none", min_ratio: float = 0.1
) -> float:
    """The learning rate of 1-based `step` (see the module docstring).

    Raises:
        ValueError: step < 1, or an unknown `decay`.

    Example::

        lr_at(5, base_lr=1.0, total_steps=100, warmup_steps=10)                   # 0.5 (warm-up)
        lr_at(100, base_lr=1.0, total_steps=100, decay="cosine", min_ratio=0.1)   # 0.1
    """
    if step < 1:
        raise ValueError(f"steps are 1-based, got step {step}")
    if warmup_steps and step <= warmup_steps:
        return base_lr * step / warmup_steps  # 1) linear warm-up
    if decay == "none":
        return base_lr  # 2) constant
    if decay not in ("linear", "cosine"):
        raise ValueError(f"decay must be none, linear or cosine, got {decay!r}")
    span = max(1, total_steps - warmup_steps)
    t = min(1.0, (step - warmup_steps) / span)  # 0 right after warm-up, 1 at the last step
    shape = 1.0 - t if decay == "linear" else 0.5 * (1.0 + math.cos(math.pi * t))  # 3) decay 1 -> 0
    return base_lr * (min_ratio + (1.0 - min_ratio) * shape)


def set_step_lrs(opt: Any, sparse: Any, cfg: ResolvedOptim, *, step: int, total_steps: int) -> None:
    """Set the dense (KStepAdam) and sparse (ShardedEmbedding) learning rates of `step` from `cfg`
    (resolved: `trainer.plan.recipe.derive` sized its warm-up to the day).

    The warm-up lasts `optim.warmup_steps`, at most `total_steps`.  Does nothing when the config asks
    for neither warm-up nor decay.
    """
    if not cfg.warmup_steps and cfg.lr_decay == "none":
        return
    warmup = min(cfg.warmup_steps, total_steps)
    kw: dict[str, Any] = {
        "total_steps": total_steps,
        "warmup_steps": warmup,
        "decay": cfg.lr_decay,
        "min_ratio": cfg.min_lr_ratio,
    }
    lr = lr_at(step, base_lr=cfg.lr, **kw)
    for group in opt.adam.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)  # `KStepAdam`'s groups: `optim.cross_lr_scale`
    sparse.lr = lr_at(step, base_lr=cfg.sparse_lr, **kw)


def embedding_l2_grad(rows: torch.Tensor, grad: torch.Tensor, l2: float) -> torch.Tensor:
    """`grad` plus the gradient of (l2 / 2) * mean_b sum_f ||rows_bf||^2.

    Args:
        rows: the pulled rows (B, F, D) (their values; no graph needed).
        grad: d loss / d rows (B, F, D) of the batch-mean loss.
        l2: the coefficient (`optim.embedding_l2`); 0 returns `grad` itself.

    Returns:
        (B, F, D): grad + l2 * rows / B.

    Example::

        g = embedding_l2_grad(torch.ones(2, 1, 3), torch.zeros(2, 1, 3), 0.5)  # every entry 0.25
    """
    if l2 == 0:
        return grad
    return grad + (l2 / rows.shape[0]) * rows.detach()
