"""The publish gate: a broken, worse, miscalibrated, older or under-evaluated model is refused, and the
reason names every check that refused; every value is recorded.  A difference the eval rows' noise
explains (a small day's calibration, AUC, slices) refuses nothing, and the reason prints its interval; where
that noise is larger than the threshold the comparison is undecided, never passed (test_verdict.py)."""

import math

import numpy as np
import pytest

from flows.guards.gate import PublishConfig, Scores, gate
from trainer.eval.group_metrics import group_auc, paired_group_se
from trainer.eval.metrics import EvalMetrics, StreamingMetrics
from trainer.eval.paired import Difference, PairedDifference

CFG = PublishConfig(max_auc_drop=0.01, min_eval_rows=100)


def m(auc, loss=0.5, rows=1000, mean_prediction=0.2, click_rate=0.2):
    return EvalMetrics(
        auc=auc,
        logloss=loss,
        rows=rows,
        mean_prediction=mean_prediction,
        click_rate=click_rate,
        calibration=mean_prediction / click_rate if click_rate else math.nan,
        ece=0.0,
    )


def s(auc, date="2026-01-02", **kw):
    return Scores(m(auc, **kw), trained_through=date)


def test_first_model_is_published_and_every_check_is_recorded():
    decision = gate(s(0.70), None, CFG)
    assert (decision.publish, decision.reason) == (True, "first model")
    assert [c["name"] for c in decision.values()] == ["eval_rows", "min_auc", "calibration", "leakage"]
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


def test_a_drop_within_the_noise_of_a_small_eval_set_is_undecided_not_published():
    noisy = Difference(rows=400, logloss=0.016, logloss_se=0.012, auc=-0.02, auc_se=0.015, sampled_rows=400)
    new, old = s(0.68, loss=0.516, rows=400), s(0.70, date="2026-01-01", loss=0.50, rows=400)
    assert not gate(new, old, CFG).publish  # the thresholds alone refuse it
    d = gate(new, old, CFG, versus=noisy)  # 2 x 0.015 > publish.max_auc_drop: these rows cannot tell
    assert not d.publish and d.verdict.startswith(
        "undecided: auc_drop +0.0200 within noise 0.0300 (2 se) on 400 rows (80 positives)"
    )
    assert d.reason.endswith("LATEST kept (publish.on_undecided=keep)")
    checks = {c["name"]: c for c in d.values()}
    assert checks["auc_drop"]["undecided"] and checks["auc_drop"]["interval"] == pytest.approx([-0.01, 0.05])
    assert checks["logloss"]["undecided"] and not checks["logloss"]["passed"]
    assert d.evidence == {"rows": 400, "positives": 80, "auc_se": 0.015}


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


def _labels(rows: int, clicks: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.random.Generator]:
    """`rows` labels with exactly `clicks` clicks, and a signal a model can learn from them."""
    rng = np.random.default_rng(seed)
    y = np.zeros(rows)
    y[rng.choice(rows, clicks, replace=False)] = 1.0
    return y, y + rng.normal(0, 1, rows), rng


def _model(signal: np.ndarray, rng: np.random.Generator, noise: float, mean: float) -> np.ndarray:
    """Probabilities ranking like `signal` blurred by `noise`, shifted to average `mean`."""
    z = signal + rng.normal(0, noise, len(signal))
    z = 0.9 * (z - z.mean()) / z.std()
    lo, hi = -10.0, 10.0
    for _ in range(60):  # bisect the intercept
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if (1 / (1 + np.exp(-(z + mid)))).mean() < mean else (lo, mid)
    return 1 / (1 + np.exp(-(z + lo)))


def _scored(y: np.ndarray, new: np.ndarray, old: np.ndarray | None) -> tuple[Scores, Scores | None, Difference | None]:
    """What the evaluate stage hands the gate: both models' metrics on the rows and their paired difference."""

    def scores(p: np.ndarray, date: str) -> Scores:
        return Scores(EvalMetrics.of(StreamingMetrics().update(y, p).result()), trained_through=date)

    if old is None:
        return scores(new, "2026-01-02"), None, None
    return scores(new, "2026-01-02"), scores(old, "2026-01-01"), PairedDifference().update(y, new, old).result()


