"""Exact AUC (equal to a brute-force pairwise count with ties as 1/2), log loss, calibration; streaming AUC
equal to the exact AUC in any split and merge order, its DeLong standard error; reliability table,
calibration error, slices."""

from __future__ import annotations

import math

import numpy as np
import pytest

from trainer.eval.metrics import (
    StreamingAUC,
    StreamingMetrics,
    auc,
    average_ranks,
    calibration,
    expected_calibration_error,
    logloss,
    reliability_table,
    slice_metrics,
)


def brute_force_auc(y: np.ndarray, s: np.ndarray) -> float:
    pos, neg = s[y == 1], s[y == 0]
    wins = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    return wins / (pos.size * neg.size)


@pytest.mark.parametrize("seed", range(20))
def test_auc_equals_pairwise_count_with_ties(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 300))
    y = rng.integers(0, 2, n)
    y[0], y[1] = 0, 1
    s = rng.integers(0, 6, n).astype(np.float64) if seed % 2 else rng.random(n)  # many ties half the time
    assert auc(y, s) == pytest.approx(brute_force_auc(y, s), abs=1e-12)


def test_auc_known_values() -> None:
    assert auc([0, 0, 1, 1], [0.1, 0.4, 0.35, 0.8]) == 0.75
    assert auc([0, 1], [0.5, 0.5]) == 0.5
    assert auc([1, 0], [1.0, 0.0]) == 1.0
    assert auc([1, 0], [0.0, 1.0]) == 0.0
    with pytest.raises(ValueError, match="1 positives and 0 negatives"):
        auc([1], [0.3])
    with pytest.raises(ValueError, match="0 or 1"):
        auc([0, 2], [0.1, 0.2])


def test_average_ranks() -> None:
    np.testing.assert_array_equal(average_ranks(np.array([3.0, 1.0, 3.0, 2.0])), [3.5, 1.0, 3.5, 2.0])


def test_logloss_and_calibration() -> None:
    y, p = np.array([1, 0, 1, 0]), np.array([0.9, 0.2, 0.6, 0.1])
    want = -np.mean([math.log(0.9), math.log(0.8), math.log(0.6), math.log(0.9)])
    assert logloss(y, p) == pytest.approx(want)
    assert math.isfinite(logloss([1, 0], [0.0, 1.0]))  # clipped
    c = calibration(y, p)
    assert c["mean_prediction"] == pytest.approx(0.45) and c["click_rate"] == 0.5
    assert c["calibration"] == pytest.approx(0.9)
    assert math.isnan(calibration([0, 0], [0.1, 0.2])["calibration"])


@pytest.mark.parametrize("seed", range(8))
def test_streaming_auc_equals_exact_auc_in_any_split_and_merge_order(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(50, 3000))
    y = rng.integers(0, 2, n)
    y[:2] = [0, 1]
    s = rng.integers(0, 20, n) / 20.0 if seed % 2 else rng.random(n).astype(np.float32)  # ties half the time
    cuts = np.sort(rng.choice(np.arange(1, n), size=4, replace=False))
    parts = [StreamingAUC().update(a, b) for a, b in zip(np.split(y, cuts), np.split(s, cuts), strict=True)]
    merged = StreamingAUC()
    for i in rng.permutation(len(parts)):
        merged.merge(parts[i])
    assert merged.result() == pytest.approx(auc(y, s), abs=1e-12)
    assert merged.count == n
    rebuilt = StreamingAUC.from_state(merged.state())
    assert rebuilt.result() == merged.result()


def test_streaming_auc_resolution_and_errors() -> None:
    a = StreamingAUC(resolution=0.1).update([0, 1, 0, 1], [0.11, 0.12, 0.5, 0.9])
    assert a.scores.size == 3 and a.result() == pytest.approx(auc([0, 1, 0, 1], [0.1, 0.1, 0.5, 0.9]))
    with pytest.raises(ValueError, match="1 positives and 0 negatives"):
        StreamingAUC().update([1], [0.2]).result()
    with pytest.raises(ValueError, match="NaN"):
        StreamingAUC().update([1, 0], [0.2, float("nan")])
    with pytest.raises(ValueError, match="differ in length"):
        StreamingAUC().update([1, 0], [0.2])


def brute_force_delong_se(y: np.ndarray, s: np.ndarray) -> float:
    """DeLong's variance from the pairwise kernel psi(x, y) = 1[x > y] + 1/2 1[x == y], row by row."""
    pos, neg = s[y == 1], s[y == 0]
    psi = (pos[:, None] > neg[None, :]) + 0.5 * (pos[:, None] == neg[None, :])  # (P, N)
    v10, v01 = psi.mean(axis=1), psi.mean(axis=0)
    return math.sqrt(v10.var(ddof=1) / pos.size + v01.var(ddof=1) / neg.size)


