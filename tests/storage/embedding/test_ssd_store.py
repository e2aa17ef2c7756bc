"""SsdStore: the contract (direct I/O and buffered), persistence, compaction, tag, fallback."""

from __future__ import annotations

import errno
import json
import logging
import os

import numpy as np
import pytest
import torch

from storage.embedding import ssd as ssd_mod
from storage.embedding.memory import MemoryStore
from storage.embedding.ssd import SsdStore
from tests.storage.embedding.conformance import (
    DIM,
    STD,
    StoreContractTests,
    all_rows,
    keys_of,
)


class TestSsdStore(StoreContractTests):
    @pytest.fixture
    def make_store(self, tmp_path):
        made = []

        def make(dim: int = DIM, init_std: float = STD) -> SsdStore:
            s = SsdStore(str(tmp_path / f"shard{len(made)}"), dim, init_std=init_std)
            made.append(s)
            return s

        yield make
        for s in made:
            s.close()


class TestSsdStoreBuffered(TestSsdStore):
    @pytest.fixture
    def make_store(self, tmp_path):
        made = []

        def make(dim: int = DIM, init_std: float = STD) -> SsdStore:
            s = SsdStore(str(tmp_path / f"shard{len(made)}"), dim, init_std=init_std, direct_io=False)
            made.append(s)
            return s

        yield make
        for s in made:
            s.close()


def _fd_flags(fd: int) -> int:
    with open(f"/proc/self/fdinfo/{fd}") as f:
        for line in f:
            if line.startswith("flags:"):
                return int(line.split()[1], 8)
    raise AssertionError("no flags in fdinfo")


def _fill(store, n: int, seed: int = 0) -> MemoryStore:
    ref = MemoryStore(store.dim, init_std=STD)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(3):
        keys = torch.randint(0, n * 3, (n,), generator=gen)
        grads = torch.randn(n, store.dim, generator=gen)
        store.update(keys, grads, lr=0.05)
        ref.update(keys, grads, lr=0.05)
    return ref


def test_o_direct_is_used_on_this_disk(tmp_path) -> None:
    with SsdStore(str(tmp_path / "s"), DIM, init_std=STD) as store:
        assert store.direct_io_active
        assert _fd_flags(store._fd) & os.O_DIRECT
        assert store.stats()["ssd"]["direct_io"] is True
        assert store.unit_bytes % 4096 == 0 and store.rows_per_unit == 4096 // (12 * DIM + 16)
    with SsdStore(str(tmp_path / "b"), DIM, direct_io=False) as store:
        assert not store.direct_io_active and not _fd_flags(store._fd) & os.O_DIRECT


def test_falls_back_when_o_direct_is_refused(tmp_path, monkeypatch, caplog) -> None:
    real_open = os.open

    def refusing_open(path, flags, *args):
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *args)

    monkeypatch.setattr(ssd_mod.os, "open", refusing_open)
    with caplog.at_level(logging.WARNING, logger="storage.embedding.ssd"):
        store = SsdStore(str(tmp_path / "s"), DIM, init_std=STD)
    assert not store.direct_io_active
    assert sum("O_DIRECT refused" in r.getMessage() for r in caplog.records) == 1
    ref = _fill(store, 200)
    probe = torch.arange(600, dtype=torch.int64)
    assert torch.equal(store.lookup(probe).rows, ref.lookup(probe).rows)
    store.close()


def test_falls_back_when_io_is_refused(tmp_path, monkeypatch, caplog) -> None:
    store = SsdStore(str(tmp_path / "s"), DIM, init_std=STD)
    real = ssd_mod.os.pwritev
    refused = []

    def pwritev(fd, bufs, off):
        if store.direct_io_active:
            refused.append(off)
            raise OSError(errno.EINVAL, "Invalid argument")
        return real(fd, bufs, off)

    monkeypatch.setattr(ssd_mod.os, "pwritev", pwritev)
    with caplog.at_level(logging.WARNING, logger="storage.embedding.ssd"):
        ref = _fill(store, 100)
    assert refused and not store.direct_io_active
    assert sum("O_DIRECT refused" in r.getMessage() for r in caplog.records) == 1
    assert torch.equal(store.lookup(torch.arange(300)).rows, ref.lookup(torch.arange(300)).rows)
    store.close()


def test_shm_works_direct_or_buffered(tmp_path) -> None:
    base = "/dev/shm" if os.path.isdir("/dev/shm") else str(tmp_path)
    path = os.path.join(base, f"ctrpipe-test-{os.getpid()}")
    try:
        with SsdStore(path, DIM, init_std=STD) as store:  # tmpfs: O_DIRECT on newer kernels, else fallback
            ref = _fill(store, 50)
            assert torch.equal(store.lookup(torch.arange(150)).rows, ref.lookup(torch.arange(150)).rows)
    finally:
        import shutil

        shutil.rmtree(path, ignore_errors=True)


