"""The sparse snapshot format: one Parquet file of full rows per store (or per rank).

Columns: ``key`` int64, ``emb`` fixed_size_list<float32 | float16 | bfloat16 bits | uint8>[width] (the
row dtype; an int8 row's codes, then its fp16 scale and offset as 4 bytes), one column per optimizer
state tensor (``m`` / ``v`` fixed_size_list<float32 | uint8>[dim] for Adam, ``v`` for rmsprop, ``acc`` float32 | uint8
for
row-wise AdaGrad, none for SGD; uint8 for log8 state), ``clock`` int32.  The schema metadata
``ctr.row_format`` names the format (`RowFormat.meta`: dim, optimizer, row dtype); a file without
it is a snapshot of the releases before compact rows: fp32 weights with Adam's ``m`` and ``v`` and
an int64 clock.  A reader gets the file's rows in the file's format (`SnapshotBatch.fmt`) and
converts them to its own (`SnapshotBatch.rows_as`).

Writers write under a temporary name beside the target and rename it into place last, so a reader
sees the old file or the complete new one.  Readers accept one file or a directory of ``*.parquet``
parts (a model's ``sparse/`` folder, written by any world size) and keep only the keys a rank owns,
reading one row group at a time.
"""

from __future__ import annotations

import json
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
from storage.embedding.rows.batch import Rows
from storage.embedding.rows.format import RowFormat
from storage.io.fsio import get_fs

ROW_GROUP_ROWS = 65536
"""Rows per Parquet row group: the unit readers stream by."""
FORMAT_KEY = b"ctr.row_format"
"""Schema metadata key holding `RowFormat.meta()` as JSON."""
_EMB_TYPES = {"fp32": pa.float32(), "fp16": pa.float16(), "bf16": pa.uint16(), "int8": pa.uint8(), "int8s": pa.uint8()}
"""Arrow value type of the `emb` column per row dtype (Arrow has no bfloat16: its bit patterns)."""
_STATE_TYPES = {"fp32": (pa.float32(), np.float32), "log8": (pa.uint8(), np.uint8)}
"""Arrow and NumPy type of the state columns per state dtype."""


def snapshot_schema(fmt: RowFormat) -> pa.Schema:
    """The Arrow schema of a snapshot of rows in format `fmt`."""
    st = _STATE_TYPES[fmt.state_dtype][0]
    fields = [("key", pa.int64()), ("emb", pa.list_(_EMB_TYPES[fmt.row_dtype], fmt.width))]
    fields += [(f.name, pa.list_(st, c) if (c := f.cols(fmt.dim)) else st) for f in fmt.rule.state]
    fields.append(("clock", pa.int32()))
    return pa.schema(fields, metadata={FORMAT_KEY: json.dumps(fmt.meta(), sort_keys=True).encode()})


def _np(x: torch.Tensor | np.ndarray, dtype: type) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().float().numpy() if x.dtype in (torch.float16, torch.bfloat16) else x.detach().cpu().numpy()
    return np.ascontiguousarray(x, dtype=dtype)


@dataclass
class SnapshotBatch:
    """Snapshot rows as NumPy arrays, in the format of the file they came from.

    Attributes:
        keys: int64 (N,).
        emb: float32 (N, dim): the weights the stored rows hold, exactly (fp16 and bf16 widen to fp32
            without loss; int8 rows decoded).
        state: the optimizer state columns by name, as stored (float32, or uint8 codes for log8).
        clock: int64 (N,).
        fmt: the file's row format.
        codes: an int8 row's stored bytes (N, dim + 4), which `rows` returns as they are (decoding and
            encoding again could move a row by a unit); None for the other row dtypes.
    """

    keys: np.ndarray
    emb: np.ndarray
    state: dict[str, np.ndarray]
    clock: np.ndarray
    fmt: RowFormat
    codes: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.keys.size)

    def select(self, idx: np.ndarray) -> SnapshotBatch:
        """The rows at positions (or mask) `idx`."""
        return SnapshotBatch(
            self.keys[idx],
            self.emb[idx],
            {k: v[idx] for k, v in self.state.items()},
            self.clock[idx],
            self.fmt,
            None if self.codes is None else self.codes[idx],
        )

    def rows(self) -> Rows:
        """The rows in the file's own format (CPU tensors)."""
        st = _STATE_TYPES[self.fmt.state_dtype][1]
        emb = _tensor(self.codes) if self.codes is not None else _tensor(self.emb).to(self.fmt.dtype)
        return Rows(
            emb, {k: _tensor(v, st) for k, v in self.state.items()}, torch.from_numpy(self.clock.astype(np.int32))
        )

    def rows_as(self, fmt: RowFormat) -> Rows:
        """The rows converted to `fmt` (`RowFormat.convert`: optimizer state and weight dtype)."""
        return fmt.convert(self.rows(), self.fmt)


