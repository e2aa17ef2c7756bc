"""`UnitFile`: a file read and written in whole aligned units, with O_DIRECT where the filesystem allows it.

The SSD shard is far larger than memory and read at random, so the page cache
would only take memory from the host tier: the row file is opened with O_DIRECT.
That needs offsets, lengths and buffer addresses aligned to the block size, so
buffers are anonymous `mmap`s (page-aligned, zeroed) and I/O moves whole units.
A batch's units are coalesced into contiguous runs (at most `_MAX_RUN_BYTES` a
call) spread over a small thread pool of `os.preadv` / `os.pwritev` calls, which
release the GIL.  Where the filesystem refuses O_DIRECT (EINVAL at open or at
the first I/O), one warning is logged and buffered I/O is used instead.
"""

from __future__ import annotations

import errno
import logging
import mmap
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

_MAX_RUN_BYTES = 32 << 20
_THREADED_RUNS = 8
"""Runs in one batch above which the batch is spread over the thread pool."""


class UnitFile:
    """A file of `unit_bytes` units, read and written whole units at a time.

    Args:
        path: the file (created if missing).
        unit_bytes: size of a unit, a multiple of the block size.
        direct_io: open with O_DIRECT (falls back to buffered I/O, with a warning,
            where the filesystem refuses it).
        io_threads: threads issuing the runs of one batch.
        truncate: empty the file on open.

    Attributes:
        counters: ``read_calls``, ``write_calls`` (system calls), ``bytes_read``, ``bytes_written``.
        direct_io_active: whether O_DIRECT is in use.
    """

    def __init__(
        self, path: Path, unit_bytes: int, *, direct_io: bool = True, io_threads: int = 4, truncate: bool = False
    ) -> None:
        if io_threads < 1:
            raise ValueError(f"io_threads must be >= 1, got {io_threads}")
        self.path = Path(path)
        self.unit_bytes = unit_bytes
        self.counters = dict.fromkeys(("read_calls", "write_calls", "bytes_read", "bytes_written"), 0)
        self._io_threads = io_threads
        self._pool = ThreadPoolExecutor(io_threads, thread_name_prefix="ssd-io") if io_threads > 1 else None
        self._owns_pool = True
        self._direct_io_requested = direct_io
        self._open(truncate=truncate)

    def _open(self, *, truncate: bool = False) -> None:
        flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0) | (os.O_TRUNC if truncate else 0)
        self.direct_io_active = False
        if self._direct_io_requested and hasattr(os, "O_DIRECT"):
            try:
                self._fd = os.open(self.path, flags | os.O_DIRECT, 0o644)
                self.direct_io_active = True
                return
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                self._warn_fallback(exc)
        self._fd = os.open(self.path, flags, 0o644)

    def _warn_fallback(self, exc: OSError) -> None:
        log.warning("O_DIRECT refused for %s (%s); using buffered I/O", self.path, exc)

    def sibling(self, path: Path) -> UnitFile:
        """A new, empty file at `path` with this file's unit size, I/O mode, threads and counters.

        For rewriting the file elsewhere and then taking it over with `replace_with`."""
        other = UnitFile.__new__(UnitFile)
        other.path, other.unit_bytes, other.counters = Path(path), self.unit_bytes, self.counters
        other._io_threads, other._pool, other._owns_pool = self._io_threads, self._pool, False
        other._direct_io_requested = self.direct_io_active
        other._open(truncate=True)
        return other

    def replace_with(self, other: UnitFile) -> None:
        """Rename `other` (a `sibling`) over this file and continue on it; `other` is spent."""
        os.replace(other.path, self.path)
        os.close(self._fd)
        self._fd, self.direct_io_active = other._fd, other.direct_io_active
        other._fd = -1

    # -- I/O -------------------------------------------------------------------------------------
    def buffer(self, n_units: int) -> mmap.mmap:
        """A zeroed, page-aligned buffer of `n_units` units (at least one)."""
        return mmap.mmap(-1, max(1, n_units) * self.unit_bytes)

    def read(self, units: np.ndarray, buf: mmap.mmap) -> None:
        """Read `units` (sorted, distinct) into `buf`, unit i of `units` at offset i; past the end reads zeros."""
        self._io(False, units, buf)

    def write(self, units: np.ndarray, buf: mmap.mmap) -> None:
        """Write `buf` to `units` (sorted, distinct), unit i of `units` from offset i."""
        self._io(True, units, buf)

    def _io(self, write: bool, units: np.ndarray, buf: mmap.mmap) -> None:
        try:
            self._run_io(write, units, buf)
        except OSError as exc:
            if exc.errno != errno.EINVAL or not self.direct_io_active:
                raise
            self._warn_fallback(exc)
            os.close(self._fd)
            self._direct_io_requested = False
            self._open()
            self._run_io(write, units, buf)

    def _runs(self, units: np.ndarray) -> list[tuple[int, int]]:
        """(first, end) index ranges of `units` (sorted, distinct) that are contiguous on disk."""
        if units.size == 0:
            return []
        breaks = np.flatnonzero(np.diff(units) != 1) + 1
        starts = np.concatenate([[0], breaks]).tolist()
        ends = np.concatenate([breaks, [units.size]]).tolist()
        per_call = max(1, _MAX_RUN_BYTES // self.unit_bytes)
        out: list[tuple[int, int]] = []
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
                            raise OSError(errno.EIO, f"short write to {self.path}")
                        break  # past end of file: the buffer stays zero
                    mv, off = mv[n:], off + n
            return calls

        if self._pool is not None and len(runs) > _THREADED_RUNS:
            k = self._io_threads
            calls = sum(self._pool.map(do, [runs[i::k] for i in range(k)]))
        else:
            calls = do(runs)
        self.counters["write_calls" if write else "read_calls"] += calls
        self.counters["bytes_written" if write else "bytes_read"] += units.size * ub

    # -- the file ----------------------------------------------------------------------------------
    def fileno(self) -> int:
        return self._fd

    @property
    def size(self) -> int:
        """Current size of the file in bytes."""
        return os.fstat(self._fd).st_size

    def fsync(self) -> None:
        os.fsync(self._fd)

    def truncate(self, n_bytes: int = 0) -> None:
        os.ftruncate(self._fd, n_bytes)

    def close(self) -> None:
        """Close the file (and the thread pool, unless a sibling's)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if self._pool is not None and self._owns_pool:
            self._pool.shutdown()

    def discard(self) -> None:
        """Close and delete the file (an unfinished `sibling`)."""
        self.close()
        self.path.unlink(missing_ok=True)
