"""`SsdStore`: full rows in a node-local file read and written with direct I/O.

The SSD level of Baidu's hierarchical parameter server.  One shard directory::

    rows.bin                  fixed-size records packed into 4 KiB-aligned units
    index-<generation>.idx    key -> slot map (`CompactSlotMap.save`), the persistent index
    meta.json                 format, dim, layout, generation, index file, tag, clean flag

A record is ``emb, m, v`` (float32[dim] each), ``clock`` (int64) and the ``key``
itself (int64, checked on every read, so a stale index can never hand one key
another key's row).  Records are packed ``rows_per_unit`` to a unit of
``unit_bytes`` (a multiple of 4096); I/O always moves whole units, at aligned
offsets, from page-aligned (anonymous `mmap`) buffers, as O_DIRECT requires.
Reads sort a batch by unit, coalesce it into contiguous runs and spread the runs
over a small thread pool of `os.preadv` / `os.pwritev` calls (which release the GIL).

Writes are log-structured: a batch of rows (new or updated) is appended, packed,
to fresh slots at the log's tail (the rest of the tail unit, then free units,
lowest first, then new units at the end of the file) and written whole-unit,
without reading anything (the tail unit's content is kept in memory and written
again around the new rows), then the key -> slot index is repointed.  The old
slots become garbage, counted per unit (`_unit_live`).  A unit left with no
live row is free for later appends; a unit left with fewer than
``ceil(gc_threshold * rows_per_unit)`` live rows is reclaimed by the same append
(its unit is read, its other live rows go to the tail with the batch).  So every
used unit but the tail and one just-filled tail holds at least that many live
rows, and, with L the most live rows held and B the most rows one call appends
(batch plus moved rows), the row file never exceeds::

    unit_bytes * (ceil(L / ceil(t * rows_per_unit)) + 2 + ceil(B / rows_per_unit) + 1)

about 1/t times the live rows' size for L >> B (t = 0.5: <= 2x; ~1.6x measured
under uniform random updates, with ~0.8 rows moved and ~0.1 units read per
written row).  The index changes only after its write succeeded, so a failed
write (a full disk) leaves every row as it was.

The key -> slot index lives in memory (`storage.embedding.compact_index.CompactSlotMap`,
~12.5 bytes per key, so a 10^8-row shard's index fits in ~1.3 GB; no free list:
slots are placed by the log) and is saved atomically on `flush()` / `close()`
(new ``index-<gen>.idx``, then ``meta.json`` replaced, then the old index
removed), so the store reopens with the same content.  The first change after a
save marks ``meta.json`` ``clean: false`` and clears the tag, so a crash mid-run
is visible to the warm stage (appends may reuse units the saved index still
points at).  `compact()` rewrites the file without holes, keeping the slot order
(it gives back free units after a large eviction).  Whole-shard scans
(`iter_rows`, snapshots, compaction) read the file sequentially and keep the
records the index points at, so a snapshot of an SSD shard lists its rows in
slot order, not key order.  The on-disk layout is the same as before
log-structured writes (format 2, readable both ways); a reopened shard's
under-threshold units are reclaimed by its next appends, `_RECHECK_UNITS` per
append, so the bound holds again once they are worked off.  Shards written in format 1 (a slot -> key
``index-<gen>.npy``) are read and saved in format 2 on the next flush.

If the filesystem refuses O_DIRECT (EINVAL), the store logs one warning and
uses buffered I/O; `direct_io_active` tells which is in use.
"""

from __future__ import annotations

import errno
import json
import logging
import mmap
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch
from fsspec.implementations.local import LocalFileSystem

from storage.embedding.base import EmbeddingStore, Lookup
from storage.embedding.compact_index import CompactSlotMap
from storage.embedding.row_init import init_rows
from storage.embedding.rows import (
    Rows,
    check_keys,
)
from storage.embedding.snapshot import (
    SnapshotWriter,
    check_snapshot_dim,
    iter_snapshot,
)
from storage.io.fsio import is_local, local_path, write_text_atomic

