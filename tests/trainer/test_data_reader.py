"""Each rank's balanced, disjoint, ordered share of the train rows, and the prefetch thread."""

from __future__ import annotations

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
    Prefetcher,
    RankReader,
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
        pq.write_table(pa.Table.from_pandas(pd.DataFrame(cols)), train / f"part-{i:05d}.parquet", row_group_size=row_group)
        start += n
    manifest = {
        "rows_train": start, "rows_eval": 0, "dense_columns": [f"d_{j}" for j in range(n_dense)],
        "key_columns": [f"k_{j}" for j in range(n_fields)], "fields": [f"C{j + 1}" for j in range(n_fields)],
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
