"""The Poly2 LR: its buckets, its fit (the liblinear objective's minimum), and its C by cross-validation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from storage.key_layout import FIELD_SHIFT, MAX_FIELDS
from trainer.companion.poly2 import (
    Poly2,
    Poly2Config,
    bucket_tokens,
    fit,
    fit_cv,
    pair_ids,
    single_ids,
)
from trainer.eval.metrics import auc, logloss


def xor_rows(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Tokens of two binary fields and a noise field; the click is likely when the first two differ."""
    rng = np.random.default_rng(seed)
    a, b, c = rng.integers(0, 2, n), rng.integers(0, 2, n), rng.integers(0, 50, n)
    tokens = np.stack([a + 2, (1 << FIELD_SHIFT) | (b + 2), (2 << FIELD_SHIFT) | (c + 2)], axis=1).astype(np.int64)
    y = (rng.random(n) < np.where(a != b, 0.8, 0.2)).astype(np.float64)
    return tokens, y


def objective_gradient(model, ids: np.ndarray, dense: np.ndarray, y: np.ndarray) -> float:
    """|C X^T (p - y) + w| over every weight the fit has (buckets, dense, bias), relative to |C X^T y|."""
    z = model.logits(ids, dense)
    r = 1 / (1 + np.exp(-z)) - y
    pos = np.searchsorted(model.buckets, ids)
    g_b = np.bincount(pos.ravel(), np.repeat(r, ids.shape[1]), model.buckets.size) * model.C + model.weights
    g_d = model.C * dense.T @ r + model.dense_weights
    g_0 = model.C * r.sum() + model.bias
    scale = model.C * np.abs(np.bincount(pos.ravel(), np.repeat(y, ids.shape[1]))).sum()
    return float(np.sqrt((g_b @ g_b) + (g_d @ g_d) + g_0**2) / scale)


def test_pair_ids_are_every_token_and_every_pair_hashed_into_the_buckets() -> None:
    tokens, _ = xor_rows(100, 0)
    ids = pair_ids(tokens, 12)
    assert ids.shape == (100, 3 + 3)
    assert ids.min() >= 0 and ids.max() < 2**12
    np.testing.assert_array_equal(ids, pair_ids(tokens.copy(), 12))  # deterministic
    # a row's pair ids depend on its own tokens only
    np.testing.assert_array_equal(pair_ids(tokens[:10], 12), ids[:10])


def test_the_same_value_in_another_field_is_another_token_and_pairs_differ() -> None:
    t = np.array([[5, (1 << FIELD_SHIFT) | 7]], dtype=np.int64)
    swapped = np.array([[7, (1 << FIELD_SHIFT) | 5]], dtype=np.int64)
    assert not np.array_equal(pair_ids(t, 22), pair_ids(swapped, 22))


def test_bucket_tokens_carry_the_field_and_the_half_log_bucket() -> None:
    dense = np.log1p(np.array([[0.0, 3.0], [np.nan, -0.5], [100.0, 1.0]]))
    t = bucket_tokens(dense, 26)
    np.testing.assert_array_equal(t >> FIELD_SHIFT, [[26, 27]] * 3)
    np.testing.assert_array_equal(t & ((1 << FIELD_SHIFT) - 1), [[2, 4], [2, 2], [11, 3]])
    with pytest.raises(ValueError, match="exceed"):
        bucket_tokens(np.zeros((1, 3)), MAX_FIELDS - 2)


def test_the_fit_learns_a_pair_that_no_single_token_carries() -> None:
    tokens, y = xor_rows(4000, 0)
    later, y_later = xor_rows(2000, 1)
    none = np.zeros((len(y), 0))
    model = fit(pair_ids(tokens, 16), none, y, 1.0)
    assert auc(y_later, model.logits(pair_ids(later, 16), np.zeros((len(y_later), 0)))) > 0.75
    # the tokens alone (their pairs' columns dropped) carry nothing
    alone = fit(pair_ids(tokens, 16)[:, :3], none, y, 1.0)
    assert auc(y_later, alone.logits(pair_ids(later, 16)[:, :3], np.zeros((len(y_later), 0)))) < 0.6


