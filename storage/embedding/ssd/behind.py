"""`ShardIo`: a shard's reads ahead and writes behind, on one background thread, with the rows in flight.

On a day whose rows live mostly on SSD, a step that reads its misses and writes its evictions itself waits on
the disk (a third of training, `bench.bigday`).  The reads of the next batch's missing rows (`SsdStore.prefetch`)
and the write-backs of evicted rows both belong off the step's path, as TorchRec's prefetch pipeline and the
seeds' parameter server do.

One thread does both, in the order they were asked, so the shard's file and index are only ever used by one thread
at a time: while jobs are in flight the caller serves rows from memory only (`from_memory`: the newest write in
flight, then what the last read ahead staged) and calls `settle` before touching the file itself.  A staged row a
later write replaced is dropped when that write completes, so memory never serves a row older than the file's.
At most `MAX_IN_FLIGHT` jobs wait: more, and the caller waits for the oldest (the rows in flight stay bounded).
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from storage.embedding.ssd.shard_file import ShardFile

MAX_IN_FLIGHT = 4
"""Jobs queued on the thread at most (a step asks for one read ahead and one write-back or two)."""


@dataclass(frozen=True)
class _Staged:
    """What a read ahead found: sorted keys, whether the shard held each, the records (meaningful where held)."""

    keys: np.ndarray
    found: np.ndarray
    recs: np.ndarray

    def without(self, keys: np.ndarray) -> _Staged:
        keep = ~np.isin(self.keys, keys)
        return _Staged(self.keys[keep], self.found[keep], self.recs[keep])


@dataclass(frozen=True)
class _Written:
    seq: int
    future: Future[None]
    keys: np.ndarray
    """Sorted."""
    recs: np.ndarray


class ShardIo:
    """The background thread of one `ShardFile` and what is in flight on it.

    Args:
        shard: the shard file; while jobs are in flight only the thread uses it.
        counters: where the thread's seconds go (`prefetch_s`, `write_behind_s`) and rows (`prefetched`).
    """

    def __init__(self, shard: ShardFile, counters: dict[str, Any]) -> None:
        self._shard = shard
        self._counters = counters
        self._pool: ThreadPoolExecutor | None = None
        self._jobs: list[Future[Any]] = []
        self._seq = 0
        self._staged: tuple[int, Future[_Staged]] | None = None
        self._written: list[_Written] = []

    def _submit(self, fn: Any, *args: Any) -> Future[Any]:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="ssd-behind")
        while len(self._jobs) >= MAX_IN_FLIGHT:
            self._jobs.pop(0).exception()  # waits; a failed job raises from `_prune`
        self._seq += 1
        job = self._pool.submit(fn, *args)
        self._jobs.append(job)
        return job

    # -- asking ---------------------------------------------------------------------------------------------
    def read_ahead(self, keys: np.ndarray) -> None:
        """Read the records of sorted distinct `keys` on the thread; the last read ahead replaces the one before."""
        job = self._submit(self._stage, keys)
        self._staged = (self._seq, job)

    def write_behind(self, keys: np.ndarray, recs: np.ndarray) -> None:
        """Write `recs` of distinct `keys` on the thread; until done, `from_memory` serves them."""
        order = np.argsort(keys, kind="stable")
        keys, recs = keys[order], recs[order]
        job = self._submit(self._write, keys, recs)
        self._written.append(_Written(self._seq, job, keys, recs))

    # -- the thread -------------------------------------------------------------------------------------------
    def _stage(self, keys: np.ndarray) -> _Staged:
        t0 = time.perf_counter()
        slots = self._shard.index.lookup(keys)
        found = slots >= 0
        recs = np.zeros(keys.size, dtype=self._shard.layout.record)
        recs[found] = self._shard.read(slots[found], keys[found])
        self._counters["prefetched"] += int(found.sum())
        self._counters["prefetch_s"] += time.perf_counter() - t0
        return _Staged(keys, found, recs)

    def _write(self, keys: np.ndarray, recs: np.ndarray) -> None:
        t0 = time.perf_counter()
        self._shard.write(keys, recs)
        self._counters["write_behind_s"] += time.perf_counter() - t0

    # -- answering --------------------------------------------------------------------------------------------
    def _prune(self) -> _Staged | None:
        """Forget the writes that completed (raising their errors), dropping their keys from a read ahead made
        before them; the read ahead, waited for."""
        staged = None
        if self._staged is not None:
            staged = self._staged[1].result()
        done = [w for w in self._written if w.future.done()]
        if not done:
            return staged
        for w in done:
            if (exc := w.future.exception()) is not None:  # its rows stay served from memory; every call says so
                raise OSError(
                    f"writing {w.keys.size} evicted rows to the SSD shard {self._shard.path} failed ({exc}); they "
                    "are held in memory only: free space under store.local_dir and rerun the day"
                ) from exc
            if staged is not None and self._staged is not None and w.seq > self._staged[0]:
                staged = staged.without(w.keys)  # the write is in the file now, newer than the staged copy
        gone = {id(w) for w in done}
        self._written = [w for w in self._written if id(w) not in gone]
        if staged is not None and self._staged is not None:
            fut: Future[_Staged] = Future()
            fut.set_result(staged)
            self._staged = (self._staged[0], fut)
        return staged

    def from_memory(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(served, found, recs) for distinct `keys`: which are answered without the file (a write in flight, the
        newest first, or the last read ahead), whether the shard holds each, and their records where found."""
        staged = self._prune()
        served = np.zeros(keys.size, dtype=bool)
        found = np.zeros(keys.size, dtype=bool)
        recs = np.zeros(keys.size, dtype=self._shard.layout.record)
        sources = [(w.keys, np.ones(w.keys.size, dtype=bool), w.recs) for w in reversed(self._written)]
        if staged is not None:
            sources.append((staged.keys, staged.found, staged.recs))
        for skeys, sfound, srecs in sources:
            todo = np.flatnonzero(~served)
            if todo.size == 0 or skeys.size == 0:
                continue
            pos = np.minimum(np.searchsorted(skeys, keys[todo]), skeys.size - 1)
            hit = skeys[pos] == keys[todo]
            at, pos = todo[hit], pos[hit]
            served[at], found[at] = True, sfound[pos]
            recs[at] = srecs[pos]
        return served, found, recs

    def settle(self) -> None:
        """Wait for every job (raising the first error): the file and index are the caller's until the next ask."""
        jobs, self._jobs = self._jobs, []
        for job in jobs:
            job.exception()  # waits; a failed job raises from `_prune`
        self._prune()

    def drop_staged(self, keys: np.ndarray) -> None:
        """Drop `keys` from what the last read ahead staged (the caller is writing them itself)."""
        self.settle()
        if self._staged is not None:
            fut: Future[_Staged] = Future()
            fut.set_result(self._staged[1].result().without(keys))
            self._staged = (self._staged[0], fut)

    def forget_staged(self) -> None:
        """Drop what the last read ahead staged (after a change the writes do not describe: an eviction, a wipe)."""
        self.settle()
        self._staged = None

    def close(self) -> None:
        """Wait for the jobs and stop the thread; a failed write raises after the thread stopped."""
        try:
            self.settle()
        finally:
            self._staged = None
            if self._pool is not None:
                self._pool.shutdown()
                self._pool = None
