"""Each rank's share of a day's training features, read in batches by a background thread.

The rows of `features/date=D/train/part-*.parquet`, taken in file order, are
split into `world` contiguous, disjoint blocks of `total // world` rows (the
remainder, fewer than `world` rows, is dropped and counted), so every rank runs
the same number of steps, which the collectives of every step require.  With a keep-rate below 1
(`trainer.sampling`) the rows are those kept, split the same way.

Paddle's heterogeneous PS pipelines IO with compute: here a thread reads and
decodes the next batches into a bounded queue while the current step runs.  It
does not pull embedding rows ahead: rows pulled before the previous step's
push would be stale, and pulls are collectives that belong to the main thread.

A reader may take several split directories in turn (`Source`): the day's training rows follow the
eval rows of the model the day starts from (`trainer.plan.parent_eval`), which that model's gate has used.
Their keys that today's vocabulary evicted are read as the field's OOV key, as today's encoding gives them.

Multi-valued fields: when the features manifest lists `bag_columns`, each
`bag_j` (list<int64>) is read as flat keys + offsets (`trainer.bags.Jagged`,
straight from the Arrow list buffers) and reaches the step as `Batch.bags`,
which the step pools into field j's row (`trainer.bags`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from storage.features_manifest import (
    bag_key_column,
    column_index,
    columns_of,
    read_features_manifest,
)
from storage.io import fsio
from storage.io.read_ahead import read_ahead
from storage.key_layout import to_oov
from trainer.bags import FieldBags, Jagged
from trainer.sampling import keep_masks
from trainer.stateful import require_keys

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FeatureSchema:
    """Column names of a features directory (from its manifest, else from the Parquet schema)."""

    dense_columns: tuple[str, ...]
    key_columns: tuple[str, ...]
    fields: tuple[str, ...]
    bag_columns: tuple[str, ...] = ()
    """`bag_j` list<int64> columns of multi-valued fields; bag_j belongs to key column k_j."""

    def __post_init__(self) -> None:
        orphans = [
            c for c in self.bag_columns if column_index(c, "bag") is None or bag_key_column(c) not in self.key_columns
        ]
        if orphans:
            raise ValueError(
                f"bag columns {orphans} have no key column k_j among {list(self.key_columns)}; "
                "bag columns are named bag_<j> after the key column k_<j> of their field (re-run encode)"
            )

    def for_pooling(self, bag_pooling: str) -> FeatureSchema:
        """The columns a model with `model.bag_pooling` reads: without bag columns for `none`."""
        return FeatureSchema(self.dense_columns, self.key_columns, self.fields) if bag_pooling == "none" else self

    @property
    def bag_fields(self) -> tuple[int, ...]:
        """Position among the key columns (the F axis of `Batch.keys`) of each bag column's field."""
        return tuple(self.key_columns.index(bag_key_column(c)) for c in self.bag_columns)

    @property
    def num_dense(self) -> int:
        return len(self.dense_columns)

    @property
    def num_fields(self) -> int:
        return len(self.key_columns)


@dataclass(frozen=True)
class Batch:
    """One step's examples: labels float32 (B,), dense float32 (B, n), keys int64 (B, F), and the bags
    of keys of its multi-valued fields (empty without them; see `trainer.bags`).  `ready`: the CUDA
    event of a batch whose dense and labels were copied to the GPU ahead (`trainer.staging`).  `upcoming_keys`:
    the next batch's keys, when `Reader.stream` hands it over (the store reads their rows ahead)."""

    labels: torch.Tensor
    dense: torch.Tensor
    keys: torch.Tensor
    bags: tuple[FieldBags, ...] = ()
    ready: Any = None
    upcoming_keys: torch.Tensor | None = None

    def __len__(self) -> int:
        return int(self.labels.shape[0])


@dataclass(frozen=True)
class RankShare:
    """Rows [start, stop) of the day's rows belong to this rank; `dropped` rows belong to nobody."""

    start: int
    stop: int
    total_rows: int
    dropped: int

    @property
    def rows(self) -> int:
        return self.stop - self.start


