"""Offline metrics of a CTR model: exact AUC (in memory or streaming), log loss, calibration, reliability."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

PROB_EPS = 1e-7
"""Every score is clipped to [PROB_EPS, 1 - PROB_EPS] (`clip_probabilities`): a predicted CTR of exactly 0 or 1
breaks bid pricing and log loss.  A model records the eps it is scored with (model.json `score_eps`)."""


def clip_probabilities(probs: np.ndarray, eps: float = PROB_EPS) -> np.ndarray:
    """`probs` (float64) clipped to [eps, 1 - eps]: the one rule of evaluation and serving
    (`trainer.eval.scoring.score_arrays`) and of log loss.

    Raises:
        ValueError: eps outside (0, 0.5).
    """
    if not 0.0 < eps < 0.5:
        raise ValueError(f"the score clipping eps must be in (0, 0.5), got {eps}")
    return np.clip(np.asarray(probs, dtype=np.float64), eps, 1.0 - eps)


def as_binary_labels(labels: np.ndarray) -> np.ndarray:
    """`labels` as a flat float64 array of 0s and 1s.

    Raises:
        ValueError: a label is neither 0 nor 1.
    """
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
    y = as_binary_labels(labels)
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
    """Mean binary cross-entropy of probabilities (clipped to [1e-7, 1 - 1e-7]: `clip_probabilities`)."""
    y = as_binary_labels(labels)
    p = clip_probabilities(np.asarray(probs).ravel())
    if y.shape != p.shape:
        raise ValueError(f"labels ({y.size}) and probs ({p.size}) differ in length")
    if y.size == 0:
        raise ValueError("logloss of an empty set")
    return float(-(y * np.log(p) + (1 - y) * np.log1p(-p)).mean())


def calibration(labels: np.ndarray, probs: np.ndarray) -> dict[str, float]:
    """Mean prediction, click rate and their ratio (1.0 = calibrated; nan when there are no clicks)."""
    y = as_binary_labels(labels)
    p = np.asarray(probs, dtype=np.float64).ravel()
    if y.size == 0:
        raise ValueError("calibration of an empty set")
    mean_pred, rate = float(p.mean()), float(y.mean())
    return {
        "mean_prediction": mean_pred,
        "click_rate": rate,
        "calibration": mean_pred / rate if rate > 0 else float("nan"),
    }


class StreamingAUC:
    """Exact AUC over data seen in pieces: per distinct score, the count of positives and negatives.

    `update` folds in a batch, `merge` folds in another accumulator (e.g. from another process:
    send `state()` and rebuild with `from_state`), `result` sorts the distinct scores once and
    counts pairs, ties counting 1/2, so the result equals `auc` on the concatenated data.  Memory
    is O(distinct scores); model probabilities are float32, so it stays bounded on eval sets of any
    size.  With `resolution` > 0 scores are first rounded to that grid (fewer distinct values;
    pairs within one grid cell count as ties, so the AUC can move by at most the mass of such pairs).

    Args:
        resolution: 0 for exact; else the rounding grid (e.g. 1e-6).

    Example::

        a, b = StreamingAUC(), StreamingAUC()
        a.update([0, 1], [0.2, 0.7])
        b.update([1, 0], [0.4, 0.5])
        a.merge(b).result()  # == auc([0, 1, 1, 0], [0.2, 0.7, 0.4, 0.5]) == 0.75
    """

    def __init__(self, resolution: float = 0.0) -> None:
        if resolution < 0:
            raise ValueError(f"resolution must be >= 0, got {resolution}")
        self.resolution = resolution
        self.scores = np.zeros(0, dtype=np.float64)  # sorted, distinct
        self.pos = np.zeros(0, dtype=np.int64)
        self.neg = np.zeros(0, dtype=np.int64)

    def _fold(self, scores: np.ndarray, pos: np.ndarray, neg: np.ndarray) -> None:
        s = np.concatenate([self.scores, scores])
        uniq, inv = np.unique(s, return_inverse=True)
        self.pos = np.bincount(inv, weights=np.concatenate([self.pos, pos]), minlength=uniq.size).astype(np.int64)
        self.neg = np.bincount(inv, weights=np.concatenate([self.neg, neg]), minlength=uniq.size).astype(np.int64)
        self.scores = uniq

    def update(self, labels: np.ndarray, scores: np.ndarray) -> StreamingAUC:
        """Add a batch of 0/1 labels and their scores; returns self."""
        y = as_binary_labels(labels)
        s = np.asarray(scores, dtype=np.float64).ravel()
        if y.shape != s.shape:
            raise ValueError(f"labels ({y.size}) and scores ({s.size}) differ in length")
        if np.isnan(s).any():
            raise ValueError("scores contain NaN")
        if self.resolution:
            s = np.round(s / self.resolution) * self.resolution
        uniq, inv = np.unique(s, return_inverse=True)
        pos = np.bincount(inv, weights=y, minlength=uniq.size)
        neg = np.bincount(inv, minlength=uniq.size) - pos
        self._fold(uniq, pos, neg)
        return self

    def merge(self, other: StreamingAUC) -> StreamingAUC:
        """Fold in another accumulator's counts; returns self."""
        self._fold(other.scores, other.pos, other.neg)
        return self

    def state(self) -> dict[str, np.ndarray]:
        """The counts as plain arrays (to send to another process or save)."""
        return {"scores": self.scores, "pos": self.pos, "neg": self.neg}

    @classmethod
    def from_state(cls, state: dict[str, np.ndarray], resolution: float = 0.0) -> StreamingAUC:
        out = cls(resolution)
        out._fold(np.asarray(state["scores"], np.float64), np.asarray(state["pos"]), np.asarray(state["neg"]))
        return out

    @property
    def count(self) -> int:
        return int(self.pos.sum() + self.neg.sum())

    def result(self) -> float:
        """The AUC of everything seen so far.

        Raises:
            ValueError: only one class seen (AUC undefined).
        """
        P, N = int(self.pos.sum()), int(self.neg.sum())
        if P == 0 or N == 0:
            raise ValueError(f"AUC is undefined with {P} positives and {N} negatives")
        neg_below = np.cumsum(self.neg) - self.neg  # negatives with a strictly lower score
        wins = (self.pos * neg_below).sum(dtype=np.float64) + 0.5 * (self.pos * self.neg).sum(dtype=np.float64)
        return float(wins / (float(P) * float(N)))

    def standard_error(self) -> float:
        """DeLong's standard error of `result()`, from the same per-score counts.

        Each positive's placement is the share of negatives it outranks (ties 1/2), each negative's
        the share of positives that outrank it; var = var(positive placements) / P + var(negative
        placements) / N (DeLong, DeLong & Clarke-Pearson 1988).  Rows with one score share one
        placement, so the counts suffice and nothing is kept per row.

        Raises:
            ValueError: fewer than 2 positives or 2 negatives (no variance to estimate).
        """
        P, N = int(self.pos.sum()), int(self.neg.sum())
        if P < 2 or N < 2:
            raise ValueError(f"the AUC's standard error needs 2 positives and 2 negatives, got {P} and {N}")
        a = self.result()
        neg_below = np.cumsum(self.neg) - self.neg
        pos_above = P - np.cumsum(self.pos)
        v10 = (neg_below + 0.5 * self.neg) / N  # placement of a positive at each distinct score
        v01 = (pos_above + 0.5 * self.pos) / P  # placement of a negative at each distinct score
        s10 = (self.pos * (v10 - a) ** 2).sum() / (P - 1)
        s01 = (self.neg * (v01 - a) ** 2).sum() / (N - 1)
        return float(np.sqrt(s10 / P + s01 / N))


