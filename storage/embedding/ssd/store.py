"""`SsdStore`: full rows of one shard in a node-local file read and written with direct I/O.

The SSD level of Baidu's hierarchical parameter server, in parts: `disk_format`
(the shard directory and record layout; every record carries its key, checked on
each read), `direct_io.UnitFile` (whole aligned units with O_DIRECT),
`unit_log.UnitLog` (log-structured appends, reclaiming sparse units),
`compact_index.CompactSlotMap` (the in-memory key -> slot index, ~12.5 bytes per
key: a 10^8-row shard's index fits in ~1.3 GB) and `shard_file.ShardFile` (the
records in the row file: appends, key-checked reads, scans, compaction; the bound
on the file's size is in its docstring).

The index is saved atomically on `flush()` / `close()` (new index file, then
meta.json, then the old index goes).  The first change after a save marks
meta.json ``clean: false`` and clears the tag, so a crash mid-run (its appends may
reuse units the saved index points at) is visible to the warm stage.  Whole-shard
scans (`iter_rows`, snapshots, `compact`) read the file sequentially: a snapshot of
a shard lists its rows in slot order, not key order.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from storage.embedding.base import EmbeddingStore, Lookup, as_row_format
from storage.embedding.rows.batch import Rows
from storage.embedding.rows.checks import check_keys
from storage.embedding.rows.format import RowFormat
from storage.embedding.rows.initial import init_rows
from storage.embedding.snapshot import SnapshotWriter, check_snapshot_dim, iter_snapshot
from storage.embedding.ssd import disk_format
from storage.embedding.ssd.behind import ShardIo
from storage.embedding.ssd.compact_index import CompactSlotMap
from storage.embedding.ssd.disk_format import ROWS_FILE, RecordLayout
from storage.embedding.ssd.shard_file import BATCH_ROWS, ShardFile
from storage.io.fsio import is_local, local_path

log = logging.getLogger(__name__)


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
            file stays within ~1/gc_threshold of the live rows' size (see `shard_file`).
            0 reclaims only units with no live row left.
        write_behind: `write_rows` hands the rows to the background thread and returns (`behind.ShardIo`; the
            tier stack's write-backs of evicted rows); a failed write then raises from the next call, its rows
            held in memory.  Off, a failed write raises from `write_rows` and changes no row.

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
        write_behind: bool = False,
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
        self._counters: dict[str, int | float] = dict.fromkeys(("hits", "misses", "evictions"), 0)
        # Seconds inside `read_rows` / `write_rows`: the tiers above call them on the step's path, so this is
        # how long training waited on this tier (`storage.embedding.pressure`).
        self._counters.update(read_s=0.0, write_s=0.0, prefetched=0, from_memory=0, prefetch_s=0.0, write_behind_s=0.0)
        self._closed = False
        index = self._load_meta()
        self._shard = ShardFile(
            self.path, self._fmt, index, gc_threshold=gc_threshold, direct_io=direct_io, io_threads=io_threads
        )
        self._io = ShardIo(self._shard, self._counters)
        self.write_behind = write_behind
        """Reads ahead (`prefetch`) and write-backs (`write_rows`) off the caller's path; `_settle` before any other
        use of the shard."""

    # -- files ------------------------------------------------------------------
    @property
    def rows_file(self) -> Path:
        """The row file of the shard."""
        return self.path / ROWS_FILE

    @property
    def direct_io_active(self) -> bool:
        """Whether the row file is read and written with O_DIRECT."""
        return self._shard.file.direct_io_active

    def _load_meta(self) -> CompactSlotMap:
        """Read (or start) meta.json, checking the format; returns the saved index (empty for a new shard)."""
        index = CompactSlotMap()
        meta = disk_format.read_meta(self.path)
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
            return index
        self._fmt.check(meta, self.path)
        if meta.get("index"):
            disk_format.load_index(self.path, meta["index"], index)
        self._meta = meta
        self._clean = bool(meta.get("clean", True))
        if not self._clean:
            log.warning("shard %s was not closed cleanly; its rows may be newer than its index", self.path)
        return index

    def _save(self, *, clean: bool) -> None:
        """Persist index + meta atomically (new index file, then meta.json, then drop the old index)."""
        self._settle()
        gen = int(self._meta.get("generation", 0)) + 1
        name = self._meta.get("index")  # unclean: only the flags change
        if clean:
            self._shard.file.fsync()
            name = disk_format.index_name(gen)
            disk_format.write_index(self.path, name, self._shard.index)
        self._meta.update(
            self._fmt.meta(),
            generation=gen,
            index=name,
            clean=clean,
            rows=len(self._shard),
            slots=self._shard.index.high_water,
            direct_io=self.direct_io_active,
        )
        disk_format.write_meta(self.path, self._meta)
        if clean:
            disk_format.drop_other_indexes(self.path, disk_format.index_name(gen))  # `name`, the index just written
        self._clean = clean

    def _changing(self, *, settle: bool = True) -> None:
        """Call before every change (`settle`: it uses the shard here, so the thread must be idle); before the first
        change after a save, marks the shard dirty (and untagged) on disk."""
        if self._closed:
            raise RuntimeError(f"SsdStore {self.path} is closed")
        if settle or self._clean:
            self._settle()
        if self._clean:
            self._meta["tag"] = None
            self._save(clean=False)

    # -- tier-to-tier interface ---------------------------------------------------------
    def read_rows(self, keys: np.ndarray) -> tuple[np.ndarray, Rows]:
        t0 = time.perf_counter()
        try:
            return self._read_rows(np.ascontiguousarray(keys, dtype=np.int64))
        finally:
            self._counters["read_s"] += time.perf_counter() - t0

    def _read_rows(self, keys: np.ndarray) -> tuple[np.ndarray, Rows]:
        served, found, recs = self._io.from_memory(keys)
        self._counters["from_memory"] += int(served.sum())
        if not served.all():  # the rest from the file: it is ours once the thread is idle
            self._settle()
            rest = np.flatnonzero(~served)
            slots = self._shard.index.lookup(keys[rest])
            held = slots >= 0
            found[rest] = held
            recs[rest[held]] = self._shard.read(slots[held], keys[rest[held]])
        nf = int(found.sum())
        self._counters["hits"] += nf
        self._counters["misses"] += keys.size - nf
        if nf == keys.size:
            return found, self._fmt.rows_of(recs)
        rows = self.row_format.fresh(init_rows(torch.from_numpy(keys), self.dim, self.init_std))
        if nf:
            idx = np.flatnonzero(found)
            rows.put(idx, self._fmt.rows_of(recs[idx]))
        return found, rows

    def prefetch(self, keys: np.ndarray) -> None:
        """Read the rows of `keys` on a background thread (one batch ahead: a new hint replaces the last), while the
        caller computes; `read_rows` then takes them from memory (`behind.ShardIo`)."""
        k = np.unique(np.ascontiguousarray(keys, dtype=np.int64))
        if k.size and not self._closed:
            self._io.read_ahead(k)

    def _settle(self) -> None:
        """Wait for the background reads and writes: the file and the index are this thread's until the next ask."""
        self._io.settle()

    def write_rows(self, keys: np.ndarray, rows: Rows) -> None:
        """Write the rows, or with `write_behind` hand them to the background thread (reads see them at once)."""
        keys = np.ascontiguousarray(keys, dtype=np.int64)
        if keys.size == 0:
            return
        t0 = time.perf_counter()
        self._changing(settle=not self.write_behind)
        if self.write_behind:
            self._io.write_behind(keys, self._fmt.to_records(keys, rows))
        else:
            self._io.drop_staged(keys)  # the staged copies are older than these rows
            self._shard.write(keys, self._fmt.to_records(keys, rows))
        self._counters["write_s"] += time.perf_counter() - t0

    def contains(self, keys: np.ndarray) -> np.ndarray:
        self._settle()
        return self._shard.index.lookup(np.ascontiguousarray(keys, dtype=np.int64)) >= 0

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
        self._io.forget_staged()
        self._counters["evictions"] += self._shard.remove(k)

    def iter_rows(self, batch_rows: int = BATCH_ROWS) -> Iterator[tuple[np.ndarray, Rows]]:
        """Yield (keys, Rows) of every row, in slot order (a sequential read of the file), exactly
        `batch_rows` at a time (the last batch may be shorter), so equal shards give equal snapshots."""
        self._settle()
        held: list[np.ndarray] = []
        n_held = 0
        for _, recs in self._shard.scan():
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
        self._io.forget_staged()
        self._shard.clear()
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

        Appends keep the file within the `gc_threshold` bound without this; it gives back the space of
        free units (after a large eviction, say) and leaves every unit full (`ShardFile.compact`)."""
        self._changing()
        self._io.forget_staged()
        before = self._shard.file.size
        self._shard.compact()
        self._save(clean=True)
        return before - self._shard.file.size

    def reserve(self, n_rows: int) -> None:
        """Size the in-memory index for `n_rows` rows now (a bulk load then never regrows it)."""
        if n_rows < 0:
            raise ValueError(f"n_rows must be >= 0, got {n_rows}")
        self._settle()
        self._shard.index.reserve(int(n_rows))

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
        return self._shard.file.size

    def flush(self) -> None:
        """Persist the index (rows are already on disk): after this the shard reopens as it is now."""
        if self._closed:
            return
        self._settle()
        if not self._clean:
            self._save(clean=True)

    def stats(self) -> dict[str, Any]:
        if not self._closed:
            self._settle()
        shard = self._shard
        free_slots = int(shard.log.free_units.size) * self.rows_per_unit
        return {
            self.tier: {
                **self._counters,
                **shard.counters,
                **shard.file.counters,
                "rows": len(self),
                "slots": shard.index.high_water,
                "free_units": int(shard.log.free_units.size),
                "free_slots": free_slots,
                "dead_slots": max(0, shard.index.high_water - len(self) - free_slots),
                "index_bytes": shard.index.nbytes,
                "index_merges": shard.index.merges,
                "file_bytes": self.file_bytes if not self._closed else 0,
                "direct_io": self.direct_io_active,
                "rows_per_unit": self.rows_per_unit,
                "unit_bytes": self.unit_bytes,
            }
        }

    def __len__(self) -> int:
        if not self._closed:
            self._settle()
        return len(self._shard)

    def close(self) -> None:
        if self._closed:
            return
        self.flush()
        self._io.close()
        self._shard.close()
        self._closed = True

    def __enter__(self) -> SsdStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
