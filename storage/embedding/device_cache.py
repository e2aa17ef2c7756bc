"""`DeviceCache`: a fixed-capacity LFU/LRU cache of full rows on the training device.

HET's worker-side cache embedding table: hot rows (weights + optimizer state)
live on the GPU (or on the CPU, same code) so most lookups and updates never
leave the device.  Capacity is allocated up front; admission and eviction are
batched per call; updates are applied to cached rows (dirty) and written back
to `below` on eviction and on `flush()`.  `slot_cache.simulate_hit_rate` replays a
key stream through the same policy without rows, for benchmarks.
"""

from __future__ import annotations

import torch

from storage.embedding.base import EmbeddingStore
from storage.embedding.caching_tier import CachingTier

__all__ = ["DeviceCache"]


class DeviceCache(CachingTier):
    """A cache of `capacity_rows` full rows on `device` over `below`.

    Args:
        below: the tier under the cache (usually a `HostStore`); it defines dim and init_std.
        capacity_rows: rows held on the device (>= 1), allocated at construction.
        policy: ``"lfu"`` (HET's choice: fewer misses on skewed streams) or ``"lru"``.
        device: the training device (``"cuda:0"``, or ``"cpu"``).

    Example::

        cache = DeviceCache(HostStore(16, budget_bytes=1 << 30, below=ssd), capacity_rows=100_000,
                            device="cuda")
        emb = cache.lookup(keys.cuda())           # (N, 16) on the GPU
        cache.update(keys, grads, lr=1e-3)
        cache.flush()                              # dirty rows go down to host, then SSD
    """

    tier = "device"

    def __init__(
        self, below: EmbeddingStore, *, capacity_rows: int, policy: str = "lfu", device: torch.device | str = "cpu"
    ) -> None:
        if below is None:
            raise ValueError("DeviceCache needs a tier below it")
        if capacity_rows < 1:
            raise ValueError(f"capacity_rows must be >= 1, got {capacity_rows}")
        super().__init__(
            below.row_format,
            init_std=below.init_std,
            device=device,
            capacity=capacity_rows,
            policy=policy,
            below=below,
            preallocate=True,
        )

    def _warm_below_first(self) -> bool:
        # The working set is sized for the host tier: warm it there, then pull the hottest up.
        return True
