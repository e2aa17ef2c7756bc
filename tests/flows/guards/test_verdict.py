"""The gate's verdict: passed, refused or undecided, and what an undecided day does (issue 51 s3).

A comparison is decided when the rows could show a change of its threshold: noise_sds paired standard errors
of the difference at most the threshold.  Beyond that a difference outside the noise still refuses, and one
whose whole interval lies within the threshold (a clearly better candidate) still passes; anything else is
undecided, never a pass.  Undecided keeps LATEST (publish.on_undecided=keep, the default) and a first model is
published; a refusal beats undecided.  A calibration no range could refuse is "not judged: N clicks"; an AUC of
0.999 with a logloss near 0 is a leak.
"""

from __future__ import annotations

import math

import pytest

from flows.guards.gate import Scores, gate
from flows.guards.noise import calibration_interval
from flows.guards.publish_config import PublishConfig
from trainer.eval.metrics import EvalMetrics
from trainer.eval.paired import Difference

CFG = PublishConfig(max_auc_drop=0.01)


def m(auc: float, *, rows: int = 3000, clicks: int = 600, loss: float = 0.45, mean: float | None = None):
    rate = clicks / rows
    mean = rate if mean is None else mean
    return EvalMetrics(auc, loss, rows, mean, rate, mean / rate if rate else math.nan, 0.0)


def s(auc: float, date: str = "2026-01-02", **kw) -> Scores:
    return Scores(m(auc, **kw), trained_through=date)


def versus(auc_se: float, logloss_se: float = 0.001) -> Difference:
    return Difference(rows=3000, logloss=0.0, logloss_se=logloss_se, auc=0.0, auc_se=auc_se, sampled_rows=3000)


OLD = s(0.9615, "2026-01-01", clicks=6, loss=0.012)


@pytest.mark.parametrize(
    ("drop", "auc_se", "verdict"),
    [
        (0.009, 0.004, "passed"),  # 2 se = 0.008 <= 0.01: the rows would show a drop of 0.01
        (0.011, 0.004, "refused"),
        (0.05, 0.02, "refused"),  # beyond 2 se = 0.04
        (0.02, 0.02, "undecided"),  # within 2 se, which exceed 0.01
        (-0.005, 0.02, "undecided"),  # better, but a drop of 0.035 is as likely
        (-0.04, 0.02, "passed"),  # better by more than the noise: the interval ends below 0.01
    ],
)
def test_a_drop_is_decided_only_where_the_rows_could_show_one_of_max_auc_drop(drop, auc_se, verdict):
    old = s(0.80, "2026-01-01")
    d = gate(s(0.80 - drop), old, CFG, versus=versus(auc_se))
    assert d.verdict.split(":")[0] == verdict, d.reason
    assert d.publish == (verdict == "passed")
    assert d.evidence == {"rows": 3000, "positives": 600, "auc_se": auc_se}


def test_the_issues_rare_positive_day_is_undecided_and_keeps_latest_where_the_2_sd_rule_published():
    # 6 positives: a threshold of max(0.01, 2 x 0.13) = 0.26 let 0.7800 replace 0.9615
    d = gate(s(0.78, clicks=6, loss=0.013), OLD, CFG, versus=versus(0.13))
    assert not d.publish and d.verdict.startswith(
        "undecided: auc_drop +0.1815 within noise 0.2600 (2 se) on 3000 rows (6 positives)"
    )
    assert "over the 0.01 allowed" in d.verdict
    assert d.reason.endswith("LATEST kept (publish.on_undecided=keep)")
    drop = next(c for c in d.values() if c["name"] == "auc_drop")
    assert drop["undecided"] and not drop["passed"] and drop["threshold"] == 0.01
    assert gate(s(0.78, clicks=6, loss=0.013), OLD, PublishConfig(on_undecided="publish"), versus=versus(0.13)).publish


def test_without_a_standard_error_the_comparison_is_undecided_and_the_upper_bound_is_used_where_it_exists():
    one = versus(math.nan)  # the paired error needs 2 positives
    d = gate(s(0.78, clicks=1, loss=0.013), s(0.96, "2026-01-01", clicks=1), CFG, versus=one)
    assert d.verdict.startswith("undecided: auc_drop: no standard error of it on 3000 rows (1 positives)")
    assert d.evidence["auc_se"] is None
    # enough clicks for Hanley-McNeil: both models' errors as if independent, an upper bound of the paired one
    d = gate(s(0.60), s(0.80, "2026-01-01"), CFG, versus=one)
    assert d.verdict == "refused" and 0.01 < d.evidence["auc_se"] < 0.05


def test_a_refusal_beats_undecided():
    d = gate(s(0.78, clicks=6, loss=0.013, rows=50), OLD, CFG, versus=versus(0.13))
    assert d.verdict == "refused" and not d.publish and "min_eval_rows" in d.reason
    assert any(c["undecided"] for c in d.values())  # recorded, still


def test_a_first_model_with_an_auc_from_one_positive_is_published_but_recorded_undecided():
    d = gate(s(0.99, clicks=1, loss=0.01), None, CFG)
    assert d.publish and d.verdict.startswith("undecided: min_auc: AUC 0.9900 on 3000 rows (1 positives)")
    assert d.reason.startswith("first model, undecided") and "nothing to keep" in d.reason
    assert d.evidence == {"rows": 3000, "positives": 1, "auc_se": None}
    near = gate(s(0.60, clicks=40), None, CFG)  # 2 Hanley-McNeil errors (0.09) reach below publish.min_auc
    assert near.publish and near.verdict.startswith("undecided: min_auc: AUC 0.6000 on 3000 rows (40 positives)")
    assert gate(s(0.80, clicks=600), None, CFG).verdict == "passed"
    assert gate(s(0.50, clicks=1), None, CFG).verdict == "refused"  # under the floor: refused, however few


def test_a_calibration_that_cannot_be_judged_says_so_with_its_clicks():
    few = m(0.8, rows=3000, clicks=3, mean=0.01)  # 10 x the click rate, on 3 clicks
    assert calibration_interval(few, 2.0) is None  # the click rate's interval reaches 0: no upper end
    d = gate(Scores(few), None, CFG)
    calib = next(c for c in d.values() if c["name"] == "calibration")
    assert calib["passed"] and calib["detail"].startswith("not judged: 3 clicks")
    assert "calibration not judged: 3 clicks" in d.reason
    judged = m(0.8, rows=3000, clicks=30, mean=0.1)
    assert not gate(Scores(judged), None, CFG).publish  # 10 x on 30 clicks: refused


def test_an_auc_of_one_with_a_logloss_near_zero_is_refused_as_a_leak_unless_allowed():
    leak = s(1.0, clicks=30, loss=0.0001)
    d = gate(leak, None, CFG)
    assert not d.publish and "docs/schema.md#leakage" in d.reason and "publish.allow_leak" in d.reason
    assert gate(leak, None, PublishConfig(allow_leak=True)).publish
    assert gate(s(0.9995, clicks=30, loss=0.05), None, CFG).publish  # a logloss the click rate alone nearly scores


@pytest.mark.parametrize(("key", "value"), [("on_undecided", "maybe"), ("pool_days", 0)])
def test_bad_undecided_settings_name_the_key(key, value):
    with pytest.raises(ValueError, match=f"publish.{key}"):
        PublishConfig(**{key: value})
