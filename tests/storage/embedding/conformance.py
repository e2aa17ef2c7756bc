"""The `EmbeddingStore` contract as a test suite every tier runs (fsspec-style).

A tier's test module does::

    class TestMyStore(StoreContractTests):
        @pytest.fixture
        def make_store(self, fmt, tmp_path):
            def make(init_std=STD):
                return MyStore(fmt, init_std=init_std, ...)
            return make

The suite runs once per representative row format (`fmt`: `TIER_FORMATS`, the default's, fp32 Adam's and
another coded one's): a tier keeps, moves and writes back stored rows without reading their bytes, so every
format's bytes go through the one path that reads them in `test_format_matrix.py` (step encode and decode,
SSD record, snapshot, restore and conversion), and each tier here with three.  The tests use only the `fmt`,
`make_store`, `reopen_store` and `tmp_path` fixtures.  `make_store` must return a fresh, empty store of `fmt` each
call; small capacities (so caching tiers spill and evict during the tests) are encouraged.  A store with a
persistent level subclasses `PersistentStoreContractTests` instead and defines `open(path, fmt, init_std)`
and `path_of(store)`: its `reopen_store` fixture closes a store and opens it
again on the same files.  Every value is checked bit for bit against a
`MemoryStore` of the same format, and the update rule against an oracle per
optimizer (`tests.helpers.stores.REFERENCES`).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from storage.embedding.base import Lookup, owner_of
from storage.embedding.caching_tier import CachingTier
from storage.embedding.memory import MemoryStore
from storage.embedding.rows.batch import Rows
from storage.embedding.rows.format import RowFormat
from storage.embedding.rows.initial import init_rows
from storage.embedding.rows.transfer import is_host
from storage.embedding.snapshot import write_snapshot
from tests.helpers.stores import (
    DIM,
    STD,
    TOLERANCE,
    all_rows,
    assert_matches_oracle,
    assert_same_rows,
    keys_of,
    random_rows,
    stored,
)

TIER_FORMATS = [
    RowFormat(DIM, "wide_rowwise_adam", "int8s", "log8"),
    RowFormat(DIM, "adam", "fp32"),
    RowFormat(DIM, "adam", "int8", "log8"),
]
"""The formats every tier runs the suite with: the default (`optim.sparse_optimizer`, `store.row_dtype`,
`store.state_dtype`: symmetric int8 rows, log8 state, two second moments a row), fp32 Adam (every value exact:
the reference's rows bit for bit with nothing rounded), and int8 rows with an offset and Adam's per-element signed
and unsigned log8 state (the other coded layout).  Every format runs through the byte paths in
`test_format_matrix.py`; `tests.helpers.stores.FORMATS` keeps the wider set the unit tests of rows use."""


class StoreContractTests:
    """Contract tests; subclasses provide the `make_store` fixture (and `reopen_store` for a persistent tier)."""

    @pytest.fixture(params=TIER_FORMATS, ids=lambda f: f.name.replace("/", "-"))
    def fmt(self, request) -> RowFormat:
        """The row format of the stores under test (`TIER_FORMATS`)."""
        return request.param

    @pytest.fixture
    def reopen_store(self):
        """None: the store has no persistent level.  Else a function: store -> the same store reopened."""
        return None

    def test_declares_dim_init_std_and_device(self, make_store, fmt) -> None:
        store = make_store()
        assert store.dim == DIM and store.init_std == STD and store.row_format == fmt
        assert isinstance(store.device, torch.device)
        got = store.lookup(keys_of(1, 2))
        assert got.rows.device == store.device
        _, rows = store.read_rows(np.array([1, 2]))
        assert rows.emb.device == store.device

    # -- lookup -------------------------------------------------------------------
    def test_lookup_shape_dtype_and_init(self, make_store, fmt) -> None:
        store = make_store()
        keys = keys_of(5, 1, 2**60 + 7, 5, 0)
        rows = store.lookup(keys).rows
        assert rows.dtype == torch.float32
        assert tuple(rows.shape) == (5, DIM)
        expected = stored(init_rows(keys, DIM, STD), fmt)
        assert torch.equal(rows.cpu(), expected)
        assert torch.equal(rows[0], rows[3])  # duplicates
        assert store.lookup(keys_of()).rows.shape == (0, DIM)

    def test_same_key_same_row_in_every_store(self, make_store, fmt) -> None:
        keys = torch.arange(100, dtype=torch.int64) * 7919
        assert torch.equal(make_store().lookup(keys).rows.cpu(), MemoryStore(fmt, init_std=STD).lookup(keys).rows)

    def test_lookup_does_not_materialise(self, make_store, tmp_path) -> None:
        store = make_store()
        store.lookup(torch.arange(50, dtype=torch.int64))
        assert len(store) == 0
        assert all_rows(store, str(tmp_path / "s.parquet"))["keys"].size == 0

    def test_lookup_order_with_mixed_known_unknown(self, make_store, fmt) -> None:
        store = make_store()
        store.update(keys_of(2, 4), torch.ones(2, DIM), lr=0.1)
        rows = store.lookup(keys_of(4, 3, 2, 4)).rows.cpu()
        ref = MemoryStore(fmt, init_std=STD)
        ref.update(keys_of(2, 4), torch.ones(2, DIM), lr=0.1)
        assert torch.equal(rows, ref.lookup(keys_of(4, 3, 2, 4)).rows)

    # -- update -------------------------------------------------------------------
    def test_update_matches_the_optimizers_oracle(self, make_store, fmt) -> None:
        """Each rule against an oracle written without `sparse_optim` (torch.optim.Adam / SGD per key, row-wise
        AdaGrad in float64), within a few units in the last place of the row dtype."""
        assert_matches_oracle(make_store(), fmt)

    def test_duplicates_are_summed(self, make_store, fmt) -> None:
        a, b = make_store(), make_store()
        g = torch.randn(3, DIM, generator=torch.Generator().manual_seed(1))
        a.update(keys_of(9, 9, 9), g, lr=0.1)
        b.update(keys_of(9), g.sum(0, keepdim=True), lr=0.1)
        tol = TOLERANCE[fmt.row_dtype]
        torch.testing.assert_close(a.lookup(keys_of(9)).rows, b.lookup(keys_of(9)).rows, rtol=tol, atol=tol * 1e-2)

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
        """A long random workload (enough to make caching tiers spill) gives exactly MemoryStore's rows.

        On a CUDA store this checks the bitwise claim of `trainer.deterministic`: it runs under
        `torch.use_deterministic_algorithms(True)`, where duplicate-key sums are sorted segment sums
        (`storage.embedding.rows.segments.segment_sum`), not atomic `index_add_`.
        """
        store = make_store()
        deterministic = store.device.type == "cuda"
        before = torch.are_deterministic_algorithms_enabled()
        torch.use_deterministic_algorithms(before or deterministic)
        try:
            got, want = _reference_workload(store, tmp_path)
        finally:
            torch.use_deterministic_algorithms(before)
        for name in want:
            np.testing.assert_array_equal(got[name], want[name], err_msg=name)

    def test_matches_reference_store_within_tolerance_without_deterministic_algorithms(
        self, make_store, tmp_path
    ) -> None:
        """What holds on CUDA without `trainer.deterministic`: atomics sum duplicates in any order, so the
        rows equal the reference's within float32 rounding of those sums (keys and clocks exactly)."""
        store = make_store()
        if store.device.type != "cuda":
            pytest.skip("a CPU store sums sequentially: the bit-for-bit test covers it")
        got, want = _reference_workload(store, tmp_path)
        for name in ("keys", "clock"):
            np.testing.assert_array_equal(got[name], want[name], err_msg=name)
        for name in set(want) - {"keys", "clock"}:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-6, err_msg=name)

    # -- bad input ----------------------------------------------------------------
    def test_non_finite_grads_raise_and_change_nothing(self, make_store, fmt, tmp_path) -> None:
        store = make_store()
        store.update(keys_of(1, 2), torch.ones(2, DIM), lr=0.1)
        before = all_rows(store, str(tmp_path / "a.parquet"))
        cases = [(float("nan"), "NaN or inf"), (float("inf"), "NaN or inf")]
        # 1e30 is finite, but its square overflows Adam's second moment and AdaGrad's accumulator, and an
        # SGD step by it overflows an fp16 row: refused as well.  (fp32 and bf16 rows hold an SGD step of 1e29.)
        if fmt.optimizer != "sgd" or fmt.row_dtype == "fp16":
            cases.append((1e30, "non-finite"))
        for bad, match in cases:
            g = torch.ones(3, DIM)
            g[2, 3] = bad
            with pytest.raises(ValueError, match=match):
                store.update(keys_of(1, 2, 3), g, lr=0.1)
                store.check_updates()  # a tier off the host refuses here (`EmbeddingStore.check_updates`)
        after = all_rows(store, str(tmp_path / "b.parquet"))
        deferred = isinstance(store, CachingTier) and not is_host(store.device)  # what it created stays, initial
        for name in before:
            np.testing.assert_array_equal(before[name], after[name][: len(before[name])] if deferred else after[name])
        assert len(store) == 2 + deferred

    def test_bad_input_raises_naming_the_value_and_changes_nothing(self, make_store) -> None:
        store = make_store()
        with pytest.raises(TypeError, match="int64, got torch.int32"):
            store.lookup(torch.tensor([1, 2], dtype=torch.int32))
        with pytest.raises(TypeError, match="ndarray"):
            store.lookup(np.array([1, 2]))  # type: ignore[arg-type]
        with pytest.raises(ValueError, match=r"\(1, 2\)"):
            store.lookup(torch.tensor([[1, 2]]))
        with pytest.raises(ValueError, match="-3"):
            store.lookup(keys_of(-3))
        with pytest.raises(TypeError, match="float64"):
            store.update(keys_of(1), torch.ones(1, DIM, dtype=torch.float64), lr=0.1)
        with pytest.raises(ValueError, match=rf"\(1, {DIM + 1}\)"):
            store.update(keys_of(1), torch.ones(1, DIM + 1), lr=0.1)
        with pytest.raises(ValueError, match=rf"\(2, {DIM}\)"):
            store.update(keys_of(1, 2), torch.ones(1, DIM), lr=0.1)
        with pytest.raises(ValueError, match="nan"):
            store.update(keys_of(1), torch.ones(1, DIM), lr=float("nan"))
        with pytest.raises(ValueError, match="-0.5"):
            store.update(keys_of(1), torch.ones(1, DIM), lr=-0.5)
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
        assert torch.equal(
            store.lookup(keys_of(2)).rows.cpu(), stored(init_rows(keys_of(2), DIM, STD), store.row_format)
        )
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

    def test_restore_replaces_content_and_filters_owner(self, make_store, fmt, tmp_path) -> None:
        keys = torch.arange(100, dtype=torch.int64) * 5 + 1
        rows = random_rows(fmt, 100, torch.Generator().manual_seed(5))
        url = str(tmp_path / "src.parquet")
        write_snapshot(url, keys, rows, fmt)
        store = make_store()
        store.update(keys_of(100_000), torch.ones(1, DIM), lr=0.1)  # replaced by the restore
        kept = store.restore(url, owner=(1, 3))
        mine = owner_of(keys, 3) == 1
        assert kept == int(mine.sum()) == len(store)
        got = all_rows(store, str(tmp_path / "out.parquet"))
        np.testing.assert_array_equal(got["keys"], keys[mine].numpy())
        np.testing.assert_array_equal(got["emb"], fmt.weights(rows.emb[mine]).numpy())
        for name, t in rows.state.items():
            np.testing.assert_array_equal(got[name], t[mine].numpy())
        np.testing.assert_array_equal(got["clock"], rows.clock[mine].numpy())
        assert torch.equal(store.lookup(keys[mine]).rows.cpu(), fmt.weights(rows.emb[mine]))
        assert torch.equal(
            store.lookup(keys_of(100_000)).rows.cpu(), stored(init_rows(keys_of(100_000), DIM, STD), fmt)
        )

    def test_restore_converts_rows_of_another_format(self, make_store, fmt, tmp_path) -> None:
        """A snapshot written before compact rows (fp32 weights with Adam, no format metadata read as that) or in
        any other format is restored converted (`RowFormat.convert`), and training goes on from the result."""
        gen = torch.Generator().manual_seed(6)
        keys = torch.arange(40, dtype=torch.int64) * 3
        for src in (RowFormat(DIM, "adam", "fp32"), RowFormat(DIM, "rowwise_adagrad", "bf16")):
            rows = random_rows(src, 40, gen)
            url = str(tmp_path / f"{src.optimizer}.parquet")
            write_snapshot(url, keys, rows, src)
            store = make_store()
            assert store.restore(url) == 40
            want = fmt.convert(rows, src)
            got = all_rows(store, str(tmp_path / f"out-{src.optimizer}.parquet"))
            np.testing.assert_array_equal(got["emb"], fmt.weights(want.emb).numpy())
            assert sorted(set(got) - {"keys", "emb", "clock"}) == sorted(fmt.state_names)
            for name, t in want.state.items():
                np.testing.assert_array_equal(got[name], t.numpy(), err_msg=f"{src.name} -> {fmt.name}: {name}")
            ref = MemoryStore(fmt, init_std=STD)
            ref.write_rows(keys.numpy(), want)
            g = torch.randn(40, DIM, generator=gen)
            store.update(keys, g, lr=0.05)
            ref.update(keys, g, lr=0.05)
            assert_same_rows(store, ref, tmp_path)

    def test_restore_wrong_dim_raises(self, make_store, fmt, tmp_path) -> None:
        url = str(tmp_path / "wide.parquet")
        wide = RowFormat(DIM + 1, fmt.optimizer, fmt.row_dtype)
        write_snapshot(url, keys_of(1, 2), wide.fresh(torch.zeros(2, DIM + 1)), wide)
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
        store.lookup(keys_of(1, 2, 3))
        store.evict(keys_of(1))
        store.flush()  # write-back tiers count bytes when rows go down
        s1 = store.stats()
        total = {k: sum(t[k] for t in s1.values()) for k in ("hits", "misses", "bytes_written", "evictions")}
        assert total["hits"] >= 2
        assert total["misses"] >= 1
        assert total["bytes_written"] > 0
        assert total["evictions"] >= 1
        assert s1[top]["rows"] >= 1

    # -- full rows: read_rows / write_rows / contains -----------------------------------
    def test_read_rows_reports_found_and_fresh_rows_without_materialising(self, make_store, fmt) -> None:
        store = make_store()
        for ks in ((3, 5), (5,), (5, 9)):  # clocks 3:1, 5:3, 9:1
            store.update(keys_of(*ks), torch.ones(len(ks), DIM), lr=0.1)
        ref = MemoryStore(fmt, init_std=STD)
        for ks in ((3, 5), (5,), (5, 9)):
            ref.update(keys_of(*ks), torch.ones(len(ks), DIM), lr=0.1)
        keys = np.array([9, 4, 5, 3, 1000])
        found, rows = store.read_rows(keys)
        want_found, want = ref.read_rows(keys)
        assert found.tolist() == want_found.tolist() == [True, False, True, True, False]
        assert rows.clock.cpu().tolist() == [1, 0, 3, 1, 0]
        assert sorted(rows.state) == sorted(fmt.state_names)
        for got_t, want_t in zip(rows.tensors(), want.tensors(), strict=True):
            assert torch.equal(got_t.cpu(), want_t)
        fresh = fmt.nearest(init_rows(torch.tensor([4, 1000]), DIM, STD))
        assert torch.equal(rows.emb.cpu()[[1, 4]], fresh)
        assert not any(t.cpu()[[1, 4]].any() for t in rows.state.values())
        assert len(store) == 3
        assert store.contains(np.array([4, 1000, 9])).tolist() == [False, False, True]

    def test_write_rows_stores_full_rows_as_given(self, make_store, fmt, tmp_path) -> None:
        store = make_store()
        gen = torch.Generator().manual_seed(7)
        keys = np.arange(60, dtype=np.int64) * 11  # more than the small caches hold
        rows = random_rows(fmt, 60, gen, clock_from=5)
        assert not store.contains(keys).any()
        store.write_rows(keys, rows)
        assert store.contains(keys).all() and len(store) == 60
        doubled = fmt.nearest(fmt.weights(rows.emb) * 2)
        again = Rows(doubled, rows.state, rows.clock + 1)
        store.write_rows(keys[:10], again.select(np.arange(10)))  # overwrite some
        found, got = store.read_rows(keys)
        assert found.all()
        want_emb = torch.cat([doubled[:10], rows.emb[10:]])
        assert torch.equal(got.emb.cpu(), want_emb)
        for name, t in rows.state.items():
            assert torch.equal(got.state[name].cpu(), t), name
        assert got.clock.cpu().tolist() == [c + 1 for c in range(5, 15)] + list(range(15, 65))
        snap = all_rows(store, str(tmp_path / "s.parquet"))
        np.testing.assert_array_equal(snap["keys"], keys)
        np.testing.assert_array_equal(snap["emb"], fmt.weights(want_emb).numpy())
        # training continues from the written state (the clock drives Adam's bias correction)
        ref = MemoryStore(fmt, init_std=STD)
        ref.write_rows(keys, Rows(want_emb, rows.state, got.clock.cpu()))
        g = torch.randn(60, DIM, generator=gen)
        store.update(torch.from_numpy(keys), g, lr=0.05)
        ref.update(torch.from_numpy(keys), g, lr=0.05)
        assert_same_rows(store, ref, tmp_path)

    # -- the lookup -> update pair ----------------------------------------------------------
    @pytest.mark.parametrize("sorted_keys", [True, False])
    def test_update_of_a_lookup_handle_equals_update_of_its_keys(self, make_store, tmp_path, sorted_keys) -> None:
        """Sorted distinct keys (a sharded pull's, the reuse path) and unsorted ones with
        duplicates; a stale handle (another call in between) and a caller who changes the keys
        tensor after the lookup: the rows are bit-identical to updates by keys, and to MemoryStore's."""
        by_handle, by_keys, ref = make_store(), make_store(), MemoryStore(make_store().row_format, init_std=STD)
        gen = torch.Generator().manual_seed(11)
        for step in range(12):
            keys = torch.randint(0, 90, (40,), generator=gen)
            keys = torch.unique(keys) if sorted_keys else keys
            grads = torch.randn(keys.numel(), DIM, generator=gen)
            handle = by_handle.lookup(keys)
            assert isinstance(handle, Lookup) and torch.equal(handle.keys, keys)
            looked = by_keys.lookup(keys).rows
            assert torch.equal(handle.rows.cpu(), looked.cpu())
            assert torch.equal(handle.rows.cpu(), ref.lookup(keys).rows)
            if step % 3 == 1:  # another call in between: the handle is stale
                other = torch.randint(0, 90, (25,), generator=gen)
                og = torch.randn(25, DIM, generator=gen)
                for s in (by_handle, by_keys, ref):
                    s.update(other, og, lr=0.03)
            if step % 3 == 2:  # the caller reuses its tensor: the handle kept its own keys
                saved = keys.clone()
                keys.add_(1000)
                keys = saved
            by_handle.update(handle, grads, lr=0.05)
            by_keys.update(keys, grads, lr=0.05)
            ref.update(keys, grads, lr=0.05)
        assert len(by_handle) == len(by_keys) == len(ref)
        assert_same_rows(by_handle, by_keys, tmp_path)
        assert_same_rows(by_handle, ref, tmp_path)

    def test_handle_of_another_store_updates_by_its_keys(self, make_store, tmp_path) -> None:
        a, b, ref = make_store(), make_store(), MemoryStore(make_store().row_format, init_std=STD)
        keys = keys_of(1, 4, 9)
        handle = b.lookup(keys)
        a.lookup(keys)
        a.update(handle, torch.ones(3, DIM), lr=0.1)
        ref.update(keys, torch.ones(3, DIM), lr=0.1)
        assert len(b) == 0
        assert_same_rows(a, ref, tmp_path)

    # -- tag ---------------------------------------------------------------------------------
    def test_tag_persists_until_the_next_change(self, make_store, reopen_store, tmp_path) -> None:
        store = make_store()
        assert store.tag is None
        store.update(keys_of(1, 2), torch.ones(2, DIM), lr=0.1)
        store.set_tag("run-1")
        if reopen_store is None:  # no persistent level: nothing to tag
            assert store.tag is None
            return
        assert store.tag == "run-1"
        store.lookup(keys_of(1, 2, 3))  # reading is no change
        store.read_rows(np.array([1, 3]))
        assert store.tag == "run-1"
        store = reopen_store(store)
        assert store.tag == "run-1" and len(store) == 2  # set_tag flushed every row first
        ref = MemoryStore(store.row_format, init_std=STD)
        ref.update(keys_of(1, 2), torch.ones(2, DIM), lr=0.1)
        assert_same_rows(store, ref, tmp_path)
        store.update(keys_of(3), torch.ones(1, DIM), lr=0.1)
        assert store.tag is None
        store = reopen_store(store)
        assert store.tag is None
        store.set_tag("run-2")
        store.set_tag(None)
        assert reopen_store(store).tag is None