def rank_share(total_rows: int, rank: int, world_size: int) -> RankShare:
    """The balanced contiguous block of rank `rank`: `total // world` rows each, remainder dropped."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} outside world of {world_size}")
    per_rank = total_rows // world_size
    return RankShare(
        start=rank * per_rank,
        stop=(rank + 1) * per_rank,
        total_rows=total_rows,
        dropped=total_rows - per_rank * world_size,
    )


def split_dir(features_url: str, split: str) -> str:
    """`<features_url>/<split>` (the features/date=D directory holds `train/` and `eval/`)."""
    return fsio.join(features_url, split)


def list_parts(url: str, storage_options: dict | None = None) -> list[str]:
    """Sorted `*.parquet` files (protocol-less paths) directly under `url`.

    Raises:
        FileNotFoundError: `url` has no Parquet files.
    """
    fs, path = fsio.get_fs(url, storage_options)
    files = sorted(p for p in fs.ls(path, detail=False) if p.endswith(".parquet")) if fs.isdir(path) else []
    if not files:
        raise FileNotFoundError(f"no Parquet files under {url}")
    return files


def read_schema(features_url: str, storage_options: dict | None = None, *, split: str = "train") -> FeatureSchema:
    """The column layout of a committed features directory.

    Uses the manifest's `dense_columns`/`key_columns`/`fields`/`bag_columns`
    (`storage.features_manifest`); falls back to the `d_<i>` / `k_<i>` / `bag_<i>` columns of the
    first Parquet file.

    Raises:
        FileNotFoundError: the directory is not committed (no `_SUCCESS.json`).
        storage.io.records.FormatError: its manifest is of a version this code does not read.
    """
    fs, path = fsio.get_fs(features_url, storage_options)
    manifest = read_features_manifest(fs, path)
    if manifest is None:
        raise FileNotFoundError(f"{features_url} is not committed (no {fsio.SUCCESS}); run the encode stage first")
    dense, keys = manifest.dense_columns, manifest.key_columns
    bags = manifest.bag_columns if keys is not None else None
    if dense is None or keys is None:
        first = list_parts(split_dir(manifest.data_dir(features_url), split), storage_options)[0]
        with fs.open(first, "rb") as f:
            names = pq.ParquetFile(f).schema_arrow.names
        dense = columns_of(names, "dense") if dense is None else dense
        keys = columns_of(names, "key") if keys is None else keys
        bags = columns_of(names, "bag") if bags is None else bags
    if not keys:
        raise ValueError(f"{features_url} has no key columns (k_0..k_F-1)")
    fields = manifest.fields or keys
    return FeatureSchema(
        dense_columns=tuple(dense),
        key_columns=tuple(keys),
        fields=tuple(fields),
        bag_columns=tuple(bags or ()),
    )


def table_to_arrays(table: pa.Table, schema: FeatureSchema) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(labels float32 (N,), dense float32 (N, n), keys int64 (N, F)) of a features table."""
    n = table.num_rows
    labels = table.column("label").to_numpy().astype(np.float32, copy=False)
    if schema.dense_columns:
        dense = np.stack([table.column(c).to_numpy().astype(np.float32, copy=False) for c in schema.dense_columns], 1)
    else:
        dense = np.zeros((n, 0), dtype=np.float32)
    keys = np.stack([table.column(c).to_numpy().astype(np.int64, copy=False) for c in schema.key_columns], 1)
    return labels, dense, keys


def table_to_bags(table: pa.Table, schema: FeatureSchema) -> tuple[Jagged, ...]:
    """The bags of each of `schema.bag_columns` (flat keys + offsets, no loop per row)."""
    return tuple(Jagged.from_arrow(table.column(c)) for c in schema.bag_columns)


@dataclass(frozen=True)
class Source:
    """A split directory a reader takes rows from, and the keys to read as their field's OOV key."""

    url: str
    evicted: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    """Sorted int64 keys to read as OOV: for a parent's eval rows, the day's evicted keys (`storage.key_layout.to_oov`).
    """


