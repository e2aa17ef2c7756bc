"""A degree-2 polynomial logistic regression ("Poly2"): a weight per token and per pair of a row's tokens.

Why it is here: on small days, the mean of its logit and the default model's gains on both real samples
(issue 31, `docs/reports/2026-12-05-companion.md`).  The two err on different rows: the
default is trained by Adam through a warm-started chain, a day at a time; this is a converged full-batch fit,
with a strong L2, of every row it is given.  It is the learner of `model.companion` (`trainer.companion`), and
of `bench.quality_rolling`'s `poly2` row and probe.

numpy and torch's sparse CSR products, no scikit-learn (not a runtime dependency): tokens are int64 keys
(`pipeline.encode.keys`: the field in the top bits), the pairs are hashed into 2^bits buckets, and the objective
is scikit-learn's liblinear one (C times the summed log loss plus half the squared weights, the intercept
penalised too), minimised by a truncated Newton method (conjugate gradients on Hessian-vector products, a
backtracking line search): a row's design is a fixed number of buckets with value 1, so X v and X^T u are
products with a CSR matrix of ones (`_Design`).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from storage.key_layout import FIELD_SHIFT, MAX_FIELDS
from trainer.eval.metrics import logloss

_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


@dataclass(frozen=True, kw_only=True)
class Poly2Config:
    """How a Poly2 LR is fit."""

    bits: int = 22
    """Hash buckets, 2^bits, shared by the tokens and their pairs."""
    cs: tuple[float, ...] = (0.001, 0.003, 0.01, 0.03, 0.1)
    """Inverse L2 strengths tried by `fit_cv` (scikit-learn's C)."""
    folds: int = 3
    """`fit_cv`'s blocks of rows, each left out of one fit: 3 chose as 5 did on both real samples' lineages, in
    less time (`docs/reports/2026-12-05-companion.md`)."""
    newton_steps: int = 30
    tol: float = 1e-4
    """Stop when the gradient's norm is below tol times its norm at zero weights (liblinear's rule: measured
    against zero weights, so a warm start stops as near the minimum as a cold one; 1e-4 is scikit-learn's
    liblinear default).  Against 1e-6 it fits in less time, with the same C and nearly the same logits, on the
    real samples' lineages."""

    def __post_init__(self) -> None:
        if not 8 <= self.bits <= 30:
            raise ValueError(f"poly2 bits must be in [8, 30], got {self.bits}")
        if not self.cs or min(self.cs) <= 0:
            raise ValueError(f"poly2 cs must be positive, got {self.cs}")
        if self.folds < 2:
            raise ValueError(f"poly2 folds must be >= 2 (each fold leaves out a block of rows), got {self.folds}")


def _mix(z: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, elementwise on uint64 (wrapping)."""
    z = z ^ (z >> np.uint64(30))
    z = z * _M1
    z = z ^ (z >> np.uint64(27))
    z = z * _M2
    return z ^ (z >> np.uint64(31))


def bucket_tokens(log_dense: np.ndarray, first_field: int) -> np.ndarray:
    """(N, n) int64 tokens of dense values already in log1p: column c's token is field `first_field` + c with
    the bucket floor(2 x) (a NaN or negative value: bucket 0) as its hash part."""
    n = log_dense.shape[1]
    if first_field < 0 or first_field + n > MAX_FIELDS:
        raise ValueError(f"dense bucket fields {first_field}..{first_field + n - 1} exceed {MAX_FIELDS} fields")
    b = np.floor(2 * np.nan_to_num(np.maximum(log_dense, 0.0), nan=0.0)).astype(np.int64)
    fields = (np.arange(first_field, first_field + n, dtype=np.int64) << FIELD_SHIFT)[None, :]
    return fields | (b + 2)


def pair_ids(tokens: np.ndarray, bits: int) -> np.ndarray:
    """(N, T) int64 tokens -> (N, T + T(T-1)/2) int64 bucket ids in [0, 2^bits): each token's and each unordered
    pair's (i < j by column).  Tokens carry their field, so a value's pairs differ by the field they pair with."""
    t = np.ascontiguousarray(tokens, dtype=np.int64).view(np.uint64)
    i, j = np.triu_indices(t.shape[1], 1)
    shift = np.uint64(64 - bits)
    with np.errstate(over="ignore"):
        single = _single_hash(t)
        pairs = _mix(single[:, i] * np.uint64(31) + _mix(t[:, j]))
    return (np.concatenate([single, pairs], axis=1) >> shift).astype(np.int64)


def single_ids(tokens: np.ndarray, bits: int) -> np.ndarray:
    """(N, T) int64 tokens -> (N, T) bucket ids: each token's alone, the first T columns of `pair_ids`."""
    t = np.ascontiguousarray(tokens, dtype=np.int64).view(np.uint64)
    with np.errstate(over="ignore"):
        return (_single_hash(t) >> np.uint64(64 - bits)).astype(np.int64)


def _single_hash(t: np.ndarray) -> np.ndarray:
    """A token's 64-bit hash (uint64 in, uint64 out; the caller silences overflow)."""
    return _mix(t + _GOLDEN)


@dataclass(frozen=True)
class Poly2:
    """A fit Poly2 LR: the weights of the buckets some fit row used (every other bucket's weight is 0)."""

    buckets: np.ndarray
    """Sorted int64 bucket ids."""
    weights: np.ndarray
    """float64, aligned with `buckets`."""
    dense_weights: np.ndarray
    """float64 (n,): the weights of the log1p dense values."""
    bias: float
    C: float

    def weights_of(self, ids: np.ndarray) -> np.ndarray:
        """The weights of bucket ids (any shape), 0 for a bucket no fit row used."""
        if not self.buckets.size:
            return np.zeros(ids.shape)
        pos = np.minimum(np.searchsorted(self.buckets, ids), self.buckets.size - 1)
        return np.where(self.buckets[pos] == ids, self.weights[pos], 0.0)

    def logits(self, ids: np.ndarray, log_dense: np.ndarray) -> np.ndarray:
        """(N,) float64 logits of rows given as `pair_ids` (N, P) and log1p dense values (N, n)."""
        return self.weights_of(ids).sum(axis=1) + log_dense @ self.dense_weights + self.bias


class _Design:
    """X = [one-hot of the compact bucket ids | dense | 1]: X v and X^T u as two CSR products.

    The one-hot part is held twice, as X's rows and as X^T's (torch sparse CSR: each output element is one
    row's sum, in a fixed order, so a fit is deterministic), which is faster than a numpy gather and bincount."""

    def __init__(self, cols: np.ndarray, dense: np.ndarray, width: int) -> None:
        n, per_row = cols.shape
        self.dense, self.width, self.nd = dense, width, dense.shape[1]
        index = torch.int32 if n * per_row < 2**31 else torch.int64  # int32: a third faster products
        crow = torch.arange(0, n * per_row + 1, per_row, dtype=index)
        flat = torch.from_numpy(np.ascontiguousarray(cols, dtype=np.int64).ravel()).to(index)
        with warnings.catch_warnings():  # "sparse CSR support is in beta": the two products used here are not
            warnings.simplefilter("ignore", UserWarning)
            self._x = torch.sparse_csr_tensor(
                crow, flat, torch.ones(flat.numel(), dtype=torch.float64), size=(n, width), check_invariants=False
            )
            xt = self._x.to_sparse_csc()
            self._xt = torch.sparse_csr_tensor(
                xt.ccol_indices(), xt.row_indices(), xt.values(), size=(width, n), check_invariants=False
            )

    @property
    def size(self) -> int:
        return self.width + self.nd + 1

    def matvec(self, v: np.ndarray) -> np.ndarray:
        onehot = (self._x @ torch.from_numpy(np.ascontiguousarray(v[: self.width]))).numpy()
        return onehot + self.dense @ v[self.width : self.width + self.nd] + v[-1]

    def rmatvec(self, u: np.ndarray) -> np.ndarray:
        out = np.empty(self.size)
        out[: self.width] = (self._xt @ torch.from_numpy(np.ascontiguousarray(u, dtype=np.float64))).numpy()
        out[self.width : self.width + self.nd] = self.dense.T @ u
        out[-1] = u.sum()
        return out


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-z))