class PersistentStoreContractTests(StoreContractTests):
    """The suite for a store with a persistent level: subclasses say how to open one on a directory."""

    def open(self, path: str, fmt: RowFormat, init_std: float):
        """A store of `fmt` on the shard directory `path` (created empty, or reopened with its content)."""
        raise NotImplementedError

    def path_of(self, store) -> str:
        """The shard directory `store` was opened on."""
        raise NotImplementedError

    @pytest.fixture
    def make_store(self, fmt, tmp_path):
        made = []

        def make(init_std: float = STD):
            made.append(self.open(str(tmp_path / f"shard{len(made)}"), fmt, init_std))
            return made[-1]

        make.made = made
        yield make
        for s in made:
            s.close()

    @pytest.fixture
    def reopen_store(self, make_store):
        def reopen(store):
            store.close()
            make_store.made.append(self.open(self.path_of(store), store.row_format, store.init_std))
            return make_store.made[-1]

        return reopen


def _reference_workload(store, tmp_path) -> tuple[dict, dict]:
    """30 steps of random updates with duplicate keys, lookups and evictions on `store` and on the reference;
    returns every row of both (checked step by step for equal lookups where the device sums sequentially)."""
    ref = MemoryStore(store.row_format, init_std=STD)
    exact = store.device.type == "cpu" or torch.are_deterministic_algorithms_enabled()
    gen = torch.Generator().manual_seed(2)
    for step in range(30):
        keys = torch.randint(0, 400, (64,), generator=gen) * 3
        grads = torch.randn(64, DIM, generator=gen)
        for s in (store, ref):
            s.update(keys, grads, lr=0.02)
        probe = torch.randint(0, 1300, (50,), generator=gen)
        got_rows, want_rows = store.lookup(probe).rows.cpu(), ref.lookup(probe).rows
        assert (
            torch.equal(got_rows, want_rows) if exact else torch.allclose(got_rows, want_rows, rtol=1e-4, atol=1e-6)
        ), f"step {step}"
        if step % 10 == 9:
            gone = torch.randint(0, 400, (20,), generator=gen) * 3
            store.evict(gone)
            ref.evict(gone)
    assert len(store) == len(ref)
    return all_rows(store, str(tmp_path / "a.parquet")), all_rows(ref, str(tmp_path / "b.parquet"))