log = logging.getLogger(__name__)

FORMAT = "ctr-ssd-shard/2"
_READABLE_FORMATS = (FORMAT, "ctr-ssd-shard/1")
BLOCK = 4096
"""I/O alignment: offsets, lengths and buffer addresses are multiples of this."""
ROWS_FILE = "rows.bin"
META_FILE = "meta.json"
_MAX_RUN_BYTES = 32 << 20
_BATCH_ROWS = 1 << 16
_RECHECK_UNITS = 1024
"""Units of an older or reopened shard checked against the threshold per append (bounds its extra I/O)."""


def record_dtype(dim: int) -> np.dtype:
    """The on-disk record of one row (packed, little-endian)."""
    return np.dtype([("emb", "<f4", (dim,)), ("m", "<f4", (dim,)), ("v", "<f4", (dim,)), ("clock", "<i8"), ("key", "<i8")])


class SsdStore(EmbeddingStore):
    """Rows of one shard in a direct-I/O row file with a persistent index.

    Args:
        path: the shard directory (local path or ``file://`` URL; created if missing).
        dim: row width; must match an existing shard's.
        init_std: std of `init_rows` for keys the shard does not hold.
        direct_io: open the row file with O_DIRECT (falls back to buffered I/O, with a
            warning, where the filesystem refuses it).
        io_threads: threads issuing the reads/writes of one batch.
        gc_threshold: a unit whose live rows fall below this fraction of `rows_per_unit` is
            reclaimed (its live rows move to the log's tail with the next append), so the row
            file stays within ~1/gc_threshold of the live rows' size (see the module docstring).
            0 reclaims only units with no live row left.

    Raises:
        ValueError: `path` is an object-store URL, or the shard has another dim or format.
    """

    tier = "ssd"

    def __init__(
        self,
        path: str,
        dim: int,
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
        if dim < 1:
            raise ValueError(f"dim must be >= 1, got {dim}")
        if not init_std > 0:
            raise ValueError(f"init_std must be > 0, got {init_std}")
        if io_threads < 1:
            raise ValueError(f"io_threads must be >= 1, got {io_threads}")
        if not 0 <= gc_threshold < 1:
            raise ValueError(f"gc_threshold must be in [0, 1), got {gc_threshold}")
        self.gc_threshold = gc_threshold
        self.path = local_path(str(path))
        self.path.mkdir(parents=True, exist_ok=True)
        self.dim = dim
        self.init_std = init_std
        self.device = torch.device("cpu")
        self.direct_io_requested = direct_io
        self._rec = record_dtype(dim)
        self.record_bytes = self._rec.itemsize
        self.unit_bytes = -(-self.record_bytes // BLOCK) * BLOCK
        self.rows_per_unit = self.unit_bytes // self.record_bytes
        self._unit = np.dtype(
            {"names": ["r"], "formats": [(self._rec, (self.rows_per_unit,))], "offsets": [0], "itemsize": self.unit_bytes}
        )
        self._counters = dict.fromkeys(
            ("hits", "misses", "bytes_read", "bytes_written", "evictions", "read_calls", "write_calls",
             "gc_units", "gc_rows"),
            0,
        )
        self._lfs = LocalFileSystem()
        self._pool = ThreadPoolExecutor(io_threads, thread_name_prefix="ssd-io") if io_threads > 1 else None
        self._io_threads = io_threads
        self._fd = -1
        self._closed = False
        self._gc_rows = int(np.ceil(gc_threshold * self.rows_per_unit))
        self._map = CompactSlotMap(reuse_slots=False)
        self._unit_live = np.zeros(0, dtype=np.int32)  # live rows per unit
        self._reset_log()
        self._meta: dict[str, Any] = {}
        self._load_meta()
        self._open_file()

    # -- files ------------------------------------------------------------------
    @property
    def rows_file(self) -> Path:
        """The row file of the shard."""
        return self.path / ROWS_FILE

    def _layout(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "dim": self.dim,
            "block": BLOCK,
            "record_bytes": self.record_bytes,
            "unit_bytes": self.unit_bytes,
            "rows_per_unit": self.rows_per_unit,
        }

    def _load_meta(self) -> None:
        meta_path = self.path / META_FILE
        if not meta_path.exists():
            self._meta = {**self._layout(), "generation": 0, "index": None, "tag": None, "clean": True, "rows": 0}
            self._clean = True
            return
        meta = json.loads(meta_path.read_text())
        if meta.get("format") not in _READABLE_FORMATS:
            raise ValueError(f"{meta_path} has format {meta.get('format')!r}, expected {FORMAT!r}")
        if meta.get("dim") != self.dim:
            raise ValueError(
                f"shard {self.path} holds rows of dim {meta.get('dim')}, asked for dim {self.dim}; "
                "wipe the shard (the warm stage restores it) or fix store.embedding_dim"
            )
        for k, v in self._layout().items():
            if k != "format" and meta.get(k) != v:
                raise ValueError(f"shard {self.path}: {k}={meta.get(k)!r}, this code writes {v!r}")
        if meta.get("index"):
            index = self.path / meta["index"]
            if meta["format"] == FORMAT:
                with open(index, "rb") as f:
                    self._map.load(f)
            else:  # format 1: slot -> key array
                self._map.load_slot_keys(np.load(index))
        self._recount_units()
        self._meta = meta
        self._reset_log()
        self._clean = bool(meta.get("clean", True))
        if not self._clean:
            log.warning("shard %s was not closed cleanly; its rows may be newer than its index", self.path)

    def _open_file(self) -> None:
        flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0)
        self.direct_io_active = False
        if self.direct_io_requested and hasattr(os, "O_DIRECT"):
            try:
                self._fd = os.open(self.rows_file, flags | os.O_DIRECT, 0o644)
                self.direct_io_active = True
                return
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                self._warn_fallback(exc)
        self._fd = os.open(self.rows_file, flags, 0o644)

    def _warn_fallback(self, exc: OSError) -> None:
        log.warning("O_DIRECT refused for %s (%s); using buffered I/O", self.rows_file, exc)

    def _fall_back_to_buffered(self, exc: OSError) -> None:
        self._warn_fallback(exc)
        os.close(self._fd)
        self.direct_io_requested = False
        self._open_file()

    def _save(self, *, clean: bool) -> None:
        """Persist index + meta atomically (new index file, then meta.json, then drop the old index)."""
        old_index = self._meta.get("index")
        gen = int(self._meta.get("generation", 0)) + 1
        index_name = f"index-{gen:08d}.idx"
        if clean:
            os.fsync(self._fd)
            tmp = self.path / f"{index_name}.tmp"
            with open(tmp, "wb") as f:
                self._map.save(f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path / index_name)
        else:
            index_name = old_index  # only the flags change
        self._meta.update(
            self._layout(), generation=gen, index=index_name, clean=clean, rows=len(self._map),
            slots=self._map.high_water, direct_io=self.direct_io_active,
        )
        write_text_atomic(self._lfs, str(self.path / META_FILE), json.dumps(self._meta, indent=2, sort_keys=True))
        if clean:
            for p in self.path.glob("index-*"):
                if p.name != index_name:
                    p.unlink()
        self._clean = clean

    def _changing(self) -> None:
        """Call before the first change after a save: marks the shard dirty (and untagged) on disk."""
        if self._closed:
            raise RuntimeError(f"SsdStore {self.path} is closed")
        if self._clean:
            self._meta["tag"] = None
            self._save(clean=False)

    # -- live rows per unit -------------------------------------------------------------
    def _count_units(self, slots: np.ndarray, sign: int) -> None:
        if slots.size == 0:
            return
        units = slots // self.rows_per_unit
        need = int(units.max()) + 1
        if need > self._unit_live.size:
            self._unit_live.resize(max(need, int(self._unit_live.size * 1.25), 1024), refcheck=False)
        np.add.at(self._unit_live, units, sign)

    def _recount_units(self) -> None:
        self._unit_live = np.zeros(-(-self._map.high_water // self.rows_per_unit), dtype=np.int32)
        for _, slots in self._map.iter_items():
            self._count_units(slots, 1)

    # -- the log: where appended rows go -------------------------------------------------
    def _reset_log(self) -> None:
        """Rebuild the allocator from the live counts (after open, wipe, compaction).

        Units past the high water are never used; units with no live row are free; units
        under the threshold (a shard from before, or a partial last unit) are reclaimed by
        the next append.  The tail unit is unknown after a reopen: appends start a new one."""
        end = -(-self._map.high_water // self.rows_per_unit)
        live = self._unit_live[:end]
        self._end_unit = end  # units [0, end) may hold rows
        self._free_units = np.flatnonzero(live == 0)  # ascending: taken lowest first
        self._recheck = np.flatnonzero((live > 0) & (live < self._gc_rows))
        self._tail_unit = -1  # the unit appends fill next (-1: none); its content is `_tail_recs`
        self._tail_fill = 0
        self._tail_recs = np.zeros(self.rows_per_unit, dtype=self._rec)

    def _allocate(self, n: int) -> np.ndarray:
        """`n` slots to append to, in order: the rest of the tail unit, free units (lowest first),
        then new units at the end of the file.  Moves the tail (`_append` puts it back if the write fails)."""
        rpu = self.rows_per_unit
        parts = []
        if self._tail_unit >= 0 and self._tail_fill < rpu:
            k = min(n, rpu - self._tail_fill)
            parts.append(self._tail_unit * rpu + self._tail_fill + np.arange(k, dtype=np.int64))
            n -= k
        need = -(-n // rpu)
        reuse = self._free_units[:need]
        self._free_units = self._free_units[reuse.size :]
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
        if self._tail_unit >= 0 and new_tail != self._tail_unit:
            # The old tail is filled: an ordinary unit now, checked against the threshold next time.
            self._recheck = np.append(self._recheck, self._tail_unit)
        self._tail_unit, self._tail_fill = new_tail, fill
        return slots

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
        recheck = self._recheck
        victims, idle = self._victims(gone)
        if victims.size:
            vslots, vrecs = self._live_in(victims, exclude=gone)
            expect = int(self._unit_live[victims].sum()) - int(np.isin(gone // self.rows_per_unit, victims).sum())
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
            self._release(gone, idle)
            return
        saved = (self._free_units, self._end_unit, self._tail_unit, self._tail_fill, recheck)
        old_tail = self._tail_unit
        new = self._allocate(keys.size)
        try:
            self._write_slots(new, recs, tail=old_tail)
        except BaseException as exc:
            (self._free_units, self._end_unit, self._tail_unit, self._tail_fill, self._recheck) = saved
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
        self._map.reassign(keys[moved], new[moved], free_old=False)
        self._map.insert(keys[~moved], new[~moved])
        self._count_units(new, 1)
        self._release(gone, idle)
        if self._tail_unit >= 0:  # keep the tail unit's content: the next append rewrites it whole
            if self._tail_unit != old_tail:
                self._tail_recs = np.zeros(self.rows_per_unit, dtype=self._rec)
            in_tail = new // self.rows_per_unit == self._tail_unit
            self._tail_recs[new[in_tail] % self.rows_per_unit] = recs[in_tail]

    def _victims(self, gone: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Units to reclaim once the `gone` slots die: (those left with 0 < live < threshold,
        those left empty that `gone` does not touch); the tail is never one.  Consumes up to
        `_RECHECK_UNITS` units of `_recheck` (a reopened shard's may be many: bounded memory)."""
        take, self._recheck = self._recheck[:_RECHECK_UNITS], self._recheck[_RECHECK_UNITS:]
        cand = np.unique(np.concatenate([gone // self.rows_per_unit, take]))
        if cand.size == 0:
            return cand, cand
        g_units, g_counts = np.unique(gone // self.rows_per_unit, return_counts=True)
        after = self._unit_live[cand].astype(np.int64)
        after[np.searchsorted(cand, g_units)] -= g_counts
        usable = cand != self._tail_unit
        empty = cand[(after == 0) & usable]
        return cand[(after > 0) & (after < self._gc_rows) & usable], empty[~np.isin(empty, g_units)]

    def _live_in(self, units: np.ndarray, exclude: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(slots, records) of the live rows of `units`, leaving out the slots in `exclude`."""
        rpu = self.rows_per_unit
        buf, arr = self._alloc(units.size)
        self._io(False, units, buf)
        recs = arr.reshape(-1).copy()
        del arr
        slots = (units[:, None] * rpu + np.arange(rpu)).reshape(-1)
        live = (self._map.lookup(recs["key"]) == slots) & ~np.isin(slots, exclude)
        return slots[live], recs[live]

    def _release(self, gone: np.ndarray, idle: np.ndarray) -> None:
        """The rows at `gone` died: count them off; units left empty (and `idle` ones, empty
        already) become free, except the tail."""
        units = np.unique(gone // self.rows_per_unit)
        if gone.size:
            np.subtract.at(self._unit_live, gone // self.rows_per_unit, 1)
        cand = np.concatenate([units, idle])
        empty = cand[(self._unit_live[cand] == 0) & (cand != self._tail_unit)]
        if empty.size:
            self._free_units = np.union1d(self._free_units, empty)

    # -- unit I/O -----------------------------------------------------------------
    def _runs(self, units: np.ndarray) -> list[tuple[int, int]]:
        """(first, end) index ranges of `units` (sorted, distinct) that are contiguous on disk."""
        if units.size == 0:
            return []
        breaks = np.flatnonzero(np.diff(units) != 1) + 1
        starts = np.concatenate([[0], breaks]).tolist()
        ends = np.concatenate([breaks, [units.size]]).tolist()
        per_call = max(1, _MAX_RUN_BYTES // self.unit_bytes)
        out = []
        for s, e in zip(starts, ends, strict=True):
            out.extend((c, min(e, c + per_call)) for c in range(s, e, per_call))
        return out

    def _run_io(self, write: bool, units: np.ndarray, buf: mmap.mmap, fd: int | None = None) -> None:
        runs = self._runs(units)
        view = memoryview(buf)
        ub = self.unit_bytes
        fd = self._fd if fd is None else fd

        def do(chunk: list[tuple[int, int]]) -> int:
            calls = 0
            for s, e in chunk:
                mv = view[s * ub : e * ub]
                off = int(units[s]) * ub
                while len(mv):
                    n = os.pwritev(fd, [mv], off) if write else os.preadv(fd, [mv], off)
                    calls += 1
                    if n <= 0:
                        if write:
                            raise OSError(errno.EIO, f"short write to {self.rows_file}")
                        break  # past end of file: the buffer stays zero
                    mv, off = mv[n:], off + n
            return calls

        if self._pool is not None and len(runs) > 8:
            k = self._io_threads
            calls = sum(self._pool.map(do, [runs[i::k] for i in range(k)]))
        else:
            calls = do(runs)
        self._counters["write_calls" if write else "read_calls"] += calls
        self._counters["bytes_written" if write else "bytes_read"] += units.size * ub

    def _io(self, write: bool, units: np.ndarray, buf: mmap.mmap, fd: int | None = None) -> None:
        try:
            self._run_io(write, units, buf, fd)
        except OSError as exc:
            if exc.errno != errno.EINVAL or not self.direct_io_active or fd is not None:
                raise
            self._fall_back_to_buffered(exc)
            self._run_io(write, units, buf)

    def _alloc(self, n_units: int) -> tuple[mmap.mmap, np.ndarray]:
        buf = mmap.mmap(-1, max(1, n_units) * self.unit_bytes)  # anonymous: page-aligned and zeroed
        arr = np.frombuffer(buf, dtype=self._unit, count=n_units)["r"]  # (n_units, rows_per_unit)
        return buf, arr

    def _read_records(self, slots: np.ndarray, keys: np.ndarray | None = None) -> np.ndarray:
        """Records at `slots` (a copy, in the order of `slots`); checks their keys against `keys`."""
        if slots.size == 0:
            return np.zeros(0, dtype=self._rec)
        unit_of = slots // self.rows_per_unit
        units, pos = np.unique(unit_of, return_inverse=True)
        buf, arr = self._alloc(units.size)
        self._io(False, units, buf)
        recs = arr[pos.reshape(-1), slots % self.rows_per_unit]  # fancy indexing copies
        del arr
        if keys is not None and not np.array_equal(recs["key"], keys):
            bad = np.flatnonzero(recs["key"] != keys)[:5]
            raise RuntimeError(
                f"shard {self.path} is inconsistent: slots {slots[bad].tolist()} hold keys "
                f"{recs['key'][bad].tolist()}, the index says {keys[bad].tolist()}; wipe and restore it"
            )
        return recs

    def _write_slots(
        self, slots: np.ndarray, recs: np.ndarray, *, fd: int | None = None, tail: int = -1
    ) -> None:
        """Write `recs` at `slots` (distinct), whole units only, never reading one first.

        Every unit touched must hold no live row outside this write, except the log's tail
        unit `tail` (-1: none), whose current content is kept in memory (`_tail_recs`) and
        written again around the new rows.  A big batch goes in pieces of about `_BATCH_ROWS` rows, split at unit
        boundaries, so the temporary unit buffers stay small whatever the batch size."""
        if slots.size == 0:
            return
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
            buf, arr = self._alloc(chunk.size)  # zeroed: unused slots of a unit read back as key 0 (never live)
            if tail >= 0:
                t = np.flatnonzero(chunk == tail)
                if t.size:
                    arr[t[0]] = self._tail_recs
            pos = np.searchsorted(chunk, unit_of[lo:hi])
            arr[pos, slots[lo:hi] % rpu] = recs[lo:hi]
            del arr
            self._io(True, chunk, buf, fd)

    def _records(self, keys: np.ndarray, rows: Rows) -> np.ndarray:
        recs = np.zeros(keys.size, dtype=self._rec)
        recs["emb"] = rows.emb.detach().cpu().numpy()
        recs["m"] = rows.m.detach().cpu().numpy()
        recs["v"] = rows.v.detach().cpu().numpy()
        recs["clock"] = rows.clock.detach().cpu().numpy()
        recs["key"] = keys
        return recs

    @staticmethod
    def _rows_of(recs: np.ndarray) -> Rows:
        return Rows(
            torch.from_numpy(np.ascontiguousarray(recs["emb"])),
            torch.from_numpy(np.ascontiguousarray(recs["m"])),
            torch.from_numpy(np.ascontiguousarray(recs["v"])),
            torch.from_numpy(np.ascontiguousarray(recs["clock"])),
        )

    # -- tier-to-tier interface ---------------------------------------------------------
    def read_rows(self, keys: np.ndarray) -> tuple[np.ndarray, Rows]:
        keys = np.ascontiguousarray(keys, dtype=np.int64)
        slots = self._map.lookup(keys)
        found = slots >= 0
        nf = int(found.sum())
        self._counters["hits"] += nf
        self._counters["misses"] += keys.size - nf
        if nf == keys.size:
            return found, self._rows_of(self._read_records(slots, keys))
        rows = Rows.fresh(init_rows(torch.from_numpy(keys), self.dim, self.init_std))
        if nf:
            idx = np.flatnonzero(found)
            rows.put(idx, self._rows_of(self._read_records(slots[idx], keys[idx])))
        return found, rows

    def write_rows(self, keys: np.ndarray, rows: Rows) -> None:
        keys = np.ascontiguousarray(keys, dtype=np.int64)
        if keys.size == 0:
            return
        self._changing()
        self._append(keys, self._records(keys, rows), self._map.lookup(keys))

    def contains(self, keys: np.ndarray) -> np.ndarray:
        return self._map.lookup(np.ascontiguousarray(keys, dtype=np.int64)) >= 0

    # -- contract -------------------------------------------------------------------------
    def lookup(self, keys: torch.Tensor) -> Lookup:
        k = check_keys(keys)
        uniq, inverse = np.unique(k, return_inverse=True)
        _, rows = self.read_rows(uniq)
        return Lookup(torch.from_numpy(k.copy()), rows.emb.index_select(0, torch.from_numpy(inverse.reshape(-1))))

    def evict(self, keys: torch.Tensor) -> None:
        k = np.unique(check_keys(keys))
        if k.size == 0 or not self.contains(k).any():
            return
        self._changing()
        # Forget the keys only once the live rows sharing their units are safe: reclaiming a unit
        # that falls below the threshold moves those rows first (an append with no new rows).
        slots = self._map.lookup(k)
        held = slots >= 0
        self._append(np.empty(0, dtype=np.int64), np.zeros(0, dtype=self._rec), np.empty(0, dtype=np.int64),
                     dying=slots[held])
        self._map.remove(k[held])
        self._counters["evictions"] += int(held.sum())

    def _scan(self, batch_rows: int = _BATCH_ROWS):
        """Yield (slots, records) of the live rows, in slot order, reading the file sequentially.

        A record is live when the index maps its key to its slot (free slots hold stale records
        or zeros, which fail that test)."""
        rpu = self.rows_per_unit
        n_units = -(-self._map.high_water // rpu)
        step = max(1, batch_rows // rpu)
        for u0 in range(0, n_units, step):
            units = np.arange(u0, min(n_units, u0 + step))
            units = units[self._unit_live[units] > 0]
            if units.size == 0:
                continue
            buf, arr = self._alloc(units.size)
            self._io(False, units, buf)
            recs = arr.reshape(-1).copy()
            del arr
            slots = (units[:, None] * rpu + np.arange(rpu)).reshape(-1)
            live = self._map.lookup(recs["key"]) == slots
            yield slots[live], recs[live]

    def iter_rows(self, batch_rows: int = _BATCH_ROWS):
        """Yield (keys, Rows) of every row, in slot order (a sequential read of the file), exactly
        `batch_rows` at a time (the last batch may be shorter), so equal shards give equal snapshots."""
        held: list[np.ndarray] = []
        n_held = 0
        for _, recs in self._scan(batch_rows):
            held.append(recs)
            n_held += recs.size
            while n_held >= batch_rows:
                cat = np.concatenate(held)
                out, rest = cat[:batch_rows], cat[batch_rows:]
                yield out["key"].copy(), self._rows_of(out)
                held, n_held = [rest], rest.size
        if n_held:
            cat = np.concatenate(held)
            yield cat["key"].copy(), self._rows_of(cat)

    def snapshot(self, url: str, storage_options: dict | None = None) -> int:
        with SnapshotWriter(url, self.dim, storage_options) as w:
            for keys, rows in self.iter_rows():
                w.write(keys, rows.emb, rows.m, rows.v, rows.clock)
        return w.rows

    def wipe(self) -> None:
        """Delete every row (truncate the file, empty the index) and clear the tag; persisted."""
        self._changing()
        self._map = CompactSlotMap(reuse_slots=False)
        self._unit_live = np.zeros(0, dtype=np.int32)
        self._reset_log()
        os.ftruncate(self._fd, 0)
        self._save(clean=True)

    def restore(
        self, url: str, *, owner: tuple[int, int] | None = None, storage_options: dict | None = None
    ) -> int:
        check_snapshot_dim(url, self.dim, storage_options)
        self.wipe()
        for b in iter_snapshot(url, owner=owner, storage_options=storage_options):
            # Keep the file order (a duplicate key's last row wins): slots follow it, so a snapshot of
            # the restored shard lists the rows as `url` does.
            _, first_rev = np.unique(b.keys[::-1], return_index=True)
            last = np.sort(b.keys.size - 1 - first_rev)
            self.write_rows(b.keys[last], Rows.from_numpy(b.emb, b.m, b.v, b.clock).select(last))
        self._save(clean=True)
        return len(self)

    def compact(self) -> int:
        """Rewrite the row file without holes, keeping the rows' slot order; returns the bytes reclaimed.

        The live rows are copied (sequential reads and writes) to a new file that then replaces
        the old one; the index is renumbered from the new file's records afterwards.  Appends
        keep the file within the `gc_threshold` bound without this; it gives back the space of
        free units (after a large eviction, say) and leaves every unit full."""
        self._changing()
        before = os.fstat(self._fd).st_size
        tmp = self.path / f"{ROWS_FILE}.compact"
        rpu = self.rows_per_unit
        n = len(self._map)
        new_live = np.full(-(-n // rpu), rpu, dtype=np.int32)
        if n % rpu:
            new_live[-1] = n % rpu
        flags = os.O_RDWR | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0)
        if self.direct_io_active:
            flags |= os.O_DIRECT
        new_fd = os.open(tmp, flags, 0o644)
        try:
            w = 0
            carry = np.zeros(0, dtype=self._rec)
            for _, recs in self._scan():
                recs = np.concatenate([carry, recs])
                full = recs.size // rpu * rpu  # whole units only: a unit is written once
                self._write_slots(np.arange(w, w + full, dtype=np.int64), recs[:full], fd=new_fd)
                w += full
                carry = recs[full:]
            self._write_slots(np.arange(w, w + carry.size, dtype=np.int64), carry, fd=new_fd)
            w += carry.size
            if w != n:
                raise RuntimeError(f"shard {self.path} is inconsistent: the index holds {n} rows, the file {w}")
            os.fsync(new_fd)
        except BaseException:
            os.close(new_fd)
            tmp.unlink(missing_ok=True)
            raise
        os.replace(tmp, self.rows_file)
        os.close(self._fd)
        self._fd = new_fd
        self._unit_live = new_live
        # Renumber: slot i of the new file holds the i-th live row (read its key back).
        self._map.merge()
        self._map.reset_slots(n)
        for slots, recs in self._scan_all():
            self._map.reassign(recs["key"], slots, free_old=False)
        self._reset_log()
        self._save(clean=True)
        return before - os.fstat(self._fd).st_size

    def _scan_all(self, batch_rows: int = _BATCH_ROWS):
        """Yield (slots, records) of every written slot below the high water mark, in order."""
        rpu = self.rows_per_unit
        hw = self._map.high_water
        n_units = -(-hw // rpu)
        step = max(1, batch_rows // rpu)
        for u0 in range(0, n_units, step):
            units = np.arange(u0, min(n_units, u0 + step))
            buf, arr = self._alloc(units.size)
            self._io(False, units, buf)
            recs = arr.reshape(-1)[: min(hw, (u0 + units.size) * rpu) - u0 * rpu].copy()
            del arr
            yield np.arange(u0 * rpu, u0 * rpu + recs.size, dtype=np.int64), recs

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
    def meta(self) -> dict[str, Any]:
        """A copy of the shard's meta.json content (as of the last save)."""
        return dict(self._meta)

    @property
    def file_bytes(self) -> int:
        """Current size of the row file."""
        return os.fstat(self._fd).st_size

    def flush(self) -> None:
        """Persist the index (rows are already on disk): after this the shard reopens as it is now."""
        if self._closed:
            return
        if not self._clean:
            self._save(clean=True)

    def stats(self) -> dict[str, Any]:
        return {
            self.tier: {
                **self._counters,
                "rows": len(self),
                "slots": self._map.high_water,
                "free_units": int(self._free_units.size),
                "free_slots": int(self._free_units.size) * self.rows_per_unit,
                "dead_slots": max(0, self._map.high_water - len(self) - int(self._free_units.size) * self.rows_per_unit),
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
        os.close(self._fd)
        if self._pool is not None:
            self._pool.shutdown()
        self._closed = True
        # Release the index now (~12.5 bytes per row), even if the object lives on.
        self._map = CompactSlotMap(reuse_slots=False)
        self._unit_live = np.zeros(0, dtype=np.int32)
        self._reset_log()

    def __enter__(self) -> SsdStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
