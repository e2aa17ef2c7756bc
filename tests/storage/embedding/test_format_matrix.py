"""Every row format a user can configure: each optimizer x row dtype x state dtype through every path that reads or
writes its bytes, on a host tier spilling to SSD records (`host_over_ssd`):

- the encode and decode of a step (`RowFormat.step`, `quantize`, stochastic rounding): within its tolerance of the
  optimizer's oracle, bit for bit the reference `MemoryStore`'s rows, fresh rows exactly as initialised, and a step
  that would not be finite refused with nothing changed;
- the SSD record (`ssd.disk_format`): full rows written, spilled, read back and reopened from the shard's files;
- the snapshot (`snapshot`): written, read, restored into a fresh store byte for byte, and rows of other formats
  restored converted (`RowFormat.convert`).

The contract suite (`conformance.py`) runs each tier with three representative formats (`TIER_FORMATS`): a tier
moves stored rows without reading their bytes, so the cross product of formats runs here, through the one path
their bytes pass, and the tiers' own behaviour (caching, eviction, write-back, persistence) there."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from storage.embedding.memory import MemoryStore
from storage.embedding.rows.format import ROW_DTYPES, STATE_DTYPES, RowFormat
from storage.embedding.rows.initial import init_rows
from storage.embedding.rows.sparse_optim import OPTIMIZERS
from storage.embedding.snapshot import write_snapshot
from tests.helpers.stores import (
    DIM,
    STD,
    all_rows,
    assert_matches_oracle,
    assert_same_rows,
    host_over_ssd,
    keys_of,
    random_rows,
    stored,
)

ALL = [
    RowFormat(DIM, o, r, s)
    for o, r, s in itertools.product(sorted(OPTIMIZERS), sorted(ROW_DTYPES), sorted(STATE_DTYPES))
]


@pytest.mark.parametrize("fmt", ALL, ids=lambda f: f.name.replace("/", "-"))
def test_every_format_trains_like_its_oracle_through_host_ssd_and_snapshot(fmt: RowFormat, tmp_path) -> None:
    store = host_over_ssd(tmp_path / "shard", rows=8, fmt=fmt)  # 8 rows in the host tier: the rest on SSD
    try:
        assert_matches_oracle(store, fmt)
        snap = all_rows(store, str(tmp_path / "s.parquet"))
        served = store.lookup(torch.from_numpy(snap["keys"])).rows.cpu().numpy()
        np.testing.assert_array_equal(snap["emb"], served)
    finally:
        store.close()


IDS = {"ids": lambda f: f.name.replace("/", "-")}


def _train(stores, steps: int = 8) -> None:
    """The same updates of `stores`: duplicate keys, two learning rates, weight decay, evictions."""
    gen = torch.Generator().manual_seed(4)
    for step in range(steps):
        keys = torch.randint(0, 40, (24,), generator=gen) * 3
        grads = torch.randn(24, DIM, generator=gen)
        lr, wd = (0.05, 0.01) if step % 2 else (0.1, 0.0)
        for s in stores:
            s.update(keys, grads, lr=lr, weight_decay=wd)
        if step == 5:
            for s in stores:
                s.evict(keys[:4])


@pytest.mark.parametrize("fmt", ALL, **IDS)
def test_every_format_steps_bit_for_bit_as_the_reference_and_refuses_a_step_that_is_not_finite(
    fmt: RowFormat, tmp_path
) -> None:
    store, ref = host_over_ssd(tmp_path / "shard", rows=8, fmt=fmt), MemoryStore(fmt, init_std=STD)
    try:
        fresh = keys_of(7, 2**60 + 1, 5)  # never updated: exactly the initial rows in the row dtype
        assert torch.equal(store.lookup(fresh).rows.cpu(), stored(init_rows(fresh, DIM, STD), fmt))
        _train([store, ref])
        assert len(store) == len(ref)
        assert_same_rows(store, ref, tmp_path)
        before = all_rows(store, str(tmp_path / "before.parquet"))
        cases = [float("nan"), float("inf")]
        # finite, but its square overflows a second moment or accumulator, and an SGD step by it the fp16 (or an
        # 8-bit row's fp16 scale) range; fp32 and bf16 rows hold an SGD step of 1e29
        if fmt.optimizer != "sgd" or fmt.row_dtype not in ("fp32", "bf16"):
            cases.append(1e30)
        for bad in cases:
            g = torch.ones(3, DIM)
            g[2, 3] = bad
            with pytest.raises(ValueError, match="NaN or inf|non-finite"):
                store.update(keys_of(3, 6, 999), g, lr=0.1)
        after = all_rows(store, str(tmp_path / "after.parquet"))
        for name in before:
            np.testing.assert_array_equal(before[name], after[name], err_msg=name)
    finally:
        store.close()


@pytest.mark.parametrize("fmt", ALL, **IDS)
def test_every_formats_full_rows_survive_the_ssd_record_a_reopen_a_snapshot_and_a_restore(
    fmt: RowFormat, tmp_path
) -> None:
    gen = torch.Generator().manual_seed(8)
    keys = np.arange(30, dtype=np.int64) * 11  # more than the host tier holds: most go down to SSD records
    rows = random_rows(fmt, 30, gen, clock_from=3)
    store = host_over_ssd(tmp_path / "shard", rows=8, fmt=fmt)
    store.write_rows(keys, rows)
    found, got = store.read_rows(keys)
    assert found.all()
    for name, want_t, got_t in zip(("emb", *rows.state, "clock"), rows.tensors(), got.tensors(), strict=True):
        assert torch.equal(got_t.cpu(), want_t), name
    store.close()
    again = host_over_ssd(tmp_path / "shard", rows=8, fmt=fmt)  # the shard's files, read by a new store
    try:
        assert len(again) == 30
        snap = tmp_path / "a.parquet"
        assert again.snapshot(str(snap)) == 30
        want = all_rows(again, str(tmp_path / "again.parquet"))
        np.testing.assert_array_equal(want["keys"], keys)
        np.testing.assert_array_equal(want["emb"], fmt.weights(rows.emb).numpy())
        for name, t in rows.state.items():
            np.testing.assert_array_equal(want[name], t.numpy(), err_msg=name)
        np.testing.assert_array_equal(want["clock"], rows.clock.numpy())
        other = host_over_ssd(tmp_path / "other", rows=8, fmt=fmt)
        try:
            assert other.restore(str(snap)) == 30
            other.snapshot(str(tmp_path / "b.parquet"))
            assert snap.read_bytes() == (tmp_path / "b.parquet").read_bytes()
            probe = torch.from_numpy(keys)
            assert torch.equal(other.lookup(probe).rows.cpu(), again.lookup(probe).rows.cpu())
        finally:
            other.close()
    finally:
        again.close()


@pytest.mark.parametrize("fmt", ALL, **IDS)
def test_every_format_restores_rows_of_another_format_converted_and_trains_on(fmt: RowFormat, tmp_path) -> None:
    gen = torch.Generator().manual_seed(6)
    keys = torch.arange(20, dtype=torch.int64) * 3
    for src in (RowFormat(DIM, "adam", "fp32"), RowFormat(DIM, "rowwise_adagrad", "bf16", "log8")):
        url = str(tmp_path / f"{src.optimizer}.parquet")
        rows = random_rows(src, 20, gen)
        write_snapshot(url, keys, rows, src)
        store = host_over_ssd(tmp_path / f"shard-{src.optimizer}", rows=8, fmt=fmt)
        try:
            assert store.restore(url) == 20
            want = fmt.convert(rows, src)
            ref = MemoryStore(fmt, init_std=STD)
            ref.write_rows(keys.numpy(), want)
            assert_same_rows(store, ref, tmp_path)
            g = torch.randn(20, DIM, generator=gen)
            store.update(keys, g, lr=0.05)
            ref.update(keys, g, lr=0.05)
            assert_same_rows(store, ref, tmp_path)
        finally:
            store.close()


@pytest.mark.parametrize("fmt", ALL, **IDS)
def test_every_formats_stored_step_is_unbiased_in_every_column(fmt: RowFormat, tmp_path) -> None:
    """One step of 4,000 fresh rows: what the store keeps, minus the step's exact fp32 result (the rule's own
    `step` on the decoded rows), averages to zero in every column within four standard errors, and so does that
    difference signed by the exact value: a row dtype that rounds a column one way (down, up, towards zero or away
    from it) fails.  fp32 rows keep the exact result."""
    n = 4_000
    keys = torch.arange(n, dtype=torch.int64) * 7 + 1
    grads = torch.randn(n, DIM, generator=torch.Generator().manual_seed(9)) * 0.3
    store = host_over_ssd(tmp_path / "shard", rows=8, fmt=fmt)
    try:
        _, fresh = store.read_rows(keys.numpy())
        exact, _ = fmt.rule.step(
            fmt.weights(fresh.emb),
            fmt.state_values(fresh.state),
            torch.ones(n, dtype=torch.int64),
            grads,
            lr=0.05,
            weight_decay=0.0,
        )
        store.update(keys, grads, lr=0.05)
        err = (store.lookup(keys).rows.cpu() - exact).double()
    finally:
        store.close()
    if fmt.row_dtype == "fp32":
        assert not err.any()
        return
    for e in (err, err * exact.sign()):
        bound = 4 * e.std(dim=0) / n**0.5 + 1e-9
        assert (e.mean(dim=0).abs() <= bound).all(), (e.mean(dim=0), bound)


def test_the_matrix_holds_every_configurable_format_and_the_tiers_formats() -> None:
    from tests.storage.embedding.conformance import TIER_FORMATS

    assert len(ALL) == len(OPTIMIZERS) * len(ROW_DTYPES) * len(STATE_DTYPES)
    assert set(TIER_FORMATS) <= set(ALL)
