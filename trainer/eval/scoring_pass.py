"""Several models scored on the same feature rows in one pass, on every core; a seeded row sample.

The daily evaluation scores the candidate and the published model on the same eval rows: each
Parquet part is read and decoded once for both, and the scoring runs on a thread pool with one
torch thread per worker (torch and NumPy release the GIL in the kernels that take the time), so
the 2 models, or the 2 halves of one model's rows, run on 2 cores at once.  Results do not depend
on the thread timing: each job's scores go back to its model in row order.

`sample_rows` draws a uniform sample of rows without replacement from a directory of parts, the
same rows for the same seed, reading one part at a time.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from storage.features_manifest import columns_of
from storage.io import fsio
from trainer.data import list_parts
from trainer.eval.group_metrics import GroupAUC, group_auc, paired_group_se
from trainer.eval.metrics import StreamingAUC, StreamingMetrics
from trainer.eval.paired import Difference, PairedDifference
from trainer.eval.scoring import LoadedModel, score
from trainer.threads import core_count, torch_threads


def feature_columns(models: Sequence[LoadedModel]) -> list[str]:
    """`label` and every column one of `models` reads, in schema order, each once."""
    return list(dict.fromkeys(["label", *(c for m in models for c in m.input_columns)]))


def has_own_keys(url: str, storage_options: dict | None = None) -> bool:
    """Whether the feature Parquet files under `url` carry the values' own keys `r_<j>` (what a companion reads;
    one encode writes all of a day's parts alike, so the first part answers)."""
    fs, _ = fsio.get_fs(url, storage_options)
    parts = list_parts(url, storage_options)
    if not parts:
        return False
    with fs.open(parts[0], "rb") as fh:
        return bool(columns_of(pq.ParquetFile(fh).schema_arrow.names, "raw"))


def read_split(url: str, columns: Sequence[str], storage_options: dict | None = None) -> Iterator[pd.DataFrame]:
    """The parts of a directory of feature Parquet files, one DataFrame each, in name order."""
    fs, _ = fsio.get_fs(url, storage_options)
    for f in list_parts(url, storage_options):
        with fs.open(f, "rb") as fh:
            yield _frame(pq.read_table(fh, columns=list(columns)))


@dataclass(frozen=True)
class RowSample:
    frame: pd.DataFrame
    of_rows: int
    """Rows of the directory the sample was drawn from."""

    @property
    def rows(self) -> int:
        return len(self.frame)


def sample_rows(
    url: str, columns: Sequence[str], rows: int, *, seed: int | Sequence[int], storage_options: dict | None = None
) -> RowSample:
    """`rows` rows drawn uniformly without replacement (numpy `default_rng(seed)`) from the parts under `url`.

    The rows keep the order of the parts; `rows` = 0 or >= the total takes every row.  Only one
    part's columns are in memory at a time besides the sample.

    Raises:
        ValueError: `rows` < 0.
        FileNotFoundError: no Parquet parts under `url`.
    """
    if rows < 0:
        raise ValueError(f"rows must be >= 0 (0 = all), got {rows}")
    fs, _ = fsio.get_fs(url, storage_options)
    files = list_parts(url, storage_options)
    counts = []
    for f in files:
        with fs.open(f, "rb") as fh:
            counts.append(pq.ParquetFile(fh).metadata.num_rows)
    total = int(sum(counts))
    if rows == 0 or rows >= total:
        frames = list(read_split(url, columns, storage_options))
        return RowSample(pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0], total)
    chosen = np.sort(np.random.default_rng(seed).choice(total, size=rows, replace=False))
    starts = np.cumsum([0, *counts])
    tables = []
    for f, lo, hi in zip(files, starts[:-1], starts[1:], strict=True):
        local = chosen[np.searchsorted(chosen, lo) : np.searchsorted(chosen, hi)] - lo
        if local.size:
            with fs.open(f, "rb") as fh:
                tables.append(pq.read_table(fh, columns=list(columns)).take(pa.array(local)))
    return RowSample(_frame(pa.concat_tables(tables)), total)


