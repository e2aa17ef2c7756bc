"""The embedding-store contract every tier implements.

A store maps int64 feature keys (see `pipeline.keys`) to rows.  A row is the
embedding vector plus its sparse-Adam state (first moment `m`, second moment
`v`) and its clock (the number of updates applied to it), so moving a row
between tiers or evicting it never loses optimizer state.

Guarantees every tier keeps (checked by `tests/storage/embedding/conformance.py`):

- `lookup(keys)` returns a float32 tensor of shape (len(keys), dim) on the
  store's device, in the order of `keys`; duplicates are allowed.  A key the
  store has never seen is initialised with `init_rows(keys, dim, std)`, a pure
  function of the key, so every rank, every tier and every rerun agrees.
  `lookup` does not store that row: a row exists (counts in `len`, appears in
  `snapshot`) once `update`, `warm` or `restore` wrote it.
- Keys are int64 tensors of shape (N,) with non-negative values; gradients are
  float32 (N, dim).  Anything else raises `TypeError` / `ValueError` before any
  row changes.
- `update(keys, grads, lr=...)` applies sparse Adam to the rows of `keys`;
  gradients of duplicate keys are summed first.  Each row's clock counts its
  own updates and drives its bias correction (lazy Adam).  Non-finite
  gradients raise `ValueError` before any row changes.
- `snapshot(url)` writes every row (embedding, m, v, clock) as one Parquet file
  (columns key:int64, emb/m/v: fixed-size list<float32>[dim], clock:int64) through fsspec,
  atomically; `restore(url, owner=(rank, world))` replaces the store's content
  with the rows of that file whose `owner_of(key, world) == rank`.
- No per-key Python loops on the hot path: every operation is batched.
"""

from __future__ import annotations

import abc
from typing import Any

import numpy as np
import torch

ADAM_BETAS = (0.9, 0.999)
ADAM_EPS = 1e-8


def owner_of(keys: torch.Tensor | np.ndarray, world_size: int) -> torch.Tensor | np.ndarray:
    """Rank that owns each key: `key % world_size` (keys are non-negative; their low 56 bits are a hash)."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    return keys % world_size


class EmbeddingStore(abc.ABC):
    """A key -> (embedding, m, v, clock) table.  See the module docstring for the contract."""

    dim: int

    @abc.abstractmethod
    def lookup(self, keys: torch.Tensor) -> torch.Tensor:
        """Embeddings of `keys` (int64, shape (N,)) as float32 (N, dim), initialising unseen keys."""
        raise NotImplementedError

    @abc.abstractmethod
    def update(self, keys: torch.Tensor, grads: torch.Tensor, *, lr: float, weight_decay: float = 0.0) -> None:
        """Apply one sparse-Adam step to the rows of `keys` with `grads` (N, dim); duplicate keys summed."""
        raise NotImplementedError

    @abc.abstractmethod
    def warm(self, keys: torch.Tensor) -> None:
        """Bring the rows of `keys` into this tier's fastest level (hint; no effect on values)."""
        raise NotImplementedError

    @abc.abstractmethod
    def evict(self, keys: torch.Tensor) -> None:
        """Delete the rows of `keys` from every level (the vocabulary dropped them); unknown keys are ignored."""
        raise NotImplementedError

    @abc.abstractmethod
    def snapshot(self, url: str, storage_options: dict | None = None) -> int:
        """Write every row to a Parquet file at `url` atomically; returns the number of rows."""
        raise NotImplementedError

    @abc.abstractmethod
    def restore(
        self, url: str, *, owner: tuple[int, int] | None = None, storage_options: dict | None = None
    ) -> int:
        """Replace the content with the rows at `url` (only those owned by `owner=(rank, world)`); returns rows kept."""
        raise NotImplementedError

    @abc.abstractmethod
    def stats(self) -> dict[str, Any]:
        """Counters per tier, top tier first: ``{tier_name: {"hits", "misses", "bytes_read",
        "bytes_written", "evictions", "rows", ...}}`` (a single-level store reports one tier)."""
        raise NotImplementedError

    @abc.abstractmethod
    def __len__(self) -> int:
        """Number of rows held (all levels)."""
        raise NotImplementedError

    def flush(self) -> None:  # noqa: B027 - optional hook
        """Write dirty rows down to the persistent level (no-op for purely in-memory stores)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release files and memory; the store is unusable afterwards."""
