"""The on-disk format of an SSD shard: records packed into aligned units, meta.json, the index file.

One shard directory::

    rows.bin                  fixed-size records packed into 4 KiB-aligned units
    index-<generation>.idx    key -> slot map (`CompactSlotMap.save`), the persistent index
    meta.json                 format, layout, generation, index file, tag, clean flag

A record is the row in its `RowFormat`: ``emb`` (the row dtype, [width]), the
optimizer's state fields (the state dtype), ``clock`` (int32) and the ``key`` itself (int64),
so a read can check the key and a stale index can never hand one key another key's
row.  At dim 16: int8 rows with Adam's moments in log8, 64 bytes (64 to a unit); int8 rows with
row-wise AdaGrad, 36 (113); fp16 rows with Adam, 172 (23); fp32 rows with Adam, 204 (20).  Records are packed
`rows_per_unit` to a unit of
`unit_bytes` (a multiple of `BLOCK`): the unit is what every read and write moves,
since O_DIRECT needs aligned offsets and lengths.  The layout is written into
meta.json with the row format (dim, optimizer, row dtype) and checked on open, so a shard is
never read with another layout or format: its format version (`SHARD`) is checked strictly
(`storage.io.records`: the message names the versions read), while fields of meta.json this code
does not know are ignored.  A shard of another row format, or of version 2 (the 0.1.0 release's fp32 + Adam
records with an int64 clock, `RecordLayout.v2`), is read through `held_layout` by the warm stage, which converts
it where it lies (`storage.embedding.ssd.upgrade`) rather than restoring it from the published snapshot.
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

from storage.embedding.rows.batch import Rows
from storage.embedding.rows.format import CLOCK_DTYPE, CLOCK_MAX, RowFormat
from storage.embedding.ssd.compact_index import CompactSlotMap
from storage.io import records
from storage.io.fsio import write_text_atomic

_WIPE = "wipe the shard (the warm stage restores it from the published model)"
SHARD = records.RecordFormat("ctr-ssd-shard", 3, fix=_WIPE, newer=f"{_WIPE}, or upgrade ctr-pipeline here")
"""meta.json: version 3 (records of the row format meta.json names, with their key); a shard of any other
version is refused (`held_layout` reads version 2 too, to convert it)."""
FORMAT = SHARD.tag
V2 = f"{SHARD.name}/2"
"""The records of the 0.1.0 release: fp32 weights and Adam's m and v, an int64 clock, the key (208 bytes at dim 16)."""
BLOCK = 4096
"""I/O alignment: offsets, lengths and buffer addresses are multiples of this."""
ROWS_FILE = "rows.bin"
META_FILE = "meta.json"


_EMB = {"fp32": "<f4", "fp16": "<f2", "bf16": "<u2", "int8": "u1", "int8s": "u1"}
"""NumPy type of the stored weights per row dtype (NumPy has no bfloat16: its bit patterns)."""
_STATE = {"fp32": "<f4", "log8": "u1"}
"""NumPy type of the stored optimizer state per state dtype."""


def record_dtype(fmt: RowFormat) -> np.dtype:
    """The on-disk record of one row of `fmt` (packed, little-endian)."""
    fields: list[tuple[Any, ...]] = [("emb", _EMB[fmt.row_dtype], (fmt.width,))]
    st = _STATE[fmt.state_dtype]
    fields += [(f.name, st, (c,)) if (c := f.cols(fmt.dim)) else (f.name, st) for f in fmt.rule.state]
    fields += [("clock", "<i4"), ("key", "<i8")]
    return np.dtype(fields)


