"""How much of a gate check's difference the eval rows' sampling explains: the standard errors the gate
compares each difference with when no row-by-row pairing measured it.

- calibration: mean prediction / click rate, where the click rate of n rows has the binomial sd
  sqrt(p (1 - p) / n): at 333 rows and a 20% click rate that is 0.022, so a calibration of 1.28 is
  anywhere in [1.05, 1.65] at 2 sd.  The interval maps the click rate's interval through
  mean_prediction / rate, so it is skewed like the ratio and never negative.  The mean prediction's
  own spread is left out: the scores vary far less than 0/1 labels and move with them, so the
  ratio's full (delta-method) interval is a little narrower than this one.  When the click rate's
  interval reaches 0 (a handful of clicks) the ratio's has no upper end: no range could refuse it, so
  the calibration is not judged, and the gate records that with the clicks (`calibration_interval`: None).
- an AUC from its positives and negatives alone: Hanley & McNeil (1982), for a slice or GAUC group
  that has no paired error (the evaluation gives each group DeLong's paired error of the two models'
  difference, `trainer.eval.group_metrics.paired_group_se`, where the group holds two clicks and two
  non-clicks).  Two models' AUCs on the same rows are correlated, so the unpaired standard error of
  their difference, sqrt(se_a^2 + se_b^2), overstates it: an upper bound, which never refuses on noise.
"""

from __future__ import annotations

import math

import numpy as np

from trainer.eval.metrics import EvalMetrics


def click_rate_sd(m: EvalMetrics) -> float:
    """Binomial standard deviation of the click rate of `m.rows` rows (0 with no rows)."""
    p = m.click_rate
    return math.sqrt(max(0.0, p * (1.0 - p)) / m.rows) if m.rows > 0 else 0.0


def clicks(m: EvalMetrics) -> int:
    """The clicks (positives) among `m.rows` rows."""
    return round(m.click_rate * m.rows)


def calibration_interval(m: EvalMetrics, sds: float) -> tuple[float, float] | None:
    """mean_prediction / rate for the click rates within `sds` binomial sds of the observed one.

    None when it cannot be judged: the calibration is undefined (no clicks) or the click rate's interval
    reaches 0 (too few clicks: the ratio would have no upper end).
    """
    if not math.isfinite(m.calibration):
        return None
    half = sds * click_rate_sd(m)
    low_rate, high_rate = m.click_rate - half, m.click_rate + half
    return (m.mean_prediction / high_rate, m.mean_prediction / low_rate) if low_rate > 0 else None


def hanley_mcneil_se(
    auc: float | np.ndarray, positives: float | np.ndarray, negatives: float | np.ndarray
) -> np.ndarray:
    """Standard error of an AUC from its value and class counts (Hanley & McNeil 1982); NaN where a
    class has fewer than 2 rows or the AUC is not finite.

    var = (A (1 - A) + (P - 1)(Q1 - A^2) + (N - 1)(Q2 - A^2)) / (P N),  Q1 = A / (2 - A),  Q2 = 2 A^2 / (1 + A)
    """
    a = np.asarray(auc, np.float64)
    p = np.asarray(positives, np.float64)
    n = np.asarray(negatives, np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        q1, q2 = a / (2.0 - a), 2.0 * a * a / (1.0 + a)
        var = (a * (1 - a) + (p - 1) * (q1 - a * a) + (n - 1) * (q2 - a * a)) / (p * n)
        se = np.sqrt(np.maximum(var, 0.0))
    return np.where((p >= 2) & (n >= 2) & np.isfinite(a), se, np.nan)
