"""bench.quality_peers: the peers choose their hyperparameters on the train rows only (the LR its C by blocked
K-fold CV or an inner time split, DeepFM its epochs by an inner time split)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from bench.quality_peers import cv_folds


def test_cv_folds_validate_every_row_once_in_contiguous_blocks() -> None:
    train = pd.DataFrame({"order": np.arange(23), "label": np.arange(23) % 2})
    parts = cv_folds(train, folds=5)
    assert len(parts) == 5
    seen = np.concatenate([va["order"].to_numpy() for _, va in parts])
    np.testing.assert_array_equal(seen, np.arange(23))  # blocks in time order, each row validated once
    for tr, va in parts:
        v = va["order"].to_numpy()
        assert np.all(np.diff(v) == 1)  # one contiguous block
        t = tr["order"].to_numpy()
        assert np.all(np.diff(t) > 0) and len(t) + len(v) == 23  # the rest, in time order
        assert not set(t) & set(v)
        assert list(tr.index) == list(range(len(tr))) and list(va.index) == list(range(len(va)))


def test_cv_folds_errors() -> None:
    with pytest.raises(ValueError, match="folds >= 2"):
        cv_folds(pd.DataFrame({"order": np.arange(10)}), folds=1)
    with pytest.raises(ValueError, match="at least"):
        cv_folds(pd.DataFrame({"order": np.arange(3)}), folds=5)


def _rows(schema, rng: np.random.Generator, *, n: int, values: int, noise: float, threshold: float) -> pd.DataFrame:
    """`n` log rows whose label follows the first categorical field (`values` values) plus normal `noise`."""
    frame = pd.DataFrame({c: rng.integers(0, values, n).astype(str) for c in schema.categorical})
    for c in schema.dense:
        frame[c] = rng.integers(0, 10, n).astype(float)
    frame["label"] = (frame[schema.categorical[0]].astype(int) + rng.normal(0, noise, n) > threshold).astype(int)
    return frame


def test_the_time_split_lr_chooses_c_on_the_last_fifth_of_the_train_rows() -> None:
    pytest.importorskip("sklearn")
    from bench.quality_peers import LR_CS, sklearn_lr_time_split
    from pipeline.schema import get_schema

    schema = get_schema("criteo")
    frame = _rows(schema, np.random.default_rng(0), n=500, values=5, noise=1, threshold=3)
    probs, info = sklearn_lr_time_split(frame.iloc[:400], frame.iloc[400:], schema)
    assert info["C"] in LR_CS and info["holdout_rows"] == 80 and probs.shape == (100,)
    assert ((probs > 0.5) == frame["label"].iloc[400:].to_numpy().astype(bool)).mean() > 0.7  # it learnt the field


def test_the_poly2_lr_learns_a_pair_of_fields_that_the_one_hot_lr_cannot() -> None:
    pytest.importorskip("sklearn")
    from bench.quality_peers import POLY2_CS, sklearn_lr_time_split
    from pipeline.schema import get_schema
    from trainer.eval.metrics import auc

    schema = get_schema("criteo")
    rng = np.random.default_rng(2)
    frame = _rows(schema, rng, n=1_500, values=2, noise=1, threshold=0)
    a, b = (frame[c].astype(int) for c in schema.categorical[:2])
    frame["label"] = ((a ^ b) == (rng.random(len(frame)) < 0.9)).astype(int)  # the XOR of two fields, 10% flipped
    train, later = frame.iloc[:1_200], frame.iloc[1_200:]
    y = later["label"].to_numpy()
    one_hot, _ = sklearn_lr_time_split(train, later, schema)
    poly2, info = sklearn_lr_time_split(train, later, schema, pairs=True)
    assert info["C"] in POLY2_CS
    assert (
        auc(y, poly2) > 0.75 and auc(y, one_hot) < 0.6
    )  # each field alone says nothing; the pair says it (0.9 at best)


def test_the_projects_own_poly2_learns_the_pair_too_without_scikit_learn() -> None:
    from bench.quality_peers import POLY2_CS, poly2_fit, poly2_inputs, poly2_keys
    from pipeline.schema import get_schema
    from trainer.companion.key_counts import KeyCounts
    from trainer.eval.metrics import auc

    schema = get_schema("criteo")
    rng = np.random.default_rng(2)
    frame = _rows(schema, rng, n=1_500, values=2, noise=1, threshold=0)
    a, b = (frame[c].astype(int) for c in schema.categorical[:2])
    frame["label"] = ((a ^ b) == (rng.random(len(frame)) < 0.9)).astype(int)
    ids, dense = poly2_inputs(frame.iloc[:3], schema, 22)
    assert ids.shape == (3, 39 + 39 * 38 // 2) and dense.shape == (3, 13)  # 26 fields and 13 dense buckets, paired
    counts = KeyCounts.of(poly2_keys(frame, schema))
    counted, _ = poly2_inputs(frame.iloc[:3], schema, 22, counts, fit_rows=True)
    assert counted.shape == (3, ids.shape[1] + 26) and np.array_equal(counted[:, : ids.shape[1]], ids)
    probs, info = poly2_fit(frame.iloc[:1_200], frame.iloc[1_200:], schema)
    assert info["C"] in POLY2_CS and probs.shape == (300,)
    assert auc(frame["label"].iloc[1_200:].to_numpy(), probs) > 0.75


def test_the_poly2_tokens_are_every_pair_of_the_fields_and_dense_buckets() -> None:
    from bench.quality_peers import _dense_bucket, _pairs, _tokens
    from pipeline.schema import get_schema

    schema = get_schema("criteo")
    frame = _rows(schema, np.random.default_rng(3), n=2, values=3, noise=0, threshold=1)
    frame.loc[0, schema.dense[0]] = np.nan
    tokens = [t + d for t, d in zip(_tokens(frame, schema), _dense_bucket(frame, schema), strict=True)]
    assert len(tokens[0]) == 39 and tokens[0][26] == f"{schema.dense[0]}#0"  # a missing value: bucket 0
    pairs = _pairs(tokens[0])
    assert len(pairs) == 39 + 39 * 38 // 2 and f"{tokens[0][0]}&{tokens[0][38]}" in pairs


def test_the_lr_fit_on_the_columns_the_train_rows_use_is_the_fit_on_all_hashed_columns() -> None:
    pytest.importorskip("sklearn")
    from bench.quality_peers import _hashed, _lr, _lr_probs
    from pipeline.schema import get_schema

    schema = get_schema("criteo")
    frame = _rows(schema, np.random.default_rng(1), n=300, values=20, noise=3, threshold=10)
    frame.loc[250:, schema.categorical[1]] = "never-seen"  # later rows with a value the fit never saw
    X, later = _hashed(frame.iloc[:250], schema), _hashed(frame.iloc[250:], schema)
    assert set(later.indices) - set(X.indices)
    y = frame["label"].iloc[:250].to_numpy()
    full = _lr(1.0).fit(X, y).predict_proba(later)[:, 1]
    np.testing.assert_allclose(_lr_probs(1.0, X, y, later), full, rtol=0, atol=1e-6)


def test_the_time_split_deepfm_chooses_its_epochs_on_the_last_fifth_of_the_train_rows() -> None:
    pytest.importorskip("deepctr_torch")
    from bench.quality_peers import deepctr_deepfm_time_split
    from pipeline.schema import get_schema

    schema = get_schema("criteo")
    frame = _rows(schema, np.random.default_rng(0), n=500, values=5, noise=1, threshold=2)
    train, later = frame.iloc[:400], frame.iloc[400:]
    probs, info = deepctr_deepfm_time_split(train, later, schema, seed=0, epochs=(8, 1, 2))
    losses = info["val_logloss"]
    assert list(losses) == [1, 2, 8] and info["holdout_rows"] == 80
    assert info["epochs"] > 1  # 1 epoch (2 Adam steps on 320 rows) underfits the field
    assert losses[info["epochs"]] == min(losses.values())
    assert probs.shape == (100,) and np.all((probs > 0) & (probs < 1))
    # measured on the way through one run = a run of that many epochs alone (same seed, same shuffles)
    _, alone = deepctr_deepfm_time_split(train, later, schema, seed=0, epochs=(2,))
    assert alone["val_logloss"] == {2: losses[2]}


def test_the_time_split_deepfm_needs_epoch_counts_of_at_least_one() -> None:
    from bench.quality_peers import deepctr_deepfm_time_split
    from pipeline.schema import get_schema

    frame = pd.DataFrame({"label": [0, 1]})
    for epochs in ((), (0, 2)):
        with pytest.raises(ValueError, match="epoch counts >= 1"):
            deepctr_deepfm_time_split(frame, frame, get_schema("criteo"), seed=0, epochs=epochs)
