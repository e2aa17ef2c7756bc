"""HET's worker-side cache of remote embedding rows with per-row clocks (Miao et al., VLDB 2022).

Clocks.  Every stored row carries a clock: the number of sparse-optimizer updates
its owner has applied (`storage.embedding.rows.batch.Rows.clock`).  A rank's cached copy of a
remote row records

- `base`: the owner's clock when the copy was fetched (sent with the row);
- `local`: the updates this rank applied to the copy since then, whose summed
  gradient (`pending`) the owner has not received yet.

Validity.  A copy may serve a pull while

    (owner's clock now - base) + local <= bound

i.e. the copy misses at most `bound` updates in both directions together:
the owner's updates it has not seen, and its own updates the owner has not
seen.  Bound 0 therefore never serves a copy (it is exactly synchronous).

Learning the owner's clock.  A copy is checked on every pull that needs it:
the rank sends the key and the owner returns its clock (8 + 8 bytes, riding in
the same all-to-all as the pull's row requests and replies) instead of the
8-byte key, the 4*dim-byte row and, at the push, the 8 + 4*dim-byte gradient
the synchronous path moves.  No cheaper estimate is safe: a rank that pushes
the pending sum of L local updates advances the owner's clock by L in one
step (see below), so a clock seen earlier says nothing about the clock now.
Copies that no pull needs are never checked and cost nothing.

Local updates.  The gradient a rank computes for a cached row is summed into
`pending` and also applied to the copy with the store's own rule
(`storage.embedding.rows.sparse_optim`, the store's `row_format.rule`), in fp32, with the
rule's state kept per copy and started at zero at the fetch: with Adam or row-wise
AdaGrad the rank sees its own first updates at about `lr` per step, whatever the
gradient's magnitude (plain SGD would move a row by lr * |g|, a vanishing amount for
the mean-loss gradients of a large batch).  The owner's state is not fetched: for
Adam that would triple the bytes of every fetch.  The copy is a preview; the owner's
row stays the authority and a refetch replaces the copy.

Pushes.  The pending sum goes to the owner, with its count L, when

- the push of a step finds that the copy cannot serve the next pull even if
  the owner did not move (`(seen - base) + local > bound`),
- a pull's clock check finds the copy too stale (the key is refetched),
- the copy is dirty and `bound` steps old (no gradient is held back longer),
- the copy is evicted (LFU: fewest hits first, then least recently used;
  HET found LFU misses less than LRU on skewed embedding accesses),
- `drain` (checkpoints and the end of training).

The owner applies a pending sum G of L updates as L optimizer steps on G / L
(`trainer.distributed.routing.apply_updates`): L local steps move a row L times, as they
would have without the cache, and its clock advances by L.  A copy is dropped
when its pending sum is pushed; the next pull fetches a fresh one.
"""

from __future__ import annotations

import torch

from storage.embedding.rows.sparse_optim import SparseAdam, SparseOptimizer


