"""bench.quality_stats: the paired bootstrap sees row-sampling noise that seeds do not show."""

from __future__ import annotations

import numpy as np
import pytest

from bench.quality_stats import mean_auc, paired_bootstrap_sd, summarize
from trainer.eval.metrics import auc


def _scores(rng: np.random.Generator, y: np.ndarray, signal: float) -> np.ndarray:
    return 1 / (1 + np.exp(-(signal * (2 * y - 1) + rng.normal(size=len(y)))))


def test_a_model_against_itself_has_no_spread_and_noise_shrinks_with_rows() -> None:
    rng = np.random.default_rng(0)
    y = (rng.random(4000) < 0.25).astype(float)
    a, b = _scores(rng, y, 0.8), _scores(rng, y, 0.8)
    assert paired_bootstrap_sd(y, [a], [a], resamples=50) == 0.0
    few = paired_bootstrap_sd(y[:500], [a[:500]], [b[:500]], resamples=200)
    many = paired_bootstrap_sd(y, [a], [b], resamples=200)
    assert 0 < many < few  # more rows, less row-sampling noise (about 1/sqrt(rows))
    assert many == paired_bootstrap_sd(y, [a], [b], resamples=200)  # deterministic


def test_correlated_models_differ_with_less_noise_than_independent_ones() -> None:
    rng = np.random.default_rng(1)
    y = (rng.random(3000) < 0.3).astype(float)
    a = _scores(rng, y, 0.8)
    close = np.clip(a + rng.normal(scale=0.01, size=len(y)), 1e-6, 1 - 1e-6)  # nearly the same ranking
    other = _scores(rng, y, 0.8)
    assert paired_bootstrap_sd(y, [a], [close], resamples=200) < paired_bootstrap_sd(y, [a], [other], resamples=200) / 3


def test_mean_auc_and_summary_average_the_seeds() -> None:
    rng = np.random.default_rng(2)
    y = (rng.random(1000) < 0.3).astype(float)
    runs = [_scores(rng, y, s) for s in (0.5, 1.0)]
    assert mean_auc(y, runs) == pytest.approx((auc(y, runs[0]) + auc(y, runs[1])) / 2)
    row = summarize(y, runs)
    assert row["auc"] == pytest.approx(mean_auc(y, runs)) and row["auc_range"] == pytest.approx(2 * row["auc_sd"])
    assert row["logloss"] > 0 and 0.5 < row["calib"] < 2
