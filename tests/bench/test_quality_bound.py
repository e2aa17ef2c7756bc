"""The planted-form fit has exactly the generator's form: given the true weights it gives the true
probabilities, and fit on a day's rows it learns more than a model of the weighted fields alone."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bench.quality_bound import (
    PlantedFormModel,
    encode,
    planted_form,
    planted_form_fit,
    train_planted_form,
)
from bench.quality_data import synthetic_days
from pipeline import generate as g
from trainer.eval.metrics import auc
from trainer.threads import torch_threads

SEED, PAIRS = 0, 8


def _days(rows: int, out):
    files = synthetic_days(rows, out, interactions=PAIRS, seed=SEED)
    truth_train = np.concatenate([np.load(files.path(d).replace(".tsv.gz", ".truth.npy")) for d in files.train_dates])
    return files, files.train_events(), files.later_events(), truth_train


def _ids_of_text(field: int, texts) -> np.ndarray:
    """Invert the generator's value text: every id a field can have on the three days, formatted."""
    card = g.CARDINALITY[field]
    ids = np.arange(card + 3 * max(1, int(card * g.DAILY_SHIFT)))
    text = g._value_text(SEED, field, ids, np.zeros(len(ids), bool)).to_pylist()
    of = dict(zip(text, ids, strict=True))
    return np.array([of[t] for t in texts], dtype=np.int64)


def test_the_true_weights_give_the_true_probabilities(tmp_path) -> None:
    files, train, later, truth = _days(12_000, tmp_path)
    form = planted_form(SEED, PAIRS)
    rows, _, vocab = encode(train, later, form)
    model = PlantedFormModel(form, vocab)
    ids = {j: _ids_of_text(j, vocab[j]) for j in form.fields}
    with torch.no_grad():
        for j in form.weighted:
            model.w[str(j)].weight[1:, 0] = torch.as_tensor(g.WEIGHTED_FIELDS[j] * g._normal(SEED, j, ids[j]))
        for j in form.latent:  # PAIR_SCALE * <l_a, l_b> = <V_a, V_b> with V = sqrt(PAIR_SCALE) * l
            model.v[str(j)].weight[1:] = torch.as_tensor(g.PAIR_SCALE**0.5 * g._latent(SEED, j, ids[j]))
        model.alpha.fill_(g.TRIPLE_SCALE * g.LATENT_DIM**0.25 / g.PAIR_SCALE**1.5)
        a, b, scale = g.INTERACTION
        code = vocab[-1].to_numpy()
        pair_ids = ids[a][code // (1 << 20) - 1] * 1_000_003 + ids[b][code % (1 << 20) - 1]
        model.u.weight[1:, 0] = torch.as_tensor(scale * g._normal(SEED, 100 + a, pair_ids))
        model.dense.weight[0] = torch.as_tensor([g.DENSE_EFFECTS[i] for i in form.dense])
        model.dense.bias.fill_(g.INTERCEPT)
        probs = torch.sigmoid(model(rows)[0]).numpy()
    assert len(probs) == len(truth) == 9_600
    np.testing.assert_allclose(probs, truth, atol=1e-5)


@pytest.mark.slow
def test_fit_on_100k_rows_learns_the_interactions_and_stays_below_the_ceiling(tmp_path) -> None:
    files, train, later, _ = _days(100_000, tmp_path)  # at 40k rows the interactions add 0.001
    # One torch thread: the fits' steps are small ops, and under `make test` (two workers on two cores, their
    # processes beside them) a second intra-op thread waits at every op's barrier: 10x the time, the same fit.
    with torch_threads(1):
        probs, info = planted_form_fit(train, later, seed=SEED, interactions=PAIRS)
        form = planted_form(SEED, PAIRS)
        first_order = type(form)(form.weighted, (), (), None, form.pair_table, form.dense)  # no latent terms
        tr, te, vocab = encode(train, later, first_order)
        model, _ = train_planted_form(
            first_order, vocab, tr, torch.arange(len(tr.label)), l2=info["l2"], epochs=info["epochs"], seed=0
        )
        with torch.no_grad():
            first = torch.sigmoid(model(te)[0]).double().numpy()
    y = later["label"].to_numpy(np.float64)
    assert info["l2"] in (1e-3, 1e-2, 1e-1) and 1 <= info["epochs"] <= 6
    assert auc(y, first) + 0.01 < auc(y, probs) < auc(y, files.truth)
