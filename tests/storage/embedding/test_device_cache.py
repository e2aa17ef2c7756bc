"""DeviceCache: the contract over a MemoryStore, LFU vs LRU, write-back to the tier below."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import pytest
import torch

from storage.embedding.device_cache import DeviceCache
from storage.embedding.memory import MemoryStore
from storage.embedding.rows.format import RowFormat
from tests.helpers.host_reads import SIM_DEVICE, TransferMode
from tests.helpers.stores import DIM, STD, keys_of
from tests.storage.embedding.conformance import TIER_FORMATS, StoreContractTests

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
class TestDeviceCacheOverMemory(StoreContractTests):
    @pytest.fixture
    def make_store(self, device, fmt):
        def make(init_std: float = STD) -> DeviceCache:
            return DeviceCache(MemoryStore(fmt, init_std=init_std), capacity_rows=32, device=device)

        return make


class TestSimulatedGpuTier(StoreContractTests):
    """A GPU tier's code on the CPU: on `cpu:0`, which is not the host (`storage.embedding.rows.transfer.is_host`),
    the tier gathers with torch and defers its finiteness check to `check_updates`, as on `cuda`;
    `TransferMode` makes each tensor report where the tier placed it, as tests/helpers/host_reads.py runs a CUDA
    rank.  The default format only: the formats' byte paths are the same on every device."""

    @pytest.fixture(params=TIER_FORMATS[:1], ids=lambda f: f.name.replace("/", "-"))
    def fmt(self, request) -> RowFormat:
        return request.param

    @pytest.fixture
    def make_store(self, fmt) -> Iterator[Callable[..., DeviceCache]]:
        with TransferMode():
            yield lambda init_std=STD: DeviceCache(
                MemoryStore(fmt, init_std=init_std), capacity_rows=32, device=SIM_DEVICE
            )


def _stream_cache(policy: str) -> tuple[DeviceCache, MemoryStore]:
    below = MemoryStore(DIM, init_std=STD)
    below.warm(torch.arange(100, dtype=torch.int64))
    return DeviceCache(below, capacity_rows=3, policy=policy), below


def test_lfu_keeps_frequent_rows_lru_keeps_recent_rows() -> None:
    # key 1 is used often early; then a scan of new keys 10, 11, 12 (one per call) and key 1 again.
    caches = {p: _stream_cache(p)[0] for p in ("lfu", "lru")}
    stream = [[1], [1], [1], [2], [3], [10], [11], [1]]
    for cache in caches.values():
        for ks in stream:
            cache.lookup(torch.tensor(ks))
    lfu, lru = caches["lfu"].stats()["device"], caches["lru"].stats()["device"]
    assert lfu["hits"] == 3  # the final 1 hits: LFU evicted 2, 3 for 10, 11
    assert lru["hits"] == 2  # LRU evicted 1 when 11 came
    assert caches["lfu"]._resident.cache.map.lookup(np.array([1]))[0] >= 0
    assert caches["lru"]._resident.cache.map.lookup(np.array([10, 11]))[0] >= 0


def test_updates_stay_on_device_until_eviction_or_flush() -> None:
    below = MemoryStore(DIM, init_std=STD)
    cache = DeviceCache(below, capacity_rows=4)
    cache.update(keys_of(1, 2), torch.ones(2, DIM), lr=0.1)
    assert len(below) == 0 and len(cache) == 2
    assert cache.stats()["device"]["dirty"] == 2
    cache.update(keys_of(3, 4, 5), torch.ones(3, DIM), lr=0.1)  # evicts one dirty row to below
    assert len(below) == 1 and len(cache) == 5
    cache.flush()
    assert len(below) == 5 and cache.stats()["device"]["dirty"] == 0
    ref = MemoryStore(DIM, init_std=STD)
    ref.update(keys_of(1, 2), torch.ones(2, DIM), lr=0.1)
    ref.update(keys_of(3, 4, 5), torch.ones(3, DIM), lr=0.1)
    assert torch.equal(below.lookup(keys_of(1, 2, 3, 4, 5)).rows, ref.lookup(keys_of(1, 2, 3, 4, 5)).rows)


def test_stats_report_every_tier_top_first() -> None:
    cache = DeviceCache(MemoryStore(DIM, init_std=STD), capacity_rows=4)
    cache.lookup(keys_of(1))
    s = cache.stats()
    assert list(s) == ["device", "memory"]
    assert s["device"]["misses"] == 1 and s["memory"]["misses"] == 1


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="capacity_rows must be >= 1, got 0"):
        DeviceCache(MemoryStore(DIM), capacity_rows=0)
    with pytest.raises(ValueError, match="-5"):
        DeviceCache(MemoryStore(DIM), capacity_rows=-5)
    with pytest.raises(ValueError, match="policy"):
        DeviceCache(MemoryStore(DIM), capacity_rows=4, policy="fifo")


def test_restore_reuses_the_buffer_and_close_frees_it(tmp_path) -> None:
    """A cache sized over half the GPU must restore in place: no second full buffer while the first lives."""
    below = MemoryStore(DIM, init_std=STD)
    cache = DeviceCache(below, capacity_rows=8)
    cache.update(keys_of(1, 2, 3), torch.ones(3, DIM), lr=0.1)
    url = str(tmp_path / "snap.parquet")
    cache.snapshot(url)
    ptrs = [t.data_ptr() for t in cache._buf.rows.tensors()]
    cache.update(keys_of(4), torch.ones(1, DIM), lr=0.1)
    assert cache.restore(url) == 3
    assert [t.data_ptr() for t in cache._buf.rows.tensors()] == ptrs
    assert cache._buf.capacity == 8 and len(cache) == 3
    assert torch.equal(cache.lookup(keys_of(1, 2, 3)).rows, below.lookup(keys_of(1, 2, 3)).rows)
    cache.close()
    assert cache._buf.capacity == 0, "a closed cache holds no device memory"


def test_a_gpu_tier_refuses_at_its_next_check_or_flush_and_a_close_drops_it() -> None:
    with TransferMode():
        below = MemoryStore(DIM, init_std=STD)
        cache = DeviceCache(below, capacity_rows=4, device=SIM_DEVICE)
        cache.update(keys_of(1, 2), torch.ones(2, DIM), lr=0.1)
        before = cache.lookup(keys_of(1, 2)).rows.clone()
        cache.update(keys_of(1, 2), torch.full((2, DIM), float("nan")), lr=0.1)  # no host read: nothing raised yet
        assert torch.equal(cache.lookup(keys_of(1, 2)).rows, before)  # the refused update changed no row
        with pytest.raises(ValueError, match="NaN or inf"):
            cache.flush()
        cache.flush()  # raised once: the check starts afresh
        assert len(below) == 2
        cache.update(keys_of(3), torch.full((1, DIM), float("inf")), lr=0.1)
        cache.close()  # a failed run's cleanup: dropped, not raised
