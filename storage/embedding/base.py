"""The embedding-store contract every tier implements.

A store maps int64 feature keys (see `pipeline.encode.keys`) to rows.  A row is the
embedding vector, the state its sparse optimizer keeps (Adam's moments, row-wise
AdaGrad's accumulator, nothing for SGD) and its clock (the number of updates applied
to it), all as the store's `row_format` lays them out (`storage.embedding.rows.format`),
so moving a row between tiers or evicting it never loses optimizer state.

Guarantees every tier keeps (checked by `tests/storage/embedding/conformance.py`):

- `lookup(keys)` returns a `Lookup`: the keys and their rows, a float32 tensor
  of shape (len(keys), dim) on `store.device`, in the order of `keys`;
  duplicates are allowed.  A key the store has never seen is initialised with
  `init_rows(keys, dim, init_std)`, a pure function of the key, so every rank,
  every tier and every rerun agrees.  `lookup` does not store that row: a row
  exists (counts in `len`, appears in `snapshot`) once `update`, `warm`,
  `write_rows` or `restore` wrote it.
- `update(target, grads, lr=...)` applies the format's sparse optimizer
  (`RowFormat.step`) to the rows of `target` (keys, or the `Lookup` of those keys);
  gradients of duplicate keys are summed first.  Each row's clock counts its own
  updates (and drives Adam's bias correction).  Given the `Lookup` returned by this store's last
  call, a tier may reuse what the lookup resolved (a caching tier does not hash
  the keys or read the tier below a second time); the result is the same
  either way.
- Keys are int64 tensors of shape (N,) with non-negative values; gradients are
  float32 (N, dim).  Anything else raises `TypeError` / `ValueError` before any
  row changes.  Non-finite gradients raise `ValueError` before any row changes; a tier on a GPU, which reads
  nothing of the device in `update`, raises it at its next `check_updates` (or `flush`) instead, the refused
  update having changed no row.
- `read_rows(keys)` returns full rows (weights, optimizer state, clock) without
  materialising unknown ones (`found=False`, fresh rows); `write_rows`
  upserts full rows as given; `contains` says which keys are held.  Caching
  tiers are built on these, and the HET cache reads row clocks through them.
- `snapshot(url)` writes every row as one Parquet file (`storage.embedding.snapshot`:
  key, weights, one column per state tensor, clock; its metadata names the row format)
  through fsspec, atomically; `restore(url, owner=(rank, world))` replaces the store's
  content with the rows of that file whose `owner_of(key, world) == rank`, converted
  to the store's format when the file holds another (`RowFormat.convert`).
- `tag` names the run whose state a persistent store holds (None for a store
  with no persistent level, whose `set_tag` does nothing).
- No per-key Python loops on the hot path: every operation is batched.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import torch

from storage.embedding.rows.batch import Rows
from storage.embedding.rows.checks import check_keys, check_update
from storage.embedding.rows.format import RowFormat
from storage.embedding.rows.segments import sum_duplicates
from storage.embedding.rows.sparse_optim import ADAM_BETAS, ADAM_EPS
from storage.embedding.rows.transfer import host_to_device

__all__ = ["ADAM_BETAS", "ADAM_EPS", "EmbeddingStore", "Lookup", "as_row_format", "owner_of"]


def as_row_format(dim: int | RowFormat) -> RowFormat:
    """A store's row format from its first argument: a `RowFormat`, or an int width as shorthand for
    `RowFormat(dim)` (fp32 weights with Adam: the rows of the releases before compact rows)."""
    if isinstance(dim, RowFormat):
        return dim
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise TypeError(f"a store takes a RowFormat or an int row width, got {type(dim).__name__}")
    return RowFormat(dim)


_Keys = TypeVar("_Keys", torch.Tensor, np.ndarray)


def owner_of(keys: _Keys, world_size: int) -> _Keys:
    """Rank that owns each key: `key % world_size` (keys are non-negative; their low 56 bits are a hash)."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    return keys % world_size


@dataclass(frozen=True, eq=False)
class Lookup:
    """The rows of `keys` as a store served them: the first half of a lookup -> update pair.

    Attributes:
        keys: int64 (N,), the store's own copy of the keys looked up (on the CPU).
        rows: float32 (N, dim) on the store's device, in the order of `keys`.
        plan: what the serving tier resolved (slots, rows read below), private to it; a
            tier reuses it in `update` only while nothing else changed it since.
    """

    keys: torch.Tensor
    rows: torch.Tensor
    plan: Any = None


