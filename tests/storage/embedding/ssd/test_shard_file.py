"""The shard's row file through `SsdStore`: log-structured appends that never read a unit they rewrite, reclaimed
units and the space bound, reused free units, compaction, a failed append, wide records, a corrupt index."""

from __future__ import annotations

import errno

import numpy as np
import pytest
import torch

from storage.embedding.memory import MemoryStore
from storage.embedding.rows.format import RowFormat
from storage.embedding.ssd import direct_io
from storage.embedding.ssd.store import SsdStore
from tests.helpers.stores import DIM, STD, all_rows, fill_like_reference, keys_of


def test_compaction_keeps_content_and_shrinks_file(tmp_path) -> None:
    store = SsdStore(str(tmp_path / "s"), DIM, init_std=STD)
    keys = torch.arange(4000, dtype=torch.int64) * 13
    store.update(keys, torch.randn(4000, DIM, generator=torch.Generator().manual_seed(5)), lr=0.1)
    store.evict(keys[torch.arange(4000) % 4 != 0])  # keep a quarter
    before = all_rows(store, str(tmp_path / "a.parquet"))
    size = store.file_bytes
    reclaimed = store.compact()
    assert reclaimed > 0 and store.file_bytes == size - reclaimed
    assert store.file_bytes == -(-1000 // store.rows_per_unit) * store.unit_bytes
    assert store.stats()["ssd"]["free_slots"] == 0
    after = all_rows(store, str(tmp_path / "b.parquet"))
    for name in before:
        np.testing.assert_array_equal(before[name], after[name])
    store.update(keys[:8], torch.ones(8, DIM), lr=0.1)  # still writable; survives reopen
    store.close()
    again = SsdStore(str(tmp_path / "s"), DIM, init_std=STD)
    assert len(again) == 1000 + 6  # keys[0], keys[4] were kept; 6 of the first 8 came back
    again.close()


def test_freed_units_are_reused(tmp_path) -> None:
    with SsdStore(str(tmp_path / "s"), DIM, init_std=STD) as store:
        rpu = store.rows_per_unit
        store.update(torch.arange(4 * rpu), torch.ones(4 * rpu, DIM), lr=0.1)
        store.evict(torch.arange(2 * rpu))  # units 0 and 1 empty: free, the file does not grow
        assert store.stats()["ssd"]["free_units"] == 2
        store.update(torch.arange(1000, 1000 + 2 * rpu), torch.ones(2 * rpu, DIM), lr=0.1)
        st = store.stats()["ssd"]
        assert st["slots"] == 4 * rpu and st["free_units"] == 0 and store.file_bytes == 4 * store.unit_bytes


@pytest.mark.parametrize("threshold", [0.5, 0.25])
def test_random_updates_stay_within_the_space_bound(tmp_path, threshold) -> None:
    """Long random updates, inserts and evictions: the file never exceeds
    unit_bytes * (ceil(L / ceil(t * rows_per_unit)) + 2 + ceil(B / rows_per_unit) + 1)
    (L: live rows, B: rows appended by one call), and the content stays exact."""
    store = SsdStore(str(tmp_path / "s"), DIM, init_std=STD, gc_threshold=threshold)
    ref = MemoryStore(DIM, init_std=STD)
    rng = np.random.default_rng(3)
    rpu, per_unit = store.rows_per_unit, store._shard.log.gc_rows
    peak_live = 0
    for step in range(300):
        keys = torch.from_numpy(np.unique(rng.integers(0, 3000, 200)))
        grads = torch.from_numpy(rng.standard_normal((keys.numel(), DIM)).astype(np.float32))
        before = store.stats()["ssd"]["gc_rows"]
        store.update(keys, grads, lr=0.05)
        ref.update(keys, grads, lr=0.05)
        if step % 10 == 9:
            gone = torch.from_numpy(np.unique(rng.integers(0, 3000, 100)))
            store.evict(gone)
            ref.evict(gone)
        batch = keys.numel() + store.stats()["ssd"]["gc_rows"] - before
        peak_live = max(peak_live, len(store))
        bound = -(-peak_live // per_unit) + 2 + -(-batch // rpu) + 1
        assert store.file_bytes <= bound * store.unit_bytes, step
    st = store.stats()["ssd"]
    assert st["gc_units"] > 0 and st["bytes_read"] > 0
    amp = store.file_bytes / (len(store) * store.record_bytes)
    assert amp < 1 / threshold + 0.5, amp
    got, want = all_rows(store, str(tmp_path / "a.parquet")), all_rows(ref, str(tmp_path / "b.parquet"))
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])
    store.close()
    with SsdStore(str(tmp_path / "s"), DIM, init_std=STD, gc_threshold=threshold) as again:
        got = all_rows(again, str(tmp_path / "c.parquet"))
        for name in want:
            np.testing.assert_array_equal(got[name], want[name])