class SnapshotWriter:
    """Streams rows into one Parquet snapshot, committed atomically.

    Use as a context manager: the file appears at `url` only when the block
    exits without an exception (`commit`); otherwise the temporary file is removed.

    Args:
        url: target file (local path or fsspec URL).
        fmt: the rows' format (an int: `RowFormat(dim)`, fp32 with Adam).
        storage_options: fsspec options for `url`.

    Example::

        with SnapshotWriter("s3://b/model/sparse/part-00000.parquet", store.row_format) as w:
            w.write(keys, rows)
    """

    def __init__(self, url: str, fmt: RowFormat | int, storage_options: dict[str, Any] | None = None) -> None:
        if isinstance(fmt, int):
            fmt = RowFormat(fmt)
        self.fmt = fmt
        self.dim = fmt.dim
        self.rows = 0
        self._fs, self._path = get_fs(url, storage_options)
        parent = self._path.rstrip("/").rsplit("/", 1)[0] if "/" in self._path.rstrip("/") else ""
        if parent:
            self._fs.makedirs(parent, exist_ok=True)
        self._tmp = f"{self._path}.tmp-{uuid.uuid4().hex[:12]}"
        self._schema = snapshot_schema(fmt)
        self._file = self._fs.open(self._tmp, "wb")
        self._writer = pq.ParquetWriter(self._file, self._schema)
        self._done = False

    def write(self, keys: torch.Tensor | np.ndarray, rows: Rows) -> None:
        """Append `rows` of `keys` (any number; split into row groups of `ROW_GROUP_ROWS`)."""
        self.fmt.check(rows, "snapshot rows")
        k = _np(keys, np.int64).reshape(-1)
        n = k.size
        if len(rows) != n:
            raise ValueError(f"{n} keys for {len(rows)} rows")
        emb = rows.emb.detach().cpu()
        emb_np = emb.view(torch.int16).numpy().view(np.uint16) if self.fmt.row_dtype == "bf16" else emb.numpy()
        st = _STATE_TYPES[self.fmt.state_dtype][1]
        state = {name: _np(rows.state[name], st) for name in self.fmt.state_names}
        c = _np(rows.clock, np.int32).reshape(-1)
        d, w = self.dim, self.fmt.width
        for lo in range(0, n, ROW_GROUP_ROWS):
            hi = min(n, lo + ROW_GROUP_ROWS)
            cols = [pa.array(k[lo:hi]), pa.FixedSizeListArray.from_arrays(pa.array(emb_np[lo:hi].reshape(-1)), w)]
            for f in self.fmt.rule.state:
                a = state[f.name][lo:hi]
                cols.append(
                    pa.FixedSizeListArray.from_arrays(pa.array(a.reshape(-1)), cw) if (cw := f.cols(d)) else pa.array(a)
                )
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
    rows: Rows,
    fmt: RowFormat,
    storage_options: dict[str, Any] | None = None,
) -> int:
    """Write `rows` of `keys` (format `fmt`) as one Parquet snapshot at `url`, atomically (temp name, then rename).

    Returns:
        The number of rows written.
    """
    with SnapshotWriter(url, fmt, storage_options) as w:
        w.write(keys, rows)
    return w.rows


def snapshot_files(
    url: str, storage_options: dict[str, Any] | None = None
) -> tuple[fsspec.AbstractFileSystem, list[str]]:
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


def _column(col: pa.ChunkedArray | pa.Array, dim: int | None) -> np.ndarray:
    """A column as NumPy in its own type: (N, dim) for a list column, else (N,)."""
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    if dim is None:
        return np.asarray(col.to_numpy(zero_copy_only=False))
    return np.asarray(col.values.to_numpy(zero_copy_only=False).reshape(-1, dim))


def _tensor(a: np.ndarray, dtype: Any = None) -> torch.Tensor:
    """`a` as a tensor sharing its memory, copied first where Arrow handed out a read-only array (torch
    warns on those, once per process, in the middle of a day's report)."""
    return torch.from_numpy(np.require(a, dtype=dtype, requirements=["C", "W"]))


def _weights(stored: np.ndarray, fmt: RowFormat) -> np.ndarray:
    """The `emb` column's values (N, width) as the fp32 weights (N, dim) they hold."""
    if fmt.row_dtype == "bf16":
        return np.asarray(_tensor(stored.view(np.int16)).view(torch.bfloat16).float().numpy())
    if fmt.coded:
        return fmt.weights(_tensor(stored)).numpy()
    return np.asarray(stored, dtype=np.float32)