def test_a_better_model_whose_calibration_is_within_the_noise_of_333_eval_rows_publishes():
    # issue 31's day: AUC 0.6878 vs 0.6697, calibration 0.2542 / 0.1982 = 1.283 on 333 rows (66 clicks)
    y, signal, rng = _labels(333, 66, seed=3)
    old, new = _model(signal, rng, 1.3, 0.20), _model(signal, rng, 1.0, 0.2542)
    cand, pub, versus = _scored(y, new, old)
    c = cand.metrics
    assert (round(c.click_rate, 4), round(c.mean_prediction, 4), round(c.calibration, 3)) == (0.1982, 0.2542, 1.283)
    assert c.auc > pub.metrics.auc
    d = gate(cand, pub, PublishConfig(on_undecided="publish"), versus=versus)
    assert d.publish, d.reason  # AUC +0.02 on 66 positives is undecided: the calibration refuses nothing
    calib = next(c for c in d.values() if c["name"] == "calibration")
    lo, hi = calib["interval"]  # the click rate's 2 sds (0.022) leave 1.283 anywhere in [1.05, 1.65]
    assert lo < 1.25 < 1.283 < hi and lo == pytest.approx(0.2542 / (0.1982 + 2 * 0.02185), abs=0.002)
    # the threshold alone refuses it, on calibration only
    d = gate(cand, pub, PublishConfig(noise_sds=0.0), versus=versus)
    assert not d.publish and [c["name"] for c in d.values() if not c["passed"]] == ["calibration"]


def test_a_first_model_is_not_refused_on_the_calibration_noise_of_184_eval_rows():
    # issue 31's first Avazu day: 0.1848 / 0.2446 = 0.755 on 184 rows (45 clicks), no published model
    y, signal, rng = _labels(184, 45, seed=0)
    cand, _, _ = _scored(y, _model(signal, rng, 1.0, 0.1848), None)
    assert cand.metrics.calibration == pytest.approx(0.755, abs=0.001)
    d = gate(cand, None, PublishConfig())
    assert (d.publish, d.reason) == (True, "first model")
    assert not gate(cand, None, PublishConfig(noise_sds=0.0)).publish


def test_a_truly_miscalibrated_model_is_still_refused_and_the_reason_prints_the_interval():
    y, signal, rng = _labels(20_000, 4_000, seed=1)
    old = _model(signal, rng, 1.0, 0.2)
    cand, pub, versus = _scored(y, old * 1.5, old)  # the same ranking, every probability x1.5
    for before in (pub, None):
        d = gate(cand, before, PublishConfig(), versus=versus if before else None)
        assert not d.publish and "calibration" in d.reason and "1.500 [1.4" in d.reason, d.reason
        assert "at 2 sd of the click rate (0.0028 on 20000 rows, 4000 clicks)" in d.reason


def test_a_drop_refused_beyond_the_noise_prints_its_interval():
    wide = Difference(rows=400, logloss=0.0, logloss_se=0.001, auc=-0.05, auc_se=0.02, sampled_rows=400)
    d = gate(s(0.65), s(0.70, date="2026-01-01"), CFG, versus=wide)
    assert "= 0.0400: [0.0100, 0.0900]" in d.reason
    drop = next(c for c in d.values() if c["name"] == "auc_drop")
    assert drop["interval"] == pytest.approx([0.01, 0.09])


def _two_models_on_slices(
    rows_per_slice: int, worse: float, seed: int = 0, *, paired: bool = False, slices: tuple[int, ...] = (1,)
):
    """Both models on 4 slices (field C1 1..4); the candidate ranks `slices` with `worse` more noise.
    With `paired`, also each slice's paired standard error of the AUC difference (what the evaluate
    stage hands the gate as `versus_groups`)."""
    rng = np.random.default_rng(seed)
    g = np.repeat([1, 2, 3, 4], rows_per_slice)
    y = (rng.random(g.size) < 0.2).astype(float)
    signal = y + rng.normal(0, 1, g.size)
    old = 1 / (1 + np.exp(-(signal - 2)))
    new = 1 / (1 + np.exp(-(signal + np.where(np.isin(g, slices), rng.normal(0, worse, g.size), 0.0) - 2)))
    cand, pub, versus = _scored(y, new, old)
    scored = (
        Scores(cand.metrics, {"C1": group_auc(y, new, g)}, trained_through="2026-01-02"),
        Scores(pub.metrics, {"C1": group_auc(y, old, g)}, trained_through="2026-01-01"),
        versus,
    )
    if not paired:
        return scored
    values, se = paired_group_se(y, new, old, g)
    return (*scored, {"C1": {v.item(): float(e) for v, e in zip(values, se, strict=True)}})


