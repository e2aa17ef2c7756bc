"""Each rank's balanced, disjoint, ordered share of the train rows; the reader's position across epochs and
restarts; bags read as flat keys + offsets; and the prefetch thread."""

from __future__ import annotations

import dataclasses
import json
import threading
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from trainer.data import (
    AUTO_PREFETCH_DEPTH,
    FeatureSchema,
    Prefetcher,
    RankReader,
    Source,
    prefetch_depth,
    rank_share,
    read_schema,
    split_dir,
)


def write_features(root: Path, sizes: list[int], *, n_dense: int = 2, n_fields: int = 3, row_group: int = 7) -> Path:
    """A committed features/date=D dir whose label column numbers the rows 0..N-1 (for order checks)."""
    train = root / "train"
    train.mkdir(parents=True)
    start = 0
    for i, n in enumerate(sizes):
        idx = np.arange(start, start + n)
        cols = {"label": idx.astype(np.float32)}
        cols |= {f"d_{j}": (idx * 10 + j).astype(np.float32) for j in range(n_dense)}
        cols |= {f"k_{j}": (idx * 100 + j).astype(np.int64) for j in range(n_fields)}
        pq.write_table(
            pa.Table.from_pandas(pd.DataFrame(cols)), train / f"part-{i:05d}.parquet", row_group_size=row_group
        )
        start += n
    manifest = {
        "rows_train": start,
        "rows_eval": 0,
        "dense_columns": [f"d_{j}" for j in range(n_dense)],
        "key_columns": [f"k_{j}" for j in range(n_fields)],
        "fields": [f"C{j + 1}" for j in range(n_fields)],
    }
    (root / "_SUCCESS.json").write_text(json.dumps(manifest))
    return root


def test_rank_share_balances_and_drops_the_remainder() -> None:
    shares = [rank_share(103, r, 4) for r in range(4)]
    assert [s.rows for s in shares] == [25] * 4 and shares[0].dropped == 3
    assert [(s.start, s.stop) for s in shares] == [(0, 25), (25, 50), (50, 75), (75, 100)]
    with pytest.raises(ValueError):
        rank_share(10, 2, 2)


