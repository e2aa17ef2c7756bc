"""`UnitLog`: where a log-structured SSD shard appends rows, and which units it reclaims.

Rewriting a row in place would read-modify-write its whole unit (O_DIRECT moves
units, not records).  Instead a batch of rows, new or updated, is appended,
packed, to fresh slots at the log's tail: the rest of the tail unit, then free
units (lowest first), then new units at the end of the file.  The old slots
become garbage, counted per unit.  A unit left with no live row is free for later
appends; a unit left with fewer than `gc_rows` live rows is reclaimed by the
append that leaves it so (its other live rows move to the tail with the batch).
Every used unit but the tail and one just-filled tail then holds at least
`gc_rows` live rows, which bounds the row file (see `storage.embedding.ssd.shard_file`).

This module is the bookkeeping only (NumPy, no I/O); `ShardFile` reads and writes.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

RECHECK_UNITS = 1024
"""Units of a reopened shard checked against the threshold per append (bounds its extra I/O)."""


class UnitLog:
    """Live rows per unit, the free units and the tail of a shard's row file.

    Args:
        rows_per_unit: records per unit.
        gc_rows: a unit with fewer live rows than this (and at least one) is reclaimed.
        record: the record dtype (the tail unit's content is kept in memory as records).

    Attributes:
        live: int32 live rows of each unit.
        free_units: units with no live row, ascending (taken lowest first).
        tail_unit: the unit appends fill next (-1: none); its records are `tail_recs`.
    """

    def __init__(self, rows_per_unit: int, gc_rows: int, record: np.dtype) -> None:
        self.rows_per_unit = rows_per_unit
        self.gc_rows = gc_rows
        self._record = record
        self.live = np.zeros(0, dtype=np.int32)
        self.reset(0)

    def add_live(self, slots: np.ndarray) -> None:
        """Count the rows now held at `slots`."""
        if slots.size == 0:
            return
        units = slots // self.rows_per_unit
        need = int(units.max()) + 1
        if need > self.live.size:
            self.live.resize(max(need, int(self.live.size * 1.25), 1024), refcheck=False)
        np.add.at(self.live, units, 1)

    def recount(self, high_water: int, slot_batches: Iterable[np.ndarray]) -> None:
        """Rebuild the live counts from every held slot (below `high_water`), then `reset`."""
        self.live = np.zeros(-(-high_water // self.rows_per_unit), dtype=np.int32)
        for slots in slot_batches:
            self.add_live(slots)
        self.reset(high_water)

    def packed(self, n_rows: int) -> None:
        """The file now holds `n_rows` rows in slots [0, n_rows) (after compaction), then `reset`."""
        rpu = self.rows_per_unit
        self.live = np.full(-(-n_rows // rpu), rpu, dtype=np.int32)
        if n_rows % rpu:
            self.live[-1] = n_rows % rpu
        self.reset(n_rows)

    def clear(self) -> None:
        """No rows at all (an emptied file)."""
        self.live = np.zeros(0, dtype=np.int32)
        self.reset(0)

    def reset(self, high_water: int) -> None:
        """Rebuild the allocator from the live counts (after open, wipe, compaction).

        Units past the high water are never used; units with no live row are free; units
        under the threshold (a reopened shard's, or a partial last unit) are reclaimed by the
        next appends.  The tail unit is unknown after a reopen: appends start a new one."""
        end = -(-high_water // self.rows_per_unit)
        live = self.live[:end]
        self._end_unit = end  # units [0, end) may hold rows
        self.free_units = np.flatnonzero(live == 0)
        self._recheck = np.flatnonzero((live > 0) & (live < self.gc_rows))
        self.tail_unit = -1
        self._tail_fill = 0
        self.tail_recs = np.zeros(self.rows_per_unit, dtype=self._record)

    # -- one append ------------------------------------------------------------------------------
    def state(self) -> tuple[Any, ...]:
        """What `allocate` and `victims` change, for `rollback` when the write that follows fails."""
        return (self.free_units, self._end_unit, self.tail_unit, self._tail_fill, self._recheck)

    def rollback(self, state: tuple[Any, ...]) -> None:
        (self.free_units, self._end_unit, self.tail_unit, self._tail_fill, self._recheck) = state

    def victims(self, gone: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Units to reclaim once the `gone` slots die.

        Returns (units left with 0 < live < gc_rows, units left empty that `gone` does not
        touch); the tail is never one.  Consumes up to `RECHECK_UNITS` of the units a reset
        found under the threshold (a reopened shard's may be many: bounded work per append)."""
        rpu = self.rows_per_unit
        take, self._recheck = self._recheck[:RECHECK_UNITS], self._recheck[RECHECK_UNITS:]
        cand = np.unique(np.concatenate([gone // rpu, take]))
        if cand.size == 0:
            return cand, cand
        g_units, g_counts = np.unique(gone // rpu, return_counts=True)
        after = self.live[cand].astype(np.int64)
        after[np.searchsorted(cand, g_units)] -= g_counts
        usable = cand != self.tail_unit
        empty = cand[(after == 0) & usable]
        return cand[(after > 0) & (after < self.gc_rows) & usable], empty[~np.isin(empty, g_units)]

    def allocate(self, n: int) -> np.ndarray:
        """`n` slots to append to, in order: the rest of the tail unit, free units (lowest first),
        then new units at the end of the file.  Moves the tail (`rollback` puts it back)."""
        rpu = self.rows_per_unit
        parts = []
        if self.tail_unit >= 0 and self._tail_fill < rpu:
            k = min(n, rpu - self._tail_fill)
            parts.append(self.tail_unit * rpu + self._tail_fill + np.arange(k, dtype=np.int64))
            n -= k
        need = -(-n // rpu)
        reuse = self.free_units[:need]
        self.free_units = self.free_units[reuse.size :]
        fresh = np.arange(self._end_unit, self._end_unit + need - reuse.size, dtype=np.int64)
        self._end_unit += fresh.size
        units = np.concatenate([reuse.astype(np.int64), fresh])
        parts.append((units[:, None] * rpu + np.arange(rpu)).reshape(-1)[:n])
        slots = np.concatenate(parts)
        last = int(slots[-1])
        if last % rpu == rpu - 1:
            new_tail, fill = -1, 0
        else:
            new_tail, fill = last // rpu, last % rpu + 1
        if self.tail_unit >= 0 and new_tail != self.tail_unit:
            # The old tail is filled: an ordinary unit now, checked against the threshold next time.
            self._recheck = np.append(self._recheck, self.tail_unit)
        self.tail_unit, self._tail_fill = new_tail, fill
        return slots

    def wrote(self, slots: np.ndarray, recs: np.ndarray, old_tail: int) -> None:
        """`recs` were written at the `allocate`d `slots` (the tail was `old_tail` before)."""
        self.add_live(slots)
        if self.tail_unit >= 0:  # keep the tail unit's content: the next append rewrites it whole
            if self.tail_unit != old_tail:
                self.tail_recs = np.zeros(self.rows_per_unit, dtype=self._record)
            in_tail = slots // self.rows_per_unit == self.tail_unit
            self.tail_recs[slots[in_tail] % self.rows_per_unit] = recs[in_tail]

    def release(self, gone: np.ndarray, idle: np.ndarray) -> None:
        """The rows at `gone` died: count them off; units left empty (and `idle` ones, empty
        already) become free, except the tail."""
        units = np.unique(gone // self.rows_per_unit)
        if gone.size:
            np.subtract.at(self.live, gone // self.rows_per_unit, 1)
        cand = np.concatenate([units, idle])
        empty = cand[(self.live[cand] == 0) & (cand != self.tail_unit)]
        if empty.size:
            self.free_units = np.union1d(self.free_units, empty)
