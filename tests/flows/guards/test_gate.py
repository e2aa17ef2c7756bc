"""The publish gate: a broken, worse, miscalibrated, older or under-evaluated model is refused, and the
reason names every check that refused; every value is recorded."""

import math

import numpy as np
import pytest

from flows.guards.gate import PublishConfig, Scores, gate
from trainer.group_metrics import group_auc
from trainer.metrics import EvalMetrics
from trainer.paired import Difference

CFG = PublishConfig(max_auc_drop=0.01, min_eval_rows=100)


def m(auc, loss=0.5, rows=1000, mean_prediction=0.2, click_rate=0.2):
    return EvalMetrics(auc=auc, logloss=loss, rows=rows, mean_prediction=mean_prediction, click_rate=click_rate,
                       calibration=mean_prediction / click_rate if click_rate else math.nan, ece=0.0)


def s(auc, date="2026-01-02", **kw):
    return Scores(m(auc, **kw), trained_through=date)


def test_first_model_is_published_and_every_check_is_recorded():
    decision = gate(s(0.70), None, CFG)
    assert (decision.publish, decision.reason) == (True, "first model")
    assert [c["name"] for c in decision.values()] == ["eval_rows", "min_auc", "calibration"]
    assert all(c["passed"] and c["detail"] == "ok" for c in decision.values())


def test_small_drop_within_tolerance_publishes():
    assert gate(s(0.695), s(0.70, date="2026-01-01"), CFG).publish


def test_large_drop_is_refused_with_reason():
    d = gate(s(0.60), s(0.70, date="2026-01-01"), CFG)
    assert not d.publish and "0.1000 below" in d.reason and "max_auc_drop" in d.reason
    drop = next(c for c in d.values() if c["name"] == "auc_drop")
    assert drop["value"] == pytest.approx(0.1) and drop["threshold"] == 0.01 and not drop["passed"]


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_non_finite_metrics_are_refused(bad):
    d = gate(s(bad), None, CFG)
    assert not d.publish and "not finite" in d.reason
    assert not gate(Scores(m(0.7, loss=bad)), None, CFG).publish


def test_too_few_eval_rows_is_refused():
    d = gate(s(0.9, rows=10), None, CFG)
    assert not d.publish and "min_eval_rows" in d.reason


def test_an_auc_under_the_floor_is_refused_even_for_the_first_model():
    d = gate(s(0.49), None, CFG)  # a day too small to learn from
    assert not d.publish and "publish.min_auc=0.55" in d.reason


def test_a_miscalibrated_model_is_refused():
    d = gate(s(0.75, mean_prediction=0.4, click_rate=0.2), None, CFG)
    assert not d.publish and "calibration" in d.reason and "2.000" in d.reason
    assert not gate(s(0.75, click_rate=0.0), None, CFG).publish  # no clicks: calibration undefined


def test_a_worse_logloss_is_refused_even_with_a_better_auc():
    d = gate(s(0.72, loss=0.52), s(0.70, date="2026-01-01", loss=0.50), CFG)
    assert not d.publish and "max_logloss_increase" in d.reason


def test_every_refusing_check_is_named():
    d = gate(s(0.50, loss=0.6, rows=10), s(0.70, date="2026-01-01"), CFG)
    for words in ("min_eval_rows", "min_auc", "max_auc_drop", "max_logloss_increase"):
        assert words in d.reason


def test_a_model_of_an_older_date_than_latest_is_refused_unless_allowed():
    d = gate(s(0.71, date="2026-01-01"), s(0.70, date="2026-01-03"), CFG)
    assert not d.publish and d.reason.startswith("older than LATEST (trained through 2026-01-03)")
    allowed = PublishConfig(max_auc_drop=0.01, min_eval_rows=100, allow_older=True)
    assert gate(s(0.71, date="2026-01-01"), s(0.70, date="2026-01-03"), allowed).publish
    assert gate(s(0.71, date="2026-01-03"), s(0.70, date="2026-01-03"), CFG).publish  # a rerun of LATEST's date