def test_reopen_after_close_keeps_content(tmp_path) -> None:
    path = str(tmp_path / "s")
    store = SsdStore(path, DIM, init_std=STD)
    ref = _fill(store, 300)
    store.evict(torch.arange(0, 900, 7))
    ref.evict(torch.arange(0, 900, 7))
    store.close()
    meta = json.loads((tmp_path / "s" / "meta.json").read_text())
    assert meta["clean"] is True and meta["rows"] == len(ref)
    assert [p.name for p in (tmp_path / "s").glob("index-*")] == [meta["index"]]
    again = SsdStore(path, DIM, init_std=STD)
    assert len(again) == len(ref)
    got, want = all_rows(again, str(tmp_path / "a.parquet")), all_rows(ref, str(tmp_path / "b.parquet"))
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])
    again.close()
    with pytest.raises(ValueError, match="dim"):
        SsdStore(path, DIM + 1)


def test_unclean_shard_is_marked_and_untagged(tmp_path) -> None:
    path = str(tmp_path / "s")
    store = SsdStore(path, DIM, init_std=STD)
    store.update(keys_of(1), torch.ones(1, DIM), lr=0.1)
    store.set_tag("v1")
    assert store.tag == "v1"
    with SsdStore(path, DIM) as reopened:
        assert reopened.tag == "v1"
    store.update(keys_of(2), torch.ones(1, DIM), lr=0.1)  # a change: the tag no longer holds
    assert store.tag is None
    crashed = json.loads((tmp_path / "s" / "meta.json").read_text())  # as a crash would leave it
    assert crashed["clean"] is False and crashed["tag"] is None
    store.flush()
    assert json.loads((tmp_path / "s" / "meta.json").read_text())["clean"] is True
    store.close()


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
    rpu, per_unit = store.rows_per_unit, store._gc_rows
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


def test_gc_threshold_is_checked(tmp_path) -> None:
    with pytest.raises(ValueError, match="gc_threshold must be in"):
        SsdStore(str(tmp_path / "s"), DIM, gc_threshold=1.0)


def test_failed_append_changes_no_row(tmp_path, monkeypatch) -> None:
    """A write error (ENOSPC) during an update leaves old rows, new keys and the allocator as they were."""
    store = SsdStore(str(tmp_path / "s"), DIM, init_std=STD)
    ref = _fill(store, 200)
    probe = torch.arange(900, dtype=torch.int64)
    before, n, slots = store.lookup(probe).rows.clone(), len(store), store.stats()["ssd"]["slots"]
    real = ssd_mod.os.pwritev

    def full(fd, bufs, off):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ssd_mod.os, "pwritev", full)
    keys = torch.arange(0, 900, 2, dtype=torch.int64)  # held rows and new keys
    with pytest.raises(OSError, match="no row changed"):
        store.update(keys, torch.ones(keys.numel(), DIM), lr=0.1)
    assert torch.equal(store.lookup(probe).rows, before) and len(store) == n
    assert store.stats()["ssd"]["slots"] == slots
    monkeypatch.setattr(ssd_mod.os, "pwritev", real)
    store.update(keys, torch.ones(keys.numel(), DIM), lr=0.1)  # the same update now goes through
    ref.update(keys, torch.ones(keys.numel(), DIM), lr=0.1)
    assert torch.equal(store.lookup(probe).rows, ref.lookup(probe).rows)
    store.close()


def test_corrupt_index_is_detected(tmp_path) -> None:
    with SsdStore(str(tmp_path / "s"), DIM, init_std=STD) as store:
        store.update(keys_of(1, 2), torch.ones(2, DIM), lr=0.1)
        slot_keys = store._map.slot_keys()
        slot_keys[:2] = slot_keys[:2][::-1].copy()
        store._map.load_slot_keys(slot_keys)
        with pytest.raises(RuntimeError, match="inconsistent"):
            store.lookup(keys_of(1)).rows


def test_refuses_object_store_urls() -> None:
    with pytest.raises(ValueError, match="local"):
        SsdStore("s3://bucket/shard", DIM)


def test_wide_rows_span_several_blocks(tmp_path) -> None:
    with SsdStore(str(tmp_path / "s"), 400, init_std=STD) as store:  # 4816-byte records
        assert store.unit_bytes == 8192 and store.rows_per_unit == 1
        ref = _fill(store, 40)
        assert torch.equal(store.lookup(torch.arange(120)).rows, ref.lookup(torch.arange(120)).rows)