class EmbeddingStore(abc.ABC):
    """A key -> (weights, optimizer state, clock) table.  See the module docstring for the contract."""

    row_format: RowFormat
    """What a row holds and how `update` changes it (`storage.embedding.rows.format`)."""
    dim: int
    init_std: float
    """Std of the initial rows of unseen keys (`storage.embedding.rows.initial.init_rows`)."""
    device: torch.device
    """Where `lookup` returns rows and where gradients are applied."""

    # ---- the training interface -----------------------------------------------------------------
    @abc.abstractmethod
    def lookup(self, keys: torch.Tensor) -> Lookup:
        """The rows of `keys` (int64, shape (N,)) as float32 (N, dim), initialising unseen keys (an unseen
        key's row is its `init_rows` row as the store would keep it: rounded to the row dtype)."""
        raise NotImplementedError

    def update(
        self, target: torch.Tensor | Lookup, grads: torch.Tensor, *, lr: float, weight_decay: float = 0.0
    ) -> None:
        """Apply one step of the store's sparse optimizer to the rows of `target` (keys, or their `Lookup`)
        with `grads` (N, dim).

        Duplicate keys are summed.  The default reads the full rows, steps them and writes them back.
        """
        keys = target.keys if isinstance(target, Lookup) else target
        k = check_update(keys, grads, self.dim, lr=lr, weight_decay=weight_decay)
        if k.size == 0:
            return
        uniq, g = sum_duplicates(k, grads.detach().to(self.device))
        _, rows = self.read_rows(uniq)
        new = self.row_format.step(
            host_to_device(torch.from_numpy(uniq), self.device), rows, g, lr=lr, weight_decay=weight_decay
        )
        self.write_rows(uniq, new)

    def warm(self, keys: torch.Tensor) -> None:
        """Bring the rows of `keys` into this store's fastest level (a hint; no effect on values).

        Unknown keys get their initial rows and become part of the store.
        """
        from storage.embedding.rows.initial import init_rows

        k = np.unique(check_keys(keys))
        missing = k[~self.contains(k)]
        if missing.size:
            self.write_rows(
                missing, self.row_format.fresh(init_rows(torch.from_numpy(missing), self.dim, self.init_std))
            )

    @abc.abstractmethod
    def evict(self, keys: torch.Tensor) -> None:
        """Delete the rows of `keys` from every level (the vocabulary dropped them); unknown keys are ignored."""
        raise NotImplementedError

    # ---- full rows: what tiers move between each other ------------------------------------------
    @abc.abstractmethod
    def read_rows(self, keys: np.ndarray) -> tuple[np.ndarray, Rows]:
        """Full rows of distinct `keys` on this store's device, and a bool mask of the keys it holds.

        Unknown keys come back as fresh `init_rows` rows (clock 0) with `found=False`; nothing is stored.
        """
        raise NotImplementedError

    @abc.abstractmethod
    def write_rows(self, keys: np.ndarray, rows: Rows) -> None:
        """Insert or overwrite the rows of distinct `keys` (counts as a change to the store)."""
        raise NotImplementedError

    @abc.abstractmethod
    def contains(self, keys: np.ndarray) -> np.ndarray:
        """Bool mask: which of `keys` this store (any level) holds."""
        raise NotImplementedError

    # ---- persistence ----------------------------------------------------------------------------
    @abc.abstractmethod
    def snapshot(self, url: str, storage_options: dict[str, Any] | None = None) -> int:
        """Write every row to a Parquet file at `url` atomically; returns the number of rows."""
        raise NotImplementedError

    @abc.abstractmethod
    def restore(
        self, url: str, *, owner: tuple[int, int] | None = None, storage_options: dict[str, Any] | None = None
    ) -> int:
        """Replace the content with the rows at `url` (only those owned by `owner=(rank, world)`); returns rows kept."""
        raise NotImplementedError

    @property
    def tag(self) -> str | None:
        """The run whose state the persistent level holds (None: no persistent level, or changed since)."""
        return None

    def set_tag(self, tag: str | None) -> None:  # noqa: B027 - a store with no persistent level keeps no tag
        """Flush, then record `tag` in the persistent level (cleared again by the next change)."""

    def check_updates(self) -> None:  # noqa: B027 - a tier that checks in `update` defers nothing
        """Raise the `ValueError` of a refused update whose check this store deferred (a tier on a GPU: one
        host read here instead of one per `update`); no-op for a store that checks in `update`."""

    def prefetch(self, keys: np.ndarray) -> None:  # noqa: B027 - a store with nothing below memory reads nothing
        """A hint: `keys` are looked up soon.  A tier over a slower one starts reading the rows it lacks in the
        background (the SSD tier, while the step computes); the lookup then finds them read.  Changes no row."""

    def flush(self) -> None:  # noqa: B027 - optional hook
        """Write dirty rows down to the persistent level (no-op for purely in-memory stores)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release files and memory; the store is unusable afterwards."""

    # ---- reporting ------------------------------------------------------------------------------
    @abc.abstractmethod
    def stats(self) -> dict[str, Any]:
        """Counters per tier, top tier first: ``{tier_name: {"hits", "misses", "bytes_read",
        "bytes_written", "evictions", "rows", ...}}`` (a single-level store reports one tier)."""
        raise NotImplementedError

    @abc.abstractmethod
    def __len__(self) -> int:
        """Number of rows held (all levels)."""
        raise NotImplementedError