def _slice_scores(auc_of_group_1: float) -> dict:
    """Two slices of 2000 rows each (field C1 values 1 and 2); group 1's AUC set by how its scores rank."""
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 4000)
    g = np.repeat([1, 2], 2000)
    good = y + rng.normal(0, 1, 4000)
    noise = rng.normal(0, 1, 4000)
    scores = np.where(g == 1, auc_of_group_1 * good + (1 - auc_of_group_1) * noise, good)
    return {"C1": group_auc(y, scores, g)}


def test_a_slice_that_got_worse_is_refused_though_the_average_holds():
    cfg = PublishConfig(max_auc_drop=0.05, min_eval_rows=100, slice_fields=("C1",), min_slice_rows=1000)
    before = Scores(m(0.70), _slice_scores(1.0), trained_through="2026-01-01")
    worse = Scores(m(0.70), _slice_scores(0.0), trained_through="2026-01-02")
    d = gate(worse, before, cfg)
    assert not d.publish and "slice(s) of C1" in d.reason and "key 1" in d.reason
    same = Scores(m(0.70), _slice_scores(1.0), trained_through="2026-01-02")
    assert gate(same, before, cfg).publish
    small = PublishConfig(max_auc_drop=0.05, min_eval_rows=100, slice_fields=("C1",), min_slice_rows=5000)
    assert gate(worse, before, small).publish  # no slice is big enough to be gated


def test_gauc_is_gated_against_the_published_models():
    cfg = PublishConfig(max_auc_drop=0.05, min_eval_rows=100, gauc_field="C1")
    before = Scores(m(0.70), _slice_scores(1.0), trained_through="2026-01-01")
    worse = Scores(m(0.70), {"C1": _slice_scores(0.0)["C1"]}, trained_through="2026-01-02")
    d = gate(worse, before, cfg)
    assert not d.publish and "GAUC over C1" in d.reason
    gauc = next(c for c in d.values() if c["name"] == "gauc")
    assert gauc["value"] < before.groups["C1"].gauc()


def test_bad_publish_values_name_the_key():
    with pytest.raises(ValueError, match="publish.calibration_range"):
        PublishConfig(calibration_range=(1.1, 1.25))
    with pytest.raises(ValueError, match="publish.min_auc"):
        PublishConfig(min_auc=1.5)


def test_a_drop_within_the_noise_of_a_small_eval_set_publishes_and_records_the_threshold_used():
    noisy = Difference(rows=400, logloss=0.016, logloss_se=0.012, auc=-0.02, auc_se=0.015, sampled_rows=400)
    new, old = s(0.68, loss=0.516, rows=400), s(0.70, date="2026-01-01", loss=0.50, rows=400)
    assert not gate(new, old, CFG).publish  # the thresholds alone refuse it
    d = gate(new, old, CFG, versus=noisy)
    assert d.publish, d.reason
    checks = {c["name"]: c for c in d.values()}
    assert checks["auc_drop"]["threshold"] == pytest.approx(0.03)  # 2 x 0.015 > publish.max_auc_drop
    assert checks["logloss"]["threshold"] == pytest.approx(0.024)


def test_a_drop_beyond_the_noise_is_refused_naming_the_noise_level():
    sure = Difference(rows=10**6, logloss=0.0, logloss_se=0.0005, auc=-0.02, auc_se=0.0008, sampled_rows=10**6)
    d = gate(s(0.68), s(0.70, date="2026-01-01"), CFG, versus=sure)
    assert not d.publish and "max_auc_drop=0.01" in d.reason
    wide = Difference(rows=400, logloss=0.0, logloss_se=0.001, auc=-0.05, auc_se=0.02, sampled_rows=400)
    d = gate(s(0.65), s(0.70, date="2026-01-01"), CFG, versus=wide)
    assert not d.publish and "2 standard errors of the difference on these rows = 0.0400" in d.reason


def test_noise_sds_zero_keeps_the_thresholds_alone():
    noisy = Difference(rows=400, logloss=0.0, logloss_se=0.012, auc=-0.02, auc_se=0.015, sampled_rows=400)
    assert not gate(s(0.68), s(0.70, date="2026-01-01"), PublishConfig(noise_sds=0.0), versus=noisy).publish
    with pytest.raises(ValueError, match="publish.noise_sds"):
        PublishConfig(noise_sds=-1.0)
