"""HET's worker-side cache of remote embedding rows with bounded staleness (Miao et al., VLDB 2022).

A rank keeps copies of rows owned by other ranks.  A copy fetched at step c
serves the pulls of steps c .. c + bound without asking the owner; the
gradients the rank computes for it meanwhile are summed into the copy's
pending gradient instead of being sent.  When the copy would be served past
its bound (at the push of step c + bound), or when it is evicted for room, the
pending sum goes to the owner as one sparse-Adam update, and the next pull
fetches a fresh copy.  So a rank never reads a row more than `bound` steps
behind the owner's copy, and never holds back more than `bound + 1` steps of
its gradients.

Deviations from the paper, on purpose:

- Staleness is counted in steps of the (synchronous) training loop, not in
  per-row version clocks: every rank steps together, so the owner's copy can
  have moved by at most `bound` steps of the other ranks' updates.
- The cached copy is not updated locally between fetches (HET applies local
  updates to it); the owner's sparse Adam stays the only place where row
  state (embedding, m, v, clock) changes, so checkpoints stay exact.

`bound = 0` is never routed here: `ShardedEmbedding` then runs the
synchronous path unchanged.
"""

from __future__ import annotations

import torch


class StaleRowCache:
    """Copies of remote rows, kept as sorted tensors (no per-key Python loops).

    Args:
        dim: row width.
        bound: steps a copy may be served after the step that fetched it.
        capacity: rows kept at most; the oldest copies are evicted beyond it.
    """

    def __init__(self, dim: int, *, bound: int, capacity: int) -> None:
        if bound < 0 or capacity < 1:
            raise ValueError(f"need bound >= 0 and capacity >= 1, got bound={bound} capacity={capacity}")
        self.dim, self.bound, self.capacity = dim, bound, capacity
        self.keys = torch.empty(0, dtype=torch.int64)  # (C,) sorted
        self.rows = torch.empty(0, dim)  # (C, D) as fetched
        self.fetched = torch.empty(0, dtype=torch.int64)  # (C,) step of the fetch
        self.pending = torch.empty(0, dim)  # (C, D) gradients not yet sent
        self.dirty = torch.empty(0, dtype=torch.bool)  # (C,) pending holds something
        self._out_keys: list[torch.Tensor] = []  # evicted copies whose pending must go out with the next push
        self._out_grads: list[torch.Tensor] = []
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        self.flushed_rows = 0

    def __len__(self) -> int:
        return int(self.keys.numel())

    def find(self, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(found (N,) bool, position in the cache (N,), valid where found) of sorted or unsorted `keys`."""
        if not len(self):
            return torch.zeros(keys.shape, dtype=torch.bool), torch.zeros(keys.shape, dtype=torch.int64)
        pos = torch.searchsorted(self.keys, keys).clamp_(max=len(self) - 1)
        return self.keys[pos] == keys, pos

    def lookup(self, keys: torch.Tensor, remote: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(hit mask (N,), rows of the hits (H, D)) for distinct `keys` (N,); counts hits and remote misses."""
        found, pos = self.find(keys)
        hits = int(found.sum())
        self.hits += hits
        self.misses += int(remote.sum()) - hits
        return found, self.rows[pos[found]]

    def insert(self, keys: torch.Tensor, rows: torch.Tensor, *, step: int) -> None:
        """Cache fresh copies of `keys` (absent from the cache) fetched at `step`; evict the oldest beyond capacity."""
        if not keys.numel():
            return
        keys = torch.cat([self.keys, keys])
        order = torch.argsort(keys)
        self.keys = keys[order]
        self.rows = torch.cat([self.rows, rows.detach().to(self.rows.dtype).cpu()])[order]
        self.fetched = torch.cat([self.fetched, torch.full((rows.shape[0],), step, dtype=torch.int64)])[order]
        self.pending = torch.cat([self.pending, torch.zeros(rows.shape[0], self.dim)])[order]
        self.dirty = torch.cat([self.dirty, torch.zeros(rows.shape[0], dtype=torch.bool)])[order]
        extra = len(self) - self.capacity
        if extra > 0:
            oldest = torch.argsort(self.fetched, stable=True)[:extra]
            drop = torch.zeros(len(self), dtype=torch.bool)
            drop[oldest] = True
            self.evictions += extra
            self._take(drop)

    def accumulate(self, keys: torch.Tensor, grads: torch.Tensor) -> torch.Tensor:
        """Add `grads` (N, D) of distinct `keys` (N,) to the pending sums of cached copies.

        Returns:
            (N,) bool: the keys that were cached (the others must be sent now).
        """
        found, pos = self.find(keys)
        p = pos[found]
        self.pending[p] += grads[found].to(self.pending.dtype).cpu()
        self.dirty[p] = True
        return found

    def expire(self, step: int) -> None:
        """Queue the pending gradients of copies that may not serve step `step + 1`, and drop those copies."""
        if len(self):
            self._take(step - self.fetched >= self.bound)

    def drain(self) -> None:
        """Queue every pending gradient and empty the cache (checkpoints and the end of training)."""
        if len(self):
            self._take(torch.ones(len(self), dtype=torch.bool))

    def take_outgoing(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(keys (M,), summed pending gradients (M, D)) queued by `expire`, `drain` and evictions; clears the queue."""
        if not self._out_keys:
            return torch.empty(0, dtype=torch.int64), torch.empty(0, self.dim)
        keys, grads = torch.cat(self._out_keys), torch.cat(self._out_grads)
        self._out_keys, self._out_grads = [], []
        self.flushed_rows += keys.numel()
        return keys, grads

    def _take(self, mask: torch.Tensor) -> None:
        send = mask & self.dirty
        if bool(send.any()):
            self._out_keys.append(self.keys[send])
            self._out_grads.append(self.pending[send])
        keep = ~mask
        self.keys, self.rows, self.fetched = self.keys[keep], self.rows[keep], self.fetched[keep]
        self.pending, self.dirty = self.pending[keep], self.dirty[keep]

    def stats(self) -> dict[str, int]:
        return {
            "rows": len(self), "hits": self.hits, "misses": self.misses, "evictions": self.evictions,
            "flushed_rows": self.flushed_rows,
        }
