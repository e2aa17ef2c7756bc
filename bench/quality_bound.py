"""What a learner that knows the planted click model's form gets from the synthetic rows.

The ceiling of `bench.quality` is the AUC of the true probabilities: no model trained on a finite
sample reaches it, since a rare value's weight or latent vector is seen a few times at most and a
value first seen on the later day is not seen at all.  This fit says how much of that gap is the
sample's: a model with exactly the generator's form (`pipeline.generate`: a weight per value of
the weighted fields, the planted pair's own weight table, the dense effects on the generator's
standardised log1p, one latent vector per value shared by the planted pairs and the three-way
term), with nothing else to learn, trained with Adam on the same training rows.  Its L2 and
passes are chosen on the last tenth of the training rows, then it is refit on all of them.

What it does not know is only the values' weights, so its AUC on the later day is a reference for
what a general-purpose model can be expected to reach on that many rows: not a proof (a better
estimator of the same form could get more), and not something `ctrpipe` runs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import nn

from pipeline import generate

L2S = (1e-3, 1e-2, 1e-1)
"""L2 on the looked-up rows (per example) tried on the held-out tenth (chosen: 1e-2 at 100k rows, 1e-3 at 1M)."""
MAX_EPOCHS = 6
"""Passes tried per L2; one stops at the first pass whose held-out AUC is below the best before it."""
BATCH = (256, 2048)
"""Batch size: the rows / 200 within these bounds, so a small sample still takes 200 steps a pass."""
LR = 0.01
_PAIR_ID = 1 << 20
"""id_a * _PAIR_ID + id_b names one value pair of the planted pair's weight table (ids < 2**20)."""


@dataclass(frozen=True)
class PlantedForm:
    """Which fields and terms the generator's click model has (0-based categorical indexes)."""

    weighted: tuple[int, ...]
    latent: tuple[int, ...]
    pairs: tuple[tuple[int, int], ...]
    triple: tuple[int, int, int] | None
    pair_table: tuple[int, int]
    """The two fields whose value pair has its own weight (`generate.INTERACTION`)."""
    dense: tuple[int, ...]

    @property
    def fields(self) -> tuple[int, ...]:
        return tuple(sorted({*self.weighted, *self.latent, *self.pair_table}))


def planted_form(seed: int, interactions: int) -> PlantedForm:
    pairs, triple = generate.planted_interactions(seed, interactions)
    latent = tuple(sorted({*(f for p in pairs for f in p), *(triple or ())}))
    return PlantedForm(
        tuple(sorted(generate.WEIGHTED_FIELDS)),
        latent,
        pairs,
        triple,
        generate.INTERACTION[:2],
        tuple(sorted(generate.DENSE_EFFECTS)),
    )


@dataclass(frozen=True)
class Encoded:
    """Rows as the fit reads them: index 0 is a missing value or one the training rows never showed."""

    ids: dict[int, torch.Tensor]
    pair: torch.Tensor
    dense: torch.Tensor
    label: torch.Tensor


def encode(train: pd.DataFrame, later: pd.DataFrame, form: PlantedForm) -> tuple[Encoded, Encoded, dict[int, pd.Index]]:
    """Index every value of the training rows per field (row i + 1 of a table is `vocab[field][i]`; the
    planted pair's table is `vocab[-1]`, of codes `index_a * 2**20 + index_b`); returns both row sets
    and `vocab`."""
    out: dict[str, dict] = {"train": {}, "later": {}}
    vocab: dict[int, pd.Index] = {}
    for j in form.fields:
        values = vocab[j] = pd.Index(train[f"C{j + 1}"].dropna().unique())
        for name, frame in (("train", train), ("later", later)):
            col = frame[f"C{j + 1}"]
            idx = values.get_indexer(col.fillna("")) + 1  # unseen -> 0
            out[name][j] = np.where(col.isna().to_numpy(), 0, idx)
    a, b = form.pair_table
    pairs = [np.where((o[a] > 0) & (o[b] > 0), o[a] * _PAIR_ID + o[b], -1) for o in (out["train"], out["later"])]
    seen = vocab[-1] = pd.Index(np.unique(pairs[0][pairs[0] >= 0]))
    pair_idx = [np.where(p >= 0, seen.get_indexer(p) + 1, 0) for p in pairs]

    def rows(frame: pd.DataFrame, ids: dict[int, np.ndarray], pair: np.ndarray) -> Encoded:
        z = []
        for i in form.dense:
            x = frame[f"I{i + 1}"]
            v = (np.log1p(np.maximum(x.fillna(0).to_numpy(np.float64), 0)) - generate.DENSE_LOG_MEAN[i]) / 1.2
            z.append(np.where(x.isna().to_numpy(), 0.0, v))
        return Encoded(
            {j: torch.as_tensor(v, dtype=torch.int64) for j, v in ids.items()},
            torch.as_tensor(np.maximum(pair, 0), dtype=torch.int64),
            torch.as_tensor(np.stack(z, 1), dtype=torch.float32),
            torch.as_tensor(frame["label"].to_numpy(np.float32)),
        )

    return rows(train, out["train"], pair_idx[0]), rows(later, out["later"], pair_idx[1]), vocab


