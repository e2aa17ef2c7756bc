"""Two models on the same rows: their AUC and logloss differences, and standard errors of those that
agree with what resampling the rows gives, streamed in batches and on a bounded sample of rows."""

from __future__ import annotations

import numpy as np
import pytest

from trainer.eval.metrics import StreamingAUC, auc, logloss
from trainer.eval.paired import PairedDifference, paired_auc_difference


def two_models(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Labels and two correlated models' probabilities: the first sees the label more clearly."""
    rng = np.random.default_rng(seed)
    y = (rng.random(n) < 0.3).astype(np.float64)
    shared = rng.normal(size=n)
    a = 1 / (1 + np.exp(-(1.0 * y + shared + 0.5 * rng.normal(size=n)) + 1.0))
    b = 1 / (1 + np.exp(-(0.8 * y + shared + 0.5 * rng.normal(size=n)) + 1.0))
    return y, a, b


def bootstrap_sds(y, a, b, draws=400, seed=1) -> tuple[float, float]:
    rng = np.random.default_rng(seed)
    d_auc, d_loss = [], []
    for _ in range(draws):
        i = rng.integers(0, y.size, y.size)
        d_auc.append(auc(y[i], a[i]) - auc(y[i], b[i]))
        d_loss.append(logloss(y[i], a[i]) - logloss(y[i], b[i]))
    return float(np.std(d_auc)), float(np.std(d_loss))


def test_the_differences_are_those_of_the_two_models_metrics() -> None:
    y, a, b = two_models(2_000)
    r = PairedDifference().update(y, a, b).result()
    assert r.rows == r.sampled_rows == 2_000
    assert r.auc == pytest.approx(auc(y, a) - auc(y, b), abs=1e-12)
    assert r.logloss == pytest.approx(logloss(y, a) - logloss(y, b), abs=1e-12)
    assert r.auc > 0 and r.logloss < 0  # the first model is the better one


def test_the_standard_errors_agree_with_a_bootstrap_over_the_rows() -> None:
    y, a, b = two_models(3_000)
    r = PairedDifference().update(y, a, b).result()
    sd_auc, sd_loss = bootstrap_sds(y, a, b)
    assert r.auc_se == pytest.approx(sd_auc, rel=0.15)
    assert r.logloss_se == pytest.approx(sd_loss, rel=0.15)
    # paired: the models share most of their errors, so far below two independent AUC errors added up
    unpaired = np.hypot(StreamingAUC().update(y, a).standard_error(), StreamingAUC().update(y, b).standard_error())
    assert r.auc_se < 0.7 * unpaired
    assert paired_auc_difference(y, a, a) == (0.0, 0.0)  # a model against itself differs by nothing


def test_batches_give_the_result_of_all_rows_at_once() -> None:
    y, a, b = two_models(1_000)
    whole = PairedDifference().update(y, a, b).result()
    d = PairedDifference()
    for lo in range(0, 1_000, 77):
        d.update(y[lo : lo + 77], a[lo : lo + 77], b[lo : lo + 77])
    d.update(y[:0], a[:0], b[:0])  # an empty frame changes nothing
    got = d.result()
    assert got.rows == whole.rows and got.auc == pytest.approx(whole.auc, abs=1e-12)
    assert got.auc_se == pytest.approx(whole.auc_se, rel=1e-9)
    assert got.logloss_se == pytest.approx(whole.logloss_se, rel=1e-9)


def test_past_max_rows_a_systematic_sample_keeps_the_auc_error_of_all_rows() -> None:
    y, a, b = two_models(20_000, seed=3)
    whole = PairedDifference().update(y, a, b).result()
    d = PairedDifference(max_rows=3_000)
    for lo in range(0, 20_000, 1_000):
        d.update(y[lo : lo + 1_000], a[lo : lo + 1_000], b[lo : lo + 1_000])
    got = d.result()
    assert got.rows == 20_000 and 1_500 <= got.sampled_rows <= 3_000
    assert got.auc_se == pytest.approx(whole.auc_se, rel=0.2)  # scaled from the sample to all rows
    assert got.logloss == pytest.approx(whole.logloss, abs=1e-12)  # exact: not sampled


def test_undefined_cases_say_so() -> None:
    assert np.isnan(PairedDifference().update([1, 1, 0], [0.2, 0.3, 0.4], [0.3, 0.2, 0.1]).result().auc_se)
    with pytest.raises(ValueError, match="no rows"):
        PairedDifference().result()
    with pytest.raises(ValueError, match="differ in length"):
        PairedDifference().update([0, 1], [0.1], [0.2, 0.3])
