"""CachingTier: reuse of a lookup's resolution by the update of its handle, the all-resident fast
path, write-back snapshots, and refused updates that change no row at any level.

The sharded step looks its owned (sorted, distinct) keys up at the pull and updates the very same
keys at the push; the update then skips hashing the keys and reading the misses below again.  The
conformance suite checks the rows; these tests check the counters too, and that the shortcut is taken.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from storage.embedding.host import HostStore, host_row_bytes
from storage.embedding.memory import MemoryStore
from tests.helpers.stores import (
    DIM,
    STD,
    all_rows,
    host_over_ssd,
    same_bytes,
    snapshot_arrays,
    train_random,
)


def _host(capacity: int) -> HostStore:
    below = MemoryStore(DIM, init_std=STD)
    return HostStore(DIM, budget_bytes=capacity * host_row_bytes(DIM), below=below, init_std=STD, evict_extra=0.0)


def _steps(n: int, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        keys = torch.unique(torch.randint(0, 60, (25,), generator=g))  # sorted distinct, as a route's
        out.append((keys, torch.randn(keys.numel(), DIM, generator=g)))
    return out


@pytest.mark.parametrize("capacity", [8, 30, 1000])  # a batch larger than the cache, spills, no spills
def test_update_after_lookup_of_the_same_keys_changes_nothing(tmp_path: Path, capacity: int) -> None:
    reused, fresh = _host(capacity), _host(capacity)
    for keys, grads in _steps(12):
        looked = reused.lookup(keys)
        reused.update(looked, grads, lr=0.05)  # the lookup's handle: its resolution is reused
        b = fresh.lookup(keys).rows
        fresh.update(keys, grads, lr=0.05)  # plain keys: resolved again
        a = looked.rows
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert reused.stats()["host"] == fresh.stats()["host"]
    # ...while the tier below was really asked once per step instead of twice (the shortcut was taken)
    asked = [sum(t.below.stats()["memory"][k] for k in ("hits", "misses")) for t in (reused, fresh)]
    assert asked[0] < asked[1]
    got, want = all_rows(reused, str(tmp_path / "a")), all_rows(fresh, str(tmp_path / "b"))
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])


def test_a_call_in_between_turns_the_reuse_off_and_the_handle_owns_its_keys(tmp_path: Path) -> None:
    host, ref = _host(6), MemoryStore(DIM, init_std=STD)
    keys = torch.tensor([1, 2, 3, 4, 5], dtype=torch.int64)
    other = torch.tensor([7, 8, 9, 10, 11], dtype=torch.int64)
    ones = torch.ones(5, DIM)
    looked = host.lookup(keys)
    host.update(other, ones, lr=0.1)  # evicts some of `keys`' rows and admits others: the plan is stale
    ref.update(other, ones, lr=0.1)
    host.update(looked, ones, lr=0.1)  # resolved afresh
    ref.update(keys, ones, lr=0.1)
    looked = host.lookup(keys)
    keys.add_(20)  # the caller's tensor changes; the handle kept its own copy of the keys looked up
    host.update(looked, ones, lr=0.1)
    ref.update(keys - 20, ones, lr=0.1)
    assert torch.equal(looked.keys, keys - 20)
    probe = torch.arange(0, 30, dtype=torch.int64)
    torch.testing.assert_close(host.lookup(probe).rows, ref.lookup(probe).rows, rtol=0, atol=0)


def test_lookup_of_unsorted_keys_with_misses_still_matches_the_reference() -> None:
    host, ref = _host(10), MemoryStore(DIM, init_std=STD)
    host.update(torch.tensor([3, 9]), torch.ones(2, DIM), lr=0.1)
    ref.update(torch.tensor([3, 9]), torch.ones(2, DIM), lr=0.1)
    keys = torch.tensor([9, 40, 3, 40, 41])  # duplicates and misses: the de-duplicating path
    torch.testing.assert_close(host.lookup(keys).rows, ref.lookup(keys).rows, rtol=0, atol=0)


def test_lookup_of_resident_keys_counts_distinct_hits() -> None:
    host = HostStore(DIM, budget_bytes=100 * host_row_bytes(DIM), init_std=STD)
    host.warm(torch.arange(10))
    before = host.stats()["host"]["hits"]
    out = host.lookup(torch.tensor([3, 3, 4, 3])).rows  # the fast path: every key resident, duplicates
    assert host.stats()["host"]["hits"] - before == 2
    assert torch.equal(out, MemoryStore(DIM, init_std=STD).lookup(torch.tensor([3, 3, 4, 3])).rows)


def test_snapshot_is_a_step_boundary_with_dirty_rows_above(tmp_path) -> None:
    store, ref = host_over_ssd(tmp_path / "s"), MemoryStore(DIM, init_std=STD)
    train_random(store, 7)
    train_random(ref, 7)
    assert store.stats()["host"]["dirty"] > 0  # rows newer than the SSD copy exist
    store.snapshot(str(tmp_path / "a.parquet"))
    ref.snapshot(str(tmp_path / "b.parquet"))
    assert same_bytes(snapshot_arrays(str(tmp_path / "a.parquet")), snapshot_arrays(str(tmp_path / "b.parquet")))
    store.close()


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), 1e30])
def test_non_finite_update_changes_no_row_at_any_level(tmp_path, bad) -> None:
    store = host_over_ssd(tmp_path / "s")
    train_random(store, 4)  # rows in host (dirty) and on SSD
    snap = str(tmp_path / "before.parquet")
    store.snapshot(snap)
    keys = torch.arange(0, 100, dtype=torch.int64)  # resident, on SSD only, and new keys
    grads = torch.zeros(100, DIM)
    grads[57, 3] = bad
    with pytest.raises(ValueError, match="NaN or inf|non-finite"):
        store.update(keys, grads, lr=0.05)
    store.snapshot(str(tmp_path / "after.parquet"))
    assert same_bytes(snapshot_arrays(snap), snapshot_arrays(str(tmp_path / "after.parquet")))
    store.close()


def test_tag_is_cleared_while_dirty_rows_are_above_the_tagged_level(tmp_path) -> None:
    store = host_over_ssd(tmp_path / "s")
    train_random(store, 2)
    store.set_tag("run-1")
    assert store.tag == "run-1"
    store.update(torch.tensor([1]), torch.ones(1, DIM), lr=0.1)  # dirty in the host tier only
    assert store.below.tag == "run-1" and store.tag is None
    store.close()