class StaleRowCache:
    """Copies of remote rows with their clocks, kept as tensors sorted by key (no per-key Python loops).

    Args:
        dim: row width.
        bound: HET staleness bound, in row updates (see the module docstring).
        capacity: copies kept at most; the least frequently used are evicted beyond it.
        rule: the store's sparse optimizer, applied to the copies (their state lives in `self.state`).
    """

    def __init__(self, dim: int, *, bound: int, capacity: int, rule: SparseOptimizer | None = None) -> None:
        if bound < 0 or capacity < 1:
            raise ValueError(f"need bound >= 0 and capacity >= 1, got bound={bound} capacity={capacity}")
        self.dim, self.bound, self.capacity = dim, bound, capacity
        self.rule = rule if rule is not None else SparseAdam()
        i64 = torch.int64
        self.keys = torch.empty(0, dtype=i64)  # (C,) sorted
        self.rows = torch.empty(0, dim)  # (C, D) fp32 copy: the owner's row + this rank's local updates
        # the rule's state of each copy, zero at the fetch: (C, D) or (C,) per tensor
        self.state = {f.name: torch.empty(f.shape(0, dim)) for f in self.rule.state}
        self.base = torch.empty(0, dtype=i64)  # (C,) owner's clock at the fetch
        self.seen = torch.empty(0, dtype=i64)  # (C,) owner's clock at the last check
        self.local = torch.empty(0, dtype=i64)  # (C,) local updates not yet pushed
        self.pending = torch.empty(0, dim)  # (C, D) their summed gradient
        self.fetched = torch.empty(0, dtype=i64)  # (C,) step of the fetch
        self.freq = torch.empty(0, dtype=i64)  # (C,) pulls served (LFU)
        self.used = torch.empty(0, dtype=i64)  # (C,) step of the last pull served (LFU tie-break)
        self._out: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []  # (keys, grads, counts) to push
        self.hits = 0
        self.misses = 0
        self.checks = 0
        self.stale = 0
        """Copies found too stale by a clock check (refetched)."""
        self.evictions = 0
        self.flushed_rows = 0
        self.max_served_staleness = 0
        """Largest (owner's clock - base) + local of any copy served: never above `bound`."""
        self.last_served: tuple[torch.Tensor, torch.Tensor, torch.Tensor] = (
            torch.empty(0, dtype=i64),
            torch.empty(0, dtype=i64),
            torch.empty(0, dtype=i64),
        )
        """(keys, base, local) of the copies the last `serve` returned (for tests of the bound)."""

    _FIELDS = ("keys", "rows", "base", "seen", "local", "pending", "fetched", "freq", "used")

    def __len__(self) -> int:
        return int(self.keys.numel())

    def find(self, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(found (N,) bool, position in the cache (N,), valid where found) of `keys`."""
        if not len(self):
            return torch.zeros(keys.shape, dtype=torch.bool), torch.zeros(keys.shape, dtype=torch.int64)
        pos = torch.searchsorted(self.keys, keys).clamp_(max=len(self) - 1)
        return self.keys[pos] == keys, pos

    # ------------------------------------------------------------------ pull

    def serve(self, keys: torch.Tensor, clocks: torch.Tensor, *, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Check cached `keys` (distinct, all cached) against the owners' `clocks` (now); serve the fresh enough.

        Copies past the bound are dropped, their pending gradients queued for
        the next push; the caller refetches those keys.

        Returns:
            (valid (N,) bool, rows of the valid keys (V, D)).
        """
        found, pos = self.find(keys)
        if not bool(found.all()):
            raise ValueError("serve() got keys that are not cached; check them with find() first")
        self.checks += int(keys.numel())
        staleness = clocks.to(torch.int64) - self.base[pos] + self.local[pos]
        valid = staleness <= self.bound
        self.seen[pos] = clocks.to(torch.int64)
        p = pos[valid]
        self.freq[p] += 1
        self.used[p] = step
        self.hits += int(valid.sum())
        self.stale += int((~valid).sum())
        if bool(valid.any()):
            self.max_served_staleness = max(self.max_served_staleness, int(staleness[valid].max()))
        self.last_served = (self.keys[p], self.base[p].clone(), self.local[p].clone())
        rows = self.rows[p]
        if not bool(valid.all()):
            drop = torch.zeros(len(self), dtype=torch.bool)
            drop[pos[~valid]] = True
            self._take(drop)
        return valid, rows

    def insert(self, keys: torch.Tensor, rows: torch.Tensor, clocks: torch.Tensor, *, step: int) -> None:
        """Cache fresh copies of `keys` (distinct, not cached) with the
        owners' `clocks`; evict by LFU beyond capacity."""
        if not keys.numel():
            return
        n = int(keys.numel())
        i64 = torch.int64
        zeros = torch.zeros(n, self.dim)
        new = {
            "keys": keys.to(i64).cpu(),
            "rows": rows.detach().to(torch.float32).cpu(),
            "base": clocks.to(i64).cpu(),
            "seen": clocks.to(i64).cpu(),
            "local": torch.zeros(n, dtype=i64),
            "pending": zeros.clone(),
            "fetched": torch.full((n,), step, dtype=i64),
            "freq": torch.ones(n, dtype=i64),
            "used": torch.full((n,), step, dtype=i64),
        }
        order = torch.argsort(torch.cat([self.keys, new["keys"]]))
        for name in self._FIELDS:
            setattr(self, name, torch.cat([getattr(self, name), new[name]])[order])
        for f in self.rule.state:
            self.state[f.name] = torch.cat([self.state[f.name], torch.zeros(f.shape(n, self.dim))])[order]
        self.misses += n
        extra = len(self) - self.capacity
        if extra > 0:
            # LFU, ties by the least recently used: sort by (freq, used) via one stable sort per key
            by_used = torch.argsort(self.used, stable=True)
            victims = by_used[torch.argsort(self.freq[by_used], stable=True)][:extra]
            drop = torch.zeros(len(self), dtype=torch.bool)
            drop[victims] = True
            self.evictions += extra
            self._take(drop)

    # ------------------------------------------------------------------ push

    def accumulate(
        self, keys: torch.Tensor, grads: torch.Tensor, *, lr: float, weight_decay: float = 0.0
    ) -> torch.Tensor:
        """Apply `grads` (N, D) of distinct `keys` (N,) to the cached copies and add them to their pending sums.

        Returns:
            (N,) bool: the keys that were cached (the others must be sent now).
        """
        found, pos = self.find(keys)
        p = pos[found]
        if p.numel():
            g = grads[found.to(grads.device)].detach().to(torch.float32).cpu()
            self.pending[p] += g
            clock = self.local[p] + 1
            emb, state = self.rule.step(
                self.rows[p], {k: v[p] for k, v in self.state.items()}, clock, g, lr=lr, weight_decay=weight_decay
            )
            if not bool(torch.isfinite(emb).all()):
                raise ValueError("a local update of a cached row is not finite; clip the gradients")
            self.rows[p], self.local[p] = emb, clock
            for k, v in state.items():
                self.state[k][p] = v
        return found

    def expire(self, step: int) -> None:
        """After the push of `step`: queue and drop the copies that may not serve the next pull.

        A copy goes when even an owner that did not move would leave it past
        the bound, or when it is dirty and `bound` steps old.
        """
        if len(self):
            over = self.seen - self.base + self.local > self.bound
            old = (self.local > 0) & (step - self.fetched >= self.bound)
            self._take(over | old)

    def drain(self) -> None:
        """Queue every pending gradient and empty the cache (checkpoints and the end of training)."""
        if len(self):
            self._take(torch.ones(len(self), dtype=torch.bool))

    def take_outgoing(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(keys (M,), pending gradient sums (M, D), local update counts (M,)) queued since the last call."""
        if not self._out:
            return torch.empty(0, dtype=torch.int64), torch.empty(0, self.dim), torch.empty(0, dtype=torch.int64)
        keys, grads, counts = (torch.cat(parts) for parts in zip(*self._out, strict=True))
        self._out = []
        self.flushed_rows += int(keys.numel())
        return keys, grads, counts

    def _take(self, mask: torch.Tensor) -> None:
        """Remove the copies in `mask`, queueing the pending sums of the dirty ones."""
        send = mask & (self.local > 0)
        if bool(send.any()):
            self._out.append((self.keys[send], self.pending[send], self.local[send]))
        keep = ~mask
        for name in self._FIELDS:
            setattr(self, name, getattr(self, name)[keep])
        for k, v in self.state.items():
            self.state[k] = v[keep]

    def stats(self) -> dict[str, int | float]:
        looked = self.hits + self.misses
        return {
            "rows": len(self),
            "hits": self.hits,
            "misses": self.misses,
            "checks": self.checks,
            "stale": self.stale,
            "evictions": self.evictions,
            "flushed_rows": self.flushed_rows,
            "hit_rate": self.hits / looked if looked else 0.0,
            "max_served_staleness": self.max_served_staleness,
        }
