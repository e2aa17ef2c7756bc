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
from storage.embedding.rows.format import RowFormat
from storage.embedding.snapshot import (
    SnapshotWriter,
    iter_snapshot,
    read_snapshot,
    snapshot_format,
    snapshot_schema,
    write_snapshot,
)
from tests.helpers.stores import (
    DIM,
    FORMATS,
    host_over_ssd,
    random_rows,
    same_bytes,
    snapshot_arrays,
    train_random,
)


def _rows(n: int, fmt: RowFormat | int, seed: int = 0, offset: int = 0):
    """(keys, rows, fmt) of `n` random rows (an int format: fp32 with Adam of that width)."""
    fmt = RowFormat(fmt) if isinstance(fmt, int) else fmt
    keys = np.arange(n, dtype=np.int64) * 7 + offset
    return keys, random_rows(fmt, n, torch.Generator().manual_seed(seed)), fmt


@pytest.mark.parametrize(
    "fmt", [RowFormat(6, f.optimizer, f.row_dtype, f.state_dtype) for f in FORMATS], ids=lambda f: f.name
)
def test_write_read_round_trip_and_schema(tmp_path, fmt) -> None:
    keys, rows, _ = _rows(1000, fmt)
    url = str(tmp_path / "sub" / "part-00000.parquet")
    assert write_snapshot(url, keys, rows, fmt) == 1000
    schema, want = pq.read_schema(url), snapshot_schema(fmt)
    assert schema.names == want.names and schema.metadata == want.metadata
    assert [str(f.type).replace("element", "item") for f in schema] == [str(f.type) for f in want]
    assert snapshot_format(url) == fmt
    got = read_snapshot(url)
    assert got.fmt == fmt
    np.testing.assert_array_equal(got.keys, keys)
    np.testing.assert_array_equal(got.emb, fmt.weights(rows.emb).numpy())
    for name, t in rows.state.items():
        np.testing.assert_array_equal(got.state[name], t.numpy())
    np.testing.assert_array_equal(got.clock, rows.clock.numpy())
    back = got.rows()
    assert all(torch.equal(a, b) for a, b in zip(back.tensors(), rows.tensors(), strict=True)), "bit for bit"
    assert [p.name for p in (tmp_path / "sub").iterdir()] == ["part-00000.parquet"]  # no temp left


def test_a_snapshot_written_before_compact_rows_reads_as_fp32_adam(tmp_path) -> None:
    """The previous release's files: no format metadata, fp32 `emb` / `m` / `v` and an int64 clock."""
    url = tmp_path / "old.parquet"
    vec = pa.list_(pa.float32(), 2)
    table = pa.table(
        {
            "key": pa.array([3, 8], pa.int64()),
            "emb": pa.FixedSizeListArray.from_arrays(pa.array([0.5, 1.0, -1.0, 2.0], pa.float32()), 2),
            "m": pa.FixedSizeListArray.from_arrays(pa.array([0.1, 0.2, 0.3, 0.4], pa.float32()), 2),
            "v": pa.FixedSizeListArray.from_arrays(pa.array([1.0, 1.0, 4.0, 4.0], pa.float32()), 2),
            "clock": pa.array([7, 1], pa.int64()),
        },
        schema=pa.schema([("key", pa.int64()), ("emb", vec), ("m", vec), ("v", vec), ("clock", pa.int64())]),
    )
    pq.write_table(table, url)
    got = read_snapshot(str(url))
    assert got.fmt == RowFormat(2, "adam", "fp32")
    assert got.clock.tolist() == [7, 1] and got.state["v"].tolist() == [[1.0, 1.0], [4.0, 4.0]]
    compact = got.rows_as(RowFormat(2, "rowwise_adagrad", "fp16"))
    assert compact.emb.dtype == torch.float16 and compact.emb.float().tolist() == [[0.5, 1.0], [-1.0, 2.0]]
    assert compact.state["acc"].shape == (2,) and (compact.state["acc"] > 0).all()


def test_accepts_torch_tensors_of_any_device_and_refuses_rows_of_another_format(tmp_path) -> None:
    keys, rows, fmt = _rows(10, 3)
    url = str(tmp_path / "t.parquet")
    write_snapshot(url, torch.from_numpy(keys), rows, fmt)
    np.testing.assert_array_equal(read_snapshot(url).emb, rows.emb.numpy())
    with pytest.raises(ValueError, match="rowwise_adagrad"):
        write_snapshot(str(tmp_path / "u.parquet"), keys, rows, RowFormat(3, "rowwise_adagrad", "fp32"))
    assert not (tmp_path / "u.parquet").exists()


