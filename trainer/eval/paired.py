"""How far apart two models are on the same rows, and how much of that the rows' sampling explains.

The publish gate compares the candidate with the published model on the day's eval rows.  On a
small day (a few hundred eval rows) two equally good models differ by 0.02 in AUC or logloss by
chance, and a gate that reads such a difference as a regression never lets a small model improve.
`PairedDifference` accumulates, in the same single pass over the rows as the metrics:

- the mean per-row logloss difference (first model minus second) and its standard error, exactly
  (n, sum and sum of squares of the per-row differences);
- the paired DeLong standard error of the AUC difference (DeLong, DeLong & Clarke-Pearson 1988),
  which needs every row's two scores: it is computed on a systematic sample of at most `max_rows`
  rows (every 2^k-th row) and scaled to the full count, since at 10^6 rows it is already far
  below any gate threshold.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from trainer.eval.metrics import PROB_EPS, as_binary_labels, average_ranks

MAX_ROWS = 1 << 20
"""Rows kept for the AUC difference's standard error (3 float64 columns: 24 MiB)."""


@dataclass(frozen=True)
class Difference:
    """First model minus second on the same rows, with the standard errors of the differences."""

    rows: int
    logloss: float
    """Mean per-row logloss difference (positive: the first model's loss is higher)."""
    logloss_se: float
    auc: float
    """AUC difference on the kept rows (the exact AUCs are the metrics'); NaN without both labels."""
    auc_se: float
    """Paired DeLong standard error of the AUC difference, for all `rows`; NaN when fewer than 2
    positives or negatives were kept."""
    sampled_rows: int
    """Rows the AUC difference and its standard error were computed on."""


class PairedDifference:
    """Accumulates two models' probabilities on the same rows, batch by batch.

    Args:
        max_rows: at most this many rows are kept for the AUC difference's standard error; past it
            every other kept row is dropped and only every 2^k-th row is kept from then on.

    Example::

        d = PairedDifference()
        d.update([0, 1, 1, 0], [0.2, 0.7, 0.6, 0.3], [0.3, 0.6, 0.4, 0.5])
        r = d.result()  # r.logloss < 0: the first model's loss is lower; r.auc == 0.0 (both rank perfectly)
    """

    def __init__(self, max_rows: int = MAX_ROWS) -> None:
        if max_rows < 2:
            raise ValueError(f"max_rows must be >= 2, got {max_rows}")
        self.max_rows = max_rows
        self.rows = 0
        self._sum = 0.0
        self._sum_sq = 0.0
        self._stride = 1
        self._kept: list[np.ndarray] = []  # (k, 3): label, first, second; rows at multiples of _stride
        self._kept_rows = 0

    def update(self, labels: np.ndarray, first: np.ndarray, second: np.ndarray) -> PairedDifference:
        """Add a batch: 0/1 labels and each model's probabilities of the same rows; returns self."""
        y = as_binary_labels(labels)
        a = np.asarray(first, dtype=np.float64).ravel()
        b = np.asarray(second, dtype=np.float64).ravel()
        if not y.shape == a.shape == b.shape:
            raise ValueError(
                f"labels ({y.size}) and the two models' probabilities ({a.size}, {b.size}) differ in length"
            )
        d = _row_loss(y, a) - _row_loss(y, b)
        self._sum += float(d.sum())
        self._sum_sq += float((d * d).sum())
        start = (-self.rows) % self._stride  # the first row of this batch at a multiple of the stride
        keep = np.stack([y, a, b], axis=1)[start :: self._stride]
        self.rows += y.size
        self._kept.append(keep)
        self._kept_rows += len(keep)
        while self._kept_rows > self.max_rows:
            rows = np.concatenate(self._kept)[::2]  # kept rows are at multiples of the stride: keep 2x
            self._kept, self._kept_rows, self._stride = [rows], len(rows), self._stride * 2
        return self

    def result(self) -> Difference:
        """The differences so far.

        Raises:
            ValueError: no rows were added.
        """
        n = self.rows
        if n == 0:
            raise ValueError("a paired difference of no rows")
        mean = self._sum / n
        var = max(0.0, (self._sum_sq - n * mean * mean) / (n - 1)) if n > 1 else float("nan")
        kept = np.concatenate(self._kept)
        auc, auc_se = paired_auc_difference(kept[:, 0], kept[:, 1], kept[:, 2])
        return Difference(n, mean, math.sqrt(var / n), auc, auc_se * math.sqrt(len(kept) / n), len(kept))


def _row_loss(y: np.ndarray, p: np.ndarray) -> np.ndarray:
    p = np.clip(p, PROB_EPS, 1 - PROB_EPS)
    return -(y * np.log(p) + (1 - y) * np.log1p(-p))


def paired_auc_difference(labels: np.ndarray, first: np.ndarray, second: np.ndarray) -> tuple[float, float]:
    """AUC(first) - AUC(second) on the same rows, and DeLong's paired standard error of it.

    Each model's positive placements (the share of negatives a positive outranks, ties 1/2) and
    negative placements give the AUC as their mean; the variance of the difference is
    var(V10_a - V10_b) / P + var(V01_a - V01_b) / N.  (NaN, NaN) without 2 positives and 2 negatives.
    """
    y = as_binary_labels(labels)
    pos = y == 1
    P, N = int(pos.sum()), int((~pos).sum())
    if P < 2 or N < 2:
        return float("nan"), float("nan")
    v10, v01 = [], []
    for s in (np.asarray(first, dtype=np.float64).ravel(), np.asarray(second, dtype=np.float64).ravel()):
        r_all = average_ranks(s)
        v10.append((r_all[pos] - average_ranks(s[pos])) / N)  # negatives below each positive (ties 1/2)
        v01.append(1.0 - (r_all[~pos] - average_ranks(s[~pos])) / P)  # positives above each negative
    d10, d01 = v10[0] - v10[1], v01[0] - v01[1]
    var = d10.var(ddof=1) / P + d01.var(ddof=1) / N
    return float(d10.mean()), float(math.sqrt(max(0.0, var)))
