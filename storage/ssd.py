"""`SsdStore`: full rows in a node-local file read and written with direct I/O.

The SSD level of Baidu's hierarchical parameter server.  One shard directory::

    rows.bin                  fixed-size records packed into 4 KiB-aligned units
    index-<generation>.npy    slot -> key (int64, -1 = free slot), the persistent index
    meta.json                 format, dim, layout, generation, index file, tag, clean flag

A record is ``emb, m, v`` (float32[dim] each), ``clock`` (int64) and the ``key``
itself (int64, checked on every read, so a stale index can never hand one key
another key's row).  Records are packed ``rows_per_unit`` to a unit of
``unit_bytes`` (a multiple of 4096); I/O always moves whole units, at aligned
offsets, from page-aligned (anonymous `mmap`) buffers, as O_DIRECT requires.
A batch is sorted by unit, coalesced into contiguous runs, and the runs are
spread over a small thread pool of `os.preadv` / `os.pwritev` calls (which
release the GIL).  Writes that cover only part of a unit read it first.

The key -> slot index lives in memory (`storage.index.SlotMap`) and is saved
atomically on `flush()` / `close()` (new ``index-<gen>.npy``, then
``meta.json`` replaced, then the old index removed), so the store reopens with
the same content.  The first change after a save marks ``meta.json``
``clean: false`` and clears the tag, so a crash mid-run is visible to the warm
stage.  Evicted rows free their slots (reused by later inserts); `compact()`
rewrites the file without holes, in key order.

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

from storage.fsio import is_local, local_path, write_text_atomic
from storage.index import SlotMap
from storage.init import init_rows
from storage.rows import (
    Rows,
    RowTier,
    check_grads,
    check_keys,
    check_lr,
    sparse_adam,
    sum_duplicates,
)
from storage.snapshot import SnapshotWriter, iter_snapshot, snapshot_dim

log = logging.getLogger(__name__)

FORMAT = "ctr-ssd-shard/1"
BLOCK = 4096
"""I/O alignment: offsets, lengths and buffer addresses are multiples of this."""
ROWS_FILE = "rows.bin"
META_FILE = "meta.json"
_MAX_RUN_BYTES = 32 << 20
_BATCH_ROWS = 1 << 16


def record_dtype(dim: int) -> np.dtype:
    """The on-disk record of one row (packed, little-endian)."""
    return np.dtype([("emb", "<f4", (dim,)), ("m", "<f4", (dim,)), ("v", "<f4", (dim,)), ("clock", "<i8"), ("key", "<i8")])


class SsdStore(RowTier):
    """Rows of one shard in a direct-I/O row file with a persistent index.

    Args:
        path: the shard directory (local path or ``file://`` URL; created if missing).
        dim: row width; must match an existing shard's.
        init_std: std of `init_rows` for keys the shard does not hold.
        direct_io: open the row file with O_DIRECT (falls back to buffered I/O, with a
            warning, where the filesystem refuses it).
        io_threads: threads issuing the reads/writes of one batch.

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
            ("hits", "misses", "bytes_read", "bytes_written", "evictions", "read_calls", "write_calls"), 0
        )
        self._lfs = LocalFileSystem()
        self._pool = ThreadPoolExecutor(io_threads, thread_name_prefix="ssd-io") if io_threads > 1 else None
        self._io_threads = io_threads
        self._fd = -1
        self._closed = False
        self._map = SlotMap()
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
        if meta.get("format") != FORMAT:
            raise ValueError(f"{meta_path} has format {meta.get('format')!r}, expected {FORMAT!r}")
        if meta.get("dim") != self.dim:
            raise ValueError(
                f"shard {self.path} holds rows of dim {meta.get('dim')}, asked for dim {self.dim}; "
                "wipe the shard (the warm stage restores it) or fix store.embedding_dim"
            )
        for k, v in self._layout().items():
            if meta.get(k) != v:
                raise ValueError(f"shard {self.path}: {k}={meta.get(k)!r}, this code writes {v!r}")
        if meta.get("index"):
            self._map.load(np.load(self.path / meta["index"]))
        self._meta = meta
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
        index_name = f"index-{gen:08d}.npy"
        if clean:
            os.fsync(self._fd)
            tmp = self.path / f"{index_name}.tmp"
            with open(tmp, "wb") as f:
                np.save(f, self._map.slot_keys[: self._map.high_water])
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
            for p in self.path.glob("index-*.npy"):
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

    def _run_io(self, write: bool, units: np.ndarray, buf: mmap.mmap) -> None:
        runs = self._runs(units)
        view = memoryview(buf)
        ub = self.unit_bytes
        fd = self._fd

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

    def _io(self, write: bool, units: np.ndarray, buf: mmap.mmap) -> None:
        try:
            self._run_io(write, units, buf)
        except OSError as exc:
            if exc.errno != errno.EINVAL or not self.direct_io_active:
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

    def _write_records(self, slots: np.ndarray, recs: np.ndarray) -> None:
        """Write `recs` at `slots` (distinct), reading first the units they only partly cover.

        A big batch is written in pieces of at most `_BATCH_ROWS` rows (by slot order), so
        the temporary unit buffers stay small whatever the batch size."""
        if slots.size > _BATCH_ROWS:
            order = np.argsort(slots, kind="stable")
            for lo in range(0, order.size, _BATCH_ROWS):
                part = order[lo : lo + _BATCH_ROWS]
                self._write_unit_batch(slots[part], recs[part])
            return
        self._write_unit_batch(slots, recs)

    def _write_unit_batch(self, slots: np.ndarray, recs: np.ndarray) -> None:
        if slots.size == 0:
            return
        rpu = self.rows_per_unit
        unit_of = slots // rpu
        units, pos, counts = np.unique(unit_of, return_inverse=True, return_counts=True)
        buf, arr = self._alloc(units.size)
        file_units = -(-os.fstat(self._fd).st_size // self.unit_bytes)
        partial = np.flatnonzero((counts < rpu) & (units < file_units))
        if partial.size:
            pbuf, parr = self._alloc(partial.size)
            self._io(False, units[partial], pbuf)
            arr[partial] = parr
            del parr
        arr[pos.reshape(-1), slots % rpu] = recs
        del arr
        self._io(True, units, buf)

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
        slots = self._map.lookup(keys)
        new = slots < 0
        if new.any():
            slots[new] = self._map.add(keys[new])
        try:
            self._write_records(slots, self._records(keys, rows))
        except OSError as exc:
            # The new keys' records may be missing: forget them, so the index never points at a
            # row that was not written.  Overwritten rows may hold the old or the new value; the
            # shard stays marked not clean (see `meta`), and the warm stage restores such a shard.
            if new.any():
                self._map.remove(keys[new])
            raise OSError(
                exc.errno,
                f"writing {keys.size} rows ({keys.size * self.record_bytes} bytes) to {self.rows_file} "
                f"failed: {exc.strerror} (disk full or file size limit?); {int(new.sum())} new rows "
                "were not added",
            ) from exc

    def contains(self, keys: np.ndarray) -> np.ndarray:
        return self._map.lookup(np.ascontiguousarray(keys, dtype=np.int64)) >= 0

    # -- contract -------------------------------------------------------------------------
    def lookup(self, keys: torch.Tensor) -> torch.Tensor:
        k = check_keys(keys)
        uniq, inverse = np.unique(k, return_inverse=True)
        _, rows = self.read_rows(uniq)
        return rows.emb.index_select(0, torch.from_numpy(inverse.reshape(-1)))

    def update(self, keys: torch.Tensor, grads: torch.Tensor, *, lr: float, weight_decay: float = 0.0) -> None:
        k = check_keys(keys)
        check_grads(grads, k.size, self.dim)
        check_lr(lr, weight_decay)
        if k.size == 0:
            return
        uniq, g = sum_duplicates(k, grads.detach().cpu())
        _, rows = self.read_rows(uniq)
        self.write_rows(uniq, sparse_adam(rows, g, lr=lr, weight_decay=weight_decay))

    def warm(self, keys: torch.Tensor) -> None:
        """Write the initial rows of the keys the shard does not hold yet (values do not change)."""
        k = np.unique(check_keys(keys))
        missing = k[~self.contains(k)]
        if missing.size:
            self.write_rows(missing, Rows.fresh(init_rows(torch.from_numpy(missing), self.dim, self.init_std)))

    def evict(self, keys: torch.Tensor) -> None:
        k = np.unique(check_keys(keys))
        if k.size == 0 or not self.contains(k).any():
            return
        self._changing()
        ok, _ = self._map.remove(k)
        self._counters["evictions"] += int(ok.sum())

    def iter_rows(self, batch_rows: int = _BATCH_ROWS):
        """Yield (keys, Rows) of every row in ascending key order, `batch_rows` at a time."""
        slots = self._map.live_slots()
        keys = self._map.slot_keys[slots]
        order = np.argsort(keys, kind="stable")
        keys, slots = keys[order], slots[order]
        for lo in range(0, keys.size, batch_rows):
            ks, ss = keys[lo : lo + batch_rows], slots[lo : lo + batch_rows]
            yield ks, self._rows_of(self._read_records(ss, ks))

    def snapshot(self, url: str, storage_options: dict | None = None) -> int:
        with SnapshotWriter(url, self.dim, storage_options) as w:
            for keys, rows in self.iter_rows():
                w.write(keys, rows.emb, rows.m, rows.v, rows.clock)
        return w.rows

    def wipe(self) -> None:
        """Delete every row (truncate the file, empty the index) and clear the tag; persisted."""
        self._changing()
        self._map = SlotMap()
        os.ftruncate(self._fd, 0)
        self._save(clean=True)

    def restore(
        self, url: str, *, owner: tuple[int, int] | None = None, storage_options: dict | None = None
    ) -> int:
        d = snapshot_dim(url, storage_options)
        if d is not None and d != self.dim:
            raise ValueError(f"snapshot {url} has dim {d}, the store has dim {self.dim}")
        self.wipe()
        for b in iter_snapshot(url, owner=owner, storage_options=storage_options):
            rev = b.keys[::-1]
            uniq, first_rev = np.unique(rev, return_index=True)
            last = b.keys.size - 1 - first_rev
            self.write_rows(uniq, Rows.from_numpy(b.emb, b.m, b.v, b.clock).select(last))
        self._save(clean=True)
        return len(self)

    def compact(self) -> int:
        """Rewrite the row file without holes, rows in key order; returns the bytes reclaimed."""
        self._changing()
        before = os.fstat(self._fd).st_size
        tmp = self.path / f"{ROWS_FILE}.compact"
        old_fd, old_map = self._fd, self._map
        new_keys = old_map.slot_keys[old_map.live_slots()]
        new_keys.sort()
        flags = os.O_RDWR | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0)
        if self.direct_io_active:
            flags |= os.O_DIRECT
        new_fd = os.open(tmp, flags, 0o644)
        try:
            for lo in range(0, new_keys.size, _BATCH_ROWS):
                ks = new_keys[lo : lo + _BATCH_ROWS]
                self._fd = old_fd
                recs = self._read_records(old_map.lookup(ks), ks)
                self._fd = new_fd
                self._write_records(np.arange(lo, lo + ks.size, dtype=np.int64), recs)
            os.fsync(new_fd)
        except BaseException:
            self._fd = old_fd
            os.close(new_fd)
            tmp.unlink(missing_ok=True)
            raise
        os.replace(tmp, self.rows_file)
        os.close(old_fd)
        self._fd = new_fd
        self._map = SlotMap()
        self._map.load(new_keys)
        self._save(clean=True)
        return before - os.fstat(self._fd).st_size

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
                "free_slots": self._map.free_slots,
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

    def __enter__(self) -> SsdStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
