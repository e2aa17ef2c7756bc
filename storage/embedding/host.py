"""`HostStore`: rows in CPU memory under a byte budget, spilling the coldest to the tier below.

The host level of the hierarchical parameter server (Baidu's HBM / memory / SSD
split): a write-back LFU cache of full rows (`storage.embedding.caching_tier.CachingTier`) whose
capacity is derived from a byte budget.  Over budget, the least-frequently used
rows (ties: least recently used) not touched by the current call are written to
`below` (dirty ones only; clean ones already are there) and dropped.  Keys it
does not hold are read from `below`, or initialised when there is no `below` or
`below` does not have them.

Choosing victims scans every resident row (NumPy, but O(capacity)), so a call
that must evict frees `evict_extra` (default 2%) of the capacity more than it
needs: the next calls admit into those free slots without a scan, and the scan
cost per admitted row stays O(1 / evict_extra) amortised.
"""

from __future__ import annotations

from typing import Any

from storage.embedding.base import EmbeddingStore, as_row_format
from storage.embedding.caching_tier import CachingTier
from storage.embedding.rows.format import RowFormat

__all__ = ["HostStore", "host_row_bytes", "rows_for_budget"]

_OVERHEAD = 64
"""Bytes per row beyond the payload: key, frequency, tick, flags and two hash-table cells."""


def host_row_bytes(dim: int | RowFormat) -> int:
    """Bytes one row of a format (an int: fp32 rows with Adam) costs in a HostStore (payload plus bookkeeping)."""
    return as_row_format(dim).row_bytes() + _OVERHEAD


def rows_for_budget(budget_bytes: int, dim: int | RowFormat) -> int:
    """How many rows of a format (an int: fp32 rows with Adam) a HostStore with `budget_bytes` holds."""
    return int(budget_bytes) // host_row_bytes(dim)


class HostStore(CachingTier):
    """CPU-memory tier with a byte budget over an optional lower tier.

    Args:
        dim: the rows' `RowFormat` (an int: its width, fp32 rows with Adam).
        budget_bytes: memory for rows; capacity is `rows_for_budget(budget_bytes, dim)` rows.
        below: the tier rows spill to (an `SsdStore`, a `MemoryStore` in tests), or None.
            Without one, going over budget raises `resident_rows.StoreCapacityError`.
        init_std: std of `init_rows` for unseen keys.
        policy: ``"lfu"`` (default) or ``"lru"``.
        evict_extra: fraction of the capacity freed beyond need when a call must evict
            (amortises the victim scan; 0 evicts exactly what is needed).

    Raises:
        ValueError: the budget does not hold a single row (including a negative budget),
            or `below` has another dim.
    """

    tier = "host"

    def __init__(
        self,
        dim: int | RowFormat,
        *,
        budget_bytes: int,
        below: EmbeddingStore | None = None,
        init_std: float = 0.01,
        policy: str = "lfu",
        evict_extra: float = 0.02,
    ) -> None:
        fmt = as_row_format(dim)
        capacity = rows_for_budget(budget_bytes, fmt)
        if capacity < 1:
            raise ValueError(
                f"budget_bytes={budget_bytes} holds no {fmt.name} row of dim {fmt.dim} "
                f"({host_row_bytes(fmt)} bytes each); raise the host budget"
            )
        super().__init__(
            fmt,
            init_std=init_std,
            device="cpu",
            capacity=capacity,
            policy=policy,
            below=below,
            evict_extra=evict_extra,
        )
        self.budget_bytes = int(budget_bytes)

    def _own_stats(self) -> dict[str, Any]:
        s = super()._own_stats()
        s["budget_bytes"] = self.budget_bytes
        s["bytes_held"] = s["rows"] * host_row_bytes(self.row_format)
        return s
