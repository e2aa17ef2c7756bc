"""trainer.plan.sparse_lr_search: a small day's sparse_lr is the candidate with the lowest cross-validated
logloss of a per-key-Adam logistic regression, and the search follows the data, not a fixed answer."""

from __future__ import annotations

import numpy as np
import pytest

from trainer.config import OptimConfig
from trainer.models.config import ModelConfig
from trainer.plan.recipe import derive
from trainer.plan.sparse_lr_search import (
    FACTORS,
    _design,
    _logits,
    _train,
    choose_sparse_lr,
)


def _day(rows: int, *, keys_per_field: int, signal: float, seed: int = 0) -> tuple[np.ndarray, ...]:
    """Rows of 4 key fields and 2 dense columns; each key value has a log-odds drawn with scale `signal`."""
    rng = np.random.default_rng(seed)
    fields = 4
    keys = rng.integers(0, keys_per_field, size=(rows, fields)) + np.arange(fields) * keys_per_field
    effect = rng.normal(0, signal, size=fields * keys_per_field)
    dense = rng.normal(size=(rows, 2)).astype(np.float32)
    z = effect[keys].sum(1) + 0.5 * dense[:, 0] - 1.0
    labels = (rng.random(rows) < 1 / (1 + np.exp(-z))).astype(np.float32)
    return labels, dense, keys.astype(np.int64)


def _recipe(rows: int) -> OptimConfig:
    return derive(OptimConfig(), ModelConfig(), rows=rows, world_size=1).optim


def test_the_choice_is_a_candidate_and_records_every_candidates_score():
    labels, dense, keys = _day(3_600, keys_per_field=50, signal=0.5)
    optim = _recipe(3_600)
    choice = choose_sparse_lr(labels, dense, keys, optim=optim)
    assert list(choice.logloss) == [float(f"{optim.sparse_lr * f:.3g}") for f in FACTORS]
    assert choice.lr == min(choice.logloss, key=choice.logloss.__getitem__) or choice.lr == float(
        f"{optim.sparse_lr:.3g}"
    )
    assert all(0 < v < 0.7 for v in choice.logloss.values()), choice.logloss  # better than a constant at p = 0.5
    assert "5-fold" in choice.reason() and "3,600" in choice.reason()


def test_frequent_strong_keys_get_a_larger_step_than_rare_weak_ones():
    # Few values seen hundreds of times with large effects: the keys must travel far in 45 steps.
    strong = choose_sparse_lr(*_day(3_600, keys_per_field=8, signal=1.5), optim=_recipe(3_600))
    # Thousands of values seen about once with small effects: every step on them is mostly noise.
    weak = choose_sparse_lr(*_day(3_600, keys_per_field=2_000, signal=0.2), optim=_recipe(3_600))
    assert strong.lr > weak.lr, (strong.logloss, weak.logloss)


def test_the_weights_fit_the_training_rows():
    labels, dense, keys = _day(2_000, keys_per_field=10, signal=1.0)
    index, values, n_ids, width = _design(dense, keys)
    optim = _recipe(2_000)
    w = _train(index, values, labels, width, optim=optim, lr=0.05, n_fields=keys.shape[1], n_ids=n_ids)
    z = _logits(w, index, values)
    trained = np.mean(np.logaddexp(0, z) - labels * z)
    p = labels.mean()
    constant = -(p * np.log(p) + (1 - p) * np.log(1 - p))
    assert trained < constant - 0.05, (trained, constant)


def test_an_unresolved_recipe_or_too_few_rows_is_refused():
    labels, dense, keys = _day(100, keys_per_field=5, signal=1.0)
    with pytest.raises(ValueError, match="resolved recipe.*optim.sparse_lr"):
        choose_sparse_lr(labels, dense, keys, optim=OptimConfig())
    with pytest.raises(ValueError, match="at least 5 rows"):
        choose_sparse_lr(labels[:3], dense[:3], keys[:3], optim=_recipe(100))