def _tensor(a: np.ndarray) -> torch.Tensor:
    # Arrow hands out read-only buffers; torch tensors must own writable memory
    return torch.from_numpy(a if a.flags.writeable and a.flags.c_contiguous else np.array(a, order="C"))


@dataclass(frozen=True)
class _Rows:
    """Decoded rows between Parquet and batches: (labels, dense, keys) arrays and one Jagged per bag column."""

    labels: np.ndarray
    dense: np.ndarray
    keys: np.ndarray
    bags: tuple[Jagged, ...]

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    @classmethod
    def concat(cls, parts: list[_Rows]) -> _Rows:
        if len(parts) == 1:
            return parts[0]
        labels, dense, keys = (np.concatenate([getattr(p, a) for p in parts]) for a in ("labels", "dense", "keys"))
        bags = tuple(Jagged.concat([p.bags[i] for p in parts]) for i in range(len(parts[0].bags)))
        return cls(labels, dense, keys, bags)

    def to_oov(self, evicted: np.ndarray) -> _Rows:
        if evicted.size == 0:
            return self
        bags = tuple(Jagged(to_oov(b.values, evicted), b.offsets) for b in self.bags)
        return _Rows(self.labels, self.dense, to_oov(self.keys, evicted), bags)

    def slice(self, lo: int, hi: int) -> _Rows:
        return _Rows(self.labels[lo:hi], self.dense[lo:hi], self.keys[lo:hi], tuple(b.slice(lo, hi) for b in self.bags))

    def to_batch(self, bag_fields: tuple[int, ...]) -> Batch:
        return Batch(
            labels=_tensor(self.labels),
            dense=_tensor(self.dense),
            keys=_tensor(self.keys),
            bags=tuple(FieldBags.from_jagged(f, b) for f, b in zip(bag_fields, self.bags, strict=True)),
        )