def test_failed_append_changes_no_row(tmp_path, monkeypatch) -> None:
    """A write error (ENOSPC) during an update leaves old rows, new keys and the allocator as they were."""
    store = SsdStore(str(tmp_path / "s"), DIM, init_std=STD)
    ref = fill_like_reference(store, 200)
    probe = torch.arange(900, dtype=torch.int64)
    before, n, slots = store.lookup(probe).rows.clone(), len(store), store.stats()["ssd"]["slots"]
    real = direct_io.os.pwritev

    def full(fd, bufs, off):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(direct_io.os, "pwritev", full)
    keys = torch.arange(0, 900, 2, dtype=torch.int64)  # held rows and new keys
    with pytest.raises(OSError, match="no row changed"):
        store.update(keys, torch.ones(keys.numel(), DIM), lr=0.1)
    assert torch.equal(store.lookup(probe).rows, before) and len(store) == n
    assert store.stats()["ssd"]["slots"] == slots
    monkeypatch.setattr(direct_io.os, "pwritev", real)
    store.update(keys, torch.ones(keys.numel(), DIM), lr=0.1)  # the same update now goes through
    ref.update(keys, torch.ones(keys.numel(), DIM), lr=0.1)
    assert torch.equal(store.lookup(probe).rows, ref.lookup(probe).rows)
    store.close()


def test_corrupt_index_is_detected(tmp_path) -> None:
    with SsdStore(str(tmp_path / "s"), DIM, init_std=STD) as store:
        store.update(keys_of(1, 2), torch.ones(2, DIM), lr=0.1)
        slots = store._shard.index.lookup(np.array([1, 2]))
        store._shard.index.reassign(np.array([1, 2]), slots[::-1].copy())  # the index swaps the two rows
        with pytest.raises(RuntimeError, match="inconsistent"):
            store.lookup(keys_of(1))


def test_wide_rows_span_several_blocks(tmp_path) -> None:
    with SsdStore(str(tmp_path / "s"), 400, init_std=STD) as store:  # 4816-byte records: one per 8 KiB unit
        ref = fill_like_reference(store, 40)
        assert torch.equal(store.lookup(torch.arange(120)).rows, ref.lookup(torch.arange(120)).rows)


def test_writes_append_and_read_only_units_they_reclaim(tmp_path) -> None:
    """Log-structured writes: a row update is appended at the tail, never read-modify-written;
    a unit is read only when it falls under the threshold and its live rows move."""
    with SsdStore(str(tmp_path / "s"), DIM, init_std=STD) as store:
        rpu, ub = store.rows_per_unit, store.unit_bytes
        thr = store._shard.log.gc_rows

        def write(keys: np.ndarray, seed: int) -> None:
            rows = RowFormat(DIM).fresh(torch.randn(keys.size, DIM, generator=torch.Generator().manual_seed(seed)))
            store.write_rows(keys, rows)
            expect[keys] = rows.emb.numpy()

        expect = np.zeros((4 * rpu, DIM), dtype=np.float32)
        write(np.arange(3 * rpu), 0)  # three full units
        st = store.stats()["ssd"]
        assert st["bytes_read"] == 0 and st["bytes_written"] == 3 * ub
        write(np.array([rpu + 1]), 1)  # one row of a full unit: appended to a new tail unit, no read
        st = store.stats()["ssd"]
        assert st["bytes_read"] == 0 and st["bytes_written"] == 4 * ub and st["slots"] == 3 * rpu + 1
        write(np.array([2, 3]), 2)  # the tail unit is rewritten whole from memory: still no read
        assert store.stats()["ssd"]["bytes_read"] == 0 and store.stats()["ssd"]["slots"] == 3 * rpu + 3
        # Overwrite unit 0 (rows 2, 3 are gone already) until it holds thr - 1 live rows: it is
        # read once and its other rows move with the batch.
        write(np.arange(4, rpu - thr + 3), 3)
        st = store.stats()["ssd"]
        assert st["gc_units"] == 1 and st["gc_rows"] == thr - 1 and st["bytes_read"] == ub
        assert st["free_units"] == 1  # unit 0 is empty and taken first by the next append
        slots = store._shard.index.lookup(np.arange(3 * rpu))
        assert not (slots // rpu == 0).any()
        write(np.arange(3 * rpu, 4 * rpu), 4)
        assert store.stats()["ssd"]["free_units"] == 0
        assert (store._shard.index.lookup(np.arange(3 * rpu, 4 * rpu)) // rpu == 0).any()
        got = store.lookup(torch.arange(4 * rpu)).rows.numpy()
        np.testing.assert_array_equal(got, expect)
