"""Snapshot file format: schema, atomic write, directory of parts, owner filter, streaming."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from storage.embedding import snapshot as snap
from storage.embedding.base import owner_of
from storage.embedding.snapshot import (
    SnapshotWriter,
    iter_snapshot,
    read_snapshot,
    snapshot_schema,
    write_snapshot,
)


def _rows(n: int, dim: int, seed: int = 0, offset: int = 0):
    g = np.random.default_rng(seed)
    keys = np.arange(n, dtype=np.int64) * 7 + offset
    return (
        keys,
        g.standard_normal((n, dim), dtype=np.float32),
        g.standard_normal((n, dim), dtype=np.float32),
        g.random((n, dim), dtype=np.float32),
        g.integers(0, 100, n),
    )


def test_write_read_round_trip_and_schema(tmp_path) -> None:
    rows = _rows(1000, 6)
    url = str(tmp_path / "sub" / "part-00000.parquet")
    assert write_snapshot(url, *rows) == 1000
    assert pq.read_schema(url).equals(snapshot_schema(6))
    got = read_snapshot(url)
    for a, b in zip(got, rows, strict=True):
        np.testing.assert_array_equal(a, b)
    assert [p.name for p in (tmp_path / "sub").iterdir()] == ["part-00000.parquet"]  # no temp left


def test_accepts_torch_tensors(tmp_path) -> None:
    rows = [torch.from_numpy(a) for a in _rows(10, 3)]
    url = str(tmp_path / "t.parquet")
    write_snapshot(url, *rows)
    np.testing.assert_array_equal(read_snapshot(url)[1], rows[1].numpy())


def test_directory_of_parts_with_owner_filter_streams_row_groups(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(snap, "ROW_GROUP_ROWS", 100)
    parts = [_rows(450, 4, seed=i, offset=i) for i in range(2)]
    for i, p in enumerate(parts):
        write_snapshot(str(tmp_path / f"part-{i:05d}.parquet"), *p)
    (tmp_path / "part-00009.parquet.tmp-abc").write_bytes(b"partial")  # a crashed writer's leftover
    allk = np.concatenate([p[0] for p in parts])
    allemb = np.concatenate([p[1] for p in parts])
    batches = list(iter_snapshot(str(tmp_path), owner=(2, 3)))
    assert len(batches) == 10  # 5 row groups per part, each read on its own
    for rank in range(3):
        keys, emb, m, v, clock = read_snapshot(str(tmp_path), owner=(rank, 3))
        mine = owner_of(allk, 3) == rank
        np.testing.assert_array_equal(keys, allk[mine])
        np.testing.assert_array_equal(emb, allemb[mine])
    assert read_snapshot(str(tmp_path))[0].size == 900


def test_atomic_abort_leaves_nothing(tmp_path) -> None:
    url = tmp_path / "x.parquet"
    write_snapshot(str(url), *_rows(5, 2))
    before = url.read_bytes()
    with pytest.raises(RuntimeError), SnapshotWriter(str(url), 2) as w:
        w.write(*_rows(5, 2, seed=9))
        raise RuntimeError("crash mid-write")
    assert url.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.parquet"]


def test_memory_filesystem_url() -> None:
    url = "memory://snapshots/run1/part-00000.parquet"
    write_snapshot(url, *_rows(20, 3))
    assert read_snapshot(url)[0].size == 20
    assert read_snapshot("memory://snapshots/run1", owner=(0, 2))[0].size == 10


def test_errors(tmp_path) -> None:
    with pytest.raises(FileNotFoundError):
        read_snapshot(str(tmp_path / "missing.parquet"))
    bad = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"key": [1]}), bad)
    with pytest.raises(ValueError, match="missing columns"):
        read_snapshot(str(bad))
    with pytest.raises(ValueError, match="owner"):
        read_snapshot(str(bad), owner=(3, 3))
    k, e, m, v, c = _rows(3, 2)
    with pytest.raises(ValueError, match="shape"):
        write_snapshot(str(tmp_path / "y.parquet"), k, e, m[:2], v, c)
    assert not (tmp_path / "y.parquet").exists()
