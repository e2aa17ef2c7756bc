"""How sure a quality difference is: the mean over seeds, the seeds' spread, and the paired bootstrap.

Two models scored on the same 2,000 later rows differ by row sampling alone far more than by their
seeds: `paired_bootstrap_sd` resamples the rows (the same resample for both models and every seed)
and reports the standard deviation of the seed-averaged AUC difference, the noise a reader compares
a difference with (|difference| > 2 sd: decided; otherwise the sample cannot tell).
"""

from __future__ import annotations

import statistics

import numpy as np

from trainer.eval.metrics import auc, logloss

BOOTSTRAP = 1000
"""Resamples of the later rows."""


def mean_auc(labels: np.ndarray, runs: list[np.ndarray], index: np.ndarray | None = None) -> float:
    """AUC averaged over the seeds' predictions `runs` (on the rows `index`, default all)."""
    if index is None:
        return statistics.fmean(auc(labels, p) for p in runs)
    return statistics.fmean(auc(labels[index], p[index]) for p in runs)


def paired_bootstrap_sd(
    labels: np.ndarray, ours: list[np.ndarray], theirs: list[np.ndarray], *, resamples: int = BOOTSTRAP, seed: int = 0
) -> float:
    """Standard deviation, over row resamples, of mean_auc(ours) - mean_auc(theirs) on the same rows.

    Args:
        labels: (N,) labels of the scored rows.
        ours, theirs: each model's predictions (N,) per seed.

    Example::

        paired_bootstrap_sd(y, [p], [p])   # 0.0: a model does not differ from itself
    """
    rng = np.random.default_rng(seed)
    n = len(labels)
    diffs = []
    for _ in range(resamples):
        index = rng.integers(0, n, n)
        if labels[index].min() == labels[index].max():  # a one-class resample has no AUC
            continue
        diffs.append(mean_auc(labels, ours, index) - mean_auc(labels, theirs, index))
    return float(np.std(diffs))


def summarize(labels: np.ndarray, runs: list[np.ndarray]) -> dict[str, float]:
    """AUC mean and population sd over seeds, their range, mean log loss and calibration (mean p / click rate)."""
    aucs = [auc(labels, p) for p in runs]
    return {
        "auc": statistics.fmean(aucs),
        "auc_sd": statistics.pstdev(aucs),
        "auc_range": max(aucs) - min(aucs),
        "logloss": statistics.fmean(logloss(labels, p) for p in runs),
        "calib": statistics.fmean(float(p.mean() / labels.mean()) for p in runs),
    }
