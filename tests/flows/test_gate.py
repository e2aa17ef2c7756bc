"""The publish gate: a broken, worse or under-evaluated model is refused, and the reason says why."""

import math
from dataclasses import astuple

import pytest

from flows.gate import GateDecision, PublishConfig, gate
from trainer.metrics import EvalMetrics

CFG = PublishConfig(max_auc_drop=0.01, min_eval_rows=100)


def m(auc, loss=0.5, rows=1000):
    return EvalMetrics(auc=auc, logloss=loss, rows=rows, mean_prediction=0.2, click_rate=0.2, calibration=1.0, ece=0.0)


def test_first_model_is_published():
    assert gate(m(0.70), None, CFG) == GateDecision(True, "first model")


def test_small_drop_within_tolerance_publishes():
    assert gate(m(0.695), m(0.70), CFG).publish


def test_large_drop_is_refused_with_reason():
    ok, reason = astuple(gate(m(0.60), m(0.70), CFG))
    assert not ok and "0.1000 below" in reason and "max_auc_drop" in reason


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_non_finite_metrics_are_refused(bad):
    ok, reason = astuple(gate(m(bad), None, CFG))
    assert not ok and "not finite" in reason
    assert not gate(m(0.7, loss=bad), None, CFG).publish


def test_too_few_eval_rows_is_refused():
    ok, reason = astuple(gate(m(0.9, rows=10), None, CFG))
    assert not ok and "min_eval_rows" in reason
