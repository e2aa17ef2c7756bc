"""warm_shards: restore across world sizes, tag skip, evictions, working sets."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from storage.embedding.base import owner_of
from storage.embedding.config import StoreConfig
from storage.embedding.host import rows_for_budget
from storage.embedding.memory import MemoryStore
from storage.embedding.rows.format import RowFormat
from storage.embedding.snapshot import read_snapshot
from storage.embedding.ssd.store import SsdStore
from storage.embedding.tiered import open_shard
from storage.io.layout import NodeLayout
from storage.warm import WORKING_SET, warm_shards

DIM = 4
CFG = StoreConfig(embedding_dim=DIM, init_std=0.02, host_budget_mb=1)
OPT = "rowwise_adagrad"
FMT = CFG.row_format(OPT)
"""The default rows (fp16 with row-wise AdaGrad)."""
OLD = RowFormat(DIM, "adam", "fp32")
"""The rows of the releases before compact rows."""


def _published(tmp_path, n: int = 600, fmt: RowFormat = FMT) -> tuple[str, np.ndarray]:
    """A model written by 2 ranks: sparse/part-00000.parquet, part-00001.parquet."""
    sparse = tmp_path / "model" / "sparse"
    keys = np.arange(n, dtype=np.int64) * 7 + 3
    for rank in range(2):
        store = MemoryStore(fmt, init_std=0.02)
        mine = torch.from_numpy(keys[owner_of(keys, 2) == rank])
        store.update(mine, torch.randn(mine.numel(), DIM, generator=torch.Generator().manual_seed(rank)), lr=0.1)
        store.snapshot(str(sparse / f"part-{rank:05d}.parquet"))
    return str(sparse), keys


def _warm(tmp_path, url, tag, ranks=(0, 1, 2), evict=(), ws=(), world=3, cfg=CFG, optimizer=OPT):
    return warm_shards(
        node=NodeLayout(str(tmp_path / "local"), "ctr"),
        world_size=world,
        ranks=list(ranks),
        store=cfg,
        optimizer=optimizer,
        snapshot_url=url,
        snapshot_tag=tag,
        evict_keys=np.array(evict, dtype=np.int64),
        working_set=np.array(ws, dtype=np.int64),
    )


def test_restore_two_shards_into_three_ranks(tmp_path) -> None:
    url, keys = _published(tmp_path)
    report = _warm(tmp_path, url, "v1")
    assert [r["restored"] for r in report["ranks"]] == [True, True, True]
    assert report["rows"] == keys.size and report["converted_from"] is None and report["row_format"] == FMT.name
    src = read_snapshot(url)
    order = np.argsort(src.keys)
    seen = []
    for rank in range(3):
        shard = NodeLayout(str(tmp_path / "local"), "ctr").shard(rank, 3)
        with SsdStore(shard, FMT) as s:
            assert s.tag == "v1"
            s.snapshot(str(tmp_path / f"out{rank}.parquet"))
        got = read_snapshot(str(tmp_path / f"out{rank}.parquet"))
        assert (owner_of(got.keys, 3) == rank).all()
        i = order[np.searchsorted(src.keys[order], got.keys)]
        np.testing.assert_array_equal(got.emb, src.emb[i])
        np.testing.assert_array_equal(got.state["acc"], src.state["acc"][i])
        np.testing.assert_array_equal(got.clock, src.clock[i])
        seen.append(got.keys)
    allk = np.concatenate(seen)
    assert allk.size == np.unique(allk).size == keys.size  # every row exactly once


def test_rows_of_a_model_written_before_compact_rows_are_converted_and_the_report_says_so(tmp_path) -> None:
    url, keys = _published(tmp_path, fmt=OLD)
    report = _warm(tmp_path, url, "v1", ranks=[0, 1, 2])
    assert report["converted_from"] == "adam/fp32" and report["row_format"] == FMT.name
    src = read_snapshot(url)
    want = FMT.convert(src.rows(), OLD)
    order = np.argsort(src.keys)
    for rank in range(3):
        with SsdStore(NodeLayout(str(tmp_path / "local"), "ctr").shard(rank, 3), FMT) as s:
            s.snapshot(str(tmp_path / f"out{rank}.parquet"))
        got = read_snapshot(str(tmp_path / f"out{rank}.parquet"))
        i = torch.from_numpy(order[np.searchsorted(src.keys[order], got.keys)])
        np.testing.assert_array_equal(got.emb, FMT.weights(want.emb[i]).numpy())
        np.testing.assert_array_equal(got.state["acc"], want.state["acc"][i].numpy())
        assert (got.state["acc"][got.clock > 0] > 0).all(), "the accumulator carries Adam's second moment"
    # the next day's warm finds the shards tagged and in its format: nothing to convert or restore
    again = _warm(tmp_path, url, "v1")
    assert not any(r["restored"] for r in again["ranks"])


def test_a_shard_of_another_row_format_under_the_right_tag_is_converted_where_it_lies(tmp_path) -> None:
    url, keys = _published(tmp_path, fmt=OLD)
    _warm(
        tmp_path,
        url,
        "v1",
        ranks=[0],
        optimizer="adam",
        cfg=StoreConfig(embedding_dim=DIM, init_std=0.02, host_budget_mb=1, row_dtype="fp32", state_dtype="fp32"),
    )
    report = _warm(tmp_path, url, "v1", ranks=[0])  # same tag, the compact default: never read as the old records
    rank = report["ranks"][0]
    assert not rank["restored"] and report["converted_from"] == "adam/fp32"
    assert rank["converted"]["from"] == "ctr-ssd-shard/3 adam/fp32" and rank["converted"]["rows"] > 0
    with SsdStore(NodeLayout(str(tmp_path / "local"), "ctr").shard(0, 3), FMT) as s:
        assert len(s) == int((owner_of(keys, 3) == 0).sum()) and s.tag == "v1"
    # under another tag it holds other rows than the day starts from: restored, not converted
    _warm(
        tmp_path,
        url,
        "v1",
        ranks=[0],
        optimizer="adam",
        cfg=StoreConfig(embedding_dim=DIM, host_budget_mb=1, row_dtype="fp32", state_dtype="fp32"),
    )
    report = _warm(tmp_path, url, "v2", ranks=[0])
    assert report["ranks"][0]["restored"] and "converted" not in report["ranks"][0]


def test_tag_match_skips_restore_and_evictions_apply(tmp_path) -> None:
    url, keys = _published(tmp_path)
    _warm(tmp_path, url, "v1")
    gone = keys[:30]
    report = _warm(tmp_path, url, "v1", evict=list(gone) + [10**12 * 3 + 1])
    assert [r["restored"] for r in report["ranks"]] == [False, False, False]
    assert sum(r["evicted"] for r in report["ranks"]) == 30
    assert report["rows"] == keys.size - 30
    for rank in range(3):
        with SsdStore(NodeLayout(str(tmp_path / "local"), "ctr").shard(rank, 3), FMT) as s:
            assert not s.contains(gone).any() and s.tag == "v1"
    # another tag: restore from scratch (the evicted keys come back from the snapshot)
    report = _warm(tmp_path, url, "v2")
    assert all(r["restored"] for r in report["ranks"]) and report["rows"] == keys.size


def test_a_changed_shard_is_restored(tmp_path) -> None:
    url, keys = _published(tmp_path)
    _warm(tmp_path, url, "v1", ranks=[1])
    store = open_shard(NodeLayout(str(tmp_path / "local"), "ctr").shard(1, 3), CFG, optimizer=OPT)
    store.update(torch.tensor([4]), torch.ones(1, DIM), lr=0.1)  # training changed it; then a crash
    store.flush()
    store.close()
    report = _warm(tmp_path, url, "v1", ranks=[1])
    assert report["ranks"][0]["restored"] is True


def test_no_snapshot_starts_empty(tmp_path) -> None:
    report = _warm(tmp_path, None, None, ws=[5, 1, 9, 5, 2])
    assert report["rows"] == 0 and not any(r["restored"] for r in report["ranks"])
    ws = [np.load(f"{NodeLayout(str(tmp_path / 'local'), 'ctr').shard(r, 3)}/{WORKING_SET}") for r in range(3)]
    assert [w.tolist() for w in ws] == [[9], [1], [5, 2]]  # owned, deduplicated, order kept


def test_working_set_is_cut_to_the_host_budget(tmp_path) -> None:
    cap = rows_for_budget(1 << 20, FMT)
    ws = np.arange(3 * cap, 0, -1, dtype=np.int64) * 2  # all owned by rank 0 of 2
    report = _warm(tmp_path, None, None, ranks=[0], world=2, ws=ws)
    r = report["ranks"][0]
    assert r["working_set_keys"] == cap
    assert r["working_set_fits"] == pytest.approx(cap / ws.size)
    got = np.load(f"{NodeLayout(str(tmp_path / 'local'), 'ctr').shard(0, 2)}/{WORKING_SET}")
    np.testing.assert_array_equal(got, ws[:cap])
    # the trainer's path: open the stack and warm it with the file
    store = open_shard(NodeLayout(str(tmp_path / "local"), "ctr").shard(0, 2), CFG, optimizer=OPT)
    store.warm(torch.from_numpy(got))
    assert store.stats()["host"]["rows"] == cap
    store.close()


def test_snapshot_of_another_dim_is_refused(tmp_path) -> None:
    url, _ = _published(tmp_path)
    with pytest.raises(ValueError, match="dim"):
        _warm(tmp_path, url, "v1", cfg=StoreConfig(embedding_dim=DIM * 2, host_budget_mb=1))


def test_shard_of_another_dim_is_discarded(tmp_path) -> None:
    url, keys = _published(tmp_path)
    SsdStore(NodeLayout(str(tmp_path / "local"), "ctr").shard(0, 3), DIM * 2).close()
    report = _warm(tmp_path, url, "v1", ranks=[0])
    assert report["ranks"][0]["restored"]