def test_the_fit_is_the_minimum_of_the_l2_log_loss() -> None:
    tokens, y = xor_rows(3000, 2)
    rng = np.random.default_rng(3)
    dense = np.log1p(rng.exponential(2.0, (len(y), 2)))
    ids = pair_ids(tokens, 14)
    model = fit(ids, dense, y, 0.1)
    assert objective_gradient(model, ids, dense, y) < 1e-5
    # one Newton step is not the answer: the stopping rule, not the step count, ended the fit
    early = fit(ids, dense, y, 0.1, config=Poly2Config(newton_steps=1))
    assert objective_gradient(early, ids, dense, y) > 1e-3


def test_a_tokens_single_id_is_its_column_of_the_pair_ids() -> None:
    tokens = np.random.default_rng(4).integers(0, 1 << 62, (5, 4))
    np.testing.assert_array_equal(single_ids(tokens, 14), pair_ids(tokens, 14)[:, :4])


TIGHT = Poly2Config(tol=1e-8)
"""Fits to the minimum (the tests of the method): the default stops at scikit-learn's liblinear tolerance."""


def test_the_fit_is_scikit_learns_liblinear_fit() -> None:
    sklearn = pytest.importorskip("sklearn.linear_model")
    sp = pytest.importorskip("scipy.sparse")
    tokens, y = xor_rows(2000, 4)
    dense = np.log1p(np.random.default_rng(5).exponential(2.0, (len(y), 2)))
    ids = pair_ids(tokens, 14)
    model = fit(ids, dense, y, 0.3, config=TIGHT)
    used, col = np.unique(ids, return_inverse=True)
    onehot = sp.csr_matrix(
        (np.ones(ids.size), (np.repeat(np.arange(len(y)), ids.shape[1]), col.ravel())), shape=(len(y), used.size)
    )
    ref = sklearn.LogisticRegression(C=0.3, solver="liblinear", tol=1e-8, max_iter=10_000).fit(
        sp.hstack([onehot, sp.csr_matrix(dense)]).tocsr(), y
    )
    np.testing.assert_allclose(model.weights, ref.coef_[0][: used.size], atol=2e-4)
    np.testing.assert_allclose(model.dense_weights, ref.coef_[0][used.size :], atol=2e-4)
    assert model.bias == pytest.approx(ref.intercept_[0], abs=2e-4)


def test_a_warm_start_reaches_the_same_minimum() -> None:
    tokens, y = xor_rows(3000, 8)
    ids, none = pair_ids(tokens, 14), np.zeros((len(y), 0))
    cold = fit(ids, none, y, 0.3, config=TIGHT)
    warm = fit(ids, none, y, 0.3, config=TIGHT, start=fit(ids[:2000], none[:2000], y[:2000], 0.1))
    np.testing.assert_allclose(warm.weights, cold.weights, rtol=0, atol=1e-4)
    assert warm.bias == pytest.approx(cold.bias, abs=1e-4)
    assert objective_gradient(warm, ids, none, y) < 1e-5


def test_the_default_tolerance_stops_near_the_minimum() -> None:
    tokens, y = xor_rows(3000, 8)
    ids, none = pair_ids(tokens, 14), np.zeros((len(y), 0))
    stopped, minimum = fit(ids, none, y, 0.3), fit(ids, none, y, 0.3, config=TIGHT)
    gap = np.abs(stopped.logits(ids, none) - minimum.logits(ids, none)).max()
    assert 0 < gap < 0.01  # stopped short of the minimum, by less than a hundredth of a logit


def test_buckets_no_fit_row_used_weigh_nothing() -> None:
    tokens, y = xor_rows(500, 6)
    model = fit(pair_ids(tokens, 20), np.zeros((len(y), 0)), y, 1.0)
    unseen = np.full((2, 6), 2**20 - 1, dtype=np.int64)
    assert unseen[0, 0] not in model.buckets
    np.testing.assert_allclose(model.logits(unseen, np.zeros((2, 0))), model.bias)


def test_the_weights_of_ids_of_any_shape_are_each_ids_own_and_0_where_no_fit_row_used_it() -> None:
    rng = np.random.default_rng(0)
    buckets = np.unique(rng.integers(-(2**62), 2**62, 5_000))
    model = Poly2(buckets, rng.standard_normal(buckets.size), np.zeros(0), 0.0, 1.0)
    seen = rng.random((300, 7)) < 0.7  # repeats, unseen ids and both orders: the lookup sorts them, then puts back
    ids = np.where(seen, rng.choice(buckets, (300, 7)), rng.integers(-(2**62), 2**62, (300, 7)))
    weight = dict(zip(buckets.tolist(), model.weights.tolist(), strict=True))
    expected = np.array([[weight.get(i, 0.0) for i in row] for row in ids.tolist()])
    np.testing.assert_array_equal(model.weights_of(ids), expected)
    assert model.weights_of(ids[0]).shape == (7,) and model.weights_of(ids[:0]).shape == (0, 7)