def reliability_table(labels: np.ndarray, probs: np.ndarray, bins: int = 10) -> list[dict[str, float]]:
    """Calibration by equal-width probability bins: count, mean prediction and click rate per bin.

    Bin i holds probabilities in [i/bins, (i+1)/bins) (the last bin includes 1.0); empty bins are
    listed with count 0 and NaN means, so tables of different days line up.

    Example::

        reliability_table([0, 1, 1], [0.05, 0.92, 0.97], bins=2)
        # [{'lo': 0.0, 'hi': 0.5, 'count': 1, 'mean_prediction': 0.05, 'click_rate': 0.0},
        #  {'lo': 0.5, 'hi': 1.0, 'count': 2, 'mean_prediction': 0.945, 'click_rate': 1.0}]
    """
    y = as_binary_labels(labels)
    p = np.asarray(probs, dtype=np.float64).ravel()
    if y.shape != p.shape:
        raise ValueError(f"labels ({y.size}) and probs ({p.size}) differ in length")
    counts, psum, ysum = reliability_counts(y, p, bins)
    return reliability_rows(counts, psum, ysum)


def reliability_counts(y: np.ndarray, p: np.ndarray, bins: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-bin (count, sum of predictions, sum of labels): the mergeable state of `reliability_table`."""
    if bins < 1:
        raise ValueError(f"bins must be >= 1, got {bins}")
    idx = np.clip((np.asarray(p, np.float64) * bins).astype(np.int64), 0, bins - 1)
    return (
        np.bincount(idx, minlength=bins).astype(np.int64),
        np.bincount(idx, weights=p, minlength=bins),
        np.bincount(idx, weights=y, minlength=bins),
    )


def reliability_rows(counts: np.ndarray, psum: np.ndarray, ysum: np.ndarray) -> list[dict[str, float]]:
    bins = counts.size
    with np.errstate(invalid="ignore", divide="ignore"):
        mp, cr = psum / counts, ysum / counts
    return [
        {
            "lo": i / bins,
            "hi": (i + 1) / bins,
            "count": int(counts[i]),
            "mean_prediction": float(mp[i]),
            "click_rate": float(cr[i]),
        }
        for i in range(bins)
    ]


def expected_calibration_error(table: list[dict[str, float]]) -> float:
    """Count-weighted mean |mean_prediction - click_rate| over the non-empty bins of a reliability table."""
    n = sum(r["count"] for r in table)
    if n == 0:
        raise ValueError("expected calibration error of an empty table")
    return float(sum(r["count"] * abs(r["mean_prediction"] - r["click_rate"]) for r in table if r["count"]) / n)


@dataclass(frozen=True)
class EvalMetrics:
    """What one evaluation of a model on a set of rows found (`StreamingMetrics.result`)."""

    auc: float
    logloss: float
    rows: int
    mean_prediction: float
    click_rate: float
    calibration: float
    """mean prediction / click rate (1 = calibrated on average)."""
    ece: float
    reliability: tuple[dict[str, float], ...] = ()

    @classmethod
    def of(cls, result: dict[str, Any]) -> EvalMetrics:
        """From `evaluate_model`'s dict (extra keys, such as `slices`, are left out)."""
        return cls(
            auc=float(result["auc"]),
            logloss=float(result["logloss"]),
            rows=int(result["rows"]),
            mean_prediction=float(result["mean_prediction"]),
            click_rate=float(result["click_rate"]),
            calibration=float(result["calibration"]),
            ece=float(result["ece"]),
            reliability=tuple(result.get("reliability", ())),
        )


class StreamingMetrics:
    """Everything `evaluate_model` reports, accumulated batch by batch and mergeable across processes.

    AUC (exact, `StreamingAUC`), log loss (sum of per-row losses), calibration (sums of predictions
    and labels) and the reliability table (per-bin sums).

    Example::

        m = StreamingMetrics()
        for labels, probs in parts:
            m.update(labels, probs)
        m.result()  # {auc, logloss, rows, mean_prediction, click_rate, calibration, ece, reliability}
    """

    def __init__(self, *, bins: int = 10, resolution: float = 0.0) -> None:
        self.auc = StreamingAUC(resolution)
        self.bins = bins
        self.rows = 0
        self.loss_sum = 0.0
        self.counts = np.zeros(bins, np.int64)
        self.psum = np.zeros(bins)
        self.ysum = np.zeros(bins)

    def update(self, labels: np.ndarray, probs: np.ndarray) -> StreamingMetrics:
        y = as_binary_labels(labels)
        p = np.asarray(probs, dtype=np.float64).ravel()
        if y.size == 0:
            return self
        self.auc.update(y, p)
        self.loss_sum += logloss(y, p) * y.size
        self.rows += y.size
        c, ps, ys = reliability_counts(y, p, self.bins)
        self.counts += c
        self.psum += ps
        self.ysum += ys
        return self

    def merge(self, other: StreamingMetrics) -> StreamingMetrics:
        if other.bins != self.bins:
            raise ValueError(f"cannot merge metrics with {other.bins} bins into {self.bins}")
        self.auc.merge(other.auc)
        self.rows += other.rows
        self.loss_sum += other.loss_sum
        self.counts += other.counts
        self.psum += other.psum
        self.ysum += other.ysum
        return self

    def result(self) -> dict[str, Any]:
        """Raises ValueError when no rows were seen or only one class (AUC undefined)."""
        if self.rows == 0:
            raise ValueError("no rows to compute metrics on")
        mean_pred, rate = float(self.psum.sum() / self.rows), float(self.ysum.sum() / self.rows)
        table = reliability_rows(self.counts, self.psum, self.ysum)
        return {
            "auc": self.auc.result(),
            "logloss": self.loss_sum / self.rows,
            "rows": self.rows,
            "mean_prediction": mean_pred,
            "click_rate": rate,
            "calibration": mean_pred / rate if rate > 0 else float("nan"),
            "ece": expected_calibration_error(table),
            "reliability": table,
        }


def slice_metrics(
    labels: np.ndarray, probs: np.ndarray, groups: np.ndarray, *, top: int = 10, min_rows: int = 100
) -> list[dict[str, Any]]:
    """Per-slice metrics (e.g. per value of one field's key): the `top` most frequent groups.

    AUC is NaN for a slice with one class; slices under `min_rows` rows are skipped.
    """
    y = as_binary_labels(labels)
    p = np.asarray(probs, dtype=np.float64).ravel()
    g = np.asarray(groups).ravel()
    values, counts = np.unique(g, return_counts=True)
    out = []
    for i in np.argsort(-counts, kind="stable")[:top]:
        if counts[i] < min_rows:
            continue
        m = g == values[i]
        ys, ps = y[m], p[m]
        both = 0 < ys.sum() < ys.size
        out.append(
            {
                "value": values[i].item(),
                "rows": int(counts[i]),
                "auc": auc(ys, ps) if both else float("nan"),
                "logloss": logloss(ys, ps),
                **calibration(ys, ps),
            }
        )
    return out
