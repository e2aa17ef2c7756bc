"""Serving exports of a trained model: the dense network as a program, the rows without optimizer state.

A server needs neither Python classes of this package nor pickles to run a model:

- the dense network is exported with `torch.export` (`export_program`; a `.pt2` file that
  `torch.export.load` reads) with a dynamic batch dimension, and, with the optional `onnx` extra,
  as ONNX (`export_onnx`, run with onnxruntime);
- the embedding rows keep only key and vector (`read_rows` drops the optimizer state; the clock is kept
  in memory to find what changed), as float32 or float16 (`cast_rows`);
- a delta (`delta_rows`) holds the rows changed since a base version, decided by the per-row
  update clock, plus the keys evicted since; `apply_delta` takes the base's rows to the target's
  exactly, and `rows_digest` names a table's content so a chain can be checked bit for bit.
"""

from __future__ import annotations

import hashlib
import io
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from storage.embedding.snapshot import iter_snapshot
from storage.io import fsio
from trainer.models.ctr_model import CTRModel

DTYPES = {"float32": np.float32, "float16": np.float16}
"""Row dtypes a bundle may hold."""
_EXAMPLE_BATCH = 4
"""Batch of the example inputs `torch.export` traces with (not 0 or 1, which it would specialise on)."""
_MAX_BATCH = 1 << 20
FIRST_EXPORT_IMPORTS = ("torch._dynamo", "torch.export._trace")
"""What the first `export_program` of a process imports before it traces (about 1.5 s of CPU; torch imports
`torch.export` itself, not its tracer): `flows.day.preload` loads them while the train stage waits."""


@dataclass(frozen=True)
class SparseRows:
    """Embedding rows sorted by key: keys int64 (N,), emb (N, D) float32 or float16, clock int64 (N,) or None."""

    keys: np.ndarray
    emb: np.ndarray
    clock: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.keys.size)

    @property
    def dim(self) -> int:
        return int(self.emb.shape[1])


# ---- the dense network -------------------------------------------------------------------------
def export_program(model: CTRModel) -> torch.export.ExportedProgram:
    """The network (eval mode) as a `torch.export` program: (dense (B, n), emb (B, F, D)) -> logits (B,), any B."""
    model = model.eval()
    dense = torch.rand(_EXAMPLE_BATCH, model.num_dense)
    emb = torch.randn(_EXAMPLE_BATCH, model.num_fields, model.dim)
    batch = torch.export.Dim("batch", min=1, max=_MAX_BATCH)
    with torch.no_grad():
        return torch.export.export(model, (dense, emb), dynamic_shapes=({0: batch}, {0: batch}))


def program_bytes(program: torch.export.ExportedProgram) -> bytes:
    """The `.pt2` file of a program (`torch.export.save`)."""
    buf = io.BytesIO()
    torch.export.save(program, buf)
    return buf.getvalue()


def load_program(data: bytes | bytearray) -> torch.nn.Module:
    """A callable module from `.pt2` bytes (`torch.export.load`): module(dense, emb) -> logits."""
    return torch.export.load(io.BytesIO(data)).module()


def onnx_missing() -> str | None:
    """Why ONNX export is unavailable (the optional `onnx` extra is not installed), or None."""
    try:
        import onnx  # noqa: F401
        import onnxscript  # noqa: F401
    except ImportError as exc:
        return f"ONNX export needs the optional extra: pip install 'ctr-pipeline[onnx]' ({exc})"
    return None


def onnx_bytes(model: CTRModel) -> bytes:
    """The network as an ONNX model (inputs `dense`, `emb`; output `logits`; dynamic batch).

    Raises:
        RuntimeError: the `onnx` extra is not installed.
    """
    if reason := onnx_missing():
        raise RuntimeError(reason)
    import tempfile
    from pathlib import Path

    model = model.eval()
    dense = torch.rand(_EXAMPLE_BATCH, model.num_dense)
    emb = torch.randn(_EXAMPLE_BATCH, model.num_fields, model.dim)
    batch = torch.export.Dim("batch", min=1, max=_MAX_BATCH)
    with torch.no_grad():
        program = torch.onnx.export(
            model,
            (dense, emb),
            input_names=["dense", "emb"],
            output_names=["logits"],
            dynamic_shapes=({0: batch}, {0: batch}),
            dynamo=True,
            verbose=False,
        )
    assert program is not None  # noqa: S101 - dynamo=True returns the ONNXProgram
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "dense.onnx"
        program.save(str(path))
        return path.read_bytes()