@pytest.mark.parametrize("seed", range(6))
def test_streaming_auc_standard_error_is_delongs_from_the_counts(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(20, 800))
    y = rng.integers(0, 2, n)
    y[:4] = [0, 1, 0, 1]
    s = rng.integers(0, 8, n) / 8.0 if seed % 2 else rng.random(n) + 0.3 * y  # ties half the time
    a = StreamingAUC().update(y[: n // 2], s[: n // 2]).merge(StreamingAUC().update(y[n // 2 :], s[n // 2 :]))
    assert a.standard_error() == pytest.approx(brute_force_delong_se(y, s), rel=1e-9)


def test_the_auc_interval_covers_the_population_auc_at_its_level() -> None:
    """Samples of 400 rows from a population whose AUC is known: the 95% interval covers it ~95% of the time."""
    rng = np.random.default_rng(0)
    y_all = (rng.random(200_000) < 0.25).astype(np.int64)
    s_all = rng.normal(size=y_all.size) + 0.9 * y_all
    truth = auc(y_all, s_all)
    covered = 0
    for _ in range(300):
        idx = rng.choice(y_all.size, 400, replace=False)
        a = StreamingAUC().update(y_all[idx], s_all[idx])
        covered += abs(a.result() - truth) <= 1.96 * a.standard_error()
    assert 0.91 <= covered / 300 <= 0.99


def test_the_standard_error_needs_two_of_each_class() -> None:
    assert StreamingAUC().update([0, 1, 1], [0.1, 0.2, 0.3]).result() == 1.0
    with pytest.raises(ValueError, match="2 positives and 2 negatives, got 2 and 1"):
        StreamingAUC().update([0, 1, 1], [0.1, 0.2, 0.3]).standard_error()


def test_reliability_table_and_ece() -> None:
    t = reliability_table([0, 1, 1, 0], [0.05, 0.92, 0.97, 1.0], bins=2)
    assert [r["count"] for r in t] == [1, 3]
    assert t[0]["mean_prediction"] == pytest.approx(0.05) and t[0]["click_rate"] == 0.0
    assert t[1]["mean_prediction"] == pytest.approx((0.92 + 0.97 + 1.0) / 3) and t[1]["click_rate"] == pytest.approx(
        2 / 3
    )
    empty = reliability_table([0, 1], [0.1, 0.2], bins=4)
    assert empty[3]["count"] == 0 and math.isnan(empty[3]["click_rate"])
    want = (1 * 0.05 + 3 * abs((0.92 + 0.97 + 1.0) / 3 - 2 / 3)) / 4
    assert expected_calibration_error(t) == pytest.approx(want)


def test_streaming_metrics_match_in_memory_metrics() -> None:
    rng = np.random.default_rng(0)
    p = rng.random(5000)
    y = (rng.random(5000) < p).astype(int)
    a, b = StreamingMetrics(bins=5), StreamingMetrics(bins=5)
    a.update(y[:1234], p[:1234])
    b.update(y[1234:], p[1234:])
    m = a.merge(b).result()
    assert m["rows"] == 5000
    assert m["auc"] == pytest.approx(auc(y, p), abs=1e-12)
    assert m["logloss"] == pytest.approx(logloss(y, p), rel=1e-12)
    assert m["calibration"] == pytest.approx(calibration(y, p)["calibration"], rel=1e-12)
    for got, want in zip(m["reliability"], reliability_table(y, p, bins=5), strict=True):  # sums in another order
        assert got["count"] == want["count"] and got["mean_prediction"] == pytest.approx(want["mean_prediction"])
        assert got["click_rate"] == pytest.approx(want["click_rate"])
    assert m["ece"] < 0.05  # labels drawn from p: calibrated
    with pytest.raises(ValueError, match="no rows"):
        StreamingMetrics().result()


def test_slice_metrics() -> None:
    y = np.array([0, 1] * 100 + [0] * 100)
    p = np.r_[np.tile([0.2, 0.8], 100), np.full(100, 0.1)]
    g = np.r_[np.full(200, 7), np.full(100, 9)]
    rows = slice_metrics(y, p, g, min_rows=50)
    assert [r["value"] for r in rows] == [7, 9]
    assert rows[0]["auc"] == 1.0 and math.isnan(rows[1]["auc"])
    assert rows[1]["click_rate"] == 0.0
