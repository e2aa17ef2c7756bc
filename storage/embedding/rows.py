"""Row-level building blocks shared by every tier.

- `Rows`: a batch of full rows (weights, optimizer state, clock), the unit tiers
  move between each other so optimizer state is never lost; their layout is the
  store's `storage.embedding.row_format.RowFormat`, whose `step` is the update rule;
- argument checks (`check_keys`, `check_update`) so every tier raises the same
  errors for the same bad input, before touching any row;
- `sum_duplicates`: one gradient per distinct key;
- `RowBuffer`: growable (or fixed) row tensors addressed by slot.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from storage.embedding.row_format import RowFormat


@dataclass
class Rows:
    """A batch of N full rows on one device, in a store's `storage.embedding.row_format.RowFormat`.

    Attributes:
        emb: (N, width) weights in the format's row dtype (`RowFormat.weights` reads them as fp32 (N, dim)).
        state: the sparse optimizer's per-row state by name, (N, dim) or (N,) each, in the state dtype.
        clock: int32 (N,) updates applied so far.
    """

    emb: torch.Tensor
    state: dict[str, torch.Tensor]
    clock: torch.Tensor

    def __len__(self) -> int:
        return int(self.clock.shape[0])

    def tensors(self) -> list[torch.Tensor]:
        """emb, the state tensors in name order, clock: what every copy moves."""
        return [self.emb, *(self.state[k] for k in sorted(self.state)), self.clock]

    def _like(self, tensors: list[torch.Tensor]) -> Rows:
        names = sorted(self.state)
        return Rows(tensors[0], dict(zip(names, tensors[1:-1], strict=True)), tensors[-1])

    @staticmethod
    def from_numpy(emb: np.ndarray, state: dict[str, np.ndarray], clock: np.ndarray) -> Rows:
        """Rows sharing memory with the arrays (copied first when an array is read-only, e.g. from Arrow)."""

        def t(a: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(np.require(a, requirements=["C", "W"]))

        return Rows(t(emb), {k: t(a) for k, a in state.items()}, t(clock))

    def numpy(self) -> tuple[np.ndarray, dict[str, np.ndarray], np.ndarray]:
        """(emb, state, clock) as CPU NumPy arrays (emb of a bf16 row as its uint16 bit patterns)."""
        emb = self.emb.detach().cpu()
        emb_np = emb.view(torch.int16).numpy().view(np.uint16) if emb.dtype == torch.bfloat16 else emb.numpy()
        return emb_np, {k: v.detach().cpu().numpy() for k, v in self.state.items()}, self.clock.detach().cpu().numpy()

    def to(self, device: torch.device | str) -> Rows:
        """The rows on `device` (no copy when already there; host rows bound for a GPU: `host_to_device`)."""
        return self._like([host_to_device(t, device) for t in self.tensors()])

    def select(self, idx: torch.Tensor | np.ndarray) -> Rows:
        """Rows at positions `idx` (an index or boolean mask)."""
        if isinstance(idx, np.ndarray):
            idx = torch.from_numpy(idx)
        idx = host_to_device(idx, self.emb.device)
        if idx.dtype == torch.bool:
            return self._like([t[idx] for t in self.tensors()])
        # index_select: same rows as t[idx], without advanced indexing's per-call setup
        return self._like([t.index_select(0, idx) for t in self.tensors()])

    def put(self, idx: torch.Tensor | np.ndarray, other: Rows) -> None:
        """Overwrite the rows at positions `idx` (distinct, or a boolean
        mask) with `other` (any device, same format)."""
        if isinstance(idx, np.ndarray):
            idx = torch.from_numpy(idx)
        idx = host_to_device(idx, self.emb.device)
        other = other.to(self.emb.device)
        pairs = zip(self.tensors(), other.tensors(), strict=True)
        if idx.dtype == torch.bool:
            for t, o in pairs:
                t[idx] = o
            return
        # index_copy_ is t[idx] = x for distinct positions, without advanced indexing's overhead
        for t, o in pairs:
            t.index_copy_(0, idx, o)


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


def host_to_device(t: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """`t` on `device`; a host tensor bound for CUDA goes through pinned memory with `non_blocking`.

    A copy from pageable memory makes the host wait for the GPU's queue to drain; from pinned
    memory it is queued like a kernel, so index and batch uploads do not stall the step.  The
    pinned staging buffer comes from torch's caching host allocator, which keeps it until the copy ran.
    """
    device = torch.device(device)
    if device.type == "cuda" and t.device.type == "cpu":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


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


def _take(t: torch.Tensor, idx: np.ndarray) -> torch.Tensor:
    """Rows `idx` of the CPU tensor `t`, gathered by NumPy on the calling thread.

    The host tier gathers between NumPy steps; `torch.index_select` would hand each gather to
    torch's intra-op thread pool, whose threads have gone to sleep by then and are slow to wake
    on a busy host, where `np.take` copies the same rows (memory-bound) on the calling thread.
    """
    if t.dtype == torch.bfloat16:  # NumPy has no bfloat16: gather the bit patterns
        return torch.from_numpy(np.take(t.view(torch.int16).numpy(), idx, axis=0)).view(torch.bfloat16)
    return torch.from_numpy(np.take(t.numpy(), idx, axis=0))


class RowBuffer:
    """Row tensors (weights, optimizer state, clock) of one `RowFormat` on one device, addressed by slot;
    grows by doubling.

    Args:
        fmt: the rows' format.
        device: where the tensors live.
        capacity: initial (or, with `fixed=True`, the only) number of slots.
        fixed: never grow (a preallocated cache).
        limit: never grow past this many slots when growing by doubling.
    """

    def __init__(
        self,
        fmt: RowFormat,
        device: torch.device | str = "cpu",
        capacity: int = 0,
        *,
        fixed: bool = False,
        limit: int | None = None,
    ) -> None:
        self.fmt = fmt
        self.dim = fmt.dim
        self.device = torch.device(device)
        self.fixed = fixed
        self.limit = limit
        self.rows = fmt.empty(capacity, self.device)

    @property
    def capacity(self) -> int:
        """Slots allocated now."""
        return len(self.rows)

    def ensure(self, n_slots: int) -> None:
        """Grow (by doubling, up to `limit`) so slots [0, n_slots) exist."""
        if n_slots <= self.capacity:
            return
        if self.fixed:
            raise ValueError(f"RowBuffer is fixed at {self.capacity} slots, asked for {n_slots}")
        size = max(n_slots, 2 * self.capacity, 1024)
        if self.limit is not None:
            size = max(n_slots, min(size, self.limit))
        grown = self.fmt.empty(size, self.device)
        old = self.capacity
        for g, t in zip(grown.tensors(), self.rows.tensors(), strict=True):
            g[:old] = t
        self.rows = grown

    def gather(self, slots: np.ndarray) -> Rows:
        """Copies of the rows at `slots`."""
        slots = np.ascontiguousarray(slots, dtype=np.int64)
        if self.device.type == "cpu":
            return self.rows._like([_take(t, slots) for t in self.rows.tensors()])
        return self.rows.select(host_to_device(torch.from_numpy(slots), self.device))

    def scatter(self, slots: np.ndarray, rows: Rows) -> None:
        """Write `rows` at `slots` (distinct), growing when needed."""
        slots = np.ascontiguousarray(slots, dtype=np.int64)
        if slots.size:
            self.ensure(int(slots.max()) + 1)
        self.rows.put(host_to_device(torch.from_numpy(slots), self.device), rows)

    def gather_emb(self, slots: np.ndarray) -> torch.Tensor:
        """The weights at `slots` as float32, (len(slots), dim)."""
        slots = np.ascontiguousarray(slots, dtype=np.int64)
        if self.device.type == "cpu":
            return self.fmt.weights(_take(self.rows.emb, slots))
        return self.fmt.weights(self.rows.emb.index_select(0, host_to_device(torch.from_numpy(slots), self.device)))

    def reset(self) -> None:
        """Drop every row.  A fixed buffer keeps its allocation and is zeroed in place: allocating a
        fresh one while the old is alive would need twice its memory (a GPU cache sized over half
        the device could not be restored)."""
        if self.fixed:
            for t in self.rows.tensors():
                t.zero_()
        else:
            self.rows = self.fmt.empty(0, self.device)

    def release(self) -> None:
        """Free the row memory (a closed store)."""
        self.rows = self.fmt.empty(0, self.device)
