"""Vectorised int64 key -> slot maps (NumPy), shared by every tier.

`KeyIndex` is an open-addressing hash table (linear probing, Fibonacci
hashing, tombstones) whose operations take whole arrays of keys: each probe
round is one vectorised step over the keys still unresolved, so a batch of N
keys costs O(N * longest probe) NumPy work and no per-key Python loop.

Each home cell has a filter byte: bit ``b`` is set when a key with that home
and filter bit ``b`` (3 hash bits the home does not depend on) was inserted, so
about 94% of absent keys are proved absent by one read of a byte array 1/12 the
table's size, and never touch the key table (an absent key's probe run would go
on to the next EMPTY cell, longer than a present key's).  A batch
whose first `_SAMPLE` keys are mostly absent starts with the filter; others
start with the home cells, and the filter is not read for them.  `remove`
leaves stale bits (they cost a probe, never a wrong answer) until a rehash.

Lookups probe one cell per key per round (a 1-D gather: the cheapest NumPy
step; at load <= 1/2 most hits end at the home cell) while many keys are
pending; the last few keys compare a window of `_WINDOW` consecutive cells per
round, so a long probe run costs few rounds.  The table
never wraps around: it has `_PAD` overflow cells after its `size` home cells,
and an insert that would run past them grows the table instead.  Home cells are
picked by multiply-shift ("fastrange") from the Fibonacci hash, so the table
size need not be a power of two and a known capacity is allocated tightly.

`SlotMap` adds slot allocation on top: a dense slot -> key array (``-1`` for a
free slot) and a free list, so row storage (tensors, an SSD file) can be
addressed by slot and holes are reused.  Its slots are int32 (2^31 - 1 rows per
map), which keeps the index at 13 bytes per cell (8 key, 4 value, 1 filter).
"""

from __future__ import annotations

import numpy as np

EMPTY = -1
"""Marks a never-used table cell (keys are non-negative)."""
_TOMB = -2
_FIB = np.uint64(0x9E3779B97F4A7C15)
_S32 = np.uint64(32)
_S29 = np.uint64(29)
_LE64 = np.dtype("<u8")
"""Little-endian: byte i of a window's comparison (cell i) is bits 8i..8i+7."""
_BIT = np.array([1 << i for i in range(8)], dtype=np.uint8)
_MAX_LOAD = 0.5
_GROWTH = 1.5
"""On growth, room for this many times the live keys (load about 1/3 right after)."""
INITIAL_SLOTS = 1 << 16
"""The slots a bounded `SlotMap` (and `SlotCache`) makes room for at first; each grows with the keys it holds, up to
its capacity."""
_WINDOW = 8
"""Cells compared per key per window round (8: the matches of a window read as one uint64)."""
_SAMPLE = 64
"""Keys whose filter bits decide how a lookup starts (filter first when a quarter are absent)."""
_CELL_ROUNDS_MIN = 512
"""Pending keys below which probing switches from one cell per round to windows."""
_PAD = 64
MAX_SLOTS = 2**31 - 1
"""Slots a `SlotMap` can address (int32)."""


