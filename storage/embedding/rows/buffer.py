"""`RowBuffer`: the row tensors of one tier on one device, addressed by slot (a tier's key index maps keys to slots)."""

from __future__ import annotations

import numpy as np
import torch

from storage.embedding.rows.batch import Rows
from storage.embedding.rows.format import RowFormat
from storage.embedding.rows.transfer import host_to_device, is_host


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
        if is_host(self.device):
            return self.rows.like([_take(t, slots) for t in self.rows.tensors()])
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
        if is_host(self.device):
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