@dataclass(frozen=True)
class RecordLayout:
    """How rows of a `RowFormat` are laid out in a shard's row file.

    Attributes:
        fmt: the row format.
        record: the dtype of one record (`record_dtype`).
        unit: the dtype of one unit: `rows_per_unit` records, padded to `unit_bytes`.
    """

    fmt: RowFormat
    record: np.dtype
    unit: np.dtype

    @property
    def dim(self) -> int:
        return self.fmt.dim

    @staticmethod
    def of(fmt: RowFormat) -> RecordLayout:
        """The layout this code writes for rows of `fmt`."""
        return RecordLayout._packed(fmt, record_dtype(fmt))

    @staticmethod
    def v2(dim: int) -> RecordLayout:
        """The layout of a `ctr-ssd-shard/2` shard (`V2`), read to be converted: fp32 rows with Adam's moments."""
        f4 = ("<f4", (dim,))
        record = np.dtype([("emb", *f4), ("m", *f4), ("v", *f4), ("clock", "<i8"), ("key", "<i8")])
        return RecordLayout._packed(RowFormat(dim, "adam", "fp32"), record)

    @staticmethod
    def _packed(fmt: RowFormat, record: np.dtype) -> RecordLayout:
        """`record`s packed into the fewest 4 KiB blocks that hold one, as many to a unit as fit."""
        unit_bytes = -(-record.itemsize // BLOCK) * BLOCK
        rpu = unit_bytes // record.itemsize
        unit = np.dtype({"names": ["r"], "formats": [(record, (rpu,))], "offsets": [0], "itemsize": unit_bytes})
        return RecordLayout(fmt, record, unit)

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
            **self.fmt.meta(),
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
        held = "/".join(str(meta.get(k, "fp32")) for k in ("optimizer", "row_dtype", "state_dtype")).removesuffix(
            "/fp32"
        )
        if held != self.fmt.name:
            raise ValueError(
                f"shard {where} holds {held} rows (optimizer/row dtype[/state dtype]), asked for {self.fmt.name}; "
                "wipe the shard (the warm stage restores and converts it from the published model) "
                "or set optim.sparse_optimizer, store.row_dtype and store.state_dtype to what it holds"
            )
        for k, v in self.meta().items():
            if meta.get(k) != v:
                raise ValueError(f"shard {where}: {k}={meta.get(k)!r}, this code writes {v!r}")

    def records_of(self, buf: memoryview | bytes | mmap.mmap, n_units: int) -> np.ndarray:
        """The records of `n_units` units in `buf`, as a (n_units, rows_per_unit) view."""
        return np.frombuffer(buf, dtype=self.unit, count=n_units)["r"]

    def to_records(self, keys: np.ndarray, rows: Rows) -> np.ndarray:
        """Records of `rows` (this layout's format) with their `keys`."""
        self.fmt.check(rows, "rows written to the shard")
        emb, state, clock = rows.numpy()
        recs = np.zeros(keys.size, dtype=self.record)
        recs["emb"] = emb
        for name, a in state.items():
            recs[name] = a
        recs["clock"] = clock
        recs["key"] = keys
        return recs

    def rows_of(self, recs: np.ndarray) -> Rows:
        """The rows held by `recs` (copies, on the CPU)."""

        def t(name: str) -> torch.Tensor:
            # a copy, not ascontiguousarray: a one-record view counts as contiguous yet keeps the record's
            # stride, which torch refuses when the record size (49 B) is not a multiple of the field's
            return torch.from_numpy(recs[name].copy())

        emb = t("emb")
        if self.fmt.row_dtype == "bf16":
            emb = emb.view(torch.int16).view(torch.bfloat16)
        clock = t("clock")
        if clock.dtype != CLOCK_DTYPE:  # a V2 record's clock is int64
            clock = clock.clamp(max=CLOCK_MAX).to(CLOCK_DTYPE)
        return Rows(emb, {name: t(name) for name in self.fmt.state_names}, clock)


def held_layout(meta: dict[str, Any], where: Path) -> RecordLayout:
    """The layout of the records a shard holds, from its meta.json content `meta`: this code's version (any row
    format it names) or `V2`.

    Raises:
        ValueError: another version (`storage.io.records.FormatError`), or a layout that is not what that
            version and row format write (a damaged meta.json).
    """
    if meta.get("format") == V2:
        layout = RecordLayout.v2(int(meta.get("dim", 0)))
    else:
        SHARD.version_of(meta, str(where / META_FILE))
        try:
            layout = RecordLayout.of(RowFormat.from_meta(meta))
        except (KeyError, TypeError) as exc:
            raise ValueError(f"shard {where}: meta.json names no row format ({exc})") from None
    for key in ("record_bytes", "unit_bytes", "rows_per_unit"):
        if meta.get(key) != getattr(layout, key):
            raise ValueError(f"shard {where}: {key}={meta.get(key)!r}, its format has {getattr(layout, key)!r}")
    return layout


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