def _as_keys(keys: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(keys, dtype=np.int64)


class KeyIndex:
    """A hash map from non-negative int64 keys to integer values, batched.

    Args:
        capacity: keys expected; the table is sized for them at load 1/2 and grows
            (to load about 1/3) when more are inserted.
        value_dtype: dtype of the stored values (int64, or int32 to save memory).

    Example::

        idx = KeyIndex()
        idx.insert(np.array([7, 9]), np.array([0, 1]))
        idx.get(np.array([9, 8, 7]))  # -> array([ 1, -1,  0])
    """

    def __init__(self, capacity: int = 0, *, value_dtype: type | np.dtype = np.int64) -> None:
        self._vdtype = np.dtype(value_dtype)
        if self._vdtype.kind != "i":
            raise TypeError(f"value_dtype must be a signed integer dtype, got {self._vdtype}")
        if capacity < 0:
            raise ValueError(f"capacity must be >= 0, got {capacity}")
        self._alloc(int(capacity))

    def _alloc(self, capacity: int) -> None:
        size = max(16, int(np.ceil(max(capacity, 1) / _MAX_LOAD)))
        self._size = size
        self._usize = np.uint64(size)
        self._keys = np.full(size + _PAD, EMPTY, dtype=np.int64)
        self._vals = np.zeros(size + _PAD, dtype=self._vdtype)
        self._filter = np.zeros(size + _PAD, dtype=np.uint8)  # per home cell: bits of the keys homed there
        self._wins = np.lib.stride_tricks.sliding_window_view(self._keys, _WINDOW)
        self._live = 0
        self._filled = 0  # live + tombstones

    def __len__(self) -> int:
        return self._live

    @property
    def table_size(self) -> int:
        """Cells in the hash table (home cells plus overflow), at least twice the keys held."""
        return self._keys.size

    @property
    def nbytes(self) -> int:
        """Memory held by the table and its filter."""
        return self._keys.nbytes + self._vals.nbytes + self._filter.nbytes

    def _hash(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(home cell, filter bit 0..7) of each key."""
        # Fibonacci hashing mixes every key bit into the top 32; multiply-shift maps them to [0, size).
        # The filter bit comes from bits 29..31, which the home cell does not depend on.
        h = keys.view(np.uint64) * _FIB  # wraps mod 2^64 (array arithmetic does not warn)
        bit = (h >> _S29).astype(np.uint8)
        bit &= 7
        h >>= _S32
        h *= self._usize
        h >>= _S32
        return h.view(np.int64), bit

    def _maybe(self, home: np.ndarray, bit: np.ndarray) -> np.ndarray:
        """False where the filter proves a key absent: no key with that home cell had that bit."""
        maybe: np.ndarray = np.right_shift(self._filter[home], bit)
        maybe &= 1
        return maybe.view(bool)

    def _find(self, keys: np.ndarray) -> np.ndarray:
        """Table position of each key, -1 when absent."""
        n = keys.size
        if n == 0 or self._live == 0:
            return np.full(n, -1, dtype=np.int64)
        tab = self._keys
        home, bit = self._hash(keys)
        if (~self._maybe(home[:_SAMPLE], bit[:_SAMPLE])).sum() * 4 >= min(n, _SAMPLE):
            # Many absent keys (judged on the first `_SAMPLE`): the filter first, so most of them
            # never touch the (large) key table; the rest are probed below.
            out = np.full(n, -1, dtype=np.int64)
            pending = np.flatnonzero(self._maybe(home, bit))
            cur = home[pending]
        else:
            # Mostly present keys: read each home cell (a 1-D gather, the cheapest NumPy step);
            # most keys are found there, or proved absent by an EMPTY cell.
            found = tab[home]
            hit = found == keys
            out = np.where(hit, home, -1)
            pending = np.flatnonzero(~hit & (found != EMPTY))
            cur = home[pending] + 1
        if pending.size == 0:
            return out
        pk = keys[pending]
        # Later rounds.  A key never sits after an EMPTY cell of its probe run (cells only turn
        # EMPTY -> key -> tombstone), so an EMPTY ends the search.  While many keys are pending,
        # each round reads one more cell per key (most runs end within a few cells); the few keys
        # left then compare a window of `_WINDOW` cells per round (rows of a strided view of the
        # table: a gather that costs ~10x a cell per key, but ends a long run in few rounds).
        last = tab.size - 1
        np.minimum(cur, last, out=cur)
        while pending.size > _CELL_ROUNDS_MIN:
            cell = tab[cur]
            hit = cell == pk
            if hit.any():
                out[pending[hit]] = cur[hit]
            keep = ~hit & (cell != EMPTY) & (cur < last)
            pending, cur, pk = pending[keep], cur[keep] + 1, pk[keep]
        wins, last_start = self._wins, tab.size - _WINDOW
        start = cur
        while pending.size:
            np.minimum(start, last_start, out=start)
            win = wins[start]
            # A window's 8 comparison bytes read as one uint64: nonzero = some cell matched.
            match = (win == pk[:, None]).view(_LE64).ravel()
            if match.any():
                # At most one cell matches: its byte is the only nonzero one, at bit 8 * offset.
                hit = match != 0
                m = match[hit]
                m -= 1
                out[pending[hit]] = start[hit] + (np.bitwise_count(m) >> 3)
            match |= (win == EMPTY).view(_LE64).ravel()
            keep = match == 0  # neither found nor ended by an EMPTY cell
            keep &= start < last_start  # the window reached the last overflow cell: absent
            pending = pending[keep]
            start = start[keep] + _WINDOW
            pk = pk[keep]
        return out

    def get(self, keys: np.ndarray) -> np.ndarray:
        """Value of each key (int64, duplicates allowed), -1 when absent."""
        keys = _as_keys(keys)
        pos = self._find(keys)
        out: np.ndarray = self._vals[pos].astype(np.int64)  # pos -1 reads the last cell; overwritten below
        out[pos < 0] = -1
        return out

    def insert(self, keys: np.ndarray, vals: np.ndarray) -> None:
        """Add `keys` (distinct, absent, non-negative) with `vals`.  Callers guarantee absence.

        Raises:
            ValueError: a value does not fit the value dtype.
        """
        keys = _as_keys(keys)
        vals = np.asarray(vals)
        if keys.size == 0:
            return
        info = np.iinfo(self._vdtype)
        if info.bits < 64 and (int(vals.max()) > info.max or int(vals.min()) < info.min):
            raise ValueError(f"values must fit {self._vdtype}, got range [{vals.min()}, {vals.max()}]")
        if (self._filled + keys.size) > _MAX_LOAD * self._size:
            self._rehash(int((self._live + keys.size) * _GROWTH))
        while keys.size:
            rest = self._place(keys, vals)
            if rest.size == 0:
                return
            # A probe run reached the end of the overflow cells: grow, then place the rest.
            keys, vals = keys[rest], vals[rest]
            self._rehash(int(max(self._live + keys.size, self._size * _MAX_LOAD) * _GROWTH))

    def _place(self, keys: np.ndarray, vals: np.ndarray) -> np.ndarray:
        """Put each key in the first free cell of its probe run; returns the positions (in `keys`)
        of the keys whose run would pass the overflow cells (those are not placed)."""
        tab = self._keys
        end = tab.size
        n = keys.size
        pos, bit = self._hash(keys)
        # Filter bits are set for every key up front (a key that ends up not placed here is
        # re-inserted after growth, which rebuilds the filter); they are never cleared by
        # `remove` (a stale bit only costs a probe) until the next rehash.
        np.bitwise_or.at(self._filter, pos, _BIT[bit])
        pending = np.arange(n)
        while pending.size:
            p = pos[pending]
            over = p >= end
            if over.any():
                return pending[over]  # the others were placed in earlier rounds or are placed now
            free = tab[p] < 0
            cand, cp = pending[free], p[free]
            if cand.size:
                # Several keys may probe the same free cell: write them all; the one that stuck wins.
                was_empty = tab[cp] == EMPTY
                tab[cp] = keys[cand]
                won = tab[cp] == keys[cand]
                winners, wcells = cand[won], cp[won]
                self._vals[wcells] = vals[winners]
                self._filled += int(np.count_nonzero(was_empty[won]))
                self._live += winners.size
                placed = np.zeros(n, dtype=bool)
                placed[winners] = True
                keep = ~placed[pending]
            else:
                keep = np.ones(pending.size, dtype=bool)
            pending = pending[keep]
            pos[pending] = p[keep] + 1
        return pending

    def remove(self, keys: np.ndarray) -> np.ndarray:
        """Delete `keys` (distinct); returns their values, -1 for keys that were absent."""
        keys = _as_keys(keys)
        pos = self._find(keys)
        ok = pos >= 0
        out = np.full(keys.size, -1, dtype=np.int64)
        out[ok] = self._vals[pos[ok]]
        self._keys[pos[ok]] = _TOMB
        self._live -= int(np.count_nonzero(ok))
        return out

    def items(self) -> tuple[np.ndarray, np.ndarray]:
        """(keys, values) of every live entry, in table order."""
        live = self._keys >= 0
        return self._keys[live], self._vals[live].astype(np.int64)

    def _rehash(self, capacity: int) -> None:
        live = self._keys >= 0
        keys, vals = self._keys[live], self._vals[live]
        del live
        self._keys = self._vals = None  # type: ignore[assignment]  # free the old table first
        self._alloc(max(capacity, keys.size, 16))
        self.insert(keys, vals)


class SlotMap:
    """Keys -> dense slots with a free list; slot -> key kept in `slot_keys` (-1 = free).

    Args:
        capacity: fixed number of slots, or None to grow without bound.
    """

    def __init__(self, capacity: int | None = None) -> None:
        if capacity is not None and not 0 <= capacity <= MAX_SLOTS:
            raise ValueError(f"SlotMap capacity must be in [0, {MAX_SLOTS}], got {capacity}")
        self.capacity = capacity
        # sized for the keys as they come, not for `capacity` up front: a small day under a large budget would
        # otherwise fill (and free) a table for millions of keys it never holds
        start = min(capacity or 0, INITIAL_SLOTS)
        self._index = KeyIndex(start, value_dtype=np.int32)
        self.slot_keys = np.full(start, EMPTY, dtype=np.int64)
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
        fresh = n - reuse
        if self.high_water + fresh > MAX_SLOTS:
            raise ValueError(f"SlotMap cannot address more than {MAX_SLOTS} slots")
        slots = np.empty(n, dtype=np.int64)
        if reuse:
            slots[:reuse] = self._free[self._free.size - reuse :]
            self._free = self._free[: self._free.size - reuse]
        if fresh:
            slots[reuse:] = np.arange(self.high_water, self.high_water + fresh)
            self.high_water += fresh
            if self.high_water > self.slot_keys.size:
                size = max(self.high_water, int(_GROWTH * self.slot_keys.size), 1024)
                grown = np.full(size, EMPTY, dtype=np.int64)
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

    def clear(self) -> None:
        """Remove every key and free every slot (capacity unchanged)."""
        self.__init__(self.capacity)  # type: ignore[misc]
