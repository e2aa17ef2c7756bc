"""Choosing a small day's `optim.sparse_lr` by cross-validation: `choose_sparse_lr(labels, dense, keys, optim=...)`.

Embedding rows train with a per-row adaptive rule (row-wise AdaGrad or Adam, `optim.sparse_optimizer`),
which moves a row by about `sparse_lr` on its first touches whatever its gradient, so `sparse_lr`
decides how far a key seen a few times may move: the shrinkage that
C sets in a logistic regression.  No one value suits every dataset: the shared samples want opposite ones
(`docs/reports/2026-12-01-daily-recipe.md`); scikit-learn settles the same question by cross-validating C.

So a day of at most MAX_ROWS train rows whose `sparse_lr` is `auto` gets it chosen here: a
logistic regression on the day's keys and dense columns, trained as the embedding rows are (the
per-key rule of `optim.sparse_optimizer`, the recipe's batch, passes, warm-up, decay and embedding L2), is
cross-validated over
`FOLDS` contiguous blocks of the train rows for each of `FACTORS` times the derived value, and the
candidate with the lowest mean held-out logloss wins (ties go to the derived value).  The dense
weights train at the dense `optim.lr` and the bias starts at the click rate, as the model's own bias
reaches it within the warm-up.  It is a proxy, a linear model where the product also trains a deep
part, chosen because it is cheap on such a day where a training of the real model per candidate and
fold costs a torchrun each.  Pure NumPy, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from storage.embedding.rows.sparse_optim import ADAGRAD_EPS, ADAM_BETAS, ADAM_EPS, SparseAdam, get_optimizer
from trainer.config import ResolvedOptim
from trainer.optim.schedule import lr_at

MAX_ROWS = 50_000
"""Days with more train rows keep the derived value (their passes are long enough: the search is for small days)."""
FOLDS = 5
FACTORS = (0.5, 1.0, 2.0, 4.0)
"""Candidates, as multiples of the derived `sparse_lr`."""
TIE = 1e-4
"""A candidate must lower the mean held-out logloss by more than this to replace the derived value."""


@dataclass(frozen=True)
class SparseLrChoice:
    lr: float
    logloss: dict[float, float]
    """Candidate -> mean held-out logloss over the folds."""
    rows: int
    folds: int

    def reason(self) -> str:
        """Why `optim.sparse_lr` has its value, for the recipe's record."""
        scores = ", ".join(f"{lr:g}: {loss:.4f}" for lr, loss in self.logloss.items())
        return (
            f"{self.folds}-fold validation of a per-key logistic regression on the day's {self.rows:,} "
            f"train rows, the lowest held-out logloss ({scores})"
        )


def choose_sparse_lr(
    labels: np.ndarray,
    dense: np.ndarray,
    keys: np.ndarray,
    *,
    optim: ResolvedOptim,
    folds: int = FOLDS,
    factors: tuple[float, ...] = FACTORS,
) -> SparseLrChoice:
    """The candidate `sparse_lr` (`factors` times `optim.sparse_lr`) with the lowest mean held-out logloss.

    Args:
        labels, dense, keys: the day's train rows in file order: (N,), (N, D) and (N, F) int64 keys.
        optim: the resolved recipe (`trainer.plan.recipe.derive`): every number the search trains with.

    Raises:
        ValueError: fewer rows than folds, or an `optim` field still `auto`.
    """
    if optim.unresolved():
        raise ValueError(f"choose_sparse_lr needs a resolved recipe, got {optim.unresolved()} still auto")
    n = len(labels)
    if n < folds or folds < 2:
        raise ValueError(
            f"choose_sparse_lr needs at least {max(2, folds)} rows and 2 folds, got {n} rows, {folds} folds"
        )
    index, values, n_ids, width = _design(dense, keys)
    bounds = np.linspace(0, n, folds + 1).astype(np.int64)
    base = float(optim.sparse_lr)
    logloss: dict[float, float] = {}
    for factor in factors:
        lr = float(f"{base * factor:.3g}")
        losses = []
        for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
            fit = np.r_[0:lo, hi:n]
            w = _train(
                index[fit], values[fit], labels[fit], width, optim=optim, lr=lr, n_fields=keys.shape[1], n_ids=n_ids
            )
            losses.append(_logloss(labels[lo:hi], _logits(w, index[lo:hi], values[lo:hi])))
        logloss[lr] = float(np.mean(losses))
    derived = float(f"{base:.3g}")
    best = min(logloss, key=logloss.__getitem__)
    if derived in logloss and logloss[best] > logloss[derived] - TIE:
        best = derived
    return SparseLrChoice(best, logloss, n, folds)


