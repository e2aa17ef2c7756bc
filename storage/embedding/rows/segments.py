"""Sums of rows by segment: `segment_sum` (reproducible on a GPU too) and `sum_duplicates` (one gradient per key).

A batch names a key as often as it occurs; a tier steps each row once, with the sum of its key's gradients.
"""

from __future__ import annotations

import numpy as np
import torch

from storage.embedding.rows.checks import strictly_increasing
from storage.embedding.rows.transfer import host_to_device


def segment_sum(values: torch.Tensor, index: torch.Tensor, n: int) -> torch.Tensor:
    """(n, ...) sums of the rows of `values` (N, ...) by `index` (N,) in [0, n); differentiable.

    `index_add` is sequential on CPU, so its sums are reproducible; on CUDA it adds with atomics
    in an order that changes from run to run.  Under `torch.use_deterministic_algorithms(True)`
    (`trainer.deterministic`) a CUDA sum sorts the rows by index first and accumulates each segment
    in that order (`index_put` with `accumulate`, deterministic on sorted indices), so every run
    adds the same numbers in the same order.
    """
    index = host_to_device(index, values.device)
    out = values.new_zeros((n, *values.shape[1:]))
    if values.device.type == "cuda" and torch.are_deterministic_algorithms_enabled():
        order = torch.argsort(index, stable=True)
        return out.index_put((index[order],), values[order], accumulate=True)
    return out.index_add(0, index, values)


def sum_duplicates(keys: np.ndarray, grads: torch.Tensor) -> tuple[np.ndarray, torch.Tensor]:
    """Distinct keys (ascending) and the sum of the gradients of each key's occurrences.

    Keys already sorted and distinct (`strictly_increasing`) come back as they are, with `grads` itself.
    """
    if strictly_increasing(keys):
        return keys, grads
    uniq, inverse = np.unique(keys, return_inverse=True)
    if uniq.size == keys.size:
        order = host_to_device(torch.from_numpy(np.argsort(keys, kind="stable")), grads.device)
        return uniq, grads.index_select(0, order)
    return uniq, segment_sum(grads, torch.from_numpy(inverse.reshape(-1)), uniq.size)
