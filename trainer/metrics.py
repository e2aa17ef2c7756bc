"""Offline metrics of a CTR model: exact AUC, log loss, calibration."""

from __future__ import annotations

import numpy as np

_EPS = 1e-7


def _as_binary_labels(labels: np.ndarray) -> np.ndarray:
    y = np.asarray(labels, dtype=np.float64).ravel()
    if y.size and not np.isin(y, (0.0, 1.0)).all():
        raise ValueError("labels must be 0 or 1")
    return y


def average_ranks(values: np.ndarray) -> np.ndarray:
    """1-based ranks of `values`, tied values sharing the average of their ranks (like scipy's rankdata)."""
    x = np.asarray(values, dtype=np.float64).ravel()
    order = np.argsort(x, kind="mergesort")
    xs = x[order]
    # start index of each run of equal values in sorted order
    starts = np.flatnonzero(np.r_[True, xs[1:] != xs[:-1]])
    ends = np.r_[starts[1:], xs.size]  # exclusive
    avg = (starts + ends + 1) / 2.0  # mean of the 1-based ranks starts+1 .. ends
    ranks = np.empty(x.size, dtype=np.float64)
    ranks[order] = np.repeat(avg, ends - starts)
    return ranks


def auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Exact ROC AUC: P(score of a random positive > that of a random negative), ties counting 1/2.

    Computed from average ranks (the Mann-Whitney U statistic divided by P*N), O(n log n).

    Raises:
        ValueError: labels not 0/1, lengths differ, or only one class present (AUC undefined).
    """
    y = _as_binary_labels(labels)
    s = np.asarray(scores, dtype=np.float64).ravel()
    if y.shape != s.shape:
        raise ValueError(f"labels ({y.size}) and scores ({s.size}) differ in length")
    pos = int(y.sum())
    neg = y.size - pos
    if pos == 0 or neg == 0:
        raise ValueError(f"AUC is undefined with {pos} positives and {neg} negatives")
    r = average_ranks(s)
    u = r[y == 1].sum() - pos * (pos + 1) / 2.0
    return float(u / (pos * neg))


def logloss(labels: np.ndarray, probs: np.ndarray) -> float:
    """Mean binary cross-entropy of probabilities (clipped to [1e-7, 1 - 1e-7])."""
    y = _as_binary_labels(labels)
    p = np.clip(np.asarray(probs, dtype=np.float64).ravel(), _EPS, 1 - _EPS)
    if y.shape != p.shape:
        raise ValueError(f"labels ({y.size}) and probs ({p.size}) differ in length")
    if y.size == 0:
        raise ValueError("logloss of an empty set")
    return float(-(y * np.log(p) + (1 - y) * np.log1p(-p)).mean())


def calibration(labels: np.ndarray, probs: np.ndarray) -> dict[str, float]:
    """Mean prediction, click rate and their ratio (1.0 = calibrated; nan when there are no clicks)."""
    y = _as_binary_labels(labels)
    p = np.asarray(probs, dtype=np.float64).ravel()
    if y.size == 0:
        raise ValueError("calibration of an empty set")
    mean_pred, rate = float(p.mean()), float(y.mean())
    return {"mean_prediction": mean_pred, "click_rate": rate, "calibration": mean_pred / rate if rate > 0 else float("nan")}