def evaluate_together(
    models: Sequence[LoadedModel],
    frames: Iterable[pd.DataFrame],
    *,
    batch_size: int = 2048,
    threads: int = 0,
    bins: int = 10,
    groups: Sequence[str] = (),
    paired: bool = False,
) -> list[Scored]:
    """The metrics of each of `models` on the same rows, every frame read once for all of them.

    Args:
        models: loaded models (`trainer.eval.scoring.load_model`); each frame must hold their columns.
        frames: feature rows with `label` (e.g. `read_split`), consumed once.
        threads: scoring threads, each with one torch thread; 0 = `core_count()`.  A frame is cut
            into row slices so that every thread has a job even for one model.
        groups: key columns (each frame must hold them) to compute every value's AUC of
            (`trainer.eval.group_metrics.GroupAUC`: slices and GAUC for the publish gate); kept in memory.
        paired: also compare the first model with each other one row by row (`trainer.eval.paired`): the
            standard errors of their AUC and logloss differences, and with `groups` of each group's AUC
            difference, which the publish gate needs.

    Returns:
        one `Scored` per model (`.result()`, `.auc.standard_error()`, `.groups`, and with `paired`
        `.versus_first` on every model after the first).
    """
    threads = threads or core_count()
    metrics = [StreamingMetrics(bins=bins) for _ in models]
    kept: list[list[np.ndarray]] = [[] for _ in models]
    kept_groups: list[pd.DataFrame] = []
    pairs = [PairedDifference() for _ in models[1:]] if paired else []
    slices = -(-threads // max(1, len(models)))  # per model and frame
    # the pool's threads are the parallelism: no intra-op threads on top
    with torch_threads(1), ThreadPoolExecutor(max_workers=threads, thread_name_prefix="score") as pool:
        for frame in frames:
            cuts = np.linspace(0, len(frame), slices + 1).astype(np.int64)
            jobs = [
                [
                    pool.submit(score, m, frame.iloc[a:b], batch_size=batch_size)
                    for a, b in zip(cuts[:-1], cuts[1:], strict=True)
                    if b > a
                ]
                for m in models
            ]
            labels = frame["label"].to_numpy(np.float64)
            scores = []
            for acc, keep, parts in zip(metrics, kept, jobs, strict=True):
                probs = np.concatenate([j.result() for j in parts]) if parts else labels[:0]
                acc.update(labels, probs)
                scores.append(probs)
                if groups:
                    keep.append(probs)
            for pair, probs in zip(pairs, scores[1:], strict=False):  # no pairs without `paired`
                pair.update(labels, scores[0], probs)
            if groups:
                kept_groups.append(frame[["label", *groups]])
    versus = [None] + [p.result() if p.rows else None for p in pairs] if paired else [None] * len(models)
    if not groups or not kept_groups:
        return [Scored(m, {}, v) for m, v in zip(metrics, versus, strict=True)]
    cols = pd.concat(kept_groups, ignore_index=True)
    y = cols["label"].to_numpy(np.float64)
    probs = [np.concatenate(p) for p in kept]
    group_se: list[dict[str, np.ndarray]] = [{}] + [
        {c: paired_group_se(y, probs[0], p, cols[c].to_numpy())[1] for c in groups} if paired else {} for p in probs[1:]
    ]
    return [
        Scored(m, {c: group_auc(y, p, cols[c].to_numpy()) for c in groups}, v, se)
        for m, p, v, se in zip(metrics, probs, versus, group_se, strict=True)
    ]


@dataclass(frozen=True)
class Scored:
    """One model's results of `evaluate_together`."""

    metrics: StreamingMetrics
    groups: dict[str, GroupAUC]
    """Per requested key column: the AUC of each of its values."""
    versus_first: Difference | None = None
    """With `paired`: the first model minus this one on the same rows (None for the first model)."""
    group_se_versus_first: dict[str, np.ndarray] = field(default_factory=dict)
    """With `paired` and `groups`: per key column, the standard error of the first model's AUC minus
    this one's in each group, row by row on the group's rows (`trainer.eval.group_metrics.paired_group_se`),
    in the order of `groups[column].values`."""

    def result(self) -> dict:
        return self.metrics.result()

    @property
    def rows(self) -> int:
        return self.metrics.rows

    @property
    def auc(self) -> StreamingAUC:
        """The exact AUC accumulator (`.standard_error()`)."""
        return self.metrics.auc


def _frame(table: pa.Table) -> pd.DataFrame:
    # list columns (bags) stay Arrow-backed: `score` reads their buffers without a loop per row
    return table.to_pandas(types_mapper=lambda t: pd.ArrowDtype(t) if pa.types.is_list(t) else None)
