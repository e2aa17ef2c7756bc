"""`MemoryStore`: the in-memory reference implementation of the store contract.

Use it in every test above the storage layer, and as the model for the other
tiers: a `SlotMap` (vectorised key -> slot hash index with a free list) over a
`RowBuffer` (growable row tensors of its `RowFormat` on one device).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from storage.embedding.base import EmbeddingStore, Lookup, as_row_format
from storage.embedding.index import SlotMap
from storage.embedding.rows.batch import Rows
from storage.embedding.rows.buffer import RowBuffer
from storage.embedding.rows.checks import check_keys
from storage.embedding.rows.format import RowFormat
from storage.embedding.rows.initial import init_rows
from storage.embedding.snapshot import (
    SnapshotWriter,
    check_snapshot_dim,
    iter_snapshot,
)


class MemoryStore(EmbeddingStore):
    """All rows in memory on one device (CPU or GPU).

    Args:
        dim: the rows' `RowFormat` (an int: its width, fp32 rows with Adam).
        init_std: std of `init_rows` for unseen keys.
        device: where the row tensors live; `lookup` returns rows there.

    Example::

        store = MemoryStore(16)
        rows = store.lookup(torch.tensor([3, 5, 3])).rows      # (3, 16), initialised, not stored
        store.update(torch.tensor([3, 3]), torch.ones(2, 16), lr=0.01)
        len(store)                                              # 1
    """

    tier = "memory"

    def __init__(self, dim: int | RowFormat, *, init_std: float = 0.01, device: torch.device | str = "cpu") -> None:
        fmt = as_row_format(dim)
        if not init_std > 0:
            raise ValueError(f"init_std must be > 0, got {init_std}")
        self.row_format = fmt
        self.dim = fmt.dim
        self._row_bytes = fmt.row_bytes()
        self.init_std = init_std
        self.device = torch.device(device)
        self._map = SlotMap()
        self._buf = RowBuffer(fmt, self.device)
        self._counters = dict.fromkeys(("hits", "misses", "bytes_read", "bytes_written", "evictions"), 0)

    # -- tier-to-tier interface -------------------------------------------------
    def read_rows(self, keys: np.ndarray) -> tuple[np.ndarray, Rows]:
        keys = np.ascontiguousarray(keys, dtype=np.int64)
        slots = self._map.lookup(keys)
        found = slots >= 0
        nf = int(found.sum())
        if nf == keys.size:
            rows = self._buf.gather(slots)
        else:
            rows = self.row_format.fresh(init_rows(torch.from_numpy(keys), self.dim, self.init_std).to(self.device))
            if nf:
                rows.put(np.flatnonzero(found), self._buf.gather(slots[found]))
        self._counters["hits"] += nf
        self._counters["misses"] += keys.size - nf
        self._counters["bytes_read"] += nf * self._row_bytes
        return found, rows

    def write_rows(self, keys: np.ndarray, rows: Rows) -> None:
        keys = np.ascontiguousarray(keys, dtype=np.int64)
        slots = self._map.lookup(keys)
        new = slots < 0
        if new.any():
            slots[new] = self._map.add(keys[new])
        self._buf.scatter(slots, rows)
        self._counters["bytes_written"] += keys.size * self._row_bytes

    def contains(self, keys: np.ndarray) -> np.ndarray:
        return self._map.lookup(np.ascontiguousarray(keys, dtype=np.int64)) >= 0

    # -- contract -----------------------------------------------------------------
    def lookup(self, keys: torch.Tensor) -> Lookup:
        k = check_keys(keys)
        slots = self._map.lookup(k)
        found = slots >= 0
        nf = int(found.sum())
        if nf == k.size:
            out = self._buf.gather_emb(slots)
        else:
            out = torch.empty((k.size, self.dim), dtype=torch.float32, device=self.device)
            miss = np.flatnonzero(~found)
            fmt = self.row_format
            out[torch.from_numpy(miss).to(self.device)] = fmt.weights(
                fmt.nearest(init_rows(torch.from_numpy(k[miss]), self.dim, self.init_std))
            ).to(self.device)
            if nf:
                out[torch.from_numpy(np.flatnonzero(found)).to(self.device)] = self._buf.gather_emb(slots[found])
        self._counters["hits"] += nf
        self._counters["misses"] += k.size - nf
        self._counters["bytes_read"] += nf * self.row_format.dtype.itemsize * self.row_format.width
        return Lookup(torch.from_numpy(k.copy()), out)

    def evict(self, keys: torch.Tensor) -> None:
        k = np.unique(check_keys(keys))
        ok, _ = self._map.remove(k)
        self._counters["evictions"] += int(ok.sum())

    def iter_rows(self, batch_rows: int = 1 << 16) -> Any:
        """Yield (keys, Rows) of every row in ascending key order, `batch_rows` at a time."""
        slots = self._map.live_slots()
        keys = self._map.slot_keys[slots]
        order = np.argsort(keys, kind="stable")
        keys, slots = keys[order], slots[order]
        for lo in range(0, keys.size, batch_rows):
            yield keys[lo : lo + batch_rows], self._buf.gather(slots[lo : lo + batch_rows])

    def snapshot(self, url: str, storage_options: dict[str, Any] | None = None) -> int:
        with SnapshotWriter(url, self.row_format, storage_options) as w:
            for keys, rows in self.iter_rows():
                w.write(keys, rows)
        return w.rows

    def restore(
        self, url: str, *, owner: tuple[int, int] | None = None, storage_options: dict[str, Any] | None = None
    ) -> int:
        check_snapshot_dim(url, self.dim, storage_options)
        self._map.clear()
        self._buf.reset()
        for b in iter_snapshot(url, owner=owner, storage_options=storage_options):
            rows = b.rows_as(self.row_format)
            keys, last = _last_occurrence(b.keys)
            self.write_rows(keys, rows.select(last))
        return len(self)

    def stats(self) -> dict[str, Any]:
        return {self.tier: {**self._counters, "rows": len(self)}}

    def __len__(self) -> int:
        return len(self._map)

    def close(self) -> None:
        self._map.clear()
        self._buf.reset()


def _last_occurrence(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct keys and the position of each one's last occurrence (later rows win)."""
    rev = keys[::-1]
    uniq, first_in_rev = np.unique(rev, return_index=True)
    return uniq, keys.size - 1 - first_in_rev
