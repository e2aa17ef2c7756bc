"""`ResidentRows`: which rows a caching tier holds, and the moves between it and the tier below.

A `storage.embedding.caching_tier.CachingTier` answers the store contract; this is the cache under it:
its slots and policy (`storage.embedding.slot_cache.SlotCache`), its rows (`RowBuffer`), the dirty and
in-below flags, and the one step every call starts with, `resolve`: make a batch's keys resident where
they fit, reading the misses below, admitting and evicting once for the whole batch (dirty victims go
below in one `write_rows` call), and handing back the keys that did not fit.
"""

from __future__ import annotations

import numpy as np
import torch

from storage.embedding.base import EmbeddingStore
from storage.embedding.rows.batch import Rows
from storage.embedding.rows.buffer import RowBuffer
from storage.embedding.rows.format import RowFormat
from storage.embedding.rows.initial import init_rows
from storage.embedding.slot_cache import SlotCache


class StoreCapacityError(RuntimeError):
    """A tier with no tier below ran out of room for rows it must keep."""


class ResidentRows:
    """The rows a caching tier holds over an optional tier below.

    Args:
        fmt: the rows' format.
        tier: the tier's name (messages).
        init_std: std of `init_rows` for keys neither here nor below.
        device: where the rows live.
        capacity: rows held at most (None: unbounded).
        policy: ``"lfu"`` or ``"lru"``.
        below: the tier below, or None.
        preallocate: allocate all `capacity` rows up front instead of growing.
        evict_extra: eviction slack, a fraction of `capacity` (see `SlotCache`).

    Attributes:
        cache: slots, policy and the dirty / in-below flags (replaced by `clear`).
        buf: the rows, by slot.
        counters: hits, misses, bytes_read, bytes_written, evictions (see `CachingTier`).
    """

    def __init__(
        self,
        fmt: RowFormat,
        *,
        tier: str,
        init_std: float,
        device: torch.device,
        capacity: int | None,
        policy: str,
        below: EmbeddingStore | None,
        preallocate: bool,
        evict_extra: float,
    ) -> None:
        self.fmt = fmt
        self.tier = tier
        self.row_bytes = fmt.row_bytes()
        self.init_std = init_std
        self.below = below
        self.cache = SlotCache(capacity, policy, evict_extra=evict_extra)
        self.buf = RowBuffer(
            fmt, device, capacity if (preallocate and capacity) else 0, fixed=preallocate, limit=capacity
        )
        self.counters = dict.fromkeys(("hits", "misses", "bytes_read", "bytes_written", "evictions"), 0)

    def read_below(self, keys: np.ndarray) -> tuple[np.ndarray, Rows]:
        """(found-below mask, rows) of `keys`: read below, or their initial rows where there is no below."""
        if self.below is None or keys.size == 0:
            fresh = self.fmt.fresh(init_rows(torch.from_numpy(keys), self.fmt.dim, self.init_std))
            return np.zeros(keys.size, dtype=bool), fresh
        found, rows = self.below.read_rows(keys)
        self.counters["bytes_read"] += int(found.sum()) * self.row_bytes
        return found, rows

    def write_below(self, keys: np.ndarray, rows: Rows) -> None:
        if keys.size == 0:
            return
        if self.below is None:
            raise StoreCapacityError("no tier below to write rows to")  # unreachable: unbounded without below
        self.below.write_rows(keys, rows)
        self.counters["bytes_written"] += keys.size * self.row_bytes

    def admit_plan(self, counts: np.ndarray, protect: np.ndarray) -> np.ndarray:
        """Evict for the newcomers with `counts`; returns the admit mask over them."""
        c = self.cache
        if self.below is None:
            if c.capacity is not None and counts.size > c.map.free_slots:
                raise StoreCapacityError(
                    f"{self.tier} tier is full ({c.capacity} rows, {counts.size} new) and has no tier below "
                    "to spill to; raise its budget or give it a `below` tier"
                )
            return np.ones(counts.size, dtype=bool)
        gone, admit = c.plan(counts, protect)
        self.drop(gone, write_back=True)
        return admit

    def drop(self, slots: np.ndarray, *, write_back: bool) -> None:
        """Forget the rows at `slots`; with `write_back`, dirty ones go below first (an eviction)."""
        c = self.cache
        if slots.size == 0:
            return
        keys = c.map.slot_keys[slots]
        if write_back:
            dirty = c.dirty[slots]
            if dirty.any():
                self.write_below(keys[dirty], self.buf.gather(slots[dirty]))
            self.counters["evictions"] += slots.size
        c.map.remove(keys)
        c.dirty[slots] = False
        c.in_below[slots] = False

    def resolve(
        self,
        keys: np.ndarray,
        counts: np.ndarray | int,
        mode: str,
        *,
        slots: np.ndarray | None = None,
        below: tuple[np.ndarray, Rows | None] | None = None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, Rows | None]:
        """Make the distinct `keys` resident where they fit.

        mode: ``"read"`` admits only rows the tier below holds; ``"create"`` admits
        every key (reading old values below); ``"write"`` admits every key without
        reading below (the caller overwrites the rows).

        slots: the keys' slots when the caller has just looked them up (the map unchanged since),
        so they are not hashed again; `below`: (found mask, rows) of the keys with slot -1 as just
        read from the tier below (an earlier `lookup` of the same keys), so they are not read again.

        Returns (slots (-1: not resident), outside positions, found-below mask of
        the outside keys, rows of the outside keys (None in write mode)).
        """
        c = self.cache
        c.next_tick()
        slots = c.map.lookup(keys) if slots is None else slots
        miss = np.flatnonzero(slots < 0)
        self.counters["hits"] += keys.size - miss.size
        self.counters["misses"] += miss.size
        outside = miss
        found_out = np.zeros(0, dtype=bool)
        rows_out: Rows | None = None
        if miss.size:
            mkeys = keys[miss]
            if mode == "write":
                found = self.below.contains(mkeys) if self.below is not None else np.zeros(miss.size, dtype=bool)
                rows = None
            elif below is not None and below[1] is not None:
                found, rows = below  # read below by the lookup just before: count the read, do not redo it
                self.counters["bytes_read"] += int(found.sum()) * self.row_bytes if self.below is not None else 0
            else:
                found, rows = self.read_below(mkeys)
            want = found if mode == "read" else np.ones(miss.size, dtype=bool)
            want_idx = np.flatnonzero(want)
            mcounts = counts[miss] if isinstance(counts, np.ndarray) else np.ones(miss.size, dtype=np.int64)
            take = want_idx[self.admit_plan(mcounts[want_idx], slots[slots >= 0])]
            if take.size:
                new = c.add(mkeys[take])
                if rows is not None:
                    self.buf.scatter(new, rows.select(take))
                c.in_below[new] = found[take]
                slots[miss[take]] = new
            rest = np.ones(miss.size, dtype=bool)
            rest[take] = False
            outside = miss[rest]
            found_out = found[rest]
            rows_out = rows.select(np.flatnonzero(rest)) if rows is not None else None
        res = slots >= 0
        c.touch(slots[res], counts[res] if isinstance(counts, np.ndarray) else counts)
        return slots, outside, found_out, rows_out

    def materialised_slots(self) -> np.ndarray:
        """Slots of the rows that are part of the store: dirty here, or held below too."""
        c = self.cache
        live = c.map.live_slots()
        slots: np.ndarray = live[c.dirty[live] | c.in_below[live]]
        return slots

    def write_dirty(self) -> None:
        """Write every dirty row below; they stay here, clean."""
        c = self.cache
        live = c.map.live_slots()
        dirty = live[c.dirty[live]]
        if dirty.size:
            self.write_below(c.map.slot_keys[dirty], self.buf.gather(dirty))
            c.dirty[dirty] = False
            c.in_below[dirty] = True

    def clear(self, *, release: bool = False) -> None:
        """Forget every row; the buffer is zeroed in place (`RowBuffer.reset`), or freed (`release`)."""
        self.cache = SlotCache(self.cache.capacity, self.cache.policy, evict_extra=self.cache.evict_extra)
        if release:
            self.buf.release()
        else:
            self.buf.reset()
