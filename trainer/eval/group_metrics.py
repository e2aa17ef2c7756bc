"""AUC per group of rows (per value of one field's key): slice AUCs for the publish gate, and GAUC.

A model can hold its overall AUC while getting worse on a big slice (one site, one device type),
which TFMA-style slice gates catch.  GAUC (the AUC within each group, averaged with the group's
clicks as weights; groups with a single class are left out) measures ranking within a group, e.g.
per user, which is what a feed ranks.

All groups are computed at once from one sort by (group, score): ranks within a group, ties
averaged, then the Mann-Whitney U statistic per group, so the cost is that of the sort.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class GroupAUC:
    """Per group (sorted by value): its rows, clicks, and AUC (NaN with a single class)."""

    values: np.ndarray
    rows: np.ndarray
    clicks: np.ndarray
    auc: np.ndarray

    def gauc(self) -> float:
        """Click-weighted mean AUC over the groups holding both classes (NaN when none does)."""
        both = np.isfinite(self.auc)
        weights = self.clicks[both].astype(np.float64)
        return float((self.auc[both] * weights).sum() / weights.sum()) if weights.sum() else float("nan")

    def slices(self, min_rows: int) -> dict[Any, tuple[int, float]]:
        """value -> (rows, AUC) of the groups with at least `min_rows` rows."""
        big = self.rows >= min_rows
        return {
            v.item(): (int(n), float(a))
            for v, n, a in zip(self.values[big], self.rows[big], self.auc[big], strict=True)
        }


def group_auc(labels: np.ndarray, scores: np.ndarray, groups: np.ndarray) -> GroupAUC:
    """AUC of `scores` against 0/1 `labels` within each value of `groups` (ties count 1/2).

    Example::

        g = group_auc([0, 1, 1, 0, 1], [0.1, 0.9, 0.2, 0.3, 0.5], [7, 7, 8, 8, 8])
        g.auc    # [1.0, 0.5]: group 8's negative (0.3) sits between its positives (0.2, 0.5)
        g.gauc() # (1.0 * 1 + 0.5 * 2) / 3
    """
    y = np.asarray(labels, np.float64).ravel()
    s = np.asarray(scores, np.float64).ravel()
    g = np.asarray(groups).ravel()
    if not (len(y) == len(s) == len(g)):
        raise ValueError(f"labels ({len(y)}), scores ({len(s)}) and groups ({len(g)}) differ in length")
    if not len(y):
        empty = np.empty(0)
        return GroupAUC(g[:0], empty.astype(np.int64), empty.astype(np.int64), empty)
    values, codes = np.unique(g, return_inverse=True)
    ranks = _midranks(s, codes)
    rows = np.bincount(codes, minlength=len(values))
    pos = np.bincount(codes, weights=y, minlength=len(values))
    neg = rows - pos
    rank_sum = np.bincount(codes, weights=ranks * y, minlength=len(values))
    with np.errstate(invalid="ignore", divide="ignore"):
        auc = (rank_sum - pos * (pos + 1) / 2.0) / (pos * neg)
    auc[(pos == 0) | (neg == 0)] = np.nan
    return GroupAUC(values=values, rows=rows.astype(np.int64), clicks=pos.astype(np.int64), auc=auc)


def _midranks(scores: np.ndarray, key: np.ndarray) -> np.ndarray:
    """Each row's rank (1-based, ties averaged) among the rows of its `key`, in the rows' own order: one
    sort by (key, score), then each run of equal (key, score) gets its run's average rank."""
    order = np.lexsort((scores, key))
    ks, ss = key[order], scores[order]
    start = np.flatnonzero(np.r_[True, ks[1:] != ks[:-1]])
    of = np.repeat(np.arange(len(start)), np.diff(np.r_[start, len(ks)]))
    run = np.flatnonzero(np.r_[True, (ks[1:] != ks[:-1]) | (ss[1:] != ss[:-1])])
    run_len = np.diff(np.r_[run, len(ks)])
    first = run - start[of[run]] + 1
    ranks = np.empty(len(ks))
    ranks[order] = np.repeat(first + (run_len - 1) / 2.0, run_len)
    return ranks


def paired_group_se(
    labels: np.ndarray, a: np.ndarray, b: np.ndarray, groups: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per group (sorted by value, as `group_auc`): DeLong's standard error of AUC(a) - AUC(b) on the group's
    rows, two models scoring the same rows (NaN for a group with fewer than two clicks or non-clicks).

    Two models' AUCs on one slice move together with the slice's rows, so the error of their difference
    is far below the two errors combined as if independent (DeLong, DeLong & Clarke-Pearson 1988).
    Returns (values, se).
    """
    y = np.asarray(labels, np.float64).ravel()
    values, g = np.unique(np.asarray(groups).ravel(), return_inverse=True)
    pos = y > 0.5
    cls = (
        g * 2 + pos
    )  # group and class: a positive's rank among its group's positives, a negative's among its negatives
    m = np.bincount(g, weights=pos, minlength=len(values))
    n = np.bincount(g, weights=~pos, minlength=len(values))
    diff = np.zeros(len(y))
    for sign, s in ((1.0, a), (-1.0, b)):
        s = np.asarray(s, np.float64).ravel()
        below = _midranks(s, g) - _midranks(s, cls)  # rows of the other class below (ties 1/2)
        with np.errstate(invalid="ignore", divide="ignore"):
            # DeLong's components: a click's share of its group's non-clicks it outranks, a non-click's share
            # of the clicks that outrank it
            comp = np.where(pos, below / n[g], 1.0 - below / m[g])
        diff += sign * comp
    var = np.zeros(len(values))
    for mask, count in ((pos, m), (~pos, n)):
        total = np.bincount(g[mask], weights=diff[mask], minlength=len(values))
        squares = np.bincount(g[mask], weights=diff[mask] ** 2, minlength=len(values))
        with np.errstate(invalid="ignore", divide="ignore"):
            var += (squares - total**2 / count) / (count - 1) / count
    var[(m < 2) | (n < 2)] = np.nan
    return values, np.sqrt(np.maximum(var, 0.0))