def file_format(pf: pq.ParquetFile, where: str) -> RowFormat:
    """The row format of a snapshot file (its metadata; none: fp32 with Adam, the format before compact rows).

    Raises:
        ValueError: the file is not a snapshot, or its columns do not match the format it names.
    """
    schema = pf.schema_arrow
    meta = schema.metadata or {}
    if "emb" not in schema.names or not pa.types.is_fixed_size_list(schema.field("emb").type):
        raise ValueError(f"{where} is not an embedding snapshot: no fixed-size list column `emb`")
    dim: int = schema.field("emb").type.list_size
    if FORMAT_KEY in meta:
        try:
            fmt = RowFormat.from_meta(json.loads(meta[FORMAT_KEY]))
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(
                f"{where}: unreadable row format {meta[FORMAT_KEY]!r} ({e}); "
                "this snapshot was written by a newer ctr-pipeline, upgrade here"
            ) from None
    else:
        fmt = RowFormat(dim)
    missing = [c for c in ("key", "emb", *fmt.state_names, "clock") if c not in schema.names]
    if missing or fmt.width != dim:
        raise ValueError(
            f"{where} is not a {fmt.name} snapshot of dim {fmt.dim}: missing columns {missing}, "
            f"emb of width {dim} (expected {fmt.width})"
        )
    return fmt


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
    for fmt, t, keep in _row_groups(url, owner, storage_options, None):
        if keep is not None and not keep.any():
            continue
        d = fmt.dim
        stored = _column(t.column("emb"), fmt.width)
        batch = SnapshotBatch(
            t.column("key").to_numpy(),
            _weights(stored, fmt),
            {f.name: _column(t.column(f.name), f.cols(d)) for f in fmt.rule.state},
            t.column("clock").to_numpy().astype(np.int64),
            fmt,
            stored if fmt.coded else None,
        )
        if keep is not None and not keep.all():
            batch = batch.select(keep)
        yield batch


def _row_groups(
    url: str, owner: tuple[int, int] | None, storage_options: dict[str, Any] | None, columns: list[str] | None
) -> Iterator[tuple[RowFormat, pa.Table, np.ndarray | None]]:
    """(row format, row group table, owned-rows mask or None) for every row group of every part, in order."""
    _check_owner(owner)
    fs, files = snapshot_files(url, storage_options)
    first: RowFormat | None = None
    for f in files:
        with fs.open(f, "rb") as fh:
            pf = pq.ParquetFile(fh)
            fmt = file_format(pf, f)
            if first is not None and fmt != first:
                raise ValueError(f"snapshot parts disagree on the row format: {fmt} in {f}, {first} before")
            first = fmt
            for i in range(pf.num_row_groups):
                t = pf.read_row_group(i, columns=columns)
                keys = t.column("key").to_numpy()
                yield fmt, t, (None if owner is None else owner_of(keys, owner[1]) == owner[0])


def snapshot_format(url: str, storage_options: dict[str, Any] | None = None) -> RowFormat | None:
    """Row format of a snapshot (its first part's), or None for a directory without parts."""
    fs, files = snapshot_files(url, storage_options)
    for f in files:
        with fs.open(f, "rb") as fh:
            return file_format(pq.ParquetFile(fh), f)
    return None


def snapshot_dim(url: str, storage_options: dict[str, Any] | None = None) -> int | None:
    """Row width of a snapshot, or None for a directory without parts."""
    fmt = snapshot_format(url, storage_options)
    return None if fmt is None else fmt.dim


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
) -> SnapshotBatch:
    """Every row of a snapshot (file or directory of parts; only `owner`'s keys) as one batch, in file order.

    Two passes: the key columns first (to size the output for the owned rows), then the row groups one at a
    time into preallocated arrays, so a big snapshot is never held twice.

    Raises:
        FileNotFoundError: `url` does not exist.
        ValueError: a part is not a snapshot, or parts disagree on the row format.
    """
    _check_owner(owner)
    n, fmt = 0, snapshot_format(url, storage_options) or RowFormat(1)
    for _, t, keep in _row_groups(url, owner, storage_options, ["key"]):
        n += t.num_rows if keep is None else int(np.count_nonzero(keep))
    st = _STATE_TYPES[fmt.state_dtype][1]
    out = SnapshotBatch(
        np.empty(n, np.int64),
        np.empty((n, fmt.dim), np.float32),
        {f.name: np.empty(f.shape(n, fmt.dim), st) for f in fmt.rule.state},
        np.empty(n, np.int64),
        fmt,
        np.empty((n, fmt.width), np.uint8) if fmt.coded else None,
    )
    at = 0
    for b in iter_snapshot(url, owner=owner, storage_options=storage_options):
        k = len(b)
        out.keys[at : at + k], out.emb[at : at + k], out.clock[at : at + k] = b.keys, b.emb, b.clock
        if out.codes is not None and b.codes is not None:
            out.codes[at : at + k] = b.codes
        for name, a in b.state.items():
            out.state[name][at : at + k] = a
        at += k
    if at != n:
        raise RuntimeError(f"snapshot {url} changed while being read ({at} rows, expected {n})")
    return out
