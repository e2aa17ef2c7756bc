"""`StorePressure`: how hard a training job leaned on the tiers below memory, from the ranks' store counters.

A host budget too small for the day's rows shows here first: a host hit rate well below the LFU rates of
`bench.store` (0.78-0.94 at 15% capacity), SSD bytes per example growing, and the step's wait on the SSD
taking a share of the training time.  The tiers count (`CachingTier`: hits, misses and evictions per tier;
`SsdStore`: unit bytes read and written and the seconds inside its calls); this turns one job's counters,
summed over its ranks, into the rates the train line and the day's record show (`TrainSummary.store_pressure`).

The SSD's seconds are wall time inside `SsdStore.read_rows` / `write_rows`, which the host tier calls on the
step's path: time the step waited.  The reads ahead and writes behind of `storage.embedding.ssd.behind` run beside
the step and count apart (`prefetch_s`, `write_behind_s`); what they did not cover, or had not finished, is here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True, kw_only=True)
class StorePressure:
    """One job's tier rates (all ranks together); every rate is 0 for a job whose rows never left the host."""

    examples: int
    host_hit_rate: float
    """Host-tier hits over lookups of distinct keys per call (1.0 when every key was resident)."""
    device_hit_rate: float | None
    """The device cache's, or None without one."""
    ssd_read_bytes_per_example: float
    """Bytes the SSD tier read (whole 4 KiB units, what the disk moves) per example trained."""
    ssd_write_bytes_per_example: float
    ssd_wait_s: float
    """Seconds the ranks spent inside SSD reads and writes, summed over the ranks."""
    ssd_wait_share: float
    """`ssd_wait_s` over the ranks' training seconds (slowest rank's x world size)."""
    evictions_per_example: float
    """Rows the host tier evicted (to the SSD) per example."""
    host_rows: int
    """Rows resident in the host tiers at the end, all ranks."""
    ssd_rows: int

    @classmethod
    def of(cls, store_stats: Sequence[dict[str, Any]], *, examples: int, train_s: float) -> StorePressure:
        """The rates of the ranks' `EmbeddingStore.stats()` (one dict per rank) for `examples` trained in `train_s`
        seconds by the slowest rank."""
        host = _summed(store_stats, "host")
        device = _summed(store_stats, "device")
        ssd = _summed(store_stats, "ssd")
        per = 1 / max(1, examples)
        wait = float(ssd.get("read_s", 0.0) + ssd.get("write_s", 0.0))
        return cls(
            examples=examples,
            host_hit_rate=_rate(host),
            device_hit_rate=_rate(device) if device else None,
            ssd_read_bytes_per_example=ssd.get("bytes_read", 0) * per,
            ssd_write_bytes_per_example=ssd.get("bytes_written", 0) * per,
            ssd_wait_s=wait,
            ssd_wait_share=wait / (train_s * max(1, len(store_stats))) if train_s > 0 else 0.0,
            evictions_per_example=host.get("evictions", 0) * per,
            host_rows=int(host.get("rows", 0)),
            ssd_rows=int(ssd.get("rows", 0)),
        )

    def record(self) -> dict[str, Any]:
        """What the day's record keeps (metrics.json `train.store`)."""
        return asdict(self)

    def summary(self) -> str:
        """One clause of the train line: the device cache's hit rate (with one), the host's, and the SSD's cost once
        rows are evicted to it (before that, its reads are the first touches of rows warm-started on the SSD)."""
        device = "" if self.device_hit_rate is None else f"device hit rate {self.device_hit_rate:.3f}, "
        if self.evictions_per_example == 0:
            return f"store: {device}host hit rate {self.host_hit_rate:.3f}, no evictions"
        return (
            f"store: {device}host hit rate {self.host_hit_rate:.3f}, SSD {self.ssd_read_bytes_per_example:,.0f}+"
            f"{self.ssd_write_bytes_per_example:,.0f} B read+written/example, waited {self.ssd_wait_share:.0%}, "
            f"{self.evictions_per_example:.2f} evictions/example"
            + (" (raise store.host_budget_mb)" if self.ssd_wait_share > 0.2 else "")
        )


def _summed(store_stats: Sequence[dict[str, Any]], tier: str) -> dict[str, float]:
    """The numeric counters of `tier` summed over the ranks (empty when no rank has the tier)."""
    out: dict[str, float] = {}
    for rank in store_stats:
        for name, value in (rank or {}).get(tier, {}).items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                out[name] = out.get(name, 0) + value
    return out


def _rate(counters: dict[str, float]) -> float:
    looked = counters.get("hits", 0) + counters.get("misses", 0)
    return counters.get("hits", 0) / looked if looked else 1.0
