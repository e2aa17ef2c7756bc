"""Snapshot files: schema, atomic write (also when a store's snapshot fails midway), directory of
parts, owner filter, streaming, fsspec URLs."""

from __future__ import annotations

import fsspec
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
from tests.helpers.stores import (
    DIM,
    host_over_ssd,
    same_bytes,
    snapshot_arrays,
    train_random,
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


def test_missing_file_bad_schema_owner_and_shapes_are_refused(tmp_path) -> None:
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


def test_failed_snapshot_leaves_previous_one_and_no_partial_file(tmp_path, monkeypatch) -> None:
    store = host_over_ssd(tmp_path / "s")
    train_random(store, 3)
    url = str(tmp_path / "snap" / "part-00000.parquet")
    store.snapshot(url)
    before = snapshot_arrays(url)
    train_random(store, 3, seed=1)
    calls = {"n": 0}
    real = pq.ParquetWriter.write_table

    def failing(self, table, *a, **k):
        calls["n"] += 1
        if calls["n"] > 1:
            raise OSError(28, "No space left on device")
        return real(self, table, *a, **k)

    monkeypatch.setattr(pq.ParquetWriter, "write_table", failing)
    monkeypatch.setattr("storage.embedding.snapshot.ROW_GROUP_ROWS", 16)  # several row groups, fail mid-file
    with pytest.raises(OSError, match="No space"):
        store.snapshot(url)
    assert same_bytes(snapshot_arrays(url), before)
    assert sorted(p.name for p in (tmp_path / "snap").iterdir()) == ["part-00000.parquet"]
    store.close()


def test_partial_snapshot_file_is_never_read_as_part(tmp_path) -> None:
    d = tmp_path / "sparse"
    write_snapshot(str(d / "part-00000.parquet"), np.array([1, 2]), np.ones((2, DIM)), np.zeros((2, DIM)),
                   np.zeros((2, DIM)), np.array([1, 1]))
    w = SnapshotWriter(str(d / "part-00001.parquet"), DIM)  # a writer killed before commit
    w.write(np.array([3]), np.ones((1, DIM)), np.zeros((1, DIM)), np.zeros((1, DIM)), np.array([1]))
    w._writer.close()
    w._file.close()
    assert any(".tmp-" in p.name for p in d.iterdir())
    assert read_snapshot(str(d))[0].tolist() == [1, 2]


def test_snapshot_restore_through_fsspec_memory(tmp_path) -> None:
    store = host_over_ssd(tmp_path / "s")
    train_random(store, 5)
    url = "memory://ctr-test/model/sparse/part-00000.parquet"
    try:
        n = store.snapshot(url)
        fs = fsspec.filesystem("memory")
        assert [p.rsplit("/", 1)[1] for p in fs.ls("/ctr-test/model/sparse", detail=False)] == ["part-00000.parquet"]
        other = host_over_ssd(tmp_path / "other")
        assert other.restore("memory://ctr-test/model/sparse", owner=(0, 1)) == n
        store.snapshot(str(tmp_path / "a.parquet"))
        other.snapshot(str(tmp_path / "b.parquet"))
        assert same_bytes(snapshot_arrays(str(tmp_path / "a.parquet")), snapshot_arrays(str(tmp_path / "b.parquet")))
        other.close()
    finally:
        fsspec.filesystem("memory").rm("/ctr-test", recursive=True)
    store.close()
