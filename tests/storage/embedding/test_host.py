"""HostStore: the contract (spilling into a MemoryStore below, and alone), plus spill behaviour."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from storage.embedding.host import HostStore, host_row_bytes
from storage.embedding.memory import MemoryStore
from storage.embedding.resident_rows import StoreCapacityError
from tests.helpers.stores import DIM, STD, all_rows, keys_of
from tests.storage.embedding.conformance import StoreContractTests


class TestHostOverMemory(StoreContractTests):
    @pytest.fixture
    def make_store(self, fmt):
        def make(init_std: float = STD) -> HostStore:
            below = MemoryStore(fmt, init_std=init_std)
            return HostStore(fmt, budget_bytes=40 * host_row_bytes(fmt), below=below, init_std=init_std)

        return make


class TestHostAlone(StoreContractTests):
    @pytest.fixture
    def make_store(self, fmt):
        def make(init_std: float = STD) -> HostStore:
            return HostStore(fmt, budget_bytes=10_000 * host_row_bytes(fmt), init_std=init_std)

        return make


def _host(capacity: int, below=None, policy: str = "lfu") -> HostStore:
    return HostStore(DIM, budget_bytes=capacity * host_row_bytes(DIM), below=below, init_std=STD, policy=policy)


def test_spill_keeps_values_and_moves_coldest(tmp_path) -> None:
    below = MemoryStore(DIM, init_std=STD)
    host = _host(10, below)
    hot = torch.arange(5, dtype=torch.int64)
    for _ in range(5):
        host.update(hot, torch.ones(5, DIM), lr=0.1)  # freq 5 each
    cold = torch.arange(100, 120, dtype=torch.int64)
    for part in cold.split(5):  # 20 new rows, 5 per call: they evict each other, never the hot rows
        host.update(part, torch.ones(5, DIM), lr=0.1)
    s = host.stats()
    assert s["host"]["rows"] <= 10
    assert s["host"]["evictions"] > 0
    assert len(host) == 25
    assert not below.contains(hot.numpy()).any()
    # hot rows stayed on the host: the next call on them is all hits
    hits = s["host"]["hits"]
    host.lookup(hot)
    assert host.stats()["host"]["hits"] == hits + 5
    ref = MemoryStore(DIM, init_std=STD)
    for _ in range(5):
        ref.update(hot, torch.ones(5, DIM), lr=0.1)
    for part in cold.split(5):
        ref.update(part, torch.ones(5, DIM), lr=0.1)
    probe = torch.cat([hot, cold])
    assert torch.equal(host.lookup(probe).rows, ref.lookup(probe).rows)
    got, want = all_rows(host, str(tmp_path / "a.parquet")), all_rows(ref, str(tmp_path / "b.parquet"))
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])


def test_rows_read_back_from_below_are_clean() -> None:
    below = MemoryStore(DIM, init_std=STD)
    below.update(keys_of(1, 2, 3), torch.ones(3, DIM), lr=0.1)
    host = _host(10, below)
    host.lookup(keys_of(1, 2, 3, 4))
    s = host.stats()["host"]
    assert s["rows"] == 3 and s["dirty"] == 0 and s["misses"] == 4
    assert len(host) == 3
    before = below.stats()["memory"]["bytes_written"]
    host.flush()
    assert below.stats()["memory"]["bytes_written"] == before  # nothing dirty to write


def test_one_big_batch_does_not_flush_hot_rows() -> None:
    host = _host(10, MemoryStore(DIM, init_std=STD))
    for _ in range(3):
        host.update(keys_of(1, 2), torch.ones(2, DIM), lr=0.1)
    host.update(torch.arange(100, 130, dtype=torch.int64), torch.ones(30, DIM), lr=0.1)
    assert (host._resident.cache.map.lookup(np.array([1, 2])) >= 0).all()
    assert host.stats()["host"]["evictions"] == 0 and len(host) == 32


def test_batch_larger_than_budget_passes_through() -> None:
    below = MemoryStore(DIM, init_std=STD)
    host = _host(8, below)
    keys = torch.arange(50, dtype=torch.int64)
    host.update(keys, torch.ones(50, DIM), lr=0.1)
    assert host.stats()["host"]["rows"] == 8
    assert len(host) == 50
    ref = MemoryStore(DIM, init_std=STD)
    ref.update(keys, torch.ones(50, DIM), lr=0.1)
    assert torch.equal(host.lookup(keys).rows, ref.lookup(keys).rows)


def test_no_below_over_budget_raises_before_any_change() -> None:
    host = _host(4)
    host.update(keys_of(1, 2, 3), torch.ones(3, DIM), lr=0.1)
    before = host.lookup(keys_of(1, 2, 3)).rows
    with pytest.raises(StoreCapacityError, match="budget"):
        host.update(keys_of(4, 5), torch.ones(2, DIM), lr=0.1)
    assert len(host) == 3
    assert torch.equal(host.lookup(keys_of(1, 2, 3)).rows, before)
    host.warm(torch.arange(100, dtype=torch.int64))  # a hint: fills what fits, never raises
    assert len(host) == 4


def test_warm_prefers_the_first_keys() -> None:
    below = MemoryStore(DIM, init_std=STD)
    below.update(torch.arange(20, dtype=torch.int64), torch.ones(20, DIM), lr=0.1)
    host = _host(5, below)
    order = torch.tensor([19, 3, 7, 11, 2, 5, 6, 8], dtype=torch.int64)
    host.warm(order)
    resident = host._resident.cache.map.lookup(np.arange(20)) >= 0
    assert set(np.flatnonzero(resident).tolist()) == {19, 3, 7, 11, 2}


def test_budget_too_small_and_bad_below_are_refused() -> None:
    with pytest.raises(ValueError, match="budget"):
        HostStore(DIM, budget_bytes=10)
    with pytest.raises(ValueError, match="budget_bytes=-4096"):
        HostStore(DIM, budget_bytes=-4096)
    with pytest.raises(ValueError, match="dim"):
        HostStore(DIM, budget_bytes=1 << 20, below=MemoryStore(DIM + 1))
    with pytest.raises(TypeError, match="EmbeddingStore"):
        HostStore(DIM, budget_bytes=1 << 20, below=object())  # type: ignore[arg-type]


def test_eviction_slack_amortises_victim_scans() -> None:
    """With slack, a call that must evict frees extra room, so most later calls evict nothing."""
    below_a, below_b = MemoryStore(DIM, init_std=STD), MemoryStore(DIM, init_std=STD)
    exact = HostStore(DIM, budget_bytes=1000 * host_row_bytes(DIM), below=below_a, init_std=STD, evict_extra=0.0)
    slack = HostStore(DIM, budget_bytes=1000 * host_row_bytes(DIM), below=below_b, init_std=STD, evict_extra=0.05)
    ref = MemoryStore(DIM, init_std=STD)
    gen = torch.Generator().manual_seed(0)
    for _ in range(200):
        keys = torch.randint(0, 3000, (20,), generator=gen)
        grads = torch.randn(20, DIM, generator=gen)
        for s in (exact, slack, ref):
            s.update(keys, grads, lr=0.05)
    se, ss = exact.stats()["host"], slack.stats()["host"]
    assert ss["victim_scans"] * 4 < se["victim_scans"]
    assert ss["rows"] <= 1000
    probe = torch.arange(3000, dtype=torch.int64)
    assert torch.equal(slack.lookup(probe).rows, ref.lookup(probe).rows)  # values unaffected
    assert torch.equal(exact.lookup(probe).rows, ref.lookup(probe).rows)
