"""A shard's records of another format, converted where they lie instead of restored from the published snapshot.

A shard of the 0.1.0 release (`ctr-ssd-shard/2`: fp32 rows with Adam's moments and an int64 clock) or of another
row format (a change of `optim.sparse_optimizer`, `store.row_dtype` or `store.state_dtype`) cannot be opened as the
day's `SsdStore`.  When it holds the rows the day starts from (its tag is the published model's), `convert_shard`
reads its live rows in slot order (a sequential read of the row file; the saved index says which slots are live),
converts them (`RowFormat.convert`, as a restore converts a snapshot's) and appends them to a new shard beside it,
which then takes its place with the old one's tag: the warm stage keeps it and reads nothing from the object store.
A shard that was not closed cleanly (its index may be older than its rows), or of another width, is not converted:
the warm stage wipes it and restores it from the snapshot.  `python -m bench.store --parts upgrade` measures both.
"""

from __future__ import annotations

import logging
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from storage.embedding.rows.format import RowFormat
from storage.embedding.ssd import disk_format
from storage.embedding.ssd.compact_index import CompactSlotMap
from storage.embedding.ssd.shard_file import ShardFile
from storage.embedding.ssd.store import SsdStore

log = logging.getLogger(__name__)

PER = 10**8
"""The rows a rebuild's cost is given for (`cost`)."""


@dataclass(frozen=True)
class Converted:
    """What `convert_shard` did."""

    rows: int
    seconds: float
    source: str
    """The records it read: `<meta.json format> <row format>`, e.g. `ctr-ssd-shard/2 adam/fp32`."""
    target: str

    def summary(self, shard: Path | str) -> str:
        return f"converted shard {shard} where it lies, {self.source} -> {self.target}: {cost(self.rows, self.seconds)}"


EXTRAPOLATE_FROM = 100_000
"""The fewest rows whose time `cost` scales to 10^8 (a smaller shard's time is mostly fixed costs)."""


def cost(rows: int, seconds: float) -> str:
    """`rows` rebuilt in `seconds`, as the run's log says it, with the time per `PER` rows at that rate."""
    text = f"{rows:,} rows in {seconds:.1f}s"
    if rows < EXTRAPOLATE_FROM:
        return text
    per = seconds / rows * PER
    return text + f", {per:.0f} s per 10^8 rows" if per < 120 else text + f", {per / 60:.0f} min per 10^8 rows"


def convert_shard(path: Path, fmt: RowFormat, *, init_std: float, tag: str | None) -> Converted | None:
    """Convert the shard at `path` to rows of `fmt` where it lies when it is worth it, else None (nothing changed).

    It is worth it when the shard was closed cleanly, is tagged `tag` (the rows the day starts from; None never
    matches) and holds rows of `fmt`'s width in a layout `disk_format.held_layout` reads but `fmt` is not.
    """
    meta = disk_format.read_meta(path)
    if meta is None or tag is None or meta.get("tag") != tag or not meta.get("clean") or not meta.get("index"):
        return None
    try:
        old = disk_format.held_layout(meta, path)
    except ValueError:
        return None
    if old.dim != fmt.dim or (old.fmt == fmt and meta.get("format") == disk_format.FORMAT):
        return None
    t0 = time.perf_counter()
    index = CompactSlotMap()
    disk_format.load_index(path, meta["index"], index)
    rows = len(index)
    new_dir = path.with_name(f"{path.name}.converting")
    shutil.rmtree(new_dir, ignore_errors=True)  # a conversion that was interrupted
    shard = ShardFile(path, old, index, gc_threshold=0.0, direct_io=True, io_threads=4)
    try:
        with SsdStore(str(new_dir), fmt, init_std=init_std) as new:
            new.reserve(rows)
            for _, recs in shard.scan():
                new.write_rows(recs["key"].copy(), fmt.convert(old.rows_of(recs), old.fmt))
            new.set_tag(tag)
    finally:
        shard.close()
    replaced = path.with_name(f"{path.name}.replaced")
    shutil.rmtree(replaced, ignore_errors=True)
    path.rename(replaced)  # killed here: no shard at `path`, and the warm stage restores an empty one
    new_dir.rename(path)
    shutil.rmtree(replaced)
    source = f"{meta.get('format')} {old.fmt.name}"
    return Converted(rows, round(time.perf_counter() - t0, 4), source, f"{disk_format.FORMAT} {fmt.name}")
