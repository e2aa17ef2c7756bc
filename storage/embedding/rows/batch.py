"""`Rows`: a batch of full rows (weights, optimizer state, clock), the unit the tiers move between each other.

A tier hands rows down, up or into a snapshot whole, so optimizer state is never lost on the way; their layout
is the store's `storage.embedding.rows.format.RowFormat`, whose `step` is the update rule.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from storage.embedding.rows.transfer import host_to_device


@dataclass
class Rows:
    """A batch of N full rows on one device, in a store's `storage.embedding.rows.format.RowFormat`.

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

    def like(self, tensors: list[torch.Tensor]) -> Rows:
        """Rows with these rows' state names made of `tensors`, given in `tensors()` order (a gather's copies)."""
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
        return self.like([host_to_device(t, device) for t in self.tensors()])

    def select(self, idx: torch.Tensor | np.ndarray) -> Rows:
        """Rows at positions `idx` (an index or boolean mask)."""
        if isinstance(idx, np.ndarray):
            idx = torch.from_numpy(idx)
        idx = host_to_device(idx, self.emb.device)
        if idx.dtype == torch.bool:
            return self.like([t[idx] for t in self.tensors()])
        # index_select: same rows as t[idx], without advanced indexing's per-call setup
        return self.like([t.index_select(0, idx) for t in self.tensors()])

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