class PlantedFormModel(nn.Module):
    """logit = b + <c, z> + u[pair] + sum_weighted w_f + sum_pairs <V_a, V_b> + alpha * sum_k V_a V_b V_c."""

    def __init__(self, form: PlantedForm, vocab: dict[int, pd.Index], *, latent_dim: int = generate.LATENT_DIM) -> None:
        super().__init__()
        self.form = form
        sizes = {j: len(v) + 1 for j, v in vocab.items()}
        self.w = nn.ModuleDict({str(j): nn.Embedding(sizes[j], 1, padding_idx=0) for j in form.weighted})
        self.v = nn.ModuleDict({str(j): nn.Embedding(sizes[j], latent_dim, padding_idx=0) for j in form.latent})
        self.u = nn.Embedding(sizes[-1], 1, padding_idx=0)
        for table in [*self.w.values(), self.u]:
            nn.init.normal_(table.weight, std=0.01)
        for table in self.v.values():  # products of small vectors have vanishing gradients: start at O(1)
            nn.init.normal_(table.weight, std=0.3)
        for table in [*self.w.values(), *self.v.values(), self.u]:
            with torch.no_grad():
                table.weight[0].zero_()
        self.dense = nn.Linear(len(form.dense), 1)
        self.alpha = nn.Parameter(torch.tensor(0.1))

    def forward(self, rows: Encoded, index: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits, sum of the squared looked-up rows) of `rows` (or of its rows at `index`)."""
        pick = (lambda t: t) if index is None else (lambda t: t[index])
        looked = [self.u(pick(rows.pair))]
        logit = self.dense(pick(rows.dense)).squeeze(1) + looked[0].squeeze(1)
        for j in self.form.weighted:
            looked.append(self.w[str(j)](pick(rows.ids[j])))
            logit = logit + looked[-1].squeeze(1)
        v = {j: self.v[str(j)](pick(rows.ids[j])) for j in self.form.latent}
        looked += v.values()
        for a, b in self.form.pairs:
            logit = logit + (v[a] * v[b]).sum(1)
        if self.form.triple:
            a, b, c = self.form.triple
            logit = logit + self.alpha * (v[a] * v[b] * v[c]).sum(1)
        return logit, sum((t**2).sum() for t in looked)


def train_planted_form(
    form: PlantedForm,
    vocab: dict[int, pd.Index],
    rows: Encoded,
    index: torch.Tensor,
    *,
    l2: float,
    epochs: int,
    seed: int,
    score: Encoded | None = None,
    score_index: torch.Tensor | None = None,
) -> tuple[nn.Module, list[float]]:
    """Adam over `index` for `epochs` shuffled passes; the AUC on (`score`, `score_index`) after each."""
    from trainer.eval.metrics import auc

    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = PlantedFormModel(form, vocab)
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    aucs: list[float] = []
    size = min(max(len(index) // 200, BATCH[0]), BATCH[1])
    for _ in range(epochs):
        order = index[torch.randperm(len(index), generator=gen)]
        for start in range(0, len(order), size):
            batch = order[start : start + size]
            logit, sq = model(rows, batch)
            loss = nn.functional.binary_cross_entropy_with_logits(logit, rows.label[batch]) + l2 * sq / len(batch)
            opt.zero_grad()
            loss.backward()
            opt.step()
        if score is not None:
            with torch.no_grad():
                p = torch.sigmoid(model(score, score_index)[0]).double().numpy()
            y = (score.label if score_index is None else score.label[score_index]).double().numpy()
            aucs.append(auc(y, p))
            if len(aucs) > 1 and aucs[-1] < max(aucs[:-1]):
                break
    return model, aucs


def planted_form_fit(
    train: pd.DataFrame, later: pd.DataFrame, *, seed: int, interactions: int, fit_seed: int = 0
) -> tuple[np.ndarray, dict[str, Any]]:
    """Probabilities of `later`'s rows from the planted-form model fit on `train` (rows in time order).

    `seed` and `interactions` are the generator's (they name the form); `fit_seed` the fit's own.
    """
    t0 = time.perf_counter()
    form = planted_form(seed, interactions)
    tr, te, vocab = encode(train, later, form)
    n = len(tr.label)
    fit_idx, held = torch.arange(n - n // 10), torch.arange(n - n // 10, n)
    scores = {
        l2: train_planted_form(
            form, vocab, tr, fit_idx, l2=l2, epochs=MAX_EPOCHS, seed=fit_seed, score=tr, score_index=held
        )[1]
        for l2 in L2S
    }
    l2, epochs = max(
        ((l2, e + 1) for l2, s in scores.items() for e in range(len(s))), key=lambda k: scores[k[0]][k[1] - 1]
    )
    model, _ = train_planted_form(form, vocab, tr, torch.arange(n), l2=l2, epochs=epochs, seed=fit_seed)
    with torch.no_grad():
        probs = torch.sigmoid(model(te)[0]).double().numpy()
    unseen = {f"C{j + 1}": float((te.ids[j] == 0).double().mean()) for j in form.latent}
    held_out = {str(k): [round(a, 4) for a in v] for k, v in scores.items()}
    return probs, {
        "l2": l2,
        "epochs": epochs,
        "held_out_auc": held_out,
        "later_unseen_or_missing": unseen,
        "s": time.perf_counter() - t0,
    }
