"""`SsdStore`: full rows of one shard in a node-local file read and written with direct I/O.

The SSD level of Baidu's hierarchical parameter server, in parts: `ssd_format`
(the shard directory and record layout; every record carries its key, checked on
each read), `direct_io.UnitFile` (whole aligned units with O_DIRECT),
`ssd_log.UnitLog` (log-structured appends, reclaiming sparse units) and
`compact_index.CompactSlotMap` (the in-memory key -> slot index, ~12.5 bytes per
key: a 10^8-row shard's index fits in ~1.3 GB).

A write appends the batch at the log's tail without reading anything, then
repoints the index, so a failed write (a full disk) leaves every row as it was.
With t = `gc_threshold`, L the most live rows held and B the most rows one call
appends (batch plus moved rows), the row file never exceeds::

    unit_bytes * (ceil(L / ceil(t * rows_per_unit)) + 2 + ceil(B / rows_per_unit) + 1)

about 1/t times the live rows' size for L >> B.  The index is saved atomically on
`flush()` / `close()` (new index file, then meta.json, then the old index goes).
The first change after a save marks meta.json ``clean: false`` and clears the
tag, so a crash mid-run (its appends may reuse units the saved index points at)
is visible to the warm stage.  Whole-shard scans
(`iter_rows`, snapshots, `compact`) read the file sequentially: a snapshot of a
shard lists its rows in slot order, not key order.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from storage.embedding import ssd_format
from storage.embedding.base import EmbeddingStore, Lookup, as_row_format
from storage.embedding.compact_index import CompactSlotMap
from storage.embedding.direct_io import UnitFile
from storage.embedding.row_format import RowFormat
from storage.embedding.row_init import init_rows
from storage.embedding.rows import Rows, check_keys
from storage.embedding.snapshot import SnapshotWriter, check_snapshot_dim, iter_snapshot
from storage.embedding.ssd_format import ROWS_FILE, RecordLayout
from storage.embedding.ssd_log import UnitLog
from storage.io.fsio import is_local, local_path

log = logging.getLogger(__name__)

_BATCH_ROWS = 1 << 16
"""Rows per piece of a big write or a scan (bounds the temporary unit buffers)."""


class SsdStore(EmbeddingStore):
    """Rows of one shard in a direct-I/O row file with a persistent index.

    Args:
        path: the shard directory (local path or ``file://`` URL; created if missing).
        dim: the rows' `RowFormat` (an int: its width, fp32 rows with Adam); must match an existing shard's.
        init_std: std of `init_rows` for keys the shard does not hold.
        direct_io: open the row file with O_DIRECT (falls back to buffered I/O, with a
            warning, where the filesystem refuses it).
        io_threads: threads issuing the reads/writes of one batch.
        gc_threshold: a unit whose live rows fall below this fraction of `rows_per_unit` is
            reclaimed (its live rows move to the log's tail with the next append), so the row
            file stays within ~1/gc_threshold of the live rows' size (see the module docstring).
            0 reclaims only units with no live row left.

    Raises:
        ValueError: `path` is an object-store URL, or the shard has another dim, row format or format version.
    """

    tier = "ssd"

    def __init__(
        self,
        path: str,
        dim: int | RowFormat,
        *,
        init_std: float = 0.01,
        direct_io: bool = True,
        io_threads: int = 4,
        gc_threshold: float = 0.5,
    ) -> None:
        if not is_local(str(path)):
            raise ValueError(
                f"SsdStore needs a node-local directory (it uses direct I/O on a row file), got {path!r}; "
                "set store.local_dir to a local path"
            )
        fmt = as_row_format(dim)
        if not init_std > 0:
            raise ValueError(f"init_std must be > 0, got {init_std}")
        if io_threads < 1:
            raise ValueError(f"io_threads must be >= 1, got {io_threads}")
        if not 0 <= gc_threshold < 1:
            raise ValueError(f"gc_threshold must be in [0, 1), got {gc_threshold}")
        self.gc_threshold = gc_threshold
        self.path = local_path(str(path))
        self.path.mkdir(parents=True, exist_ok=True)
        self.row_format = fmt
        self.dim = fmt.dim
        self.init_std = init_std
        self.device = torch.device("cpu")
        self._fmt = RecordLayout.of(fmt)
        self.record_bytes = self._fmt.record_bytes
        self.unit_bytes = self._fmt.unit_bytes
        self.rows_per_unit = self._fmt.rows_per_unit
        self._counters = dict.fromkeys(("hits", "misses", "evictions", "gc_units", "gc_rows"), 0)
        self._closed = False
        self._map = CompactSlotMap()
        self._log = UnitLog(self.rows_per_unit, int(np.ceil(gc_threshold * self.rows_per_unit)), self._fmt.record)
        self._load_meta()
        self._file = UnitFile(self.rows_file, self.unit_bytes, direct_io=direct_io, io_threads=io_threads)

    # -- files ------------------------------------------------------------------
    @property
    def rows_file(self) -> Path:
        """The row file of the shard."""
        return self.path / ROWS_FILE

    @property
    def direct_io_active(self) -> bool:
        """Whether the row file is read and written with O_DIRECT."""
        return self._file.direct_io_active

    def _load_meta(self) -> None:
        meta = ssd_format.read_meta(self.path)
        if meta is None:
            self._meta: dict[str, Any] = {
                **self._fmt.meta(),
                "generation": 0,
                "index": None,
                "tag": None,
                "clean": True,
                "rows": 0,
            }
            self._clean = True
            return
        self._fmt.check(meta, self.path)
        if meta.get("index"):
            ssd_format.load_index(self.path, meta["index"], self._map)
        self._log.recount(self._map.high_water, (slots for _, slots in self._map.iter_items()))
        self._meta = meta
        self._clean = bool(meta.get("clean", True))
        if not self._clean:
            log.warning("shard %s was not closed cleanly; its rows may be newer than its index", self.path)

    def _save(self, *, clean: bool) -> None:
        """Persist index + meta atomically (new index file, then meta.json, then drop the old index)."""
        gen = int(self._meta.get("generation", 0)) + 1
        name = self._meta.get("index")  # unclean: only the flags change
        if clean:
            self._file.fsync()
            name = ssd_format.index_name(gen)
            ssd_format.write_index(self.path, name, self._map)
        self._meta.update(
            self._fmt.meta(),
            generation=gen,
            index=name,
            clean=clean,
            rows=len(self._map),
            slots=self._map.high_water,
            direct_io=self.direct_io_active,
        )
        ssd_format.write_meta(self.path, self._meta)
        if clean:
            ssd_format.drop_other_indexes(self.path, ssd_format.index_name(gen))  # `name`, the index just written
        self._clean = clean

    def _changing(self) -> None:
        """Call before the first change after a save: marks the shard dirty (and untagged) on disk."""
        if self._closed:
            raise RuntimeError(f"SsdStore {self.path} is closed")
        if self._clean:
            self._meta["tag"] = None
            self._save(clean=False)

    # -- the log ---------------------------------------------------------------------------
    def _append(self, keys: np.ndarray, recs: np.ndarray, old: np.ndarray, *, dying: np.ndarray | None = None) -> None:
        """Write `recs` of `keys` (distinct; `old`: their current slots, -1 for new keys) to fresh
        slots at the log's tail and repoint the index; `dying`: slots of rows being deleted.

        Units that the dying old slots leave under the threshold are reclaimed in the same
        write: their other live rows are read and appended with the batch.  The index changes
        only after the write succeeded, so a failed write leaves every row as it was."""
        n_user = keys.size
        gone = old[old >= 0]
        if dying is not None and dying.size:
            gone = np.concatenate([gone, dying])
        before = self._log.state()
        victims, idle = self._log.victims(gone)
        if victims.size:
            vslots, vrecs = self._live_in(victims, exclude=gone)
            expect = int(self._log.live[victims].sum()) - int(np.isin(gone // self.rows_per_unit, victims).sum())
            if vslots.size != expect:
                raise RuntimeError(
                    f"shard {self.path} is inconsistent: units {victims[:5].tolist()} hold {vslots.size} live "
                    f"rows, the index counts {expect}; wipe and restore it"
                )
            keys = np.concatenate([keys, vrecs["key"]])
            recs = np.concatenate([recs, vrecs])
            old = np.concatenate([old, vslots])
            gone = np.concatenate([gone, vslots])
            self._counters["gc_units"] += int(victims.size)
            self._counters["gc_rows"] += int(vslots.size)
        if keys.size == 0:
            self._log.release(gone, idle)
            return
        old_tail = self._log.tail_unit
        new = self._log.allocate(keys.size)
        try:
            self._write_slots(new, recs, tail=old_tail)
        except BaseException as exc:
            self._log.rollback(before)
            if not isinstance(exc, OSError):
                raise
            n_new = int((old[:n_user] < 0).sum())
            raise OSError(
                exc.errno,
                f"writing {n_user} rows ({n_user * self.record_bytes} bytes) to {self.rows_file} "
                f"failed: {exc.strerror} (disk full or file size limit?); no row changed, {n_new} new rows "
                "were not added",
            ) from exc
        moved = old >= 0
        self._map.reassign(keys[moved], new[moved])
        self._map.insert(keys[~moved], new[~moved])
        self._log.wrote(new, recs, old_tail)
        self._log.release(gone, idle)

    def _live_in(self, units: np.ndarray, exclude: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(slots, records) of the live rows of `units`, leaving out the slots in `exclude`."""
        slots, recs = self._read_units(units)
        live = (self._map.lookup(recs["key"]) == slots) & ~np.isin(slots, exclude)
        return slots[live], recs[live]

    # -- unit I/O -----------------------------------------------------------------
    def _read_units(self, units: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(slots, records) of every slot of `units` (sorted, distinct), records copied out."""
        buf = self._file.buffer(units.size)
        self._file.read(units, buf)
        arr = self._fmt.records_of(buf, units.size)
        recs = arr.reshape(-1).copy()
        del arr
        rpu = self.rows_per_unit
        return (units[:, None] * rpu + np.arange(rpu)).reshape(-1), recs

    def _read_records(self, slots: np.ndarray, keys: np.ndarray) -> np.ndarray:
        """Records at `slots` (a copy, in the order of `slots`); checks their keys against `keys`."""
        if slots.size == 0:
            return np.zeros(0, dtype=self._fmt.record)
        units, pos = np.unique(slots // self.rows_per_unit, return_inverse=True)
        buf = self._file.buffer(units.size)
        self._file.read(units, buf)
        arr = self._fmt.records_of(buf, units.size)
        recs: np.ndarray = arr[pos.reshape(-1), slots % self.rows_per_unit]  # fancy indexing copies
        del arr
        if not np.array_equal(recs["key"], keys):
            bad = np.flatnonzero(recs["key"] != keys)[:5]
            raise RuntimeError(
                f"shard {self.path} is inconsistent: slots {slots[bad].tolist()} hold keys "
                f"{recs['key'][bad].tolist()}, the index says {keys[bad].tolist()}; wipe and restore it"
            )
        return recs

    def _write_slots(
        self, slots: np.ndarray, recs: np.ndarray, *, file: UnitFile | None = None, tail: int = -1
    ) -> None:
        """Write `recs` at `slots` (distinct), whole units only, never reading one first.

        Every unit touched must hold no live row outside this write, except the log's tail
        unit `tail` (-1: none), whose current content is kept in memory (`UnitLog.tail_recs`)
        and written again around the new rows.  A big batch goes in pieces of about
        `_BATCH_ROWS` rows, split at unit boundaries, so the unit buffers stay small."""
        if slots.size == 0:
            return
        file = self._file if file is None else file
        rpu = self.rows_per_unit
        order = np.argsort(slots, kind="stable")
        slots, recs = slots[order], recs[order]
        unit_of = slots // rpu
        units = np.unique(unit_of)
        step = max(1, _BATCH_ROWS // rpu)
        for a in range(0, units.size, step):
            chunk = units[a : a + step]
            lo = int(np.searchsorted(unit_of, chunk[0], side="left"))
            hi = int(np.searchsorted(unit_of, chunk[-1], side="right"))
            buf = file.buffer(chunk.size)  # zeroed: unused slots of a unit read back as key 0 (never live)
            arr = self._fmt.records_of(buf, chunk.size)
            if tail >= 0:
                t = np.flatnonzero(chunk == tail)
                if t.size:
                    arr[t[0]] = self._log.tail_recs
            pos = np.searchsorted(chunk, unit_of[lo:hi])
            arr[pos, slots[lo:hi] % rpu] = recs[lo:hi]
            del arr
            file.write(chunk, buf)

    # -- tier-to-tier interface ---------------------------------------------------------
    def read_rows(self, keys: np.ndarray) -> tuple[np.ndarray, Rows]:
        keys = np.ascontiguousarray(keys, dtype=np.int64)
        slots = self._map.lookup(keys)
        found = slots >= 0
        nf = int(found.sum())
        self._counters["hits"] += nf
        self._counters["misses"] += keys.size - nf
        if nf == keys.size:
            return found, self._fmt.rows_of(self._read_records(slots, keys))
        rows = self.row_format.fresh(init_rows(torch.from_numpy(keys), self.dim, self.init_std))
        if nf:
            idx = np.flatnonzero(found)
            rows.put(idx, self._fmt.rows_of(self._read_records(slots[idx], keys[idx])))
        return found, rows

    def write_rows(self, keys: np.ndarray, rows: Rows) -> None:
        keys = np.ascontiguousarray(keys, dtype=np.int64)
        if keys.size == 0:
            return
        self._changing()
        self._append(keys, self._fmt.to_records(keys, rows), self._map.lookup(keys))

    def contains(self, keys: np.ndarray) -> np.ndarray:
        return self._map.lookup(np.ascontiguousarray(keys, dtype=np.int64)) >= 0

    # -- contract -------------------------------------------------------------------------
    def lookup(self, keys: torch.Tensor) -> Lookup:
        k = check_keys(keys)
        uniq, inverse = np.unique(k, return_inverse=True)
        _, rows = self.read_rows(uniq)
        return Lookup(
            torch.from_numpy(k.copy()),
            self.row_format.weights(rows.emb.index_select(0, torch.from_numpy(inverse.reshape(-1)))),
        )

    def evict(self, keys: torch.Tensor) -> None:
        k = np.unique(check_keys(keys))
        if k.size == 0 or not self.contains(k).any():
            return
        self._changing()
        # Forget the keys only once the live rows sharing their units are safe: reclaiming a unit
        # that falls below the threshold moves those rows first (an append with no new rows).
        slots = self._map.lookup(k)
        held = slots >= 0
        self._append(
            np.empty(0, dtype=np.int64),
            np.zeros(0, dtype=self._fmt.record),
            np.empty(0, dtype=np.int64),
            dying=slots[held],
        )
        self._map.remove(k[held])
        self._counters["evictions"] += int(held.sum())

    def _scan(self, *, live_only: bool = True) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Yield (slots, records) in slot order, reading the file sequentially, `_BATCH_ROWS` at a time.

        `live_only`: only the rows the index maps to their slot (free slots hold stale records
        or zeros, which fail that test); else every slot below the index's high water."""
        rpu = self.rows_per_unit
        hw = self._map.high_water
        n_units = -(-hw // rpu)
        step = max(1, _BATCH_ROWS // rpu)
        for u0 in range(0, n_units, step):
            units = np.arange(u0, min(n_units, u0 + step))
            if live_only:
                units = units[self._log.live[units] > 0]
                if units.size == 0:
                    continue
            slots, recs = self._read_units(units)
            if live_only:
                live = self._map.lookup(recs["key"]) == slots
                yield slots[live], recs[live]
            else:
                below = slots < hw
                yield slots[below], recs[below]

    def iter_rows(self, batch_rows: int = _BATCH_ROWS) -> Iterator[tuple[np.ndarray, Rows]]:
        """Yield (keys, Rows) of every row, in slot order (a sequential read of the file), exactly
        `batch_rows` at a time (the last batch may be shorter), so equal shards give equal snapshots."""
        held: list[np.ndarray] = []
        n_held = 0
        for _, recs in self._scan():
            held.append(recs)
            n_held += recs.size
            while n_held >= batch_rows:
                cat = np.concatenate(held)
                out, rest = cat[:batch_rows], cat[batch_rows:]
                yield out["key"].copy(), self._fmt.rows_of(out)
                held, n_held = [rest], rest.size
        if n_held:
            cat = np.concatenate(held)
            yield cat["key"].copy(), self._fmt.rows_of(cat)

    def snapshot(self, url: str, storage_options: dict[str, Any] | None = None) -> int:
        with SnapshotWriter(url, self.row_format, storage_options) as w:
            for keys, rows in self.iter_rows():
                w.write(keys, rows)
        return w.rows

    def wipe(self) -> None:
        """Delete every row (truncate the file, empty the index) and clear the tag; persisted."""
        self._changing()
        self._map = CompactSlotMap()
        self._log.clear()
        self._file.truncate(0)
        self._save(clean=True)

    def restore(
        self, url: str, *, owner: tuple[int, int] | None = None, storage_options: dict[str, Any] | None = None
    ) -> int:
        check_snapshot_dim(url, self.dim, storage_options)
        self.wipe()
        for b in iter_snapshot(url, owner=owner, storage_options=storage_options):
            # Keep the file order (a duplicate key's last row wins): slots follow it, so a snapshot of
            # the restored shard lists the rows as `url` does.
            _, first_rev = np.unique(b.keys[::-1], return_index=True)
            last = np.sort(b.keys.size - 1 - first_rev)
            self.write_rows(b.keys[last], b.select(last).rows_as(self.row_format))
        self._save(clean=True)
        return len(self)

    def compact(self) -> int:
        """Rewrite the row file without holes, keeping the rows' slot order; returns the bytes reclaimed.

        The live rows are copied (sequential reads and writes) to a new file that then replaces
        the old one; the index is renumbered from the new file's records afterwards.  Appends
        keep the file within the `gc_threshold` bound without this; it gives back the space of
        free units (after a large eviction, say) and leaves every unit full."""
        self._changing()
        before = self._file.size
        rpu = self.rows_per_unit
        n = len(self._map)
        new = self._file.sibling(self.path / f"{ROWS_FILE}.compact")
        try:
            w = 0
            carry = np.zeros(0, dtype=self._fmt.record)
            for _, recs in self._scan():
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
        self._file.replace_with(new)
        # Renumber: slot i of the new file holds the i-th live row (read its key back).
        self._map.merge()
        self._map.high_water = n
        for slots, recs in self._scan(live_only=False):
            self._map.reassign(recs["key"], slots)
        self._log.packed(n)
        self._save(clean=True)
        return before - self._file.size

    def reserve(self, n_rows: int) -> None:
        """Size the in-memory index for `n_rows` rows now (a bulk load then never regrows it)."""
        if n_rows < 0:
            raise ValueError(f"n_rows must be >= 0, got {n_rows}")
        self._map.reserve(int(n_rows))

    # -- tag / meta -------------------------------------------------------------------------
    @property
    def tag(self) -> str | None:
        """What this shard's content equals (e.g. a published model version), or None."""
        return self._meta.get("tag")

    def set_tag(self, tag: str | None) -> None:
        """Record that the shard equals `tag` (saved with the index, atomically); any later change clears it."""
        if tag is not None and not isinstance(tag, str):
            raise TypeError(f"tag must be a str or None, got {type(tag).__name__}")
        self.flush()
        self._meta["tag"] = tag
        self._save(clean=True)

    @property
    def file_bytes(self) -> int:
        """Current size of the row file."""
        return self._file.size

    def flush(self) -> None:
        """Persist the index (rows are already on disk): after this the shard reopens as it is now."""
        if self._closed:
            return
        if not self._clean:
            self._save(clean=True)

    def stats(self) -> dict[str, Any]:
        free_slots = int(self._log.free_units.size) * self.rows_per_unit
        return {
            self.tier: {
                **self._counters,
                **self._file.counters,
                "rows": len(self),
                "slots": self._map.high_water,
                "free_units": int(self._log.free_units.size),
                "free_slots": free_slots,
                "dead_slots": max(0, self._map.high_water - len(self) - free_slots),
                "index_bytes": self._map.nbytes,
                "index_merges": self._map.merges,
                "file_bytes": self.file_bytes if not self._closed else 0,
                "direct_io": self.direct_io_active,
                "rows_per_unit": self.rows_per_unit,
                "unit_bytes": self.unit_bytes,
            }
        }

    def __len__(self) -> int:
        return len(self._map)

    def close(self) -> None:
        if self._closed:
            return
        self.flush()
        self._file.close()
        self._closed = True
        # Release the index now (~12.5 bytes per row), even if the object lives on.
        self._map = CompactSlotMap()
        self._log.clear()

    def __enter__(self) -> SsdStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
