"""The open_shard stack (device cache / host / SSD): the contract, plus stack behaviour."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from storage.embedding.config import StoreConfig
from storage.embedding.device_cache import DeviceCache
from storage.embedding.host import HostStore, host_row_bytes
from storage.embedding.memory import MemoryStore
from storage.embedding.rows.format import RowFormat
from storage.embedding.ssd.store import SsdStore
from storage.embedding.tiered import AUTO_DEVICE_SHARE, device_cache_rows, open_shard
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


def test_auto_is_the_device_tier_on_cuda_and_none_on_the_host(monkeypatch) -> None:
    """`store.device_cache_rows: auto`: the host tier's rows on a GPU, within a share of its free memory; 0 on CPU."""
    fmt = RowFormat(DIM)
    host_rows = (1 << 20) // host_row_bytes(fmt)  # _config's host_budget_mb=1
    auto = dataclasses.replace(_config(), device_cache_rows="auto")
    assert device_cache_rows(auto, fmt, "cpu") == 0
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (80 << 30, 80 << 30))  # an H100's, all free
    assert device_cache_rows(auto, fmt, "cuda:0") == host_rows  # the host tier's rows fit in a share of it
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (1 << 20, 80 << 30))  # 1 MiB free
    assert device_cache_rows(auto, fmt, "cuda:0") == int((1 << 20) * AUTO_DEVICE_SHARE) // fmt.row_bytes() < host_rows
    assert device_cache_rows(_config(device_rows=7), fmt, "cuda:0") == 7  # a number is taken as it is


def test_the_seed_reaches_every_tier_and_each_rounds_with_it_alike(tmp_path) -> None:
    """`optim.seed` (open_shard's `seed`) seeds the stochastic rounding of every tier: the stack's rows equal those
    of one MemoryStore of the same seed bit for bit, whichever tier held a row at an update; another seed differs."""
    cfg = _config(device_rows=8, row_dtype="fp16", state_dtype="log8")
    store = open_shard(str(tmp_path / "s"), cfg, optimizer="adam", seed=7)
    assert [store.row_format.seed, store.below.row_format.seed, store.below.below.row_format.seed] == [7, 7, 7]
    refs = {s: MemoryStore(RowFormat(DIM, "adam", "fp16", "log8", seed=s), init_std=STD) for s in (7, 8)}
    gen = torch.Generator().manual_seed(5)
    for _ in range(6):
        keys = torch.randint(0, 100, (32,), generator=gen)
        g = torch.randn(32, DIM, generator=gen) * 1e-3  # steps of a fraction of an fp16 ulp: rounding decides
        for s in (store, *refs.values()):
            s.update(keys, g, lr=0.05)
    got = all_rows(store, str(tmp_path / "a.parquet"))
    same, other = (all_rows(refs[s], str(tmp_path / f"{s}.parquet")) for s in (7, 8))
    for name in same:
        np.testing.assert_array_equal(got[name], same[name], err_msg=name)
    assert not np.array_equal(got["emb"], other["emb"])
    store.close()