class RankReader:
    """Reads this rank's share of a split in order, as batches of `batch_size` (the last may be smaller).

    `url` is one split directory, or several `Source`s read one after the other as one sequence of rows.

    Stateful: `position` counts the batches handed to training over every epoch (`stream`), so a
    checkpoint written after a step resumes at the next batch, however far a reader thread ran ahead.

    Args:
        url: the split directory (`features/date=D/train`), or the `Source`s to read in turn.
        schema: the column layout.
        rank, world_size: this rank's place; all ranks get the same number of rows.
        batch_size: examples per batch.
        storage_options: fsspec options.
        keep_rate, seed: the share of negative rows read, and the seed picking them (`trainer.sampling`).

    Example::

        reader = RankReader(split_dir(url, "train"), read_schema(url), rank=0, world_size=2, batch_size=512)
        for batch in reader.iter_batches(): ...  # one pass, no position
        with reader.stream(epochs=2, depth=2) as batches:  # from `position`, counting it up
            for batch in batches: ...
    """

    def __init__(
        self,
        url: str | Sequence[Source],
        schema: FeatureSchema,
        *,
        rank: int,
        world_size: int,
        batch_size: int,
        storage_options: dict | None = None,
        keep_rate: float = 1.0,
        seed: int = 0,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        sources = [Source(url)] if isinstance(url, str) else list(url)
        if not sources:
            raise ValueError("a reader needs at least one split directory")
        self.fs, _ = fsio.get_fs(sources[0].url, storage_options)
        placed = [(path, s) for s in sources for path in list_parts(s.url, storage_options)]
        self.files = [path for path, _ in placed]
        self._evicted = [s.evicted for _, s in placed]
        self.schema, self.batch_size = schema, batch_size
        self.columns = ["label", *schema.dense_columns, *schema.key_columns, *schema.bag_columns]
        self.file_rows: list[int] = []
        for path in self.files:
            with self.fs.open(path, "rb") as f:
                self.file_rows.append(pq.ParquetFile(f).metadata.num_rows)
        self._keep = keep_masks(self.fs, self.files, keep_rate, seed=seed)
        """Per file, which rows are read (None: all); `file_rows` then counts the kept ones."""
        self.sampled_out = 0
        """Negative rows left out by the keep-rate."""
        if self._keep is not None:
            self.sampled_out = sum(self.file_rows) - sum(int(k.sum()) for k in self._keep)
            self.file_rows = [int(k.sum()) for k in self._keep]
        self.share = rank_share(sum(self.file_rows), rank, world_size)
        self.position = 0
        """Batches handed to training so far, over every epoch: where `stream` continues."""

    @property
    def steps_per_epoch(self) -> int:
        return -(-self.share.rows // self.batch_size)

    def _chunks(self, skip_rows: int = 0) -> Iterator[_Rows]:
        """The share's rows in order from its `skip_rows`-th, one Parquet row group slice at a time."""
        lo, hi = self.share.start + skip_rows, self.share.stop
        offset = 0
        keeps: list[np.ndarray | None] = list(self._keep) if self._keep is not None else [None] * len(self.files)
        for path, rows, evicted, keep in zip(self.files, self.file_rows, self._evicted, keeps, strict=True):
            if offset >= hi:
                break
            if offset + rows > lo:
                with self.fs.open(path, "rb") as f:
                    pf = pq.ParquetFile(f)
                    rg_off, raw = offset, 0  # rg_off counts kept rows, raw the file's rows
                    for i in range(pf.metadata.num_row_groups):
                        n_raw = pf.metadata.row_group(i).num_rows
                        kept = None if keep is None else keep[raw : raw + n_raw]
                        n, raw = n_raw if kept is None else int(kept.sum()), raw + n_raw
                        a, b = max(lo, rg_off), min(hi, rg_off + n)
                        if a < b:
                            table = pf.read_row_group(i, columns=self.columns)
                            table = (table if kept is None else table.filter(pa.array(kept))).slice(a - rg_off, b - a)
                            decoded = _Rows(*table_to_arrays(table, self.schema), table_to_bags(table, self.schema))
                            yield decoded.to_oov(evicted)
                        rg_off += n
            offset += rows

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The whole share at once as (labels, dense, keys), without bags: for a small day's recipe search
        (`trainer.plan.sparse_lr_search`), not for training."""
        parts = list(self._chunks())
        if not parts:
            raise ValueError(f"no rows in {self.files} for this share")
        rows = _Rows.concat(parts)
        return rows.labels, rows.dense, rows.keys

    def iter_batches(self, start_batch: int = 0) -> Iterator[Batch]:
        """One pass over the share: `steps_per_epoch` batches, from batch `start_batch` (a resumed run).

        Skipping reads nothing before the first needed row group.
        """
        if not 0 <= start_batch <= self.steps_per_epoch:
            raise ValueError(f"start_batch must be in [0, {self.steps_per_epoch}], got {start_batch}")
        B, fields = self.batch_size, self.schema.bag_fields
        parts: list[_Rows] = []
        buffered = 0
        for chunk in self._chunks(min(start_batch * B, self.share.rows)):
            parts.append(chunk)
            buffered += len(chunk)
            if buffered < B:
                continue
            rows = _Rows.concat(parts)
            start = 0
            while buffered - start >= B:
                yield rows.slice(start, start + B).to_batch(fields)
                start += B
            parts = [rows.slice(start, buffered)]
            buffered -= start
        if buffered:
            yield _Rows.concat(parts).to_batch(fields)

    @contextmanager
    def stream(
        self,
        epochs: int,
        *,
        depth: int = 0,
        on_start: Callable[[], Any] | None = None,
        prepare: Callable[[Batch], Batch] | None = None,
    ) -> Iterator[Iterator[Batch]]:
        """The batches from `position` to the end of epoch `epochs`, read `depth` ahead by a `Prefetcher`
        thread; `position` counts each one as it is handed over (in the caller's thread).  `prepare`
        runs on each batch in the reader thread (`trainer.staging.BatchStager`: its copy to the GPU)."""
        start, per = self.position, self.steps_per_epoch

        def batches() -> Iterator[Batch]:  # runs in the reader thread: reads no state that changes
            first = start // per
            for epoch in range(first, epochs):
                for batch in self.iter_batches(start - epoch * per if epoch == first else 0):
                    yield batch if prepare is None else prepare(batch)

        def handed_over(ahead: Iterable[Batch]) -> Iterator[Batch]:
            items = iter(ahead)  # one batch ahead: each carries the next one's keys (the store reads their rows)
            batch = next(items, None)
            while batch is not None:
                following = next(items, None)
                self.position += 1  # before the step: a checkpoint at its end resumes after it
                yield batch if following is None else replace(batch, upcoming_keys=following.keys)
                batch = following

        with Prefetcher(batches, depth=depth, on_start=on_start) as ahead:
            yield handed_over(ahead)

    def state_dict(self) -> dict[str, Any]:
        """The position, and the share and batch size it counts in."""
        return {"position": self.position, "batch_size": self.batch_size, "share": [self.share.start, self.share.stop]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue at the saved position.

        Raises:
            ValueError: the state counts batches of another size or another share of the rows.
        """
        require_keys(state, ("position", "batch_size", "share"), "reader")
        mine = {"batch_size": self.batch_size, "share": [self.share.start, self.share.stop]}
        theirs = {"batch_size": state["batch_size"], "share": list(state["share"])}
        if theirs != mine or state["position"] < 0:
            raise ValueError(f"reader state {dict(state)} does not fit this reader's {mine}")
        self.position = int(state["position"])


AUTO_PREFETCH_DEPTH = 2
"""The queue depth `prefetch_batches="auto"` picks where the reader thread can overlap the step."""


def prefetch_depth(requested: int | str, *, device_type: str) -> int:
    """The reader thread's queue depth for `trainer.prefetch_batches` (`requested`; 0 = no thread).

    An explicit number is kept.  `auto` runs the thread on a CUDA device, where the step's kernels run
    asynchronously while the host would otherwise wait, and not on CPU: there reading is cheap next to
    a step, so there is little to hide, while the thread's Python work takes GIL hand-offs and core
    time from the step.  A CPU run reading from a slow store can still ask for it.

    Args:
        requested: `trainer.prefetch_batches`, an int >= 0 or "auto".
        device_type: the rank's device type (`cuda`, `cpu`).

    Example::

        prefetch_depth("auto", device_type="cpu")  # 0
        prefetch_depth("auto", device_type="cuda")  # 2
        prefetch_depth(3, device_type="cpu")  # 3
    """
    if requested != "auto":
        return int(requested)
    return AUTO_PREFETCH_DEPTH if device_type == "cuda" else 0


class Prefetcher:
    """Runs an iterator in a background thread, `depth` items ahead, through a bounded queue.

    The thread is `storage.io.read_ahead.read_ahead` (the same one ingest reads chunks with); this adds
    `on_start`, run first inside that thread (e.g. to pin it to the NUMA node's cores).
    Exceptions in the producer are re-raised in the consumer.  `close()` (or
    leaving a `with` block) stops the thread even when the consumer stopped early.
    With `depth=0` there is no thread: the consumer runs the iterator itself
    (the unpipelined reference `bench.train` measures against), and `on_start` is not called.

    Args:
        make_iter: builds the iterator; called inside the thread.
        depth: queue capacity (>= 1), or 0 for no background thread.
        on_start: called first inside the thread.
    """

    def __init__(
        self, make_iter: Callable[[], Iterable[Any]], *, depth: int = 2, on_start: Callable[[], Any] | None = None
    ) -> None:
        if depth < 0:
            raise ValueError(f"prefetch depth must be >= 0, got {depth}")

        def produce() -> Iterator[Any]:  # a generator: its body runs in read_ahead's thread
            if depth and on_start is not None:
                on_start()
            yield from make_iter()

        self._items = read_ahead(produce(), depth, name="batch-prefetch")

    def __iter__(self) -> Iterator[Any]:
        return self._items

    def close(self) -> None:
        self._items.close()  # stops and joins the producer thread, if it started

    def __enter__(self) -> Prefetcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