def test_a_slice_drop_within_its_noise_publishes_and_one_beyond_it_is_refused():
    cfg = PublishConfig(max_auc_drop=0.05, max_logloss_increase=0.05, slice_fields=("C1",), min_slice_rows=500)
    new, old, versus = _two_models_on_slices(500, worse=0.7)
    drop = old.groups["C1"].auc[0] - new.groups["C1"].auc[0]
    assert drop > cfg.max_slice_auc_drop  # beyond the threshold, which alone refuses it...
    assert not gate(new, old, PublishConfig(**{**_fields(cfg), "noise_sds": 0.0}), versus=versus).publish
    d = gate(new, old, cfg, versus=versus)
    assert d.publish, d.reason  # ...but within 2 standard errors of a 500-row slice
    check = next(c for c in d.values() if c["name"] == "slices:C1")
    assert check["threshold"] > drop and check["interval"][0] < 0 < drop < check["interval"][1]
    new, old, versus = _two_models_on_slices(20_000, worse=1.5)  # a real loss on 20,000 rows: refused
    d = gate(new, old, cfg, versus=versus)
    assert not d.publish and "worst: key 1" in d.reason and "2 standard errors" in d.reason


def test_a_gauc_drop_within_its_noise_is_undecided():
    cfg = PublishConfig(max_auc_drop=0.05, max_logloss_increase=0.05, gauc_field="C1")
    new, old, versus = _two_models_on_slices(300, worse=1.0, seed=1)
    drop = old.groups["C1"].gauc() - new.groups["C1"].gauc()
    assert drop > cfg.max_gauc_drop
    assert not gate(new, old, PublishConfig(**{**_fields(cfg), "noise_sds": 0.0}), versus=versus).publish
    d = gate(new, old, cfg, versus=versus)
    assert not d.publish and d.verdict.startswith("undecided: gauc: GAUC over C1")
    new, old, versus = _two_models_on_slices(20_000, worse=3.0)
    d = gate(new, old, cfg, versus=versus)
    assert not d.publish and "GAUC over C1" in d.reason and "standard errors" in d.reason


def test_a_real_slice_loss_within_the_unpaired_bound_is_refused_on_its_paired_error():
    # slice 1 of 2,000 rows drops 0.024 AUC: the two models' errors taken as independent (2 x 0.021)
    # would call it noise; row by row on the same rows the difference's error is 0.0065
    cfg = PublishConfig(max_auc_drop=0.05, max_logloss_increase=0.05, slice_fields=("C1",), min_slice_rows=500)
    new, old, versus, versus_groups = _two_models_on_slices(2_000, worse=0.5, paired=True)
    drop = old.groups["C1"].auc[0] - new.groups["C1"].auc[0]
    assert drop > cfg.max_slice_auc_drop and 2 * versus_groups["C1"][1] < drop
    assert gate(new, old, cfg, versus=versus).publish  # the unpaired upper bound lets it through
    d = gate(new, old, cfg, versus=versus, versus_groups=versus_groups)
    assert not d.publish and "worst: key 1" in d.reason
    check = next(c for c in d.values() if c["name"] == "slices:C1")
    assert check["interval"] == pytest.approx([drop - 2 * versus_groups["C1"][1], drop + 2 * versus_groups["C1"][1]])
    # the same slices at 500 rows: within the paired error too, published
    new, old, versus, versus_groups = _two_models_on_slices(500, worse=0.5, paired=True)
    assert gate(new, old, cfg, versus=versus, versus_groups=versus_groups).publish


def test_a_real_gauc_loss_within_the_unpaired_bound_is_refused_on_the_paired_errors():
    cfg = PublishConfig(max_auc_drop=0.05, max_logloss_increase=0.05, gauc_field="C1", max_gauc_drop=0.01)
    new, old, versus, versus_groups = _two_models_on_slices(1_000, worse=0.45, paired=True, slices=(1, 2, 3, 4))
    drop = old.groups["C1"].gauc() - new.groups["C1"].gauc()
    assert drop > cfg.max_gauc_drop
    assert gate(new, old, cfg, versus=versus).verdict.startswith("undecided")  # within the unpaired upper bound
    d = gate(new, old, cfg, versus=versus, versus_groups=versus_groups)
    assert not d.publish and d.verdict == "refused" and "GAUC over C1" in d.reason


def _fields(cfg: PublishConfig) -> dict:
    return {f: getattr(cfg, f) for f in cfg.__dataclass_fields__}
