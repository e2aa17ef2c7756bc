"""The sparse snapshot format: one Parquet file of full rows per store (or per rank).

Columns (see `storage.embedding.base`): ``key`` int64, ``emb`` / ``m`` / ``v``
fixed_size_list<float32>[dim], ``clock`` int64.  Writers write under a temporary
name beside the target and rename it into place last, so a reader sees the old
file or the complete new one.  Readers accept one file or a directory of
``*.parquet`` parts (a model's ``sparse/`` folder, written by any world size)
and keep only the keys a rank owns, reading one row group at a time.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from fsspec.implementations.local import LocalFileSystem

from storage.embedding.base import owner_of
from storage.io.fsio import get_fs

ROW_GROUP_ROWS = 65536
"""Rows per Parquet row group: the unit readers stream by."""
_COLUMNS = ("key", "emb", "m", "v", "clock")


def snapshot_schema(dim: int) -> pa.Schema:
    """The Arrow schema of a snapshot of rows of width `dim`."""
    vec = pa.list_(pa.float32(), dim)
    return pa.schema([("key", pa.int64()), ("emb", vec), ("m", vec), ("v", vec), ("clock", pa.int64())])


def _np(x: torch.Tensor | np.ndarray, dtype: type) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().numpy()
    return np.ascontiguousarray(x, dtype=dtype)


@dataclass
class SnapshotBatch:
    """A batch of snapshot rows as NumPy arrays: keys (N,), emb/m/v (N, dim) float32, clock (N,)."""

    keys: np.ndarray
    emb: np.ndarray
    m: np.ndarray
    v: np.ndarray
    clock: np.ndarray

    def __len__(self) -> int:
        return int(self.keys.size)


class SnapshotWriter:
    """Streams row batches into one Parquet snapshot, committed atomically.

    Use as a context manager: the file appears at `url` only when the block
    exits without an exception (`commit`); otherwise the temporary file is removed.

    Args:
        url: target file (local path or fsspec URL).
        dim: row width.
        storage_options: fsspec options for `url`.

    Example::

        with SnapshotWriter("s3://b/model/sparse/part-00000.parquet", 16) as w:
            w.write(keys, emb, m, v, clock)
    """

    def __init__(self, url: str, dim: int, storage_options: dict[str, Any] | None = None) -> None:
        if dim < 1:
            raise ValueError(f"dim must be >= 1, got {dim}")
        self.dim = dim
        self.rows = 0
        self._fs, self._path = get_fs(url, storage_options)
        parent = self._path.rstrip("/").rsplit("/", 1)[0] if "/" in self._path.rstrip("/") else ""
        if parent:
            self._fs.makedirs(parent, exist_ok=True)
        self._tmp = f"{self._path}.tmp-{uuid.uuid4().hex[:12]}"
        self._schema = snapshot_schema(dim)
        self._file = self._fs.open(self._tmp, "wb")
        self._writer = pq.ParquetWriter(self._file, self._schema)
        self._done = False

    def write(
        self,
        keys: torch.Tensor | np.ndarray,
        emb: torch.Tensor | np.ndarray,
        m: torch.Tensor | np.ndarray,
        v: torch.Tensor | np.ndarray,
        clock: torch.Tensor | np.ndarray,
    ) -> None:
        """Append rows (any number; split into row groups of `ROW_GROUP_ROWS`)."""
        k = _np(keys, np.int64).reshape(-1)
        n = k.size
        arrays = [_np(a, np.float32) for a in (emb, m, v)]
        for name, a in zip(("emb", "m", "v"), arrays, strict=True):
            if a.shape != (n, self.dim):
                raise ValueError(f"{name} must have shape ({n}, {self.dim}), got {a.shape}")
        c = _np(clock, np.int64).reshape(-1)
        if c.size != n:
            raise ValueError(f"clock must have {n} entries, got {c.size}")
        for lo in range(0, n, ROW_GROUP_ROWS):
            hi = min(n, lo + ROW_GROUP_ROWS)
            cols = [pa.array(k[lo:hi])]
            cols += [pa.FixedSizeListArray.from_arrays(pa.array(a[lo:hi].reshape(-1)), self.dim) for a in arrays]
            cols.append(pa.array(c[lo:hi]))
            self._writer.write_table(pa.Table.from_arrays(cols, schema=self._schema))
        self.rows += n

    def commit(self) -> int:
        """Close the file and rename it into place; returns the rows written."""
        if self._done:
            return self.rows
        self._writer.close()
        self._file.close()
        if isinstance(self._fs, LocalFileSystem):
            os.replace(self._tmp, self._path)  # atomic on POSIX
        else:
            self._fs.mv(self._tmp, self._path)
        self._done = True
        return self.rows

    def abort(self) -> None:
        """Drop the temporary file; nothing appears at the target."""
        if self._done:
            return
        self._done = True
        try:
            self._writer.close()
            self._file.close()
        finally:
            if self._fs.exists(self._tmp):
                self._fs.rm(self._tmp)

    def __enter__(self) -> SnapshotWriter:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is None:
            self.commit()
        else:
            self.abort()


def write_snapshot(
    url: str,
    keys: torch.Tensor | np.ndarray,
    emb: torch.Tensor | np.ndarray,
    m: torch.Tensor | np.ndarray,
    v: torch.Tensor | np.ndarray,
    clock: torch.Tensor | np.ndarray,
    storage_options: dict[str, Any] | None = None,
) -> int:
    """Write rows as one Parquet snapshot at `url`, atomically (temp name, then rename).

    Args:
        url: target file, local path or fsspec URL; parent directories are created.
        keys: int64 (N,).
        emb, m, v: float32 (N, dim).
        clock: int64 (N,).
        storage_options: fsspec options for `url`.

    Returns:
        The number of rows written.
    """
    emb_np = _np(emb, np.float32)
    if emb_np.ndim != 2:
        raise ValueError(f"emb must be 2-D (N, dim), got shape {emb_np.shape}")
    with SnapshotWriter(url, emb_np.shape[1], storage_options) as w:
        w.write(keys, emb_np, m, v, clock)
    return w.rows


def snapshot_files(url: str, storage_options: dict[str, Any] | None = None) -> tuple[fsspec.AbstractFileSystem, list[str]]:
    """(filesystem, sorted Parquet paths) of a snapshot file or a directory of `*.parquet` parts.

    Raises:
        FileNotFoundError: `url` does not exist.
    """
    fs, path = get_fs(url, storage_options)
    if not fs.exists(path):
        raise FileNotFoundError(url)
    if fs.isdir(path):
        files = sorted(p for p in fs.ls(path, detail=False) if p.endswith(".parquet"))
        return fs, files
    return fs, [path]


def _check_owner(owner: tuple[int, int] | None) -> None:
    if owner is None:
        return
    rank, world = owner
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"owner must be (rank, world) with 0 <= rank < world, got {owner}")


def _fsl_to_numpy(col: pa.ChunkedArray | pa.Array, dim: int) -> np.ndarray:
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    arr: np.ndarray = col.values.to_numpy(zero_copy_only=False).reshape(-1, dim)
    return arr


def _file_dim(pf: pq.ParquetFile, where: str) -> int:
    schema = pf.schema_arrow
    missing = [c for c in _COLUMNS if c not in schema.names]
    if missing:
        raise ValueError(f"{where} is not an embedding snapshot: missing columns {missing}")
    t = schema.field("emb").type
    if not pa.types.is_fixed_size_list(t):
        raise ValueError(f"{where}: column emb must be fixed_size_list<float32>, got {t}")
    size: int = t.list_size
    return size


def iter_snapshot(
    url: str,
    *,
    owner: tuple[int, int] | None = None,
    storage_options: dict[str, Any] | None = None,
) -> Iterator[SnapshotBatch]:
    """Yield the rows of a snapshot (file or directory of parts) one row group at a time.

    Args:
        url: a snapshot file or a directory of `*.parquet` parts.
        owner: (rank, world): keep only keys with `owner_of(key, world) == rank`.
        storage_options: fsspec options.
    """
    for d, t, keep in _row_groups(url, owner, storage_options, list(_COLUMNS)):
        if keep is not None and not keep.any():
            continue
        batch = SnapshotBatch(
            t.column("key").to_numpy(),
            _fsl_to_numpy(t.column("emb"), d),
            _fsl_to_numpy(t.column("m"), d),
            _fsl_to_numpy(t.column("v"), d),
            t.column("clock").to_numpy(),
        )
        if keep is not None and not keep.all():
            batch = SnapshotBatch(*(a[keep] for a in (batch.keys, batch.emb, batch.m, batch.v, batch.clock)))
        yield batch


def _row_groups(
    url: str, owner: tuple[int, int] | None, storage_options: dict[str, Any] | None, columns: list[str]
) -> Iterator[tuple[int, pa.Table, np.ndarray | None]]:
    """(dim, row group table, owned-rows mask or None) for every row group of every part, in order."""
    _check_owner(owner)
    fs, files = snapshot_files(url, storage_options)
    dim = None
    for f in files:
        with fs.open(f, "rb") as fh:
            pf = pq.ParquetFile(fh)
            d = _file_dim(pf, f)
            if dim is not None and d != dim:
                raise ValueError(f"snapshot parts disagree on dim: {d} in {f}, {dim} before")
            dim = d
            for i in range(pf.num_row_groups):
                t = pf.read_row_group(i, columns=columns)
                keys = t.column("key").to_numpy()
                yield d, t, (None if owner is None else owner_of(keys, owner[1]) == owner[0])


def snapshot_dim(url: str, storage_options: dict[str, Any] | None = None) -> int | None:
    """Row width of a snapshot, or None for a directory without parts."""
    fs, files = snapshot_files(url, storage_options)
    for f in files:
        with fs.open(f, "rb") as fh:
            return _file_dim(pq.ParquetFile(fh), f)
    return None


def check_snapshot_dim(url: str, dim: int, storage_options: dict[str, Any] | None = None) -> None:
    """Refuse to restore a snapshot of another row width into a store of width `dim`."""
    d = snapshot_dim(url, storage_options)
    if d is not None and d != dim:
        raise ValueError(f"snapshot {url} has dim {d}, the store has dim {dim}")


def read_snapshot(
    url: str,
    *,
    owner: tuple[int, int] | None = None,
    storage_options: dict[str, Any] | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Read a snapshot (file or directory of parts) into NumPy arrays.

    Two passes: the key columns first (to size the output for the owned rows),
    then the row groups one at a time into preallocated arrays, so a big
    snapshot is never held twice.

    Args:
        url: a snapshot file or a directory of `*.parquet` parts.
        owner: (rank, world): keep only keys with `owner_of(key, world) == rank`.
        storage_options: fsspec options.

    Returns:
        (keys int64 (N,), emb float32 (N, dim), m, v, clock int64 (N,)), in file order.
        `torch.from_numpy` turns each into a tensor without a copy.

    Raises:
        FileNotFoundError: `url` does not exist.
        ValueError: a part is not a snapshot, or parts disagree on dim.
    """
    n, dim = 0, 1
    for group_dim, t, keep in _row_groups(url, owner, storage_options, ["key"]):
        n += t.num_rows if keep is None else int(np.count_nonzero(keep))
        dim = group_dim or 1
    out: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray] = (
        np.empty(n, dtype=np.int64),
        np.empty((n, dim), dtype=np.float32),
        np.empty((n, dim), dtype=np.float32),
        np.empty((n, dim), dtype=np.float32),
        np.empty(n, dtype=np.int64),
    )
    at = 0
    for b in iter_snapshot(url, owner=owner, storage_options=storage_options):
        k = len(b)
        for dst, src in zip(out, (b.keys, b.emb, b.m, b.v, b.clock), strict=True):
            dst[at : at + k] = src
        at += k
    if at != n:
        raise RuntimeError(f"snapshot {url} changed while being read ({at} rows, expected {n})")
    return out
