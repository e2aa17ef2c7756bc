"""CompactSlotMap against a Python dict: caller-placed slots, removes, reassigns, merges, save / load."""

from __future__ import annotations

import io

import numpy as np
import pytest

import storage.embedding.ssd.compact_index as ci
from storage.embedding.ssd.compact_index import CompactSlotMap, mix, unmix


@pytest.fixture
def tiny_merges(monkeypatch):
    """Merge after a few dozen inserts and move entries in small chunks, so every path runs."""
    monkeypatch.setattr(ci, "_MIN_DELTA", 40)
    monkeypatch.setattr(ci, "_CHUNK", 37)


def _items(m: CompactSlotMap) -> dict[int, int]:
    return {k: s for keys, slots in m.iter_items() for k, s in zip(keys.tolist(), slots.tolist(), strict=True)}


def test_mix_is_a_bijection() -> None:
    keys = np.array([0, 1, 2**62, 2**63 - 1, 7 << 56 | 12345], dtype=np.int64)
    np.testing.assert_array_equal(unmix(mix(keys)), keys)


def test_matches_a_dict_through_inserts_removes_reassigns_merges_and_reloads(tiny_merges) -> None:
    rng = np.random.default_rng(0)
    m, ref = CompactSlotMap(), {}
    top = 0  # the test places keys the way the SSD log does: fresh slots above every used one
    merges = 0
    for step in range(240):
        op = rng.integers(0, 4)
        if op <= 1:  # insert new keys (some in another field: top bits set)
            ks = np.unique(rng.integers(0, 3000, rng.integers(0, 100)) | (int(rng.integers(0, 3)) << 56))
            ks = ks[[k not in ref for k in ks.tolist()]]
            slots = np.arange(top, top + ks.size)
            top += ks.size
            m.insert(ks, slots)
            ref.update(zip(ks.tolist(), slots.tolist(), strict=True))
        elif op == 2:  # remove, some absent
            ks = np.unique(rng.integers(0, 3000, rng.integers(0, 60)))
            ok, had = m.remove(ks)
            assert ok.tolist() == [k in ref for k in ks.tolist()]
            assert had.tolist() == [ref.pop(k) for k in ks.tolist() if k in ref]
        elif ref:  # move some keys to fresh slots
            ks = rng.choice(np.array(list(ref), dtype=np.int64), min(15, len(ref)), replace=False)
            new = np.arange(top, top + ks.size)
            top += ks.size
            assert m.reassign(ks, new).tolist() == [ref[k] for k in ks.tolist()]
            ref.update(zip(ks.tolist(), new.tolist(), strict=True))
        probe = np.concatenate([rng.integers(0, 3000, 300), np.array(list(ref)[:50], dtype=np.int64)])
        assert m.lookup(probe).tolist() == [ref.get(k, -1) for k in probe.tolist()], step
        assert len(m) == len(ref) and m.high_water == top
        if step % 60 == 59:
            f = io.BytesIO()
            m.save(f)
            f.seek(0)
            again = CompactSlotMap()
            again.load(f)
            assert _items(again) == ref
            assert again.high_water == m.high_water
            merges += m.merges
            m = again
    assert merges > 3


def test_insert_and_reassign_place_keys_where_the_caller_says() -> None:
    m = CompactSlotMap()
    m.insert(np.array([5, 6, 7]), np.array([10, 11, 12]))
    assert m.high_water == 13 and m.lookup(np.array([6, 8])).tolist() == [11, -1]
    assert m.reassign(np.array([5, 7]), np.array([20, 21])).tolist() == [10, 12]
    assert m.high_water == 22
    ok, had = m.remove(np.array([6, 9]))
    assert ok.tolist() == [True, False] and had.tolist() == [11]
    f = io.BytesIO()
    m.save(f)
    f.seek(0)
    again = CompactSlotMap()
    again.load(f)
    assert again.high_water == 22
    assert again.lookup(np.array([5, 6, 7])).tolist() == [20, -1, 21]
    with pytest.raises(KeyError, match="not in the map"):
        again.reassign(np.array([99]), np.array([30]))


def test_corrupt_index_file_is_refused() -> None:
    m = CompactSlotMap()
    m.insert(np.arange(100), np.arange(100))
    f = io.BytesIO()
    m.save(f)
    raw = bytearray(f.getvalue())
    with pytest.raises(ValueError, match="truncated"):
        CompactSlotMap().load(io.BytesIO(bytes(raw[:-50])))
    h_start = raw.index(mix(np.arange(100))[np.argsort(mix(np.arange(100)))][:1].tobytes())
    raw[h_start : h_start + 8], raw[h_start + 8 : h_start + 16] = (
        raw[h_start + 8 : h_start + 16],
        raw[h_start : h_start + 8],
    )
    with pytest.raises(ValueError, match="corrupt"):
        CompactSlotMap().load(io.BytesIO(bytes(raw)))