# ---- rows --------------------------------------------------------------------------------------
def read_rows(sparse_url: str, *, dim: int, storage_options: dict | None = None) -> SparseRows:
    """Key, vector (float32, widened from the stored row dtype) and clock of every row of a model's `sparse/`
    parts (any world size), sorted by key.

    The optimizer state is not kept: serving never needs it.
    """
    keys, emb, clock = [np.zeros(0, np.int64)], [np.zeros((0, dim), np.float32)], [np.zeros(0, np.int64)]
    for b in iter_snapshot(sparse_url, storage_options=storage_options):
        keys.append(b.keys)
        emb.append(b.emb)
        clock.append(b.clock)
    k = np.concatenate(keys)
    order = np.argsort(k, kind="stable")
    return SparseRows(keys=k[order], emb=np.concatenate(emb)[order], clock=np.concatenate(clock)[order])


def cast_rows(rows: SparseRows, dtype: str) -> SparseRows:
    """The rows with vectors in `dtype` (`DTYPES`), clock kept."""
    if dtype not in DTYPES:
        raise ValueError(f"row dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    return SparseRows(rows.keys, np.ascontiguousarray(rows.emb, dtype=DTYPES[dtype]), rows.clock)


@dataclass(frozen=True)
class RowDelta:
    """What takes a base table to a target table: the target's changed or new rows, and the keys it lost."""

    rows: SparseRows
    evicted: np.ndarray
    """int64, ascending: keys of the base absent from the target."""
    by_clock: int
    """Rows whose clock moved (or that are new): the update clock decided."""
    by_value: int
    """Rows with the base's clock but another vector (a key evicted and admitted again in between)."""


def delta_rows(target: SparseRows, base: SparseRows) -> RowDelta:
    """The rows of `target` that differ from `base`, and the keys of `base` that `target` lacks.

    A row changed when its key is new, when its update clock differs from the base's, or (the
    guard that makes the chain exact) when its vector differs although the clock does not: a key
    evicted and admitted again restarts its clock.  Vectors are compared in the rows' own dtype.

    Raises:
        ValueError: the tables differ in width or dtype, or a clock is missing.
    """
    if target.emb.dtype != base.emb.dtype or target.dim != base.dim:
        raise ValueError(
            f"delta needs rows of one width and dtype, got {target.emb.dtype}x{target.dim} "
            f"and {base.emb.dtype}x{base.dim}"
        )
    if target.clock is None or base.clock is None:
        raise ValueError("delta_rows needs the per-row clocks of both tables (read_rows of the registry versions)")
    pos = np.minimum(np.searchsorted(base.keys, target.keys), max(len(base) - 1, 0))
    found = base.keys[pos] == target.keys if len(base) else np.zeros(len(target), dtype=bool)
    clock_moved = ~found
    clock_moved[found] = target.clock[found] != base.clock[pos[found]]
    value_moved = np.zeros(len(target), dtype=bool)
    same = found & ~clock_moved
    value_moved[same] = (target.emb[same] != base.emb[pos[same]]).any(axis=1)
    changed = clock_moved | value_moved
    kept = np.isin(base.keys, target.keys, assume_unique=True)
    rows = SparseRows(target.keys[changed], target.emb[changed], target.clock[changed])
    return RowDelta(
        rows=rows, evicted=base.keys[~kept], by_clock=int(clock_moved.sum()), by_value=int(value_moved.sum())
    )


def apply_delta(base: SparseRows, rows: SparseRows, evicted: np.ndarray) -> SparseRows:
    """`base` without `evicted` keys, with `rows` inserted or replacing its rows (sorted by key; no clocks)."""
    drop = np.isin(base.keys, evicted) | np.isin(base.keys, rows.keys)
    keys = np.concatenate([base.keys[~drop], rows.keys])
    emb = np.concatenate([base.emb[~drop], rows.emb.astype(base.emb.dtype, copy=False)])
    order = np.argsort(keys, kind="stable")
    return SparseRows(keys=keys[order], emb=emb[order])


def rows_digest(rows: SparseRows) -> str:
    """sha256 of a table's content (dtype, shape, keys, vectors): equal digests, bit-identical tables."""
    h = hashlib.sha256(f"{rows.emb.dtype.str}:{rows.emb.shape}".encode())
    h.update(np.ascontiguousarray(rows.keys, dtype="<i8").data)  # the buffers themselves: no copy of a large table
    h.update(np.ascontiguousarray(rows.emb).data)
    return h.hexdigest()


def describe_program(model: CTRModel, keep_rate: float = 1.0) -> dict[str, Any]:
    """The input and output shapes of the exported network, for the bundle manifest; its probability is corrected
    for the keep-rate of negatives it trained with (`trainer.sampling`)."""
    return {
        "inputs": {"dense": ["batch", model.num_dense], "emb": ["batch", model.num_fields, model.dim]},
        "outputs": {"logits": ["batch"]},
        "probability": "sigmoid(logits)" if keep_rate == 1.0 else f"sigmoid(logits + log({keep_rate:g}))",
    }


def read_bytes(url: str, storage_options: dict | None = None) -> bytes:
    fs, path = fsio.get_fs(url, storage_options)
    with fs.open(path, "rb") as f:
        return f.read()
