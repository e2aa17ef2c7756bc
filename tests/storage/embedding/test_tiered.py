"""The open_shard stack (device cache / host / SSD): the contract, plus stack behaviour."""

from __future__ import annotations

import numpy as np
import torch

from storage.embedding.config import StoreConfig
from storage.embedding.device_cache import DeviceCache
from storage.embedding.host import HostStore, host_row_bytes
from storage.embedding.memory import MemoryStore
from storage.embedding.rows.format import RowFormat
from storage.embedding.ssd.store import SsdStore
from storage.embedding.tiered import open_shard
from tests.helpers.stores import DIM, STD, all_rows
from tests.storage.embedding.conformance import PersistentStoreContractTests


def _config(
    device_rows: int = 16, dim: int = DIM, std: float = STD, row_dtype: str = "fp32", state_dtype: str = "fp32"
) -> StoreConfig:
    return StoreConfig(
        embedding_dim=dim,
        init_std=std,
        host_budget_mb=1,
        device_cache_rows=device_rows,
        row_dtype=row_dtype,
        state_dtype=state_dtype,
    )


def _small_stack(path: str, fmt: RowFormat | int = DIM, std: float = STD, device_rows: int = 16) -> DeviceCache:
    """The open_shard layering with a host budget of 48 rows so every tier spills in the tests."""
    ssd = SsdStore(path, fmt, init_std=std)
    host = HostStore(fmt, budget_bytes=48 * host_row_bytes(fmt), below=ssd, init_std=std)
    return DeviceCache(host, capacity_rows=device_rows, policy="lfu")


class TestSmallStack(PersistentStoreContractTests):
    def open(self, path: str, fmt: RowFormat, init_std: float):
        return _small_stack(path, fmt, init_std)

    def path_of(self, store) -> str:
        while not isinstance(store, SsdStore):
            store = store.below
        return str(store.path)


class TestOpenShard(TestSmallStack):
    def open(self, path: str, fmt: RowFormat, init_std: float):
        return open_shard(
            path,
            _config(dim=fmt.dim, std=init_std, row_dtype=fmt.row_dtype, state_dtype=fmt.state_dtype),
            optimizer=fmt.optimizer,
        )


def test_open_shard_stacks_device_host_ssd_and_reports_every_tier(tmp_path) -> None:
    store = open_shard(str(tmp_path / "s"), _config(device_rows=8), optimizer="adam")
    assert isinstance(store, DeviceCache) and store.capacity == 8
    assert isinstance(store.below, HostStore) and store.below.capacity == (1 << 20) // host_row_bytes(DIM)
    assert isinstance(store.below.below, SsdStore) and store.below.below.path == tmp_path / "s"
    store.lookup(torch.arange(4))
    stats = store.stats()
    assert list(stats) == ["device", "host", "ssd"] and stats["ssd"]["misses"] == 4
    store.close()
    no_cache = open_shard(str(tmp_path / "t"), _config(device_rows=0), optimizer="adam")
    assert isinstance(no_cache, HostStore) and isinstance(no_cache.below, SsdStore)
    no_cache.close()


def test_set_tag_flushes_every_tier_to_ssd_and_a_reopened_shard_sees_everything(tmp_path) -> None:
    path = str(tmp_path / "s")
    store = _small_stack(path)
    ref = MemoryStore(DIM, init_std=STD)
    gen = torch.Generator().manual_seed(4)
    for _ in range(10):
        keys = torch.randint(0, 500, (64,), generator=gen)
        g = torch.randn(64, DIM, generator=gen)
        store.update(keys, g, lr=0.05)
        ref.update(keys, g, lr=0.05)
    assert store.stats()["device"]["dirty"] > 0
    store.set_tag("run-7")  # flushes first
    assert store.stats()["device"]["dirty"] == 0 and store.stats()["host"]["dirty"] == 0
    assert store.tag == "run-7"
    store.close()
    ssd = SsdStore(path, DIM, init_std=STD)
    assert ssd.tag == "run-7" and len(ssd) == len(ref)
    got, want = all_rows(ssd, str(tmp_path / "a.parquet")), all_rows(ref, str(tmp_path / "b.parquet"))
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])
    ssd.close()