def _design(dense: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, int, int]:
    """Every row as (index, value) pairs: its F keys (ids below n_ids, the number of distinct keys; value
    1), its D dense columns standardised, and a bias (ids n_ids .. n_ids + D).  Returns
    (index, values, n_ids, width = n_ids + D + 1)."""
    n = keys.shape[0]
    _, inverse = np.unique(keys, return_inverse=True)
    ids = inverse.reshape(n, -1)
    n_ids = int(ids.max()) + 1 if ids.size else 0
    d = dense.shape[1] if dense.ndim == 2 else 0
    x = (dense - dense.mean(0)) / (dense.std(0) + 1e-6) if d else np.zeros((n, 0))
    index = np.concatenate([ids, np.broadcast_to(n_ids + np.arange(d + 1), (n, d + 1))], axis=1)
    values = np.concatenate([np.ones(ids.shape), x, np.ones((n, 1))], axis=1)
    return index.astype(np.int64), values.astype(np.float64), n_ids, n_ids + d + 1


def _logits(w: np.ndarray, index: np.ndarray, values: np.ndarray) -> np.ndarray:
    return (w[index] * values).sum(1)


def _logloss(y: np.ndarray, z: np.ndarray) -> float:
    return float(np.mean(np.logaddexp(0.0, z) - y * z))  # -y log p - (1 - y) log (1 - p), p = sigmoid(z)


def _train(
    index: np.ndarray,
    values: np.ndarray,
    y: np.ndarray,
    width: int,
    *,
    optim: ResolvedOptim,
    lr: float,
    n_fields: int,
    n_ids: int,
) -> np.ndarray:
    """Weights after the recipe's passes over the rows in order: the rule of `optim.sparse_optimizer` at `lr` on
    the key weights (as `storage.embedding.rows.sparse_optim`, a row of width 1), Adam at the dense `optim.lr` on the
    dense and bias weights (ids >= n_ids)."""
    b1, b2 = ADAM_BETAS
    rule = optim.sparse_optimizer
    adam_like = isinstance(get_optimizer(rule), SparseAdam)
    w, m, v, clock = np.zeros(width), np.zeros(width), np.zeros(width), np.zeros(width)
    acc = np.zeros(width)  # row-wise AdaGrad's accumulator of the key weights
    rate_y = float(np.clip(y.mean(), 1e-4, 1 - 1e-4))
    w[-1] = np.log(rate_y / (1 - rate_y))  # the bias starts at the click rate: the keys need not carry it
    n, batch, l2 = len(y), int(optim.batch_size), float(optim.embedding_l2)
    total = int(optim.epochs) * -(-n // batch)
    kw: dict[str, Any] = {
        "total_steps": total,
        "warmup_steps": min(int(optim.warmup_steps), total),
        "decay": optim.lr_decay,
        "min_ratio": optim.min_lr_ratio,
    }
    step = 0
    for _ in range(int(optim.epochs)):
        for lo in range(0, n, batch):
            step += 1
            rate_keys, rate_rest = lr_at(step, base_lr=lr, **kw), lr_at(step, base_lr=float(optim.lr), **kw)
            idx, val = index[lo : lo + batch], values[lo : lo + batch]
            r = 1.0 / (1.0 + np.exp(-_logits(w, idx, val))) - y[lo : lo + batch]
            touched, inv = np.unique(idx, return_inverse=True)
            inv = inv.reshape(idx.shape)
            g = np.bincount(inv.ravel(), weights=(r[:, None] * val).ravel(), minlength=len(touched)) / len(r)
            if l2:  # the embedding L2 of `trainer.optim.schedule.embedding_l2_grad`, on the keys only
                uses = np.bincount(inv[:, :n_fields].ravel(), minlength=len(touched))
                g += l2 * w[touched] * uses / len(r)
            clock[touched] += 1
            m[touched] = b1 * m[touched] + (1 - b1) * g
            v[touched] = b2 * v[touched] + (1 - b2) * g * g
            t = clock[touched]
            unit = m[touched] / (1 - b1**t) / (np.sqrt(v[touched] / (1 - b2**t)) + ADAM_EPS)  # Adam's step at lr 1
            key = touched < n_ids
            if adam_like:  # adam and the row-wise Adams: on one value per key, row-wise v is v
                key_step = rate_keys * unit
            elif rule == "rmsprop":
                key_step = rate_keys * g / (np.sqrt(v[touched] / (1 - b2**t)) + ADAM_EPS)
            elif rule == "rowwise_adagrad":
                acc[touched] += np.where(key, g * g, 0.0)
                key_step = rate_keys * g / (np.sqrt(acc[touched]) + ADAGRAD_EPS)
            else:  # sgd
                key_step = rate_keys * g
            w[touched] -= np.where(key, key_step, rate_rest * unit)
    return w
