"""CompactSlotMap against a Python dict; the SSD shard's index format, old and new; RMW-free writes."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import torch

import storage.embedding.compact_index as ci
from storage.embedding.cache import SlotCache, simulate_hit_rates
from storage.embedding.compact_index import CompactSlotMap, mix, unmix
from storage.embedding.host import HostStore, host_row_bytes
from storage.embedding.memory import MemoryStore
from storage.embedding.rows import Rows
from storage.embedding.ssd import SsdStore

DIM, STD = 8, 0.05


@pytest.fixture
def tiny_merges(monkeypatch):
    """Merge after a few dozen adds and move entries in small chunks, so every path runs."""
    monkeypatch.setattr(ci, "_MIN_DELTA", 40)
    monkeypatch.setattr(ci, "_CHUNK", 37)


def test_mix_is_a_bijection() -> None:
    keys = np.array([0, 1, 2**62, 2**63 - 1, 7 << 56 | 12345], dtype=np.int64)
    np.testing.assert_array_equal(unmix(mix(keys)), keys)


def test_matches_a_dict_through_adds_removes_reassigns_merges_and_reloads(tiny_merges) -> None:
    rng = np.random.default_rng(0)
    m, ref = CompactSlotMap(), {}
    merges = 0
    for step in range(240):
        op = rng.integers(0, 4)
        if op <= 1:  # add new keys (some in another field: top bits set)
            ks = np.unique(rng.integers(0, 3000, rng.integers(0, 100)) | (int(rng.integers(0, 3)) << 56))
            ks = ks[[k not in ref for k in ks.tolist()]]
            slots = m.add(ks)
            assert not set(slots.tolist()) & set(ref.values()), "a slot was given twice"
            ref.update(zip(ks.tolist(), slots.tolist(), strict=True))
        elif op == 2:  # remove, some absent
            ks = np.unique(rng.integers(0, 3000, rng.integers(0, 60)))
            ok, freed = m.remove(ks)
            assert ok.tolist() == [k in ref for k in ks.tolist()]
            assert freed.tolist() == [ref.pop(k) for k in ks.tolist() if k in ref]
        elif ref:  # move some keys to fresh slots
            ks = rng.choice(np.array(list(ref), dtype=np.int64), min(15, len(ref)), replace=False)
            new = m.take_fresh(ks.size)
            assert m.reassign(ks, new).tolist() == [ref[k] for k in ks.tolist()]
            ref.update(zip(ks.tolist(), new.tolist(), strict=True))
        probe = np.concatenate([rng.integers(0, 3000, 300), np.array(list(ref)[:50], dtype=np.int64)])
        assert m.lookup(probe).tolist() == [ref.get(k, -1) for k in probe.tolist()], step
        assert len(m) == len(ref)
        if step % 60 == 59:
            f = io.BytesIO()
            m.save(f)
            f.seek(0)
            again = CompactSlotMap()
            again.load(f)
            keys, slots = again.items()
            assert dict(zip(keys.tolist(), slots.tolist(), strict=True)) == ref
            assert again.high_water == m.high_water
            assert again.free_slots + len(ref) == again.high_water  # free list rebuilt on load
            merges += m.merges
            m = again
    assert merges > 3


def test_freed_slots_are_reused_lowest_first() -> None:
    m = CompactSlotMap()
    m.add(np.arange(10))
    m.remove(np.array([7, 2, 5]))
    np.testing.assert_array_equal(m.add(np.array([100, 101])), [2, 5])
    assert m.high_water == 10


def test_caller_placed_slots_keep_no_free_list() -> None:
    """`reuse_slots=False` (the SSD log): `insert` at chosen slots, `reassign` repoints and
    raises the high water, removed / old slots are not kept, a reload rebuilds no free list."""
    m = CompactSlotMap(reuse_slots=False)
    m.insert(np.array([5, 6, 7]), np.array([10, 11, 12]))
    assert m.high_water == 13 and m.lookup(np.array([6, 8])).tolist() == [11, -1]
    assert m.reassign(np.array([5, 7]), np.array([20, 21]), free_old=True).tolist() == [10, 12]
    assert m.high_water == 22 and m.free_slots == 0
    ok, freed = m.remove(np.array([6, 9]))
    assert ok.tolist() == [True, False] and freed.tolist() == [11] and m.free_slots == 0
    f = io.BytesIO()
    m.save(f)
    f.seek(0)
    again = CompactSlotMap(reuse_slots=False)
    again.load(f)
    assert again.free_slots == 0 and again.high_water == 22
    assert again.lookup(np.array([5, 6, 7])).tolist() == [20, -1, 21]
    with pytest.raises(KeyError, match="not in the map"):
        again.reassign(np.array([99]), np.array([30]))


def test_corrupt_index_file_is_refused() -> None:
    m = CompactSlotMap()
    m.add(np.arange(100))
    f = io.BytesIO()
    m.save(f)
    raw = bytearray(f.getvalue())
    with pytest.raises(ValueError, match="truncated"):
        CompactSlotMap().load(io.BytesIO(bytes(raw[:-50])))
    h_start = raw.index(mix(np.arange(100))[np.argsort(mix(np.arange(100)))][:1].tobytes())
    raw[h_start : h_start + 8], raw[h_start + 8 : h_start + 16] = raw[h_start + 8 : h_start + 16], raw[h_start : h_start + 8]
    with pytest.raises(ValueError, match="corrupt"):
        CompactSlotMap().load(io.BytesIO(bytes(raw)))


def test_format_1_shard_is_read_and_upgraded(tmp_path) -> None:
    path = tmp_path / "s"
    keys = torch.arange(0, 600, 3, dtype=torch.int64)
    with SsdStore(str(path), DIM, init_std=STD) as store:
        store.update(keys, torch.randn(keys.numel(), DIM, generator=torch.Generator().manual_seed(1)), lr=0.1)
        want = store.lookup(keys).rows.clone()
        slot_keys = store._map.slot_keys()
    # Rewrite the shard's index as format 1 wrote it: a slot -> key .npy.
    meta = json.loads((path / "meta.json").read_text())
    (path / meta["index"]).unlink()
    np.save(path / "index-00000009.npy", slot_keys)
    meta.update(format="ctr-ssd-shard/1", index="index-00000009.npy")
    (path / "meta.json").write_text(json.dumps(meta))
    with SsdStore(str(path), DIM, init_std=STD) as store:
        assert len(store) == keys.numel()
        assert torch.equal(store.lookup(keys).rows, want)
        store.update(keys[:3], torch.ones(3, DIM), lr=0.1)
    meta = json.loads((path / "meta.json").read_text())
    assert meta["format"] == "ctr-ssd-shard/2" and meta["index"].endswith(".idx")
    assert [p.name for p in path.glob("index-*")] == [meta["index"]]


def test_writes_append_and_read_only_units_they_reclaim(tmp_path) -> None:
    """Log-structured writes: a row update is appended at the tail, never read-modify-written;
    a unit is read only when it falls under the threshold and its live rows move."""
    with SsdStore(str(tmp_path / "s"), DIM, init_std=STD) as store:
        rpu, ub = store.rows_per_unit, store.unit_bytes
        thr = store._gc_rows

        def write(keys: np.ndarray, seed: int) -> None:
            rows = Rows.fresh(torch.randn(keys.size, DIM, generator=torch.Generator().manual_seed(seed)))
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
        slots = store._map.lookup(np.arange(3 * rpu))
        assert not (slots // rpu == 0).any()
        write(np.arange(3 * rpu, 4 * rpu), 4)
        assert store.stats()["ssd"]["free_units"] == 0
        assert (store._map.lookup(np.arange(3 * rpu, 4 * rpu)) // rpu == 0).any()
        got = store.lookup(torch.arange(4 * rpu)).rows.numpy()
        np.testing.assert_array_equal(got, expect)


def test_slot_cache_touch_accesses_equals_touch_of_counts() -> None:
    rng = np.random.default_rng(2)
    a, b = SlotCache(None), SlotCache(None)
    a.add(np.arange(50))
    b.add(np.arange(50))
    for _ in range(5):
        a.next_tick()
        b.next_tick()
        slots = rng.integers(0, 50, 200)
        uniq, counts = np.unique(slots, return_counts=True)
        assert a.touch_accesses(slots) == uniq.size
        b.touch(uniq, counts)
        np.testing.assert_array_equal(a.freq, b.freq)
        np.testing.assert_array_equal(a.last, b.last)


def test_host_lookup_fast_path_counts_distinct_hits() -> None:
    host = HostStore(DIM, budget_bytes=100 * host_row_bytes(DIM), init_std=STD)
    host.warm(torch.arange(10))
    before = host.stats()["host"]["hits"]
    out = host.lookup(torch.tensor([3, 3, 4, 3])).rows
    assert host.stats()["host"]["hits"] - before == 2
    assert torch.equal(out, MemoryStore(DIM, init_std=STD).lookup(torch.tensor([3, 3, 4, 3])).rows)


def test_per_access_hit_rate() -> None:
    stream = np.array([1, 1, 1, 2, 1, 1, 3, 3], dtype=np.int64)
    rates = simulate_hit_rates(stream, 10, "lfu", batch=4)
    # batch 1: 1 misses then hits twice, 2 misses; batch 2: 1 hits twice, 3 misses then hits.
    assert rates == {"distinct": 1 / 4, "access": 5 / 8}
