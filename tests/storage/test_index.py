"""KeyIndex / SlotMap against a Python dict on random batched workloads."""

from __future__ import annotations

import numpy as np
import pytest

from storage.index import KeyIndex, SlotMap


def test_key_index_matches_dict() -> None:
    rng = np.random.default_rng(0)
    idx, ref = KeyIndex(), {}
    for step in range(60):
        cand = np.unique(rng.integers(0, 5000, 300) * (2**40 + 1))
        absent = np.array([k for k in cand.tolist() if k not in ref], dtype=np.int64)
        vals = rng.integers(0, 10**9, absent.size)
        idx.insert(absent, vals)
        ref.update(zip(absent.tolist(), vals.tolist(), strict=True))
        if step % 3 == 2:
            gone = np.unique(rng.choice(cand, 100))
            removed = idx.remove(gone)
            for k, r in zip(gone.tolist(), removed.tolist(), strict=True):
                assert r == ref.pop(k, -1)
        probe = rng.integers(0, 5000, 500) * (2**40 + 1)
        assert idx.get(probe).tolist() == [ref.get(k, -1) for k in probe.tolist()]
        assert len(idx) == len(ref)


def test_slot_map_reuses_slots_and_respects_capacity() -> None:
    sm = SlotMap(capacity=4)
    s = sm.add(np.array([10, 11, 12]))
    assert sorted(s.tolist()) == [0, 1, 2]
    ok, freed = sm.remove(np.array([11, 99]))
    assert ok.tolist() == [True, False] and freed.tolist() == [1]
    assert sm.free_slots == 2
    s2 = sm.add(np.array([13, 14]))
    assert sorted(s2.tolist()) == [1, 3]
    with pytest.raises(ValueError, match="full"):
        sm.add(np.array([15]))
    assert sm.lookup(np.array([14, 10, 11])).tolist()[1:] == [0, -1]
    copy = SlotMap()
    copy.load(sm.slot_keys[: sm.high_water])
    assert copy.lookup(np.array([10, 12, 13, 14])).tolist() == sm.lookup(np.array([10, 12, 13, 14])).tolist()


def test_key_index_grows_past_overflow_cells_and_reserves(monkeypatch) -> None:
    # Two overflow cells only: probe runs pass them often, so inserts must grow and retry.
    monkeypatch.setattr("storage.index._PAD", 2)
    idx = KeyIndex(16)
    rng = np.random.default_rng(1)
    ref: dict[int, int] = {}
    for _ in range(30):
        ks = np.setdiff1d(rng.integers(0, 10**12, 200), np.fromiter(ref, dtype=np.int64, count=len(ref)))
        ks = rng.permutation(ks)
        idx.insert(ks, np.arange(len(ref), len(ref) + ks.size))
        ref.update(zip(ks.tolist(), range(len(ref), len(ref) + ks.size), strict=True))
    probe = np.array(list(ref)[:3000] + [10**13, 10**13 + 1], dtype=np.int64)
    assert idx.get(probe).tolist() == [ref.get(k, -1) for k in probe.tolist()]
    keys, vals = idx.items()
    assert dict(zip(keys.tolist(), vals.tolist(), strict=True)) == ref
    big = KeyIndex()
    big.reserve(10_000)
    size = big.table_size
    big.insert(np.arange(10_000) * 3, np.arange(10_000))
    assert big.table_size == size  # no regrowth up to the reserved count
    assert big.get(np.array([3 * 9_999, 1])).tolist() == [9_999, -1]


def test_key_index_int32_values_refuse_overflow() -> None:
    idx = KeyIndex(value_dtype=np.int32)
    with pytest.raises(ValueError, match="int32"):
        idx.insert(np.array([1]), np.array([2**31]))
    idx.insert(np.array([1, 2]), np.array([2**31 - 1, 0]))
    assert idx.get(np.array([1, 2])).dtype == np.int64
    assert idx.get(np.array([1, 2])).tolist() == [2**31 - 1, 0]
    with pytest.raises(TypeError, match="float64"):
        KeyIndex(value_dtype=np.float64)
