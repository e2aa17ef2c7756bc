"""SsdStore.prefetch: rows read ahead on a background thread serve the next `read_rows`, and never a stale row.

The trainer hints the next batch's keys after each pull (`trainer.data.Reader.stream` hands each batch over with
the next one's keys), so the SSD reads of a step overlap the step before it.  Between the hint and the read, the
step's push may write some of those rows back: a staged copy older than the file must not be served.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from storage.embedding.host import HostStore
from storage.embedding.ssd.store import SsdStore

DIM = 4


def _store(tmp_path: Path) -> SsdStore:
    store = SsdStore(str(tmp_path / "shard"), DIM)
    keys = np.arange(100, dtype=np.int64)
    _, rows = store.read_rows(keys)  # fresh initial rows
    rows.emb[:] = torch.arange(100, dtype=torch.float32).unsqueeze(1)  # row k holds k
    store.write_rows(keys, rows)
    return store


def test_a_prefetched_row_is_served_from_memory_and_equals_the_files(tmp_path: Path) -> None:
    with _store(tmp_path) as store:
        store.prefetch(np.array([5, 7, 500]))  # 500 is not on the shard: nothing to stage for it
        found, rows = store.read_rows(np.array([5, 7, 9, 500]))
        assert found.tolist() == [True, True, True, False]
        assert rows.emb[:3, 0].tolist() == [5.0, 7.0, 9.0]
        st = store.stats()["ssd"]
        assert (st["prefetched"], st["from_memory"]) == (2, 3)  # 500 known absent from memory, 9 from the file


def test_a_write_after_the_hint_wins_over_the_staged_copy(tmp_path: Path) -> None:
    with _store(tmp_path) as store:
        store.prefetch(np.array([5, 7]))
        _, newer = store.read_rows(np.array([5]))
        newer.emb[:] = -1.0
        store.write_rows(np.array([5]), newer)  # the push of the step in between
        _, rows = store.read_rows(np.array([5, 7]))
        assert rows.emb[:, 0].tolist() == [-1.0, 7.0]


def test_an_eviction_after_the_hint_drops_the_staged_rows(tmp_path: Path) -> None:
    with _store(tmp_path) as store:
        store.prefetch(np.array([5]))
        store.evict(torch.tensor([5]))
        found, _ = store.read_rows(np.array([5]))
        assert not found[0]


def test_the_host_tier_hints_only_the_keys_it_lacks(tmp_path: Path) -> None:
    ssd = _store(tmp_path)
    host = HostStore(DIM, budget_bytes=1 << 20, below=ssd)
    try:
        host.lookup(torch.tensor([1, 2]))  # now resident in the host tier
        before = ssd.stats()["ssd"]  # (waits for the writes in flight: the rows written behind are in the file)
        host.prefetch(np.array([1, 2, 3]))
        host.lookup(torch.tensor([3]))
        after = ssd.stats()["ssd"]
        assert after["prefetched"] - before["prefetched"] == 1 and after["from_memory"] - before["from_memory"] == 1
    finally:
        host.close()


def test_rows_written_behind_read_back_at_once_and_reach_the_file(tmp_path: Path) -> None:
    with SsdStore(str(tmp_path / "shard"), DIM, write_behind=True) as store:
        keys = np.arange(50, dtype=np.int64)
        _, rows = store.read_rows(keys)
        rows.emb[:] = 3.0
        store.write_rows(keys, rows)  # returns before the thread appended them
        found, back = store.read_rows(keys)
        assert found.all() and bool((back.emb == 3.0).all())
        store.flush()
    with SsdStore(str(tmp_path / "shard"), DIM) as reopened:
        found, back = reopened.read_rows(keys)
        assert found.all() and bool((back.emb == 3.0).all())


def test_a_failed_write_behind_raises_from_the_next_call_and_keeps_its_rows(tmp_path: Path, monkeypatch) -> None:
    import errno

    from storage.embedding.ssd import direct_io

    store = SsdStore(str(tmp_path / "shard"), DIM, write_behind=True)
    keys = np.arange(10, dtype=np.int64)
    _, rows = store.read_rows(keys)

    def full(fd, bufs, off):  # noqa: ANN001, ANN202 - os.pwritev's signature
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(direct_io.os, "pwritev", full)
    store.write_rows(keys, rows)
    with pytest.raises(OSError, match="held in memory only: free space under store.local_dir"):
        store.flush()
    monkeypatch.undo()
    with pytest.raises(OSError, match="held in memory only"):
        store.close()