@pytest.mark.parametrize("world", [1, 2, 3])
def test_ranks_read_disjoint_balanced_ordered_rows(tmp_path: Path, world: int) -> None:
    root = write_features(tmp_path, [13, 0, 30, 8])  # 51 rows over files and row groups
    schema = read_schema(str(root))
    assert schema.dense_columns == ("d_0", "d_1") and schema.fields == ("C1", "C2", "C3")
    seen = []
    steps = set()
    for r in range(world):
        reader = RankReader(split_dir(str(root), "train"), schema, rank=r, world_size=world, batch_size=4)
        batches = list(reader.iter_batches())
        steps.add(len(batches))
        assert len(batches) == reader.steps_per_epoch
        rows = np.concatenate([b.labels.numpy() for b in batches]).astype(int)
        assert len(rows) == 51 // world
        assert (np.diff(rows) == 1).all()  # in order, contiguous
        b = batches[0]
        assert b.dense.dtype.is_floating_point and b.keys.dtype.is_signed and b.keys.shape == (len(b), 3)
        np.testing.assert_array_equal(b.keys[:, 1].numpy(), b.labels.numpy().astype(int) * 100 + 1)
        np.testing.assert_array_equal(b.dense[:, 0].numpy(), b.labels.numpy() * 10)
        seen.append(rows)
    assert len(steps) == 1  # every rank runs the same number of steps
    allrows = np.concatenate(seen)
    assert len(np.unique(allrows)) == len(allrows) == (51 // world) * world


def test_the_whole_share_at_once_equals_its_batches_in_order(tmp_path: Path) -> None:
    root = write_features(tmp_path, [13, 0, 30, 8])
    reader = RankReader(split_dir(str(root), "train"), read_schema(str(root)), rank=1, world_size=2, batch_size=4)
    labels, dense, keys = reader.arrays()
    batches = list(reader.iter_batches())
    np.testing.assert_array_equal(labels, np.concatenate([b.labels.numpy() for b in batches]))
    np.testing.assert_array_equal(keys, np.concatenate([b.keys.numpy() for b in batches]))
    assert labels[0] == 25 and dense.shape == (25, 2) and reader.position == 0  # rank 1's rows; nothing consumed


@pytest.mark.parametrize("world", [1, 2])
def test_sources_are_read_in_turn_as_one_sequence_and_only_their_own_evictions_apply(
    tmp_path: Path, world: int
) -> None:
    carried, train = write_features(tmp_path / "carried", [5, 9]), write_features(tmp_path / "train", [13, 8])
    evicted = np.array([100, 300, 301, 302])  # row 1's first key and all of row 3's, in the carried rows only
    sources = [Source(split_dir(str(carried), "train"), evicted), Source(split_dir(str(train), "train"))]
    schema = read_schema(str(train))
    got = []
    for r in range(world):
        reader = RankReader(sources, schema, rank=r, world_size=world, batch_size=4)
        labels, _, keys = reader.arrays()
        batches = list(reader.iter_batches())
        np.testing.assert_array_equal(keys, np.concatenate([b.keys.numpy() for b in batches]))
        got.append((labels, keys))
    labels, keys = (np.concatenate([g[i] for g in got]) for i in (0, 1))
    n = 35 // world * world
    np.testing.assert_array_equal(labels, np.r_[np.arange(14), np.arange(21)][:n])  # carried first, then the day's
    want = (np.r_[np.arange(14), np.arange(21)][:, None] * 100 + np.arange(3))[:n]
    want[1, 0] = 0  # evicted: the field's OOV key (field 0 here)
    want[3, :] = 0
    np.testing.assert_array_equal(keys, want)  # the day's row 1 keeps key 100: its encoding is already today's
    with pytest.raises(ValueError, match="at least one"):
        RankReader([], schema, rank=0, world_size=1, batch_size=4)


@pytest.mark.parametrize("depth", [0, 2])
def test_the_stream_counts_its_position_over_epochs_and_a_restart_continues_there(tmp_path: Path, depth: int) -> None:
    root = write_features(tmp_path, [13, 0, 30, 8])
    url, schema = split_dir(str(root), "train"), read_schema(str(root))
    reader = RankReader(url, schema, rank=1, world_size=2, batch_size=4)  # 25 rows: 7 batches an epoch
    with reader.stream(2, depth=depth) as batches:
        whole = []
        for batch in batches:
            whole.append(batch.labels.tolist())
            assert reader.position == len(whole)  # counted when handed over, not when read ahead
    assert len(whole) == 2 * reader.steps_per_epoch == 14 and whole[:7] == whole[7:]

    first = RankReader(url, schema, rank=1, world_size=2, batch_size=4)
    with first.stream(2, depth=depth) as batches:
        for _ in zip(range(9), batches, strict=False):  # a run that stops after batch 9 (epoch 2, batch 2)
            pass
    state = first.state_dict()
    assert state == {"position": 9, "batch_size": 4, "share": [25, 50]}
    again = RankReader(url, schema, rank=1, world_size=2, batch_size=4)
    again.load_state_dict(state)
    with again.stream(2, depth=depth) as batches:
        assert [b.labels.tolist() for b in batches] == whole[9:]
    assert again.position == 14

    threads = set()

    def prepare(batch):  # what trainer.staging.BatchStager does to each batch, in the reader thread
        threads.add(threading.current_thread().name)
        return dataclasses.replace(batch, labels=batch.labels + 1)

    staged = RankReader(url, schema, rank=1, world_size=2, batch_size=4)
    with staged.stream(2, depth=depth, prepare=prepare) as batches:
        assert [(b.labels - 1).tolist() for b in batches] == whole
    assert threads == ({"batch-prefetch"} if depth else {threading.current_thread().name})


def test_a_reader_state_of_another_share_or_batch_size_is_refused(tmp_path: Path) -> None:
    root = write_features(tmp_path, [20])
    reader = RankReader(split_dir(str(root), "train"), read_schema(str(root)), rank=0, world_size=2, batch_size=4)
    for bad in (
        {"position": 1, "batch_size": 5, "share": [0, 10]},
        {"position": 1, "batch_size": 4, "share": [10, 20]},
    ):
        with pytest.raises(ValueError, match="does not fit this reader"):
            reader.load_state_dict(bad)
    with pytest.raises(ValueError, match=r"reader state lacks \['share'\]"):
        reader.load_state_dict({"position": 1, "batch_size": 4})
    assert reader.position == 0


def _write_bag_features(root: Path, lists: list[list[int]], *, row_group: int = 5, parts: int = 2) -> Path:
    """A committed features dir: label numbers the rows, k_0 = 100 * row, k_1 = first of bag_1 (or -1)."""
    train = root / "train"
    train.mkdir(parents=True)
    n = len(lists)
    bounds = np.linspace(0, n, parts + 1).astype(int)
    for i, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
        idx = np.arange(lo, hi)
        table = pa.table(
            {
                "label": idx.astype(np.float32),
                "d_0": idx.astype(np.float32),
                "k_0": (idx * 100).astype(np.int64),
                "k_1": np.array([x[0] if x else -1 for x in lists[lo:hi]], np.int64),
                "bag_1": pa.array(lists[lo:hi], type=pa.list_(pa.int64())),
            }
        )
        pq.write_table(table, train / f"part-{i:05d}.parquet", row_group_size=row_group)
    manifest = {
        "dense_columns": ["d_0"],
        "key_columns": ["k_0", "k_1"],
        "fields": ["site", "tags"],
        "bag_columns": ["bag_1"],
    }
    (root / "_SUCCESS.json").write_text(json.dumps(manifest))
    return root


@pytest.mark.parametrize(("world", "batch_size"), [(1, 4), (2, 7), (3, 32)])
def test_the_reader_hands_each_rows_bag_over_as_flat_keys_and_offsets(
    tmp_path: Path, world: int, batch_size: int
) -> None:
    g = np.random.default_rng(0)
    lists = [[int(k) for k in g.integers(0, 1000, int(g.integers(0, 5)))] for _ in range(37)]
    root = _write_bag_features(tmp_path, lists)
    schema = read_schema(str(root))
    assert schema.bag_columns == ("bag_1",) and schema.bag_fields == (1,)
    for r in range(world):
        reader = RankReader(split_dir(str(root), "train"), schema, rank=r, world_size=world, batch_size=batch_size)
        for batch in reader.iter_batches():
            (bags,) = batch.bags
            assert bags.field == 1 and bags.offsets[0] == 0 and bags.offsets.numel() == len(batch) + 1
            for b, row in enumerate(batch.labels.long().tolist()):
                assert bags.values[bags.offsets[b] : bags.offsets[b + 1]].tolist() == lists[row]
    none = RankReader(split_dir(str(root), "train"), schema.for_pooling("none"), rank=0, world_size=1, batch_size=8)
    assert all(b.bags == () for b in none.iter_batches())


def test_a_bag_column_without_its_key_column_is_refused() -> None:
    with pytest.raises(ValueError, match=r"bag columns \['bag_2'\] have no key column"):
        FeatureSchema(dense_columns=(), key_columns=("k_0", "k_1"), fields=("a", "b"), bag_columns=("bag_2",))


def test_uncommitted_features_are_refused(tmp_path: Path) -> None:
    (tmp_path / "train").mkdir()
    with pytest.raises(FileNotFoundError, match="not committed"):
        read_schema(str(tmp_path))


def test_prefetcher_runs_ahead_in_a_thread_and_propagates_errors() -> None:
    threads: list[str] = []

    def gen():
        for i in range(5):
            threads.append(threading.current_thread().name)
            yield i

    with Prefetcher(gen, depth=2) as p:
        assert list(p) == [0, 1, 2, 3, 4]
    assert set(threads) == {"batch-prefetch"}

    def bad():
        yield 1
        raise OSError("disk gone")

    with Prefetcher(bad, depth=1) as p, pytest.raises(OSError, match="disk gone"):
        list(p)

    def endless():
        i = 0
        while True:
            yield i
            i += 1

    p = Prefetcher(endless, depth=2)
    it = iter(p)
    assert next(it) == 0
    p.close()  # the consumer stopped early: the thread still ends
    assert not [t for t in threading.enumerate() if t.name == "batch-prefetch"]


def test_auto_prefetch_runs_the_reader_thread_only_on_a_gpu() -> None:
    # a GPU computes while the host thread waits: the thread has something to hide behind
    assert prefetch_depth("auto", device_type="cuda") == AUTO_PREFETCH_DEPTH
    # on CPU it would take core and GIL time from the step it means to hide behind
    assert prefetch_depth("auto", device_type="cpu") == 0
    # an explicit depth is kept whatever the device (the bench's with/without rows rely on it)
    assert prefetch_depth(0, device_type="cuda") == 0
    assert prefetch_depth(3, device_type="cpu") == 3
