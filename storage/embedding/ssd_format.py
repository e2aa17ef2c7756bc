"""The on-disk format of an SSD shard: records packed into aligned units, meta.json, the index file.

One shard directory::

    rows.bin                  fixed-size records packed into 4 KiB-aligned units
    index-<generation>.idx    key -> slot map (`CompactSlotMap.save`), the persistent index
    meta.json                 format, layout, generation, index file, tag, clean flag

A record is ``emb, m, v`` (float32[dim] each), ``clock`` (int64) and the ``key``
itself (int64), so a read can check the key and a stale index can never hand one
key another key's row.  Records are packed `rows_per_unit` to a unit of
`unit_bytes` (a multiple of `BLOCK`): the unit is what every read and write moves,
since O_DIRECT needs aligned offsets and lengths.  The layout is written into
meta.json and checked on open, so a shard is never read with another layout: its format version
(`SHARD`) is checked strictly (`storage.io.records`: the message names the versions read), while
fields of meta.json this code does not know are ignored.
"""

from __future__ import annotations

import json
import mmap
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from fsspec.implementations.local import LocalFileSystem

from storage.embedding.compact_index import CompactSlotMap
from storage.embedding.rows import Rows
from storage.io import records
from storage.io.fsio import write_text_atomic

_WIPE = "wipe the shard (the warm stage restores it from the published model)"
SHARD = records.RecordFormat("ctr-ssd-shard", 2, fix=_WIPE, newer=f"{_WIPE}, or upgrade ctr-pipeline here")
"""meta.json: version 2 (rows.bin records with their key); a shard of any other version is refused."""
FORMAT = SHARD.tag
BLOCK = 4096
"""I/O alignment: offsets, lengths and buffer addresses are multiples of this."""
ROWS_FILE = "rows.bin"
META_FILE = "meta.json"


def record_dtype(dim: int) -> np.dtype:
    """The on-disk record of one row (packed, little-endian)."""
    return np.dtype([("emb", "<f4", (dim,)), ("m", "<f4", (dim,)), ("v", "<f4", (dim,)), ("clock", "<i8"), ("key", "<i8")])


@dataclass(frozen=True)
class RecordLayout:
    """How rows of width `dim` are laid out in a shard's row file.

    Attributes:
        dim: row width.
        record: the dtype of one record (`record_dtype`).
        unit: the dtype of one unit: `rows_per_unit` records, padded to `unit_bytes`.
    """

    dim: int
    record: np.dtype
    unit: np.dtype

    @staticmethod
    def of(dim: int) -> RecordLayout:
        """The layout this code writes for rows of width `dim`."""
        record = record_dtype(dim)
        unit_bytes = -(-record.itemsize // BLOCK) * BLOCK
        rpu = unit_bytes // record.itemsize
        unit = np.dtype({"names": ["r"], "formats": [(record, (rpu,))], "offsets": [0], "itemsize": unit_bytes})
        return RecordLayout(dim, record, unit)

    @property
    def record_bytes(self) -> int:
        return self.record.itemsize

    @property
    def unit_bytes(self) -> int:
        return self.unit.itemsize

    @property
    def rows_per_unit(self) -> int:
        return self.unit_bytes // self.record_bytes

    def meta(self) -> dict[str, Any]:
        """The layout fields of meta.json."""
        return {
            "format": FORMAT,
            "dim": self.dim,
            "block": BLOCK,
            "record_bytes": self.record_bytes,
            "unit_bytes": self.unit_bytes,
            "rows_per_unit": self.rows_per_unit,
        }

    def check(self, meta: dict[str, Any], where: Path) -> None:
        """Raise `ValueError` unless the shard at `where` (its meta.json content `meta`) has this layout."""
        SHARD.version_of(meta, str(where / META_FILE))  # FormatError, a ValueError
        if meta.get("dim") != self.dim:
            raise ValueError(
                f"shard {where} holds rows of dim {meta.get('dim')}, asked for dim {self.dim}; "
                "wipe the shard (the warm stage restores it) or fix store.embedding_dim"
            )
        for k, v in self.meta().items():
            if meta.get(k) != v:
                raise ValueError(f"shard {where}: {k}={meta.get(k)!r}, this code writes {v!r}")

    def records_of(self, buf: memoryview | bytes | mmap.mmap, n_units: int) -> np.ndarray:
        """The records of `n_units` units in `buf`, as a (n_units, rows_per_unit) view."""
        return np.frombuffer(buf, dtype=self.unit, count=n_units)["r"]

    def to_records(self, keys: np.ndarray, rows: Rows) -> np.ndarray:
        """Records of `rows` with their `keys`."""
        recs = np.zeros(keys.size, dtype=self.record)
        recs["emb"] = rows.emb.detach().cpu().numpy()
        recs["m"] = rows.m.detach().cpu().numpy()
        recs["v"] = rows.v.detach().cpu().numpy()
        recs["clock"] = rows.clock.detach().cpu().numpy()
        recs["key"] = keys
        return recs


def rows_of(recs: np.ndarray) -> Rows:
    """The rows held by `recs` (copies, on the CPU)."""
    return Rows(*(torch.from_numpy(np.ascontiguousarray(recs[f])) for f in ("emb", "m", "v", "clock")))


def read_meta(directory: Path) -> dict[str, Any] | None:
    """The shard's meta.json content, or None for a new shard."""
    path = directory / META_FILE
    return json.loads(path.read_text()) if path.exists() else None


def write_meta(directory: Path, meta: dict[str, Any]) -> None:
    """Replace meta.json atomically."""
    write_text_atomic(LocalFileSystem(), str(directory / META_FILE), json.dumps(meta, indent=2, sort_keys=True))


def index_name(generation: int) -> str:
    """The index file written by the save of `generation`."""
    return f"index-{generation:08d}.idx"


def load_index(directory: Path, name: str, index: CompactSlotMap) -> None:
    """Load the index file `name` of the shard into `index`."""
    with open(directory / name, "rb") as f:
        index.load(f)


def write_index(directory: Path, name: str, index: CompactSlotMap) -> None:
    """Write `index` as the file `name`, durably: a temporary file, fsync, then rename."""
    tmp = directory / f"{name}.tmp"
    with open(tmp, "wb") as f:
        index.save(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, directory / name)


def drop_other_indexes(directory: Path, keep: str) -> None:
    """Remove every index file of the shard but `keep` (older generations, interrupted saves)."""
    for p in directory.glob("index-*"):
        if p.name != keep:
            p.unlink()
