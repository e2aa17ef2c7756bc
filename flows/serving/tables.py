"""A bundle's embedding rows as a lookup, in memory or memory-mapped, and delta chains applied to them.

`memory_table` holds the rows in RAM (`trainer.eval.scoring.FrozenEmbeddings`, the lookup evaluation
uses).  `MmapTable` (`score-server --mmap`) serves a table larger than RAM: the key -> row map is a
`storage.embedding.index.KeyIndex` in memory, and the vectors stay in `rows/emb.npy`, memory-mapped.
Its anonymous resident memory is bounded by the index, `KeyIndex.nbytes` (13 bytes per cell, at
least 2 cells per key: about 26-40 bytes per key), plus one batch of rows; the pages of the mapped
file are the kernel's page cache, reclaimable, so a table bigger than RAM is served at the cost of
reads from disk for the rows not cached.

Either way a key the model never trained gets its deterministic initial row, as in training.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from flows.serving.bundle import EMB, EVICTED, KEYS, BundleError, BundleReader
from storage.embedding.index import KeyIndex
from trainer.eval.scoring import FrozenEmbeddings, fill_rows
from trainer.export import SparseRows, apply_delta, rows_digest


def read_table(reader: BundleReader) -> SparseRows:
    """The rows stored in one bundle (of a delta: its changed rows)."""
    return SparseRows(keys=reader.read_array(KEYS), emb=reader.read_array(EMB))


def chain_table(readers: Sequence[BundleReader]) -> SparseRows:
    """The rows of the last bundle of a chain: a full bundle, then deltas each based on the one before.

    Every step is checked against the manifests' digests, so the result is bit-identical to the
    target version's full table or an error names the broken link.

    Raises:
        BundleError: the chain does not start with a full bundle, a delta's base is not the version
            before it, or a digest differs.
    """
    if not readers or readers[0].kind != "full":
        raise BundleError("a chain starts with a full bundle (kind 'full'), then its deltas in order")
    table = read_table(readers[0])
    _check_digest(readers[0], table)
    for prev, reader in zip(readers, readers[1:], strict=False):
        m = reader.manifest
        if reader.kind != "delta" or m["base_version"] != prev.version:
            raise BundleError(
                f"{reader.url} ({reader.kind}, base {m.get('base_version')}) does not follow "
                f"{prev.version}: pass the deltas in version order"
            )
        if m["base_rows_digest"] != prev.manifest["rows_digest"]:
            raise BundleError(f"{reader.url} was made from other rows of {prev.version} than {prev.url} holds")
        table = apply_delta(table, read_table(reader), reader.read_array(EVICTED))
        _check_digest(reader, table)
    return table


def _check_digest(reader: BundleReader, table: SparseRows) -> None:
    if rows_digest(table) != reader.manifest["rows_digest"]:
        raise BundleError(f"the rows reached at {reader.version} ({reader.url}) differ from the version's own")


def memory_table(rows: SparseRows, *, init_std: float) -> FrozenEmbeddings:
    """The rows in RAM (float16 rows stay float16 and are widened per lookup)."""
    return FrozenEmbeddings(rows.keys, rows.emb, dim=rows.dim, init_std=init_std)


class MmapTable:
    """Rows served from a memory-mapped `rows/emb.npy` through an in-memory `KeyIndex` (see the module docstring).

    Args:
        keys: int64 (N,) keys of the rows, in file order (read once to build the index, then dropped).
        emb_path: a local `.npy` file of (N, D) float32 or float16 rows.
        init_std: std of the initial rows of unknown keys.
    """

    def __init__(self, keys: np.ndarray, emb_path: str, *, init_std: float) -> None:
        self.emb = np.load(emb_path, mmap_mode="r", allow_pickle=False)
        if self.emb.ndim != 2 or self.emb.shape[0] != keys.size:
            raise BundleError(f"{emb_path} holds {self.emb.shape} rows for {keys.size} keys")
        self.dim, self.init_std = int(self.emb.shape[1]), init_std
        self.index = KeyIndex(keys.size, value_dtype=np.int32 if keys.size < 2**31 else np.int64)
        self.index.insert(keys, np.arange(keys.size))

    def __len__(self) -> int:
        return len(self.index)

    @property
    def resident_bytes(self) -> int:
        """The anonymous memory the table holds: its index (the mapped rows are page cache)."""
        return self.index.nbytes

    def lookup(self, keys: torch.Tensor) -> torch.Tensor:
        """Rows of `keys` (N,) as float32 (N, D); unknown keys get `init_rows`."""
        k = np.array(keys.detach().cpu().numpy(), dtype=np.int64)
        slots = self.index.get(k)
        found = slots >= 0
        rows, inverse = np.unique(slots[found], return_inverse=True)  # ascending: pages read in file order
        vectors = np.asarray(self.emb[rows], dtype=np.float32).reshape(-1, self.dim)[inverse.reshape(-1)]
        return fill_rows(k, found, torch.from_numpy(vectors), self.init_std)
