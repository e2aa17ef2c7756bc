"""Bags of keys: multi-valued fields pooled into one embedding row per field.

A multi-valued field j (a schema file's `multi_valued`) reaches the trainer as
two columns (docs/formats.md, "Multi-valued fields"): `k_j`, the key of
the list's first value (or the field's missing key), and `bag_j`, the keys of
all its values.  The model keeps its input `emb` (B, F, D), one row per
field, so every architecture works unchanged: the row of a bag field is the
pooled rows of its bag (`model.bag_pooling`: mean or sum), and an empty bag
uses `k_j`'s row (the missing key), exactly as a single-valued field does.

Every (example, field) pair is a *cell* that feeds on one or more keys:

    cells.keys   (N,)    every key the batch uses, cell by cell in (b, f) order, N >= B*F
    cells.cell   (N,)    the cell b*F + f each key feeds
    cells.counts (B*F,)  keys per cell (1 for a single-valued field or an empty bag)

The training step pulls `cells.keys` in one pull (the pull dedupes), pools
the pulled rows (N, D) into (B, F, D) with `pool_rows`, and pushes the rows'
gradients, which autograd carries back through the pooling, with the keys
(the push sums duplicates).  Without bags the cells are the (B, F) keys
themselves and pooling is a view: the step is what it was before bags.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from storage.embedding.rows.segments import segment_sum
from storage.embedding.rows.transfer import host_to_device
from trainer.models.config import BAG_POOLINGS
from trainer.optim.schedule import embedding_l2_grad


@dataclass(frozen=True)
class Jagged:
    """Variable-length int64 lists of N rows: row i is `values[offsets[i]:offsets[i + 1]]`.

    The reader's form of a `bag_j` column between Parquet and a batch; `offsets[0] == 0` always.

    Args:
        values: int64 (T,), the rows' keys back to back.
        offsets: int64 (N + 1,), non-decreasing, from 0 to T.
    """

    values: np.ndarray
    offsets: np.ndarray

    def __len__(self) -> int:
        return int(self.offsets.size - 1)

    @classmethod
    def from_arrow(cls, column: pa.Array | pa.ChunkedArray) -> Jagged:
        """The lists of an Arrow list<int64> column (a null list is empty), without a Python loop per row."""
        arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
        lengths = pc.list_value_length(arr).fill_null(0).to_numpy(zero_copy_only=False)
        offsets = np.zeros(len(arr) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        values = pc.list_flatten(arr).to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
        return cls(values=values, offsets=offsets)

    @classmethod
    def concat(cls, parts: Sequence[Jagged]) -> Jagged:
        """The rows of `parts` one after the other."""
        shifts = np.cumsum([0] + [p.values.size for p in parts[:-1]])
        offsets = np.concatenate([[0]] + [p.offsets[1:] + s for p, s in zip(parts, shifts, strict=True)])
        return cls(values=np.concatenate([p.values for p in parts]), offsets=offsets.astype(np.int64))

    def slice(self, lo: int, hi: int) -> Jagged:
        """Rows [lo, hi)."""
        a, b = int(self.offsets[lo]), int(self.offsets[hi])
        return Jagged(values=self.values[a:b], offsets=self.offsets[lo : hi + 1] - a)


@dataclass(frozen=True)
class FieldBags:
    """The bags of one field for a batch: `field` is the column of `Batch.keys` (F axis) they replace.

    Args:
        field: position of the field among the key columns (the j of `k_j` / `bag_j`).
        values: int64 (T,), the keys of every bag of the batch, back to back.
        offsets: int64 (B + 1,), bag b is `values[offsets[b]:offsets[b + 1]]`; offsets[0] == 0.
    """

    field: int
    values: torch.Tensor
    offsets: torch.Tensor

    @classmethod
    def from_jagged(cls, field: int, bags: Jagged) -> FieldBags:
        return cls(
            field=field,
            values=torch.from_numpy(np.array(bags.values, np.int64)),
            offsets=torch.from_numpy(np.array(bags.offsets, np.int64)),
        )


@dataclass(frozen=True)
class Cells:
    """The keys of a batch's (B, F) cells, flattened (see the module docstring for the layout)."""

    keys: torch.Tensor
    """int64 (N,): every key to pull, cell by cell."""
    cell: torch.Tensor
    """int64 (N,): the cell b*F + f that `keys[i]` feeds; non-decreasing."""
    counts: torch.Tensor
    """int64 (B*F,): keys per cell, >= 1."""
    shape: tuple[int, int]
    """(B, F)."""

    @property
    def plain(self) -> bool:
        """One key per cell: the cells are the (B, F) keys in row-major order."""
        return self.keys.numel() == self.shape[0] * self.shape[1]