def test_cross_validation_chooses_the_c_of_the_lowest_left_out_loss_and_refits_every_row() -> None:
    tokens, y = xor_rows(3000, 7)
    ids, none = pair_ids(tokens, 14), np.zeros((len(y), 0))
    model, losses = fit_cv(ids, none, y, config=Poly2Config(cs=(1e-4, 1.0), tol=1e-8))
    assert set(losses) == {1e-4, 1.0}
    assert model.C == min(losses, key=losses.__getitem__) == 1.0  # 1e-4 leaves the XOR unlearnt
    refit = fit(ids, none, y, 1.0, config=TIGHT)  # from zero weights: the minimum the refit reached
    np.testing.assert_allclose(model.weights, refit.weights, rtol=0, atol=1e-4)


@pytest.mark.parametrize(
    ("key", "value"), [("bits", 40), ("cs", ()), ("cs", (0.0,)), ("folds", 1), ("cv", "shuffled"), ("newton_steps", 0)]
)
def test_bad_settings_are_refused_naming_the_setting(key: str, value: object) -> None:
    with pytest.raises(ValueError, match=f"poly2 {key}"):
        Poly2Config(**{key: value})  # type: ignore[arg-type]


def test_cross_validation_needs_a_row_per_fold() -> None:
    tokens, y = xor_rows(2, 7)
    with pytest.raises(ValueError, match="at least 4 rows"):  # forward: 3 folds cut the rows into 4 blocks
        fit_cv(pair_ids(tokens, 14), np.zeros((2, 0)), y)
    with pytest.raises(ValueError, match="at least 3 rows"):
        fit_cv(pair_ids(tokens, 14), np.zeros((2, 0)), y, config=Poly2Config(cv="blocks"))


def test_the_c_search_stops_at_the_first_c_past_the_best() -> None:
    """Ascending Cs until one's left-out loss is above the best so far: the Cs it fit are a prefix of the grid, the
    last of them is worse than the best, and the best is the one a search of every C would choose."""
    tokens, y = xor_rows(1500, 7)
    ids, none = pair_ids(tokens, 14), np.zeros((len(y), 0))
    grid = (1e-4, 1e-2, 1.0, 1e2, 1e4, 1e6)
    model, losses = fit_cv(ids, none, y, config=Poly2Config(cs=grid))
    fit_cs = list(losses)
    assert fit_cs == list(grid[: len(fit_cs)]) and len(fit_cs) < len(grid)  # it stopped early here
    assert losses[fit_cs[-1]] > min(losses.values()) and min(losses, key=losses.__getitem__) == model.C
    every = {C: fit_cv(ids, none, y, config=Poly2Config(cs=(C,)))[1][C] for C in grid}
    assert min(every, key=every.__getitem__) == model.C  # the early stop lost nothing on this grid


def test_the_left_out_loss_is_each_blocks_score_by_a_fit_of_the_others_unseen_buckets_weighing_nothing() -> None:
    """`cv="blocks"`: each of the 3 blocks of rows, in row order, is scored by a fit of the other rows alone; the
    loss is over every row."""
    tokens, y = xor_rows(1200, 9)
    rare = (3 << FIELD_SHIFT) | np.random.default_rng(9).integers(2, 10**6, len(y))  # a value of almost every row
    ids, none = pair_ids(np.column_stack([tokens, rare]), 20), np.zeros((len(y), 0))
    _, losses = fit_cv(ids, none, y, config=Poly2Config(cs=(0.3,), folds=3, tol=1e-8, cv="blocks"))
    z = np.empty(len(y))
    for lo, hi in ((0, 400), (400, 800), (800, 1200)):
        others = np.r_[0:lo, hi : len(y)]
        model = fit(ids[others], none[others], y[others], 0.3, config=TIGHT)
        assert not np.isin(ids[lo:hi], model.buckets).all()  # the block has buckets the other rows never had
        z[lo:hi] = model.logits(ids[lo:hi], none[lo:hi])
    assert losses[0.3] == pytest.approx(logloss(y, 1 / (1 + np.exp(-z))), abs=1e-6)


