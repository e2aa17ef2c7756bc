"""The `EmbeddingStore` contract as a test suite every tier runs (fsspec-style).

A tier's test module does::

    class TestMyStore(StoreContractTests):
        @pytest.fixture
        def make_store(self, tmp_path):
            def make(dim=DIM, init_std=STD):
                return MyStore(dim, init_std=init_std, ...)
            return make

The tests use only the `make_store` and `tmp_path` fixtures.  `make_store`
must return a fresh, empty store each call; small capacities (so caching tiers
spill and evict during the tests) are encouraged.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from storage.embedding.base import ADAM_BETAS, ADAM_EPS, EmbeddingStore, owner_of
from storage.embedding.memory import MemoryStore
from storage.embedding.row_init import init_rows
from storage.embedding.snapshot import read_snapshot, write_snapshot

DIM = 8
STD = 0.05


def keys_of(*ks: int) -> torch.Tensor:
    return torch.tensor(ks, dtype=torch.int64)


def all_rows(store: EmbeddingStore, url: str) -> dict[str, np.ndarray]:
    """Every row of `store`, via its snapshot, sorted by key."""
    store.snapshot(url)
    keys, emb, m, v, clock = read_snapshot(url)
    order = np.argsort(keys)
    return {"keys": keys[order], "emb": emb[order], "m": m[order], "v": v[order], "clock": clock[order]}


class ReferenceAdam:
    """torch.optim.Adam with one parameter per key, stepped only when the key is touched (lazy Adam)."""

    def __init__(self, dim: int, std: float) -> None:
        self.dim, self.std = dim, std
        self.params: dict[int, torch.nn.Parameter] = {}
        self.opts: dict[int, torch.optim.Adam] = {}

    def step(self, keys: torch.Tensor, grads: torch.Tensor, lr: float, weight_decay: float = 0.0) -> None:
        summed: dict[int, torch.Tensor] = {}
        for k, g in zip(keys.tolist(), grads, strict=True):
            summed[k] = summed[k] + g if k in summed else g.clone()
        for k, g in summed.items():
            if k not in self.params:
                self.params[k] = torch.nn.Parameter(init_rows(keys_of(k), self.dim, self.std)[0].clone())
                self.opts[k] = torch.optim.Adam(
                    [self.params[k]], lr=lr, betas=ADAM_BETAS, eps=ADAM_EPS, weight_decay=weight_decay
                )
            opt = self.opts[k]
            for group in opt.param_groups:
                group["lr"], group["weight_decay"] = lr, weight_decay
            self.params[k].grad = g.clone()
            opt.step()

    def row(self, k: int) -> torch.Tensor:
        return self.params[k].detach() if k in self.params else init_rows(keys_of(k), self.dim, self.std)[0]


class StoreContractTests:
    """Contract tests; subclasses provide the `make_store` fixture."""

    # -- lookup -------------------------------------------------------------------
    def test_lookup_shape_dtype_and_init(self, make_store) -> None:
        store = make_store()
        keys = keys_of(5, 1, 2**60 + 7, 5, 0)
        rows = store.lookup(keys).rows
        assert rows.dtype == torch.float32
        assert tuple(rows.shape) == (5, DIM)
        expected = init_rows(keys, DIM, STD)
        assert torch.equal(rows.cpu(), expected)
        assert torch.equal(rows[0], rows[3])  # duplicates
        assert store.lookup(keys_of()).rows.shape == (0, DIM)

    def test_same_key_same_row_in_every_store(self, make_store) -> None:
        keys = torch.arange(100, dtype=torch.int64) * 7919
        assert torch.equal(make_store().lookup(keys).rows.cpu(), MemoryStore(DIM, init_std=STD).lookup(keys).rows)

    def test_lookup_does_not_materialise(self, make_store, tmp_path) -> None:
        store = make_store()
        store.lookup(torch.arange(50, dtype=torch.int64)).rows
        assert len(store) == 0
        assert all_rows(store, str(tmp_path / "s.parquet"))["keys"].size == 0

    def test_lookup_order_with_mixed_known_unknown(self, make_store) -> None:
        store = make_store()
        store.update(keys_of(2, 4), torch.ones(2, DIM), lr=0.1)
        rows = store.lookup(keys_of(4, 3, 2, 4)).rows.cpu()
        ref = MemoryStore(DIM, init_std=STD)
        ref.update(keys_of(2, 4), torch.ones(2, DIM), lr=0.1)
        assert torch.equal(rows, ref.lookup(keys_of(4, 3, 2, 4)).rows)

    # -- update -------------------------------------------------------------------
    def test_update_matches_torch_adam(self, make_store) -> None:
        store = make_store()
        ref = ReferenceAdam(DIM, STD)
        gen = torch.Generator().manual_seed(0)
        for step in range(6):
            n = 12
            keys = torch.randint(0, 20, (n,), generator=gen)  # duplicates and untouched keys
            grads = torch.randn(n, DIM, generator=gen)
            lr, wd = (0.05, 0.01) if step % 2 else (0.1, 0.0)
            store.update(keys, grads, lr=lr, weight_decay=wd)
            ref.step(keys, grads, lr, wd)
        probe = torch.arange(25, dtype=torch.int64)
        got = store.lookup(probe).rows.cpu()
        want = torch.stack([ref.row(k) for k in probe.tolist()])
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)

    def test_duplicates_are_summed(self, make_store) -> None:
        a, b = make_store(), make_store()
        g = torch.randn(3, DIM, generator=torch.Generator().manual_seed(1))
        a.update(keys_of(9, 9, 9), g, lr=0.1)
        b.update(keys_of(9), g.sum(0, keepdim=True), lr=0.1)
        torch.testing.assert_close(a.lookup(keys_of(9)).rows, b.lookup(keys_of(9)).rows, rtol=1e-6, atol=1e-8)

    def test_lazy_clocks(self, make_store, tmp_path) -> None:
        store = make_store()
        store.update(keys_of(1, 2, 2), torch.ones(3, DIM), lr=0.01)
        store.update(keys_of(2, 3), torch.ones(2, DIM), lr=0.01)
        store.update(keys_of(2), torch.ones(1, DIM), lr=0.01)
        rows = all_rows(store, str(tmp_path / "s.parquet"))
        assert rows["keys"].tolist() == [1, 2, 3]
        assert rows["clock"].tolist() == [1, 3, 1]
        assert len(store) == 3

    def test_matches_reference_store_bit_for_bit(self, make_store, tmp_path) -> None:
        """A long random workload (enough to make caching tiers spill) gives exactly MemoryStore's rows."""
        store, ref = make_store(), MemoryStore(DIM, init_std=STD)
        gen = torch.Generator().manual_seed(2)
        for step in range(30):
            keys = torch.randint(0, 400, (64,), generator=gen) * 3
            grads = torch.randn(64, DIM, generator=gen)
            for s in (store, ref):
                s.update(keys, grads, lr=0.02)
            probe = torch.randint(0, 1300, (50,), generator=gen)
            assert torch.equal(store.lookup(probe).rows.cpu(), ref.lookup(probe).rows), f"step {step}"
            if step % 10 == 9:
                gone = torch.randint(0, 400, (20,), generator=gen) * 3
                store.evict(gone)
                ref.evict(gone)
        assert len(store) == len(ref)
        got, want = all_rows(store, str(tmp_path / "a.parquet")), all_rows(ref, str(tmp_path / "b.parquet"))
        for name in want:
            np.testing.assert_array_equal(got[name], want[name], err_msg=name)

    # -- bad input ----------------------------------------------------------------
    def test_non_finite_grads_raise_and_change_nothing(self, make_store, tmp_path) -> None:
        store = make_store()
        store.update(keys_of(1, 2), torch.ones(2, DIM), lr=0.1)
        before = all_rows(store, str(tmp_path / "a.parquet"))
        for bad in (float("nan"), float("inf")):
            g = torch.ones(3, DIM)
            g[2, 3] = bad
            with pytest.raises(ValueError, match="NaN or inf"):
                store.update(keys_of(1, 2, 3), g, lr=0.1)
        after = all_rows(store, str(tmp_path / "b.parquet"))
        for name in before:
            np.testing.assert_array_equal(before[name], after[name])
        assert len(store) == 2

    def test_wrong_dtype_and_shape_raise(self, make_store) -> None:
        store = make_store()
        with pytest.raises(TypeError):
            store.lookup(torch.tensor([1, 2], dtype=torch.int32)).rows
        with pytest.raises(TypeError):
            store.lookup(np.array([1, 2])).rows  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            store.lookup(torch.tensor([[1, 2]])).rows
        with pytest.raises(ValueError):
            store.lookup(keys_of(-3)).rows
        with pytest.raises(TypeError):
            store.update(keys_of(1), torch.ones(1, DIM, dtype=torch.float64), lr=0.1)
        with pytest.raises(ValueError):
            store.update(keys_of(1), torch.ones(1, DIM + 1), lr=0.1)
        with pytest.raises(ValueError):
            store.update(keys_of(1, 2), torch.ones(1, DIM), lr=0.1)
        with pytest.raises(ValueError):
            store.update(keys_of(1), torch.ones(1, DIM), lr=float("nan"))
        assert len(store) == 0

    # -- warm / evict ----------------------------------------------------------------
    def test_warm_keeps_values(self, make_store) -> None:
        store = make_store()
        store.update(keys_of(1, 2), torch.ones(2, DIM), lr=0.1)
        before = store.lookup(keys_of(1, 2, 3)).rows.cpu()
        store.warm(keys_of(3, 2, 1, 1))
        assert torch.equal(store.lookup(keys_of(1, 2, 3)).rows.cpu(), before)

    def test_evict(self, make_store, tmp_path) -> None:
        store = make_store()
        store.update(keys_of(1, 2, 3), torch.ones(3, DIM), lr=0.1)
        store.evict(keys_of(2, 2, 99))  # duplicates and unknown keys are fine
        assert len(store) == 2
        assert torch.equal(store.lookup(keys_of(2)).rows.cpu(), init_rows(keys_of(2), DIM, STD))
        assert all_rows(store, str(tmp_path / "s.parquet"))["keys"].tolist() == [1, 3]
        store.update(keys_of(2), torch.ones(1, DIM), lr=0.1)  # a new life: clock restarts
        assert all_rows(store, str(tmp_path / "t.parquet"))["clock"].tolist() == [1, 1, 1]

    # -- snapshot / restore ----------------------------------------------------------
    def test_snapshot_restore_round_trip(self, make_store, tmp_path) -> None:
        store = make_store()
        gen = torch.Generator().manual_seed(3)
        for _ in range(4):
            keys = torch.randint(0, 300, (40,), generator=gen)
            store.update(keys, torch.randn(40, DIM, generator=gen), lr=0.05)
        a = str(tmp_path / "a.parquet")
        n = store.snapshot(a)
        assert n == len(store)
        other = make_store()
        assert other.restore(a) == n
        b = str(tmp_path / "b.parquet")
        other.snapshot(b)
        assert (tmp_path / "a.parquet").read_bytes() == (tmp_path / "b.parquet").read_bytes()
        probe = torch.arange(300, dtype=torch.int64)
        assert torch.equal(other.lookup(probe).rows.cpu(), store.lookup(probe).rows.cpu())
        # training continues identically after a restore
        g = torch.randn(300, DIM, generator=gen)
        store.update(probe, g, lr=0.05)
        other.update(probe, g, lr=0.05)
        assert torch.equal(other.lookup(probe).rows.cpu(), store.lookup(probe).rows.cpu())

    def test_restore_replaces_content_and_filters_owner(self, make_store, tmp_path) -> None:
        keys = torch.arange(100, dtype=torch.int64) * 5 + 1
        emb = torch.randn(100, DIM)
        m, v = torch.randn(100, DIM), torch.rand(100, DIM)
        clock = torch.arange(100, dtype=torch.int64) + 1
        url = str(tmp_path / "src.parquet")
        write_snapshot(url, keys, emb, m, v, clock)
        store = make_store()
        store.update(keys_of(100_000), torch.ones(1, DIM), lr=0.1)  # replaced by the restore
        kept = store.restore(url, owner=(1, 3))
        mine = owner_of(keys, 3) == 1
        assert kept == int(mine.sum()) == len(store)
        got = all_rows(store, str(tmp_path / "out.parquet"))
        np.testing.assert_array_equal(got["keys"], keys[mine].numpy())
        np.testing.assert_array_equal(got["emb"], emb[mine].numpy())
        np.testing.assert_array_equal(got["m"], m[mine].numpy())
        np.testing.assert_array_equal(got["v"], v[mine].numpy())
        np.testing.assert_array_equal(got["clock"], clock[mine].numpy())
        assert torch.equal(store.lookup(keys[mine]).rows.cpu(), emb[mine])
        assert torch.equal(store.lookup(keys_of(100_000)).rows.cpu(), init_rows(keys_of(100_000), DIM, STD))

    def test_restore_wrong_dim_raises(self, make_store, tmp_path) -> None:
        url = str(tmp_path / "wide.parquet")
        z = torch.zeros(2, DIM + 1)
        write_snapshot(url, keys_of(1, 2), z, z, z, keys_of(1, 1))
        with pytest.raises(ValueError, match="dim"):
            make_store().restore(url)

    # -- stats ------------------------------------------------------------------------
    def test_stats_counters_move(self, make_store) -> None:
        store = make_store()
        s0 = store.stats()
        assert s0 and all(isinstance(v, dict) for v in s0.values())
        top = next(iter(s0))
        for name in ("hits", "misses", "bytes_read", "bytes_written", "evictions", "rows"):
            assert name in s0[top], name
        store.update(keys_of(1, 2), torch.ones(2, DIM), lr=0.1)
        store.lookup(keys_of(1, 2, 3)).rows
        store.evict(keys_of(1))
        store.flush()  # write-back tiers count bytes when rows go down
        s1 = store.stats()
        total = {k: sum(t[k] for t in s1.values()) for k in ("hits", "misses", "bytes_written", "evictions")}
        assert total["hits"] >= 2
        assert total["misses"] >= 1
        assert total["bytes_written"] > 0
        assert total["evictions"] >= 1
        assert s1[top]["rows"] >= 1
