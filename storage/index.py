"""Vectorised int64 key -> slot maps (NumPy), shared by every tier.

`KeyIndex` is an open-addressing hash table (linear probing, Fibonacci
hashing, tombstones) whose operations take whole arrays of keys: each probe
round is one vectorised step over the keys still unresolved, so a batch of N
keys costs O(N * longest probe) NumPy work and no per-key Python loop.

`SlotMap` adds slot allocation on top: a dense slot -> key array (``-1`` for a
free slot) and a free list, so row storage (tensors, an SSD file) can be
addressed by slot and holes are reused.
"""

from __future__ import annotations

import numpy as np

EMPTY = -1
"""Marks a never-used table cell (keys are non-negative)."""
_TOMB = -2
_FIB = np.uint64(0x9E3779B97F4A7C15)
_MAX_LOAD = 0.5


def _as_keys(keys: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(keys, dtype=np.int64)


class KeyIndex:
    """A hash map from non-negative int64 keys to int64 values, batched.

    Args:
        capacity: rows expected; the table grows by doubling when the load passes 1/2.

    Example::

        idx = KeyIndex()
        idx.insert(np.array([7, 9]), np.array([0, 1]))
        idx.get(np.array([9, 8, 7]))  # -> array([ 1, -1,  0])
    """

    def __init__(self, capacity: int = 0) -> None:
        self._alloc(max(16, int(capacity)))

    def _alloc(self, capacity: int) -> None:
        size = 16
        while size * _MAX_LOAD < capacity:
            size *= 2
        self._bits = size.bit_length() - 1
        self._mask = size - 1
        self._keys = np.full(size, EMPTY, dtype=np.int64)
        self._vals = np.zeros(size, dtype=np.int64)
        self._live = 0
        self._filled = 0  # live + tombstones

    def __len__(self) -> int:
        return self._live

    @property
    def table_size(self) -> int:
        """Cells in the hash table (a power of two, at least twice the keys held)."""
        return self._keys.size

    def _home(self, keys: np.ndarray) -> np.ndarray:
        # Fibonacci hashing: the top bits of key * 2^64/phi mix every key bit.
        with np.errstate(over="ignore"):
            h = keys.view(np.uint64) * _FIB
        return (h >> np.uint64(64 - self._bits)).astype(np.int64)

    def _find(self, keys: np.ndarray) -> np.ndarray:
        """Table position of each key, -1 when absent."""
        n = keys.size
        out = np.full(n, -1, dtype=np.int64)
        if n == 0 or self._live == 0:
            return out
        pos = self._home(keys)
        pending = np.arange(n)
        while pending.size:
            p = pos[pending]
            found = self._keys[p]
            hit = found == keys[pending]
            out[pending[hit]] = p[hit]
            keep = ~(hit | (found == EMPTY))
            pending = pending[keep]
            pos[pending] = (p[keep] + 1) & self._mask
        return out

    def get(self, keys: np.ndarray) -> np.ndarray:
        """Value of each key (duplicates allowed), -1 when absent."""
        keys = _as_keys(keys)
        pos = self._find(keys)
        out = np.full(keys.size, -1, dtype=np.int64)
        ok = pos >= 0
        out[ok] = self._vals[pos[ok]]
        return out

    def insert(self, keys: np.ndarray, vals: np.ndarray) -> None:
        """Add `keys` (distinct, absent, non-negative) with `vals`.  Callers guarantee absence."""
        keys = _as_keys(keys)
        vals = np.ascontiguousarray(vals, dtype=np.int64)
        if keys.size == 0:
            return
        if (self._filled + keys.size) > _MAX_LOAD * self._keys.size:
            self._rehash(self._live + keys.size)
        pos = self._home(keys)
        pending = np.arange(keys.size)
        while pending.size:
            p = pos[pending]
            free = self._keys[p] < 0
            cand, cp = pending[free], p[free]
            if cand.size:
                # Several keys of the batch may probe the same free cell: the first wins.
                cells, first = np.unique(cp, return_index=True)
                winners = cand[first]
                self._filled += int(np.count_nonzero(self._keys[cells] == EMPTY))
                self._keys[cells] = keys[winners]
                self._vals[cells] = vals[winners]
                placed = np.zeros(keys.size, dtype=bool)
                placed[winners] = True
                keep = ~placed[pending]
            else:
                keep = np.ones(pending.size, dtype=bool)
            pending = pending[keep]
            pos[pending] = (p[keep] + 1) & self._mask
        self._live += keys.size

    def remove(self, keys: np.ndarray) -> np.ndarray:
        """Delete `keys` (distinct); returns their values, -1 for keys that were absent."""
        keys = _as_keys(keys)
        pos = self._find(keys)
        out = np.full(keys.size, -1, dtype=np.int64)
        ok = pos >= 0
        out[ok] = self._vals[pos[ok]]
        self._keys[pos[ok]] = _TOMB
        self._live -= int(np.count_nonzero(ok))
        return out

    def _rehash(self, need: int) -> None:
        live = self._keys >= 0
        keys, vals = self._keys[live], self._vals[live]
        self._alloc(max(2 * need, 16))  # headroom, so a run of small inserts does not rehash each time
        self.insert(keys, vals)

    def clear(self) -> None:
        """Remove every key."""
        self._alloc(16)


class SlotMap:
    """Keys -> dense slots with a free list; slot -> key kept in `slot_keys` (-1 = free).

    Args:
        capacity: fixed number of slots, or None to grow without bound.
    """

    def __init__(self, capacity: int | None = None) -> None:
        self.capacity = capacity
        self._index = KeyIndex(capacity or 0)
        self.slot_keys = np.full(capacity or 0, EMPTY, dtype=np.int64)
        self.high_water = 0  # slots [0, high_water) have been used at least once
        self._free = np.empty(0, dtype=np.int64)

    def __len__(self) -> int:
        return len(self._index)

    @property
    def free_slots(self) -> int:
        """Slots that `add` can take without growing."""
        if self.capacity is None:
            return self._free.size
        return self._free.size + (self.capacity - self.high_water)

    def lookup(self, keys: np.ndarray) -> np.ndarray:
        """Slot of each key, -1 when absent (duplicates allowed)."""
        return self._index.get(keys)

    def add(self, keys: np.ndarray) -> np.ndarray:
        """Allocate slots for `keys` (distinct, absent); reuses freed slots first."""
        keys = _as_keys(keys)
        n = keys.size
        if n == 0:
            return np.empty(0, dtype=np.int64)
        if self.capacity is not None and n > self.free_slots:
            raise ValueError(f"SlotMap full: {n} new keys, {self.free_slots} free of {self.capacity}")
        reuse = min(n, self._free.size)
        slots = np.empty(n, dtype=np.int64)
        if reuse:
            slots[:reuse] = self._free[self._free.size - reuse :]
            self._free = self._free[: self._free.size - reuse]
        fresh = n - reuse
        if fresh:
            slots[reuse:] = np.arange(self.high_water, self.high_water + fresh)
            self.high_water += fresh
            if self.high_water > self.slot_keys.size:
                grown = np.full(max(self.high_water, 2 * self.slot_keys.size, 1024), EMPTY, dtype=np.int64)
                grown[: self.slot_keys.size] = self.slot_keys
                self.slot_keys = grown
        self.slot_keys[slots] = keys
        self._index.insert(keys, slots)
        return slots

    def remove(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Free the slots of `keys` (distinct); returns (present mask, their slots)."""
        slots = self._index.remove(keys)
        ok = slots >= 0
        freed = slots[ok]
        self.slot_keys[freed] = EMPTY
        self._free = np.concatenate([self._free, freed])
        return ok, freed

    def live_slots(self) -> np.ndarray:
        """Slots in use, ascending."""
        return np.flatnonzero(self.slot_keys[: self.high_water] >= 0)

    def load(self, slot_keys: np.ndarray) -> None:
        """Replace the content with `slot_keys` (slot -> key, -1 for a free slot)."""
        slot_keys = np.ascontiguousarray(slot_keys, dtype=np.int64)
        if self.capacity is not None and slot_keys.size > self.capacity:
            raise ValueError(f"{slot_keys.size} slots do not fit a SlotMap of capacity {self.capacity}")
        live = np.flatnonzero(slot_keys >= 0)
        keys = slot_keys[live]
        if np.unique(keys).size != keys.size:
            raise ValueError("slot -> key array holds a key twice")
        self._index = KeyIndex(keys.size)
        self._index.insert(keys, live)
        self.high_water = slot_keys.size
        size = max(self.capacity or 0, slot_keys.size)
        self.slot_keys = np.full(size, EMPTY, dtype=np.int64)
        self.slot_keys[: slot_keys.size] = slot_keys
        self._free = np.flatnonzero(slot_keys < 0)[::-1].copy()

    def clear(self) -> None:
        """Remove every key and free every slot (capacity unchanged)."""
        self.__init__(self.capacity)  # type: ignore[misc]
