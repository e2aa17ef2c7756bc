"""`ShardFile`: the records of one SSD shard in its row file, found by key through the in-memory index.

Writes are log-structured (`storage.embedding.ssd.unit_log`): a batch is appended at the log's tail
without reading anything, then the index is repointed, so a failed write (a full disk) leaves every
row as it was.  With t = `gc_threshold`, L the most live rows held and B the most rows one call
appends (batch plus moved rows), the row file never exceeds::

    unit_bytes * (ceil(L / ceil(t * rows_per_unit)) + 2 + ceil(B / rows_per_unit) + 1)

about 1/t times the live rows' size for L >> B.  Every read checks each record's key against the
index.  Whole-shard scans (and `compact`) read the file sequentially, in slot order.

This is the file and its index only: rows as `storage.embedding.rows.batch.Rows`, meta.json, the
saved index and the store contract are `storage.embedding.ssd.store.SsdStore`'s.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from storage.embedding.ssd.compact_index import CompactSlotMap
from storage.embedding.ssd.direct_io import UnitFile
from storage.embedding.ssd.disk_format import ROWS_FILE, RecordLayout
from storage.embedding.ssd.unit_log import UnitLog

BATCH_ROWS = 1 << 16
"""Rows per piece of a big write or a scan (bounds the temporary unit buffers)."""


class ShardFile:
    """The records of one shard: the row file, the key -> slot index and the log that places appends.

    Args:
        path: the shard directory (the row file is `ROWS_FILE` in it).
        layout: how records are packed into units.
        index: the key -> slot index (a reopened shard's, as loaded); the live counts are rebuilt from it.
        gc_threshold: a unit whose live rows fall below this fraction of `rows_per_unit` is reclaimed.
        direct_io: open the row file with O_DIRECT (`UnitFile` falls back to buffered I/O).
        io_threads: threads issuing the reads/writes of one batch.

    Attributes:
        index: key -> slot of every row held.
        log: live rows per unit, free units and the tail (`UnitLog`).
        file: the row file.
        counters: ``gc_units`` / ``gc_rows``, the units reclaimed and the live rows they moved.
    """

    def __init__(
        self,
        path: Path,
        layout: RecordLayout,
        index: CompactSlotMap,
        *,
        gc_threshold: float,
        direct_io: bool,
        io_threads: int,
    ) -> None:
        self.path = path
        self.layout = layout
        self.rows_per_unit = layout.rows_per_unit
        self.index = index
        self.log = UnitLog(self.rows_per_unit, int(np.ceil(gc_threshold * self.rows_per_unit)), layout.record)
        self.log.recount(index.high_water, (slots for _, slots in index.iter_items()))
        self.counters = dict.fromkeys(("gc_units", "gc_rows"), 0)
        self.file = UnitFile(path / ROWS_FILE, layout.unit_bytes, direct_io=direct_io, io_threads=io_threads)

    def __len__(self) -> int:
        return len(self.index)

    # -- by key ----------------------------------------------------------------------------------
    def read(self, slots: np.ndarray, keys: np.ndarray) -> np.ndarray:
        """Records at `slots` (a copy, in the order of `slots`); checks their keys against `keys`."""
        if slots.size == 0:
            return np.zeros(0, dtype=self.layout.record)
        units, pos = np.unique(slots // self.rows_per_unit, return_inverse=True)
        buf = self.file.buffer(units.size)
        self.file.read(units, buf)
        arr = self.layout.records_of(buf, units.size)
        recs: np.ndarray = arr[pos.reshape(-1), slots % self.rows_per_unit]  # fancy indexing copies
        del arr
        if not np.array_equal(recs["key"], keys):
            bad = np.flatnonzero(recs["key"] != keys)[:5]
            raise RuntimeError(
                f"shard {self.path} is inconsistent: slots {slots[bad].tolist()} hold keys "
                f"{recs['key'][bad].tolist()}, the index says {keys[bad].tolist()}; wipe and restore it"
            )
        return recs

    def write(self, keys: np.ndarray, recs: np.ndarray) -> None:
        """Write `recs` of `keys` (distinct): appended, and the index repointed once the write succeeded."""
        self.append(keys, recs, self.index.lookup(keys))

    def remove(self, keys: np.ndarray) -> int:
        """Forget `keys` (distinct); returns how many the shard held.

        The keys go only once the live rows sharing their units are safe: reclaiming a unit that
        falls below the threshold moves those rows first (an append with no new rows)."""
        slots = self.index.lookup(keys)
        held = slots >= 0
        self.append(
            np.empty(0, dtype=np.int64),
            np.zeros(0, dtype=self.layout.record),
            np.empty(0, dtype=np.int64),
            dying=slots[held],
        )
        self.index.remove(keys[held])
        return int(held.sum())

    # -- the log ---------------------------------------------------------------------------------
    def append(self, keys: np.ndarray, recs: np.ndarray, old: np.ndarray, *, dying: np.ndarray | None = None) -> None:
        """Write `recs` of `keys` (distinct; `old`: their current slots, -1 for new keys) to fresh
        slots at the log's tail and repoint the index; `dying`: slots of rows being deleted.

        Units that the dying old slots leave under the threshold are reclaimed in the same
        write: their other live rows are read and appended with the batch.  The index changes
        only after the write succeeded, so a failed write leaves every row as it was."""
        n_user = keys.size
        gone = old[old >= 0]
        if dying is not None and dying.size:
            gone = np.concatenate([gone, dying])
        before = self.log.state()
        victims, idle = self.log.victims(gone)
        if victims.size:
            vslots, vrecs = self._live_in(victims, exclude=gone)
            expect = int(self.log.live[victims].sum()) - int(np.isin(gone // self.rows_per_unit, victims).sum())
            if vslots.size != expect:
                raise RuntimeError(
                    f"shard {self.path} is inconsistent: units {victims[:5].tolist()} hold {vslots.size} live "
                    f"rows, the index counts {expect}; wipe and restore it"
                )
            keys = np.concatenate([keys, vrecs["key"]])
            recs = np.concatenate([recs, vrecs])
            old = np.concatenate([old, vslots])
            gone = np.concatenate([gone, vslots])
            self.counters["gc_units"] += int(victims.size)
            self.counters["gc_rows"] += int(vslots.size)
        if keys.size == 0:
            self.log.release(gone, idle)
            return
        old_tail = self.log.tail_unit
        new = self.log.allocate(keys.size)
        try:
            self._write_slots(new, recs, tail=old_tail)
        except BaseException as exc:
            self.log.rollback(before)
            if not isinstance(exc, OSError):
                raise
            n_new = int((old[:n_user] < 0).sum())
            raise OSError(
                exc.errno,
                f"writing {n_user} rows ({n_user * self.layout.record_bytes} bytes) to {self.path / ROWS_FILE} "
                f"failed: {exc.strerror} (disk full or file size limit?); no row changed, {n_new} new rows "
                "were not added",
            ) from exc
        moved = old >= 0
        self.index.reassign(keys[moved], new[moved])
        self.index.insert(keys[~moved], new[~moved])
        self.log.wrote(new, recs, old_tail)
        self.log.release(gone, idle)

    def _live_in(self, units: np.ndarray, exclude: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(slots, records) of the live rows of `units`, leaving out the slots in `exclude`."""
        slots, recs = self._read_units(units)
        live = (self.index.lookup(recs["key"]) == slots) & ~np.isin(slots, exclude)
        return slots[live], recs[live]

    # -- unit I/O --------------------------------------------------------------------------------
    def _read_units(self, units: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(slots, records) of every slot of `units` (sorted, distinct), records copied out."""
        buf = self.file.buffer(units.size)
        self.file.read(units, buf)
        arr = self.layout.records_of(buf, units.size)
        recs = arr.reshape(-1).copy()
        del arr
        rpu = self.rows_per_unit
        return (units[:, None] * rpu + np.arange(rpu)).reshape(-1), recs

    def _write_slots(
        self, slots: np.ndarray, recs: np.ndarray, *, file: UnitFile | None = None, tail: int = -1
    ) -> None:
        """Write `recs` at `slots` (distinct), whole units only, never reading one first.

        Every unit touched must hold no live row outside this write, except the log's tail
        unit `tail` (-1: none), whose current content is kept in memory (`UnitLog.tail_recs`)
        and written again around the new rows.  A big batch goes in pieces of about
        `BATCH_ROWS` rows, split at unit boundaries, so the unit buffers stay small."""
        if slots.size == 0:
            return
        file = self.file if file is None else file
        rpu = self.rows_per_unit
        order = np.argsort(slots, kind="stable")
        slots, recs = slots[order], recs[order]
        unit_of = slots // rpu
        units = np.unique(unit_of)
        step = max(1, BATCH_ROWS // rpu)
        for a in range(0, units.size, step):
            chunk = units[a : a + step]
            lo = int(np.searchsorted(unit_of, chunk[0], side="left"))
            hi = int(np.searchsorted(unit_of, chunk[-1], side="right"))
            buf = file.buffer(chunk.size)  # zeroed: unused slots of a unit read back as key 0 (never live)
            arr = self.layout.records_of(buf, chunk.size)
            if tail >= 0:
                t = np.flatnonzero(chunk == tail)
                if t.size:
                    arr[t[0]] = self.log.tail_recs
            pos = np.searchsorted(chunk, unit_of[lo:hi])
            arr[pos, slots[lo:hi] % rpu] = recs[lo:hi]
            del arr
            file.write(chunk, buf)

    # -- whole file ------------------------------------------------------------------------------
    def scan(self, *, live_only: bool = True) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Yield (slots, records) in slot order, reading the file sequentially, `BATCH_ROWS` at a time.

        `live_only`: only the rows the index maps to their slot (free slots hold stale records
        or zeros, which fail that test); else every slot below the index's high water."""
        rpu = self.rows_per_unit
        hw = self.index.high_water
        n_units = -(-hw // rpu)
        step = max(1, BATCH_ROWS // rpu)
        for u0 in range(0, n_units, step):
            units = np.arange(u0, min(n_units, u0 + step))
            if live_only:
                units = units[self.log.live[units] > 0]
                if units.size == 0:
                    continue
            slots, recs = self._read_units(units)
            if live_only:
                live = self.index.lookup(recs["key"]) == slots
                yield slots[live], recs[live]
            else:
                below = slots < hw
                yield slots[below], recs[below]

    def compact(self) -> None:
        """Rewrite the row file without holes, keeping the rows' slot order.

        The live rows are copied (sequential reads and writes) to a new file that then replaces
        the old one; the index is renumbered from the new file's records afterwards."""
        rpu = self.rows_per_unit
        n = len(self.index)
        new = self.file.sibling(self.path / f"{ROWS_FILE}.compact")
        try:
            w = 0
            carry = np.zeros(0, dtype=self.layout.record)
            for _, recs in self.scan():
                recs = np.concatenate([carry, recs])
                full = recs.size // rpu * rpu  # whole units only: a unit is written once
                self._write_slots(np.arange(w, w + full, dtype=np.int64), recs[:full], file=new)
                w += full
                carry = recs[full:]
            self._write_slots(np.arange(w, w + carry.size, dtype=np.int64), carry, file=new)
            w += carry.size
            if w != n:
                raise RuntimeError(f"shard {self.path} is inconsistent: the index holds {n} rows, the file {w}")
            new.fsync()
        except BaseException:
            new.discard()
            raise
        self.file.replace_with(new)
        # Renumber: slot i of the new file holds the i-th live row (read its key back).
        self.index.merge()
        self.index.high_water = n
        for slots, recs in self.scan(live_only=False):
            self.index.reassign(recs["key"], slots)
        self.log.packed(n)

    def clear(self) -> None:
        """Hold no row: an empty index and an empty (truncated) file."""
        self.index = CompactSlotMap()
        self.log.clear()
        self.file.truncate(0)

    def close(self) -> None:
        """Close the file and release the index now (~12.5 bytes per row), even if the object lives on."""
        self.file.close()
        self.index = CompactSlotMap()
        self.log.clear()
