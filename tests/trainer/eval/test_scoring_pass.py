"""Several models scored in one pass over the same rows, on a thread pool; a seeded row sample.

Scored together, on any number of threads, each model gets exactly the metrics it gets alone;
a sample holds distinct, whole rows of the split, the same ones for the same seed.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from tests.helpers.model_dirs import make_model_dir, write_feature_day
from trainer.eval.scoring import evaluate_model, load_model, score
from trainer.eval.scoring_pass import (
    evaluate_together,
    feature_columns,
    read_split,
    sample_rows,
)


@pytest.fixture()
def day(tmp_path: Path) -> Path:
    write_feature_day(tmp_path / "day", train_parts=(400, 1, 350, 249), eval_parts=(90, 1, 70))
    return tmp_path / "day"


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_models_scored_together_get_the_metrics_each_gets_alone(tmp_path: Path, day: Path, threads: int) -> None:
    models = [load_model(str(make_model_dir(tmp_path, name, seed=seed)[0])) for name, seed in (("a", 3), ("b", 4))]
    before = torch.get_num_threads()
    together = evaluate_together(
        models, read_split(str(day / "eval"), feature_columns(models)), threads=threads, batch_size=16
    )
    assert torch.get_num_threads() == before  # the pool's one-thread setting is undone
    for m, got in zip(models, together, strict=True):
        alone = evaluate_model(m, str(day / "eval"))
        assert got.rows == alone["rows"] == 161  # every row, by each model
        # float32 kernels round a row's score by the batch it is in, so equal up to that rounding
        assert got.result()["auc"] == pytest.approx(alone["auc"], abs=1e-9)
        assert got.result()["logloss"] == pytest.approx(alone["logloss"], rel=1e-6)
    assert together[0].result()["auc"] != together[1].result()["auc"]  # two models, two results


def test_the_gates_per_value_aucs_scored_together_equal_those_of_each_model_alone(tmp_path: Path, day: Path) -> None:
    models = [load_model(str(make_model_dir(tmp_path, name, seed=seed)[0])) for name, seed in (("a", 3), ("b", 4))]
    together = evaluate_together(
        models, read_split(str(day / "eval"), feature_columns(models)), threads=2, batch_size=16, groups=("k_0",)
    )
    for m, got in zip(models, together, strict=True):
        alone = evaluate_model(m, str(day / "eval"), groups=("k_0",))["groups"]["k_0"]
        g = got.groups["k_0"]
        assert len(g.values) > 1 and np.isfinite(g.auc).any()  # several values, some with both classes
        np.testing.assert_array_equal(g.values, alone.values)
        np.testing.assert_array_equal(g.rows, alone.rows)
        np.testing.assert_allclose(g.auc, alone.auc, atol=1e-9, equal_nan=True)
    assert evaluate_together(models, read_split(str(day / "eval"), feature_columns(models)))[0].groups == {}


def test_paired_with_groups_each_values_auc_difference_gets_its_paired_error(tmp_path: Path, day: Path) -> None:
    from trainer.eval.group_metrics import paired_group_se

    models = [load_model(str(make_model_dir(tmp_path, name, seed=seed)[0])) for name, seed in (("a", 3), ("b", 4))]
    frames = list(read_split(str(day / "eval"), feature_columns(models)))
    first, second = evaluate_together(models, frames, threads=2, batch_size=16, groups=("k_0",), paired=True)
    assert first.group_se_versus_first == {}
    rows = pd.concat(frames, ignore_index=True)
    probs = [score(m, rows, batch_size=16) for m in models]
    values, se = paired_group_se(rows["label"].to_numpy(), probs[0], probs[1], rows["k_0"].to_numpy())
    np.testing.assert_array_equal(values, second.groups["k_0"].values)
    np.testing.assert_allclose(second.group_se_versus_first["k_0"], se, atol=1e-6, equal_nan=True)
    assert np.isfinite(se).any()


def test_feature_columns_are_the_label_and_each_models_columns_once(tmp_path: Path) -> None:
    models = [load_model(str(make_model_dir(tmp_path, name)[0])) for name in ("a", "b")]
    assert feature_columns(models) == ["label", "d_0", "k_0", "k_1"]


def test_a_sample_holds_distinct_whole_rows_of_the_split_the_same_for_the_same_seed(day: Path) -> None:
    cols = ["label", "d_0", "k_0", "k_1", "row"]
    everything = pd.concat(read_split(str(day / "train"), cols), ignore_index=True).set_index("row")
    sample = sample_rows(str(day / "train"), cols, 300, seed=[0, 20260102])
    assert sample.rows == 300 and sample.of_rows == 1000
    assert sample.frame["row"].is_unique
    pd.testing.assert_frame_equal(sample.frame.set_index("row"), everything.loc[sample.frame["row"]])
    again = sample_rows(str(day / "train"), cols, 300, seed=[0, 20260102])
    pd.testing.assert_frame_equal(again.frame, sample.frame)
    other = sample_rows(str(day / "train"), cols, 300, seed=[0, 20260103])
    assert set(other.frame["row"]) != set(sample.frame["row"])


def test_a_sample_draws_every_part_in_proportion_to_its_rows(day: Path) -> None:
    shares = (
        np.array(
            [
                np.bincount(
                    sample_rows(str(day / "train"), ["row"], 200, seed=s).frame["row"].to_numpy() // 1000, minlength=4
                )
                for s in range(40)
            ]
        ).mean(axis=0)
        / 200
    )
    np.testing.assert_allclose(shares, [0.4, 0.001, 0.35, 0.249], atol=0.02)


def test_a_sample_of_zero_or_more_rows_than_the_split_is_every_row(day: Path) -> None:
    for rows in (0, 1000, 5000):
        sample = sample_rows(str(day / "train"), ["row"], rows, seed=1)
        assert sample.rows == sample.of_rows == 1000
    with pytest.raises(ValueError, match="rows must be >= 0"):
        sample_rows(str(day / "train"), ["row"], -1, seed=1)


def test_paired_scoring_gives_the_first_model_minus_each_other_one_with_its_standard_errors(
    tmp_path: Path, day: Path
) -> None:
    models = [load_model(str(make_model_dir(tmp_path, name, seed=seed)[0])) for name, seed in (("a", 3), ("b", 4))]
    first, second = evaluate_together(
        models, read_split(str(day / "eval"), feature_columns(models)), threads=2, batch_size=16, paired=True
    )
    assert first.versus_first is None
    d = second.versus_first
    assert d.rows == d.sampled_rows == 161
    assert d.logloss == pytest.approx(first.result()["logloss"] - second.result()["logloss"], abs=1e-9)
    assert d.auc == pytest.approx(first.result()["auc"] - second.result()["auc"], abs=1e-9)
    assert d.auc_se > 0 and d.logloss_se > 0
    unpaired = evaluate_together(models, read_split(str(day / "eval"), feature_columns(models)))
    assert [s.versus_first for s in unpaired] == [None, None]