def expand_cells(keys: torch.Tensor, bags: Sequence[FieldBags] = ()) -> Cells:
    """The cells of a batch: field f of example b feeds on its bag when field f has bags and the bag
    is not empty, else on `keys[b, f]` alone (for a bag field that key is the first value's key, or
    the missing key of an empty bag, so the union of `k_j` and the bag keys is what is pulled).

    Vectorised over the batch: one pass per bag field, no loop per row.

    Args:
        keys: int64 (B, F), the `k_*` columns.
        bags: the batch's bag fields, each field at most once.

    Raises:
        ValueError: a bag field outside [0, F), listed twice, or with offsets not for B rows.
    """
    B, F = keys.shape
    flat = keys.reshape(-1).to(torch.int64)
    if not bags:
        return Cells(keys=flat, cell=torch.arange(B * F), counts=torch.ones(B * F, dtype=torch.int64), shape=(B, F))
    counts = torch.ones(B, F, dtype=torch.int64)
    from_bag = torch.zeros(B, F, dtype=torch.bool)  # the cell's keys come from its bag
    start = torch.zeros(B, F, dtype=torch.int64)  # where they start in `source`
    seen: set[int]
    sources, base, seen = [flat], B * F, set()
    for fb in bags:
        if not 0 <= fb.field < F or fb.field in seen or fb.offsets.numel() != B + 1:
            raise ValueError(
                f"bags of field {fb.field} do not fit a batch of {B} rows x {F} fields "
                f"({fb.offsets.numel()} offsets; fields with bags so far: {sorted(seen)})"
            )
        seen.add(fb.field)
        lengths = fb.offsets[1:] - fb.offsets[:-1]  # (B,)
        counts[:, fb.field] = lengths.clamp(min=1)  # an empty bag feeds on k_j (the missing key)
        from_bag[:, fb.field] = lengths > 0
        start[:, fb.field] = base + fb.offsets[:-1] - fb.offsets[0]
        sources.append(fb.values.to(torch.int64))
        base += fb.values.numel()
    source = torch.cat(sources)
    counts_flat = counts.reshape(-1)  # (B*F,)
    cell = torch.repeat_interleave(torch.arange(B * F), counts_flat)  # (N,)
    first = torch.cumsum(counts_flat, 0) - counts_flat  # (B*F,) position of each cell's first key
    rank_in_cell = torch.arange(cell.numel()) - first[cell]  # (N,)
    index = torch.where(from_bag.reshape(-1)[cell], start.reshape(-1)[cell] + rank_in_cell, cell)
    return Cells(keys=source[index], cell=cell, counts=counts_flat, shape=(B, F))


def pool_rows(rows: torch.Tensor, cells: Cells, mode: str) -> torch.Tensor:
    """The (B, F, D) model input from the pulled rows (N, D): each cell's rows summed, or averaged.

    Differentiable: the gradient of a cell's output reaches each of its rows (divided by the
    cell's count for `mean`), like `torch.nn.EmbeddingBag`.

    Raises:
        ValueError: an unknown mode, or `none` with bags (the reader should not have read them).
    """
    B, F = cells.shape
    if mode not in BAG_POOLINGS:
        raise ValueError(f"model.bag_pooling must be one of {BAG_POOLINGS}, got {mode!r}")
    if cells.plain:
        return rows.view(B, F, rows.shape[-1])  # (B, F, D): nothing to pool
    if mode == "none":
        raise ValueError("model.bag_pooling is none but the batch has bags; drop them before pooling")
    out = segment_sum(rows, cells.cell, B * F)  # (B*F, D) sums (sorted, not atomic, when deterministic)
    if mode == "mean":
        out = out / host_to_device(cells.counts, rows.device).to(rows.dtype).unsqueeze(1)
    return out.view(B, F, rows.shape[-1])


def pooling_weights(cells: Cells, mode: str) -> torch.Tensor:
    """float32 (N,): d(cell output) / d(row) of each pulled row: 1 / count for `mean`, else 1."""
    if mode == "mean":
        return 1.0 / cells.counts[cells.cell].to(torch.float32)
    return torch.ones(cells.keys.numel())


def cells_l2_grad(rows: torch.Tensor, grad: torch.Tensor, cells: Cells, mode: str, l2: float) -> torch.Tensor:
    """`grad` (N, D) plus the gradient of (l2 / 2) * mean_b sum_f sum_(k in cell bf) w_k ||e_k||^2.

    w_k is the row's pooling weight (`pooling_weights`): a bag member is regularised in proportion to
    its share of the field's row, as its data gradient is, and a bag field as a whole as much as a
    single-valued one under mean pooling.  Without bags this is `regularize.embedding_l2_grad`.
    """
    B, F = cells.shape
    if l2 == 0:
        return grad
    if cells.plain:
        D = rows.shape[-1]
        return embedding_l2_grad(rows.view(B, F, D), grad.view(B, F, D), l2).view(-1, D)
    w = host_to_device(pooling_weights(cells, mode), rows.device).to(rows.dtype).unsqueeze(1)  # (N, 1)
    return grad + (l2 / B) * w * rows.detach()
