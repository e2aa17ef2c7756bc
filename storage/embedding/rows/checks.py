"""The argument checks every tier runs before touching a row, so every tier refuses bad input the same way.

`check_keys` and `check_update` (keys, gradients, learning rate, weight decay) raise the same errors for the
same bad input in every tier; `all_finite` and `strictly_increasing` are the cheap tests they and the tiers'
fast paths share.
"""

from __future__ import annotations

import numpy as np
import torch


def check_keys(keys: torch.Tensor) -> np.ndarray:
    """Validate `keys` and return them as a contiguous int64 NumPy array (a CPU copy when needed).

    Raises:
        TypeError: not an int64 torch.Tensor.
        ValueError: not 1-D, or a negative key.
    """
    if not isinstance(keys, torch.Tensor):
        raise TypeError(f"keys must be a torch.Tensor of int64, got {type(keys).__name__}")
    if keys.dtype != torch.int64:
        raise TypeError(f"keys must be int64, got {keys.dtype}")
    if keys.dim() != 1:
        raise ValueError(f"keys must be 1-D (N,), got shape {tuple(keys.shape)}")
    arr = np.ascontiguousarray(keys.detach().cpu().numpy())
    if arr.size and arr.min() < 0:
        raise ValueError(f"keys must be non-negative (pipeline.encode.keys), got {int(arr.min())}")
    return arr


def all_finite(t: torch.Tensor) -> bool:
    """`torch.isfinite(t).all()`, in one reduction for the usual all-finite case.

    A sum with a NaN or infinite term is never finite, so a finite sum proves every entry finite;
    only a non-finite sum (a bad entry, or finite entries overflowing) pays for the elementwise check
    (the step checks every gradient and new row, so the common case must be cheap).
    """
    return bool(torch.isfinite(t.sum())) or bool(torch.isfinite(t).all())


def strictly_increasing(keys: np.ndarray) -> bool:
    """Whether `keys` are sorted and distinct: already what `np.unique` would return (no sort needed).

    The keys a sharded pull sends to an owner are a route's sorted distinct keys; one O(N) pass
    lets the tiers skip their de-duplicating sorts for them.
    """
    return bool(keys.size < 2 or (keys[1:] > keys[:-1]).all())


def check_grads(grads: torch.Tensor, n: int, dim: int, *, finite: bool = True) -> None:
    """Validate a gradient batch for `n` keys of width `dim`.

    Args:
        finite: also check every entry is finite (a host read); a tier that updates on a GPU leaves
            it to `sparse_adam`, whose one check of the new rows refuses the same gradients.

    Raises:
        TypeError: not a float32 torch.Tensor.
        ValueError: wrong shape, or a NaN/inf entry.
    """
    if not isinstance(grads, torch.Tensor):
        raise TypeError(f"grads must be a torch.Tensor of float32, got {type(grads).__name__}")
    if grads.dtype != torch.float32:
        raise TypeError(f"grads must be float32, got {grads.dtype}; cast with grads.float()")
    if tuple(grads.shape) != (n, dim):
        raise ValueError(f"grads must have shape ({n}, {dim}) for {n} keys, got {tuple(grads.shape)}")
    if finite and not all_finite(grads):
        raise ValueError("grads contain NaN or inf; no row was changed")


def check_update(
    keys: torch.Tensor, grads: torch.Tensor, dim: int, *, lr: float, weight_decay: float, finite: bool = True
) -> np.ndarray:
    """The keys of an `update` as int64 numpy, after every argument check (`check_keys`, `check_grads`,
    and `lr` / `weight_decay` finite and >= 0): every tier refuses bad input the same way, before any row changes."""
    k = check_keys(keys)
    check_grads(grads, k.size, dim, finite=finite)
    if not lr >= 0 or not np.isfinite(lr):
        raise ValueError(f"lr must be a finite number >= 0, got {lr}")
    if not weight_decay >= 0 or not np.isfinite(weight_decay):
        raise ValueError(f"weight_decay must be a finite number >= 0, got {weight_decay}")
    return k
