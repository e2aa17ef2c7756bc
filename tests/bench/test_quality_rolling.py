"""bench.quality --protocol rolling: every shared real row cut into days by row order, each origin trained
through the product path on the days before it and scored on the next; pooled AUCs with paired sds and the
peers (or a line saying why a peer is skipped)."""

from __future__ import annotations

import pytest

from bench.quality_rolling import blend, split_counts


def test_a_sample_is_cut_into_consecutive_days_of_almost_equal_size() -> None:
    assert split_counts(10_000, 5) == (2_000,) * 5
    assert split_counts(9_999, 5) == (1_999, 2_000, 2_000, 2_000, 2_000)
    assert sum(split_counts(3_301, 3)) == 3_301
    with pytest.raises(ValueError, match="rolling split"):
        split_counts(10, 1)


def test_the_probe_blend_is_the_mean_of_two_models_logits() -> None:
    import numpy as np

    p, q = np.array([0.1, 0.5, 0.9, 0.3]), np.array([0.3, 0.5, 0.2, 0.3])
    logit = np.log(p / (1 - p)) / 2 + np.log(q / (1 - q)) / 2
    np.testing.assert_allclose(blend(p, q), 1 / (1 + np.exp(-logit)))
    np.testing.assert_allclose(blend(p, p), p)
    np.testing.assert_allclose(blend(p, q), blend(q, p))
    assert np.isfinite(blend(np.array([0.0, 1.0]), np.array([0.5, 0.5]))).all()  # clipped, never inf - inf


# Its smoke run (every origin pooled, every model on the same rows): tests/bench/test_smoke.py::check_quality.


def test_a_variant_is_the_default_config_with_its_keys_set_and_named_by_them(tmp_path) -> None:
    import argparse

    from bench._common import Variant
    from bench.quality import variants_of
    from bench.quality_data import DayFiles
    from bench.quality_product import model_name, product_config

    v = Variant.parse("vocab.min_count=1, optim.batch_size=64")
    assert v.sets == {"vocab.min_count": 1, "optim.batch_size": 64}
    assert model_name("attention", v) == "attention [vocab.min_count=1, optim.batch_size=64]"
    assert "/" not in Variant.row_format("adam/fp32").folder and " " not in v.folder
    files = DayFiles(
        name="criteo",
        fmt="criteo",
        url=str(tmp_path / "{date}.txt"),
        train_dates=("2024-01-01",),
        later_date="2024-01-02",
    )
    cfg = product_config(files, tmp_path, arch="attention", seed=3, variant=v)
    assert (cfg.vocab.min_count, cfg.optim.batch_size, cfg.optim.seed) == (1, 64, 3)
    args = argparse.Namespace(row_formats=["adam/fp32"], variants=["vocab.min_count=1"])
    assert [x.label for x in variants_of(args)] == ["adam/fp32", "vocab.min_count=1"]
    with pytest.raises(ValueError, match="key=value"):
        Variant.parse("vocab.min_count")
    with pytest.raises(ValueError, match="min_cnt"):  # a typo fails before any run, naming the key
        variants_of(argparse.Namespace(row_formats=[], variants=["vocab.min_cnt=1"]))
