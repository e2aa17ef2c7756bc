"""The evaluate stage's work: the gate's comparison on every eval row, the next-day AUC on a seeded sample.

The candidate and the published model are scored on all of the day's eval rows (what the gate
compares); the published model's next-day AUC is computed on `evaluate.next_day_rows` of the day's
train rows, the same rows when the day is rerun, with a 95% interval for the model on the day's
traffic: DeLong's on the rows scored, which keeps its width when the sample is every row.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from fsspec.implementations.local import LocalFileSystem

from flows.guards.evaluation import Z95, EvaluateConfig, evaluate_day
from flows.guards.noise import hanley_mcneil_se
from tests.helpers.model_dirs import make_model_dir, write_feature_day
from trainer.companion import file as companion_file
from trainer.companion.fit import fit_rows
from trainer.companion.poly2 import Poly2Config
from trainer.eval.scoring import evaluate_model, load_model
from trainer.eval.scoring_pass import read_split
from trainer.model_dir import read_meta, write_meta
from trainer.plan.published import Published

DATE = "2026-01-02"


@pytest.fixture()
def day(tmp_path: Path) -> dict:
    write_feature_day(tmp_path / "day", train_parts=(700, 600, 700), eval_parts=(150, 100))
    candidate = str(make_model_dir(tmp_path, "candidate", seed=3)[0])
    old = str(make_model_dir(tmp_path, "published", seed=4)[0])
    return {
        "features_url": str(tmp_path / "day"),
        "candidate_url": candidate,
        "published": Published("v00001", old, read_meta(old)),
    }


def _evaluate(day: dict, cfg: EvaluateConfig, date: str = DATE, **kw):
    return evaluate_day(cfg, date=date, **{**day, **kw})


def test_before_the_first_publish_only_the_candidate_is_scored_on_every_eval_row(day: dict) -> None:
    ev = _evaluate(day, EvaluateConfig(), published=None)
    alone = evaluate_model(day["candidate_url"], day["features_url"] + "/eval")
    assert ev.new.rows == alone["rows"] == 250 and ev.new.auc == pytest.approx(alone["auc"], abs=1e-9)
    assert ev.published is None and ev.next_day is None and ev.rows_scored == 250
    assert ev.record()["next_day"] is None and ev.record()["rows_per_s"] > 0
    assert ev.versus is None and ev.record()["versus_published"] is None


def test_both_models_are_compared_on_every_eval_row_and_the_next_day_on_a_sample(day: dict) -> None:
    ev = _evaluate(day, EvaluateConfig(next_day_rows=500, threads=2))
    pub_url = day["published"].url
    assert ev.new.rows == ev.published.rows == 250  # the gate's comparison: exact, every row
    assert ev.published.auc == pytest.approx(evaluate_model(pub_url, day["features_url"] + "/eval")["auc"], abs=1e-9)
    nd = ev.next_day
    assert nd.metrics.rows == 500 and nd.of_rows == 2000 and nd.seed == 0
    lo, hi = nd.ci95
    assert 0 < nd.auc_se < 0.05 and lo < nd.auc < hi
    everything = evaluate_model(pub_url, day["features_url"] + "/train")["auc"]
    assert abs(nd.auc - everything) < 4 * nd.auc_se  # the sample estimates the AUC on all the train rows
    rec = ev.record()
    assert rec["rows_scored"] == ev.rows_scored == 250 * 2 + 500 and rec["rows_per_s"] > 0
    assert rec["next_day"] == {
        "auc": nd.auc,
        "auc_se": nd.auc_se,
        "auc_ci95": [lo, hi],
        "rows": 500,
        "of_rows": 2000,
        "seed": 0,
    }
    assert "next-day" in ev.summary() and "rows/s" in ev.summary()
    # the gate's noise level: the candidate minus the published model, row by row on the same rows
    v = ev.versus
    assert v.rows == 250 and v.auc == pytest.approx(ev.new.auc - ev.published.auc, abs=1e-9)
    assert v.logloss == pytest.approx(ev.new.logloss - ev.published.logloss, abs=1e-9)
    assert rec["versus_published"]["auc_se"] == v.auc_se > 0


def test_each_gated_fields_values_get_the_paired_error_of_the_two_models_auc_difference(day: dict) -> None:
    ev = _evaluate(day, EvaluateConfig(next_day_rows=100), groups={"k_0": "C1"})
    mine, theirs = ev.new_groups["C1"], ev.published_groups["C1"]
    paired = ev.versus_groups["C1"]
    assert list(paired) == [v.item() for v in mine.values]
    both = [
        v.item() for v, p, n in zip(mine.values, mine.clicks, mine.rows - mine.clicks, strict=True) if p >= 2 and n >= 2
    ]
    assert both and all(0 < paired[v] < 0.5 for v in both)  # two clicks and two non-clicks: defined
    assert all(math.isnan(e) for v, e in paired.items() if v not in both)
    assert (theirs.values == mine.values).all()  # the same rows, the same values
    assert _evaluate(day, EvaluateConfig(next_day_rows=100), published=None).versus_groups == {}


def test_the_next_day_sample_is_the_same_for_a_rerun_and_another_for_another_day(day: dict) -> None:
    cfg = EvaluateConfig(next_day_rows=300)
    first, rerun = _evaluate(day, cfg).next_day, _evaluate(day, cfg).next_day
    assert rerun.record() == first.record()  # the same rows: the same AUC and interval
    assert _evaluate(day, cfg, date="2026-01-03").next_day.auc != first.auc
    assert _evaluate(day, EvaluateConfig(next_day_rows=300, seed=1)).next_day.auc != first.auc


def test_a_sample_of_every_train_row_is_the_exact_next_day_auc_with_its_delong_interval(day: dict) -> None:
    nd = _evaluate(day, EvaluateConfig(next_day_rows=0)).next_day
    assert nd.metrics.rows == nd.of_rows == 2000
    assert nd.auc == pytest.approx(
        evaluate_model(day["published"].url, day["features_url"] + "/train")["auc"], abs=1e-9
    )
    # the day's rows are a sample of its traffic: the interval keeps DeLong's width (it printed [a, a] once)
    clicks = sum(int(f["label"].sum()) for f in read_split(day["features_url"] + "/train", ["label"]))
    assert nd.auc_se == pytest.approx(float(hanley_mcneil_se(nd.auc, clicks, 2000 - clicks)), rel=0.3)
    lo, hi = nd.ci95
    assert 0.005 < nd.auc_se < 0.05 and hi - lo == pytest.approx(2 * Z95 * nd.auc_se)
    ev = _evaluate(day, EvaluateConfig(next_day_rows=0))
    assert f"next-day {nd.auc:.4f} [{lo:.4f}, {hi:.4f}] on 2000 rows" in ev.summary() and lo < nd.auc < hi


@pytest.mark.parametrize(
    ("kw", "key"),
    [({"next_day_rows": -1}, "next_day_rows"), ({"batch_size": 0}, "batch_size"), ({"threads": -2}, "threads")],
)
def test_bad_evaluate_settings_name_the_key(kw: dict, key: str) -> None:
    with pytest.raises(ValueError, match=f"evaluate.{key}"):
        EvaluateConfig(**kw)


def test_a_published_companion_on_a_day_without_own_keys_is_not_scored_rather_than_by_its_network_alone(
    day: dict,
) -> None:
    """A day of more rows than `encode.raw_keys_up_to` after a small one: the published model's companion has no
    own keys to read, so the published model is not scored on the day's rows at all (what is served is the blend);
    the gate's comparisons are then undecided unless earlier rows can be pooled (test_served_gate.py)."""
    pub = day["published"].url
    before = _evaluate(day, EvaluateConfig())
    rng = np.random.default_rng(0)
    keys, labels = rng.integers(0, 50, (400, 2)), (rng.random(400) < 0.3).astype(np.float64)
    fitted, record = fit_rows(keys, None, labels, config=Poly2Config(bits=14, cs=(1.0,)))
    companion_file.save(f"{pub}/{companion_file.FILE}", fitted)
    write_meta(LocalFileSystem(), pub, replace(read_meta(pub), companion={**record, "sources": []}))
    assert load_model(pub).companion is not None
    ev = _evaluate(day, EvaluateConfig(), published=Published("v00001", pub, read_meta(pub)))
    assert ev.published is None and ev.versus is None and ev.next_day is None and "own keys r_<j>" in ev.unserved
    assert before.published is not None and not before.unserved
    assert ev.new.auc == before.new.auc and ev.rows_scored == ev.new.rows
    assert "v00001 not scored: its companion reads" in ev.summary() and ev.record()["unserved"] == ev.unserved