def test_directory_of_parts_with_owner_filter_streams_row_groups(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(snap, "ROW_GROUP_ROWS", 100)
    parts = [_rows(450, 4, seed=i, offset=i) for i in range(2)]
    for i, p in enumerate(parts):
        write_snapshot(str(tmp_path / f"part-{i:05d}.parquet"), *p)
    (tmp_path / "part-00009.parquet.tmp-abc").write_bytes(b"partial")  # a crashed writer's leftover
    allk = np.concatenate([p[0] for p in parts])
    allemb = np.concatenate([p[1].emb.numpy() for p in parts])
    batches = list(iter_snapshot(str(tmp_path), owner=(2, 3)))
    assert len(batches) == 10  # 5 row groups per part, each read on its own
    for rank in range(3):
        got = read_snapshot(str(tmp_path), owner=(rank, 3))
        mine = owner_of(allk, 3) == rank
        np.testing.assert_array_equal(got.keys, allk[mine])
        np.testing.assert_array_equal(got.emb, allemb[mine])
    assert read_snapshot(str(tmp_path)).keys.size == 900
    keys, rows, _ = _rows(5, RowFormat(4, "sgd", "fp16"))
    write_snapshot(str(tmp_path / "part-00002.parquet"), keys, rows, RowFormat(4, "sgd", "fp16"))
    with pytest.raises(ValueError, match="disagree on the row format"):
        read_snapshot(str(tmp_path))


def test_atomic_abort_leaves_nothing(tmp_path) -> None:
    url = tmp_path / "x.parquet"
    write_snapshot(str(url), *_rows(5, 2))
    before = url.read_bytes()
    with pytest.raises(RuntimeError), SnapshotWriter(str(url), 2) as w:
        keys, rows, _ = _rows(5, 2, seed=9)
        w.write(keys, rows)
        raise RuntimeError("crash mid-write")
    assert url.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.parquet"]


def test_memory_filesystem_url() -> None:
    url = "memory://snapshots/run1/part-00000.parquet"
    write_snapshot(url, *_rows(20, 3))
    assert read_snapshot(url).keys.size == 20
    assert read_snapshot("memory://snapshots/run1", owner=(0, 2)).keys.size == 10


def test_missing_file_bad_schema_owner_and_shapes_are_refused(tmp_path) -> None:
    with pytest.raises(FileNotFoundError):
        read_snapshot(str(tmp_path / "missing.parquet"))
    bad = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"key": [1]}), bad)
    with pytest.raises(ValueError, match="not an embedding snapshot"):
        read_snapshot(str(bad))
    no_v = tmp_path / "no_v.parquet"
    vec = pa.list_(pa.float32(), 2)
    pq.write_table(
        pa.table(
            {
                "key": pa.array([1], pa.int64()),
                "emb": pa.FixedSizeListArray.from_arrays(pa.array([1.0, 2.0], pa.float32()), 2),
            },
            schema=pa.schema([("key", pa.int64()), ("emb", vec)]),
        ),
        no_v,
    )
    with pytest.raises(ValueError, match=r"missing columns \['m', 'v', 'clock'\]"):
        read_snapshot(str(no_v))
    with pytest.raises(ValueError, match="owner"):
        read_snapshot(str(bad), owner=(3, 3))
    k, rows, fmt = _rows(3, 2)
    with pytest.raises(ValueError, match="3 keys for 2 rows"):
        write_snapshot(str(tmp_path / "y.parquet"), k, rows.select(np.arange(2)), fmt)
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
    fmt = RowFormat(DIM)
    write_snapshot(str(d / "part-00000.parquet"), np.array([1, 2]), fmt.fresh(torch.ones(2, DIM)), fmt)
    w = SnapshotWriter(str(d / "part-00001.parquet"), fmt)  # a writer killed before commit
    w.write(np.array([3]), fmt.fresh(torch.ones(1, DIM)))
    w._writer.close()
    w._file.close()
    assert any(".tmp-" in p.name for p in d.iterdir())
    assert read_snapshot(str(d)).keys.tolist() == [1, 2]


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