def test_the_weights_do_not_depend_on_the_number_of_threads() -> None:
    tokens, y = xor_rows(2000, 10)
    ids, dense = pair_ids(tokens, 14), np.random.default_rng(0).random((len(y), 2))
    saved = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one, _ = fit_cv(ids, dense, y)
        torch.set_num_threads(2)
        two, _ = fit_cv(ids, dense, y)
    finally:
        torch.set_num_threads(saved)
    np.testing.assert_array_equal(one.weights, two.weights)
    np.testing.assert_array_equal(one.dense_weights, two.dense_weights)


def test_a_converged_fit_records_its_newton_steps_and_final_gradient() -> None:
    tokens, y = xor_rows(2000, 11)
    ids, none = pair_ids(tokens, 14), np.zeros((len(y), 0))
    done = fit(ids, none, y, 0.3).convergence
    assert done is not None and done.converged and done.stop == "tolerance"
    assert 1 <= done.newton_steps < Poly2Config().newton_steps and done.grad_ratio <= Poly2Config().tol
    assert done.grad_norm > 0 and done.to_dict()["converged"] is True


def test_a_fit_that_runs_out_of_newton_steps_warns_how_far_it_stopped_and_records_converged_false(caplog) -> None:
    tokens, y = xor_rows(2000, 11)
    ids, none = pair_ids(tokens, 14), np.zeros((len(y), 0))
    with caplog.at_level("WARNING", logger="trainer.companion.poly2"):
        model = fit(ids, none, y, 0.3, config=Poly2Config(newton_steps=1, tol=1e-10))
    done = model.convergence
    assert done is not None and not done.converged and done.stop == "newton_steps" and done.newton_steps == 1
    assert done.grad_ratio > 1e-10
    (warning,) = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert "of 2000 rows at C 0.3 stopped unconverged after 1 Newton steps" in warning
    assert f"{done.grad_ratio:.2e} of its norm at zero weights" in warning and "x the tolerance 1e-10" in warning


def test_a_failed_line_search_stops_the_fit_where_it_was_and_warns(monkeypatch, caplog) -> None:
    import trainer.companion.poly2 as poly2

    tokens, y = xor_rows(500, 12)
    ids, none = pair_ids(tokens, 14), np.zeros((len(y), 0))
    monkeypatch.setattr(poly2, "_line_search", lambda *a: None)  # no step decreases the objective
    with caplog.at_level("WARNING", logger="trainer.companion.poly2"):
        model = fit(ids, none, y, 0.3)
    assert model.convergence is not None and model.convergence.stop == "line_search"
    assert not model.convergence.converged and model.convergence.newton_steps == 0
    assert not model.weights.any() and model.bias == 0  # the weights it started from: no step was taken
    assert "line search found no step" in caplog.text


def test_forward_folds_score_each_block_by_a_fit_of_the_blocks_before_it_alone() -> None:
    """`cv="forward"`: 3 folds cut the rows into 4 blocks in row order; block k is scored by a fit of blocks 1..k-1
    (never of a later row), and the loss is over the scored rows (all but the first block)."""
    tokens, y = xor_rows(1200, 9)
    ids, none = pair_ids(tokens, 14), np.zeros((len(y), 0))
    config = Poly2Config(cs=(0.3,), folds=3, tol=1e-8, cv="forward")
    _, losses = fit_cv(ids, none, y, config=config)
    z = np.empty(len(y))
    for lo, hi in ((300, 600), (600, 900), (900, 1200)):
        model = fit(ids[:lo], none[:lo], y[:lo], 0.3, config=TIGHT)
        z[lo:hi] = model.logits(ids[lo:hi], none[lo:hi])
    assert losses[0.3] == pytest.approx(logloss(y[300:], 1 / (1 + np.exp(-z[300:]))), abs=1e-6)
    assert Poly2Config().cv == "forward"  # the default (the rolling benchmark: the same Cs, in less time)
    with pytest.raises(ValueError, match="at least 4 rows"):
        fit_cv(ids[:3], none[:3], y[:3], config=config)
