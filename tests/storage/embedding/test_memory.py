"""MemoryStore: the reference tier runs the contract suite (also as a CUDA store when one is present)."""

from __future__ import annotations

import pytest
import torch

from storage.embedding.memory import MemoryStore
from tests.helpers.stores import STD
from tests.storage.embedding.conformance import StoreContractTests


class TestMemoryStore(StoreContractTests):
    @pytest.fixture
    def make_store(self, fmt):
        def make(init_std: float = STD) -> MemoryStore:
            return MemoryStore(fmt, init_std=init_std)

        return make


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
class TestMemoryStoreCuda(StoreContractTests):
    @pytest.fixture
    def make_store(self, fmt):
        def make(init_std: float = STD) -> MemoryStore:
            return MemoryStore(fmt, init_std=init_std, device="cuda")

        return make


def test_bad_constructor_arguments_name_the_value() -> None:
    with pytest.raises(ValueError, match="dim"):
        MemoryStore(0)
    with pytest.raises(ValueError, match="init_std"):
        MemoryStore(4, init_std=0.0)


def test_freed_slots_are_reused_as_the_store_grows() -> None:
    store = MemoryStore(4)
    keys = torch.arange(5000, dtype=torch.int64) * 11
    store.update(keys, torch.ones(5000, 4), lr=0.1)
    store.evict(keys[:2500])
    store.update(keys[:1000] + 1, torch.ones(1000, 4), lr=0.1)
    assert len(store) == 3500
    assert store._map.high_water == 5000  # freed slots were reused