def _objective(C: float, z: np.ndarray, y: np.ndarray, w: np.ndarray) -> float:
    return float(C * (np.logaddexp(0.0, z) - y * z).sum() + 0.5 * w @ w)


def _numbered(ids: np.ndarray, log_dense: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the rows' columns: each id's number among the sorted distinct ids, the sorted distinct ids)."""
    n = len(labels)
    if n == 0 or ids.shape[0] != n or log_dense.shape[0] != n:
        raise ValueError(f"poly2 fit needs rows: ids {ids.shape}, dense {log_dense.shape}, labels ({n},)")
    codes, found = pd.factorize(np.ascontiguousarray(ids, dtype=np.int64).ravel())  # hashing: np.unique's sort
    order = np.argsort(found)  # took 7x longer on 5M ids
    rank = np.empty(order.size, dtype=np.int64)
    rank[order] = np.arange(order.size)
    return rank[codes].reshape(ids.shape), found[order]


class _Fold:
    """The rows but a block [lo, hi), on the buckets they use (`rows`), and the block's columns in their numbering
    (-1: a bucket no other row has, whose weight in the fold's fit is 0): a fit of the other rows, scored on the
    block, with no lookup of the ids again."""

    def __init__(
        self, cols: np.ndarray, buckets: np.ndarray, log_dense: np.ndarray, labels: np.ndarray, lo: int, hi: int
    ) -> None:
        self.lo, self.hi = lo, hi
        keep = np.concatenate([cols[:lo], cols[hi:]])
        self.used = np.zeros(buckets.size, dtype=bool)
        self.used[keep] = True
        number = np.cumsum(self.used) - 1
        self.rows = _Rows(
            number[keep],
            buckets[self.used],
            np.concatenate([log_dense[:lo], log_dense[hi:]]),
            np.concatenate([labels[:lo], labels[hi:]]),
        )
        block = cols[lo:hi]
        self.block = np.where(self.used[block], number[block], -1)
        self.block_dense = log_dense[lo:hi]

    def block_logits(self, w: np.ndarray) -> np.ndarray:
        k = self.rows.buckets.size
        return np.append(w[:k], 0.0)[self.block].sum(axis=1) + self.block_dense @ w[k:-1] + w[-1]


class _Rows:
    """Rows ready to fit: their columns (compact bucket numbers, in bucket order), design and labels (built once
    for every C fit on them)."""

    def __init__(self, cols: np.ndarray, buckets: np.ndarray, log_dense: np.ndarray, labels: np.ndarray) -> None:
        self.buckets = buckets
        self.X = _Design(cols, log_dense, buckets.size)
        self.y = labels

    @classmethod
    def of(cls, ids: np.ndarray, log_dense: np.ndarray, labels: np.ndarray) -> _Rows:
        cols, buckets = _numbered(ids, log_dense, labels)
        return cls(cols, buckets, np.asarray(log_dense, dtype=np.float64), np.asarray(labels, dtype=np.float64))

    def start(self, model: Poly2 | None) -> np.ndarray:
        """The weight vector of `model` on these rows' buckets (0 where it has none), or zeros."""
        w = np.zeros(self.X.size)
        if model is not None:
            w[: self.buckets.size] = model.weights_of(self.buckets)
            w[self.buckets.size : -1], w[-1] = model.dense_weights, model.bias
        return w

    def model(self, w: np.ndarray, C: float) -> Poly2:
        k = self.buckets.size
        return Poly2(buckets=self.buckets, weights=w[:k].copy(), dense_weights=w[k:-1].copy(), bias=float(w[-1]), C=C)


def fit(
    ids: np.ndarray,
    log_dense: np.ndarray,
    labels: np.ndarray,
    C: float,
    *,
    config: Poly2Config = Poly2Config(),
    start: Poly2 | None = None,
) -> Poly2:
    """The Poly2 LR of rows `ids` (N, P) (`pair_ids`), log1p dense values (N, n) and 0/1 labels, at inverse L2 C.

    Args:
        start: a fit to start from (its weights of the buckets these rows use, else 0): the same minimum, in
            fewer Newton steps when it is near (another C, or a subset of the rows).

    Raises:
        ValueError: no rows, or shapes that disagree.
    """
    rows = _Rows.of(ids, log_dense, labels)
    return rows.model(_minimise(rows, C, rows.start(start), config), C)


def _minimise(rows: _Rows, C: float, w: np.ndarray, config: Poly2Config) -> np.ndarray:
    """Truncated Newton from `w` on liblinear's objective at C; the minimising weights."""
    X, y = rows.X, rows.y
    g0 = float(np.linalg.norm(C * X.rmatvec(0.5 - y)))  # the gradient at zero weights
    for _ in range(config.newton_steps):
        z = X.matvec(w)
        p = _sigmoid(z)
        g = C * X.rmatvec(p - y) + w
        gn = float(np.linalg.norm(g))
        if gn <= config.tol * g0:
            break
        d = _newton_direction(X, C * p * (1.0 - p), g, gn)
        f0, slope, step = _objective(C, z, y, w), float(g @ d), 1.0
        while step > 1e-6:  # backtracking (Armijo): a full Newton step is almost always taken
            trial = w + step * d
            if _objective(C, X.matvec(trial), y, trial) <= f0 + 1e-4 * step * slope:
                break
            step *= 0.5
        w = trial
    return w


def _newton_direction(X: _Design, curvature: np.ndarray, g: np.ndarray, gn: float, *, iters: int = 250) -> np.ndarray:
    """Conjugate gradients on H d = -g, H = X^T diag(curvature) X + I, to a residual of 0.1 |g| (truncated Newton).

    The vectors hold a weight per bucket (millions): they are updated in place, with one scratch vector."""
    d = np.zeros_like(g)
    r = -g
    p = r.copy()
    scratch = np.empty_like(g)
    rs = float(r @ r)
    for _ in range(iters):
        Hp = X.rmatvec(curvature * X.matvec(p))
        Hp += p
        a = rs / float(p @ Hp)
        d += np.multiply(p, a, out=scratch)
        r -= np.multiply(Hp, a, out=scratch)
        rs_next = float(r @ r)
        if np.sqrt(rs_next) <= 0.1 * gn:
            break
        p *= rs_next / rs
        p += r
        rs = rs_next
    return d


def fit_cv(
    ids: np.ndarray, log_dense: np.ndarray, labels: np.ndarray, *, config: Poly2Config = Poly2Config()
) -> tuple[Poly2, dict[float, float]]:
    """The Poly2 LR with C chosen by cross-validation: the rows are cut, in row order, into `config.folds`
    blocks, each left out of one fit of the others; the Cs of `config.cs` are tried in ascending order (each
    fold from its weights at the C before) until one's log loss over every left-out row is above the best so
    far (the loss over C has one minimum in every fit measured, and the large Cs are the slow fits); the best C
    is then refit on every row, from the mean of its folds' weights.

    Every row is left out once, so the choice rests on all the rows, not on a last fifth: on a lineage's first small
    day that fifth is a few hundred rows, and its choice was the noisiest of the chain's
    (`docs/reports/2026-12-05-companion.md`).  The buckets are numbered once for all the rows; each fold is the other
    rows on the buckets they use (`_Fold`), and scores its block by the same numbers.  The folds' designs (each of the
    rows but a block: twice the rows' design in all, with 3 folds) are freed before the refit's is built.

    Returns:
        (the refit model, {C: left-out log loss} of the Cs fit).
    """
    n = len(labels)
    if n < config.folds:
        raise ValueError(f"poly2 cross-validation needs at least {config.folds} rows (config.folds), got {n}")
    cols, buckets = _numbered(ids, log_dense, labels)
    dense, y = np.asarray(log_dense, dtype=np.float64), np.asarray(labels, dtype=np.float64)
    edges = np.linspace(0, n, config.folds + 1).astype(np.int64)
    folds = [_Fold(cols, buckets, dense, y, int(lo), int(hi)) for lo, hi in zip(edges[:-1], edges[1:], strict=True)]
    weights = [f.rows.start(None) for f in folds]
    losses: dict[float, float] = {}
    best: tuple[float, list[np.ndarray]] | None = None
    for C in sorted(config.cs):
        z = np.empty(n)
        for j, fold in enumerate(folds):
            weights[j] = _minimise(fold.rows, C, weights[j], config)
            z[fold.lo : fold.hi] = fold.block_logits(weights[j])
        losses[C] = logloss(y, _sigmoid(z))
        if best is not None and losses[C] > losses[best[0]]:
            break
        best = (C, list(weights))
    assert best is not None  # noqa: S101 - an invariant, for mypy
    C, chosen = best
    start = np.zeros(buckets.size + dense.shape[1] + 1)  # the mean of the folds' weights, 0 where a fold has none
    for fold, w in zip(folds, chosen, strict=True):
        k = fold.rows.buckets.size
        start[: buckets.size][fold.used] += w[:k] / len(folds)
        start[buckets.size :] += w[k:] / len(folds)
    del folds, weights
    rows = _Rows(cols, buckets, dense, y)
    return rows.model(_minimise(rows, C, start, config), C), losses
