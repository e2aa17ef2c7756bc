"""Negative sampling of the train rows (`optim.negative_sampling`, a keep-rate w in (0, 1]) and its correction.

With rare positives most steps see negatives only; keeping every positive and a share w of the negatives
trains on fewer rows for the same positives.  The model then learns odds inflated by 1/w, so every score
is corrected: q = p / (p + (1 - p) / w), i.e. logit(q) = logit(p) + log(w), before the clip to
[eps, 1 - eps] (`trainer.eval.scoring.score_arrays`, which evaluation, the gate and serving all go through).

Which negatives stay is a hash of the seed and the row's place in the reader's files (`trainer.data.RankReader`),
so a rerun, a resumed run and every rank drop the same rows, with no state to save.  Only rows that train are
sampled: the eval rows the gate scores never are.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pyarrow.parquet as pq

from storage.io import fsio

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def check_keep_rate(keep_rate: float, key: str = "optim.negative_sampling") -> float:
    """`keep_rate` as a float in (0, 1].

    Raises:
        ValueError: outside (0, 1], naming `key` and what the value means.
    """
    try:
        w = float(keep_rate) if not isinstance(keep_rate, bool) else math.nan
    except (TypeError, ValueError):
        w = math.nan
    if not 0.0 < w <= 1.0:  # NaN fails too
        raise ValueError(
            f"{key} must be in (0, 1] (the share of negative train rows kept; 1 = keep all), got {keep_rate!r}"
        )
    return w


def uniform(index: np.ndarray, seed: int) -> np.ndarray:
    """A number in [0, 1) per row index: splitmix64 of (seed, index), the same on every machine."""
    with np.errstate(over="ignore"):
        z = np.asarray(index, dtype=np.uint64) + np.uint64(seed & (2**64 - 1)) * _GOLDEN + _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z ^= z >> np.uint64(31)
    return (z >> np.uint64(11)).astype(np.float64) * 2.0**-53


def keep_mask(labels: np.ndarray, keep_rate: float, *, seed: int, start: int = 0) -> np.ndarray:
    """Which of `labels` (rows start, start+1, ... of the reader's files) train: every positive, and a
    negative when its row's `uniform` draw is below `keep_rate`."""
    draw = uniform(np.arange(start, start + len(labels), dtype=np.uint64), seed)
    return (np.asarray(labels) > 0) | (draw < keep_rate)


def keep_masks(fs: object, files: Sequence[str], keep_rate: float, *, seed: int) -> list[np.ndarray] | None:
    """One `keep_mask` per Parquet file of `files`, numbering the rows across them in order (None at 1.0).
    Reads each file's label column only."""
    if keep_rate >= 1.0:
        return None
    masks, start = [], 0
    for path in files:
        with fs.open(path, "rb") as f:  # type: ignore[attr-defined]
            labels = pq.read_table(f, columns=["label"]).column("label").to_numpy()
        masks.append(keep_mask(labels, keep_rate, seed=seed, start=start))
        start += len(labels)
    return masks


def kept_rows(urls: Sequence[str], keep_rate: float, *, seed: int, storage_options: dict | None = None) -> int:
    """Rows a reader of the split directories `urls` (in its order) trains at `keep_rate`: what the day's
    recipe is sized for (`flows.day.stages.train_plan`)."""
    files: list[str] = []
    for url in urls:  # in `trainer.data.list_parts`'s order: the numbering of the rows must be the reader's
        fs, path = fsio.get_fs(url, storage_options)
        files += sorted(fs.glob(fsio.join(path, "*.parquet")))
    masks = keep_masks(fs, files, keep_rate, seed=seed)
    if masks is None:
        raise ValueError("kept_rows counts a sampled day: keep_rate must be below 1")
    return int(sum(m.sum() for m in masks))


def correct_logits(logits: np.ndarray, keep_rate: float) -> np.ndarray:
    """Logits of a model trained at `keep_rate`, corrected to the unsampled rows: logit + log(keep_rate)."""
    return logits if keep_rate == 1.0 else logits + math.log(keep_rate)


def corrected_probability(p: np.ndarray, keep_rate: float) -> np.ndarray:
    """q = p / (p + (1 - p) / w): the same correction on probabilities (for checks and readers of logits)."""
    p = np.asarray(p, dtype=np.float64)
    return p / (p + (1.0 - p) / keep_rate)
