"""A degree-2 polynomial logistic regression ("Poly2"): a weight per token and per pair of a row's tokens.

Why it is here: on small days, the mean of its logit and the default model's gains on both real samples
(issue 31, `docs/reports/2026-12-05-companion.md`).  The two err on different rows: the
default is trained by Adam through a warm-started chain, a day at a time; this is a converged full-batch fit,
with a strong L2, of every row it is given.  It is the learner of `model.companion` (`trainer.companion`), and
of `bench.quality_rolling`'s `poly2` row and probe.

numpy and torch's sparse CSR products, no scikit-learn: it is not a runtime dependency, and its liblinear was not
faster at the production settings on real rows (8,000 rows, the C cross-validation chose; medians of 3 rounds on a
shared 2-core machine): Criteo 7.7 s here against 11.9 s, Avazu 2.8 s against 3.9 s, each within 0.4 millionths of
the minimum's loss; at liblinear's own (tighter) stop, for equal loss, 8.1 s against 11.9 s and 4.7 s against 3.9 s
(`python -m bench._companion_solver`, `bench/results/companion_solver.json`).  Tokens are int64 keys
(`pipeline.encode.keys`: the field in the top bits), the pairs are hashed into 2^bits buckets, and the objective
is scikit-learn's liblinear one (C times the summed log loss plus half the squared weights, the intercept
penalised too), minimised by a truncated Newton method (conjugate gradients on Hessian-vector products, a
backtracking line search): a row's design is a fixed number of buckets with value 1, so X v and X^T u are
products with a CSR matrix of ones (`_Design`).
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch

from storage.key_layout import FIELD_SHIFT, MAX_FIELDS
from trainer.eval.metrics import logloss

log = logging.getLogger(__name__)

_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


CV_ORDERS = ("blocks", "forward")


@dataclass(frozen=True)
class Convergence:
    """How a fit's Newton iterations stopped: model.json `companion.convergence` (`to_dict`)."""

    converged: bool
    """The gradient met the tolerance (`Poly2Config.tol`)."""
    stop: str
    """`tolerance`, `newton_steps` (the most steps were taken) or `line_search` (no step decreased the objective)."""
    newton_steps: int
    grad_norm: float
    """|g(w)| at the weights returned."""
    grad_ratio: float
    """|g(w)| / |g(0)|: converged when at most tol."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "converged": self.converged,
            "stop": self.stop,
            "newton_steps": self.newton_steps,
            "grad_norm": self.grad_norm,
            "grad_ratio": self.grad_ratio,
        }


@dataclass(frozen=True, kw_only=True)
class Poly2Config:
    """How a Poly2 LR is fit."""

    bits: int = 22
    """Hash buckets, 2^bits, shared by the tokens and their pairs."""
    cs: tuple[float, ...] = (0.001, 0.003, 0.01, 0.03, 0.1)
    """Inverse L2 strengths tried by `fit_cv` (scikit-learn's C)."""
    folds: int = 3
    """`fit_cv`'s left-out blocks of rows: 3 chose as 5 did on both real samples' lineages, in less time
    (`docs/reports/2026-12-05-companion.md`)."""
    cv: str = "forward"
    """How `fit_cv` cuts the rows: `forward`, `folds` + 1 blocks, each of the later `folds` scored by a fit of the
    blocks before it alone, or `blocks`, each of `folds` blocks left out of a fit of the others (the later rows
    too; before issue 51).  `fit_cv` says why `forward`."""
    newton_steps: int = 30
    """The most Newton steps of a fit: one that stops there unconverged warns and says so (`Convergence`)."""
    tol: float = 1e-4
    """Stop when the gradient's norm is at most tol times its norm at zero weights, |g(w)| <= tol |g(0)|: measured
    against zero weights, so a warm start stops as near the minimum as a cold one.  liblinear (scikit-learn's
    `solver="liblinear"`, whose default tol is 1e-4 too) scales its tol by max(min(pos, neg), 1) / rows, which at
    click rates of 3-25 % is a 4-30x tighter stop; this solver does not: against 1e-6 (and so against liblinear's
    rule) 1e-4 fit in less time, with the same C and nearly the same logits, on the real samples' lineages
    (`docs/reports/2026-12-05-companion.md`; the time against liblinear: `bench/results/companion_solver.json`)."""

    def __post_init__(self) -> None:
        if not 8 <= self.bits <= 30:
            raise ValueError(f"poly2 bits must be in [8, 30], got {self.bits}")
        if not self.cs or min(self.cs) <= 0:
            raise ValueError(f"poly2 cs must be positive, got {self.cs}")
        if self.folds < 2:
            raise ValueError(f"poly2 folds must be >= 2 (each fold leaves out a block of rows), got {self.folds}")
        if self.cv not in CV_ORDERS:
            raise ValueError(f"poly2 cv must be one of {CV_ORDERS}, got {self.cv!r}")
        if self.newton_steps < 1 or not 0 < self.tol < 1:
            raise ValueError(f"poly2 newton_steps must be >= 1 and tol in (0, 1), got {self.newton_steps}, {self.tol}")


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
    convergence: Convergence | None = None
    """How the fit that made it stopped; None for one read from a file (the record keeps it)."""

    def weights_of(self, ids: np.ndarray) -> np.ndarray:
        """The weights of bucket ids (any shape), 0 for a bucket no fit row used."""
        if not self.buckets.size:
            return np.zeros(ids.shape)
        # searched in ascending order: consecutive searches then walk nearby parts of `buckets` (millions of ids,
        # most of them pairs seen once), where a day's scattered pair ids miss the cache at every step; the sort
        # costs less than the misses it saves (a fifth of the time on 220k ids into 5M buckets)
        flat = np.ascontiguousarray(ids, dtype=np.int64).ravel()
        order = np.argsort(flat)
        wanted = flat[order]
        pos = np.minimum(np.searchsorted(self.buckets, wanted), self.buckets.size - 1)
        out = np.empty(flat.size)
        out[order] = np.where(self.buckets[pos] == wanted, self.weights[pos], 0.0)
        return out.reshape(np.shape(ids))

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
        columns = np.ascontiguousarray(cols, dtype=np.int64).ravel()
        ones = torch.ones(columns.size, dtype=torch.float64)
        # X^T's rows: each bucket's rows in ascending order (a stable sort of X's columns), what X.to_sparse_csc()
        # gives, without its conversion (the longest part of building a design); torch's stable sort of the int32
        # columns takes a fraction of numpy's stable argsort's time, and gives the same order
        order = torch.sort(torch.from_numpy(columns).to(index), stable=True).indices.numpy()
        ccol = np.zeros(width + 1, dtype=np.int64)
        np.cumsum(np.bincount(columns, minlength=width), out=ccol[1:])
        with warnings.catch_warnings():  # "sparse CSR support is in beta": the two products used here are not
            warnings.simplefilter("ignore", UserWarning)
            self._x = torch.sparse_csr_tensor(
                crow, torch.from_numpy(columns).to(index), ones, size=(n, width), check_invariants=False
            )
            self._xt = torch.sparse_csr_tensor(
                torch.from_numpy(ccol).to(index),
                torch.from_numpy(order // per_row).to(index),
                ones,
                size=(width, n),
                check_invariants=False,
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
    """The rows a fold fits: those but the block [lo, hi) (`blocks`), or those before it (`forward`), on the buckets
    they use (`rows`); and the block's columns in their numbering (-1: a bucket none of them has, whose weight in
    the fold's fit is 0): a fit scored on the block, with no lookup of the ids again."""

    def __init__(
        self,
        cols: np.ndarray,
        buckets: np.ndarray,
        log_dense: np.ndarray,
        labels: np.ndarray,
        lo: int,
        hi: int,
        *,
        forward: bool = False,
    ) -> None:
        self.lo, self.hi = lo, hi
        after = hi if not forward else len(labels)  # forward: none of the rows from the block on
        keep = np.concatenate([cols[:lo], cols[after:]])
        self.used = np.zeros(buckets.size, dtype=bool)
        self.used[keep] = True
        number = np.cumsum(self.used) - 1
        self.rows = _Rows(
            number[keep],
            buckets[self.used],
            np.concatenate([log_dense[:lo], log_dense[after:]]),
            np.concatenate([labels[:lo], labels[after:]]),
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

    def model(self, w: np.ndarray, C: float, convergence: Convergence | None = None) -> Poly2:
        k = self.buckets.size
        return Poly2(
            buckets=self.buckets,
            weights=w[:k].copy(),
            dense_weights=w[k:-1].copy(),
            bias=float(w[-1]),
            C=C,
            convergence=convergence,
        )


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
    w, done = _minimise(rows, C, rows.start(start), config)
    return rows.model(w, C, done)


def _minimise(
    rows: _Rows, C: float, w: np.ndarray, config: Poly2Config, what: str = ""
) -> tuple[np.ndarray, Convergence]:
    """Truncated Newton from `w` on liblinear's objective at C: the weights it stopped at and how it stopped.

    It stops converged (`Poly2Config.tol`), or unconverged after `newton_steps` steps or a line search that found
    no decrease (liblinear stops there too), keeping the last weights that decreased the objective; unconverged,
    it logs a warning with how far the gradient is from the tolerance (`what` names the fit)."""
    X, y = rows.X, rows.y
    g0 = float(np.linalg.norm(C * X.rmatvec(0.5 - y)))  # the gradient at zero weights
    steps, stop = 0, "newton_steps"
    while True:
        z = X.matvec(w)
        p = _sigmoid(z)
        g = C * X.rmatvec(p - y) + w
        gn = float(np.linalg.norm(g))
        if gn <= config.tol * g0:
            stop = "tolerance"
            break
        if steps == config.newton_steps:
            break
        d = _newton_direction(X, C * p * (1.0 - p), g, gn)
        trial = _line_search(X, y, C, w, d, _objective(C, z, y, w), float(g @ d))
        if trial is None:
            stop = "line_search"
            break
        w, steps = trial, steps + 1
    done = Convergence(stop == "tolerance", stop, steps, gn, gn / g0 if g0 > 0 else 0.0)
    if not done.converged:
        why = (
            f"after {steps} Newton steps (Poly2Config.newton_steps)"
            if stop == "newton_steps"
            else f"at Newton step {steps + 1}: its line search found no step that decreased the objective"
        )
        log.warning(
            "companion: the poly2 fit %sof %d rows at C %g stopped unconverged %s: its gradient is %.2e of its "
            "norm at zero weights, %.1fx the tolerance %g; its weights are short of the minimum",
            f"{what} " if what else "",
            len(y),
            C,
            why,
            done.grad_ratio,
            done.grad_ratio / config.tol,
            config.tol,
        )
    return w, done


def _line_search(
    X: _Design, y: np.ndarray, C: float, w: np.ndarray, d: np.ndarray, f0: float, slope: float
) -> np.ndarray | None:
    """Backtracking (Armijo) along `d` from `w`: the first of steps 1, 1/2, ... down to 1e-6 that decreases the
    objective enough (a full Newton step is almost always taken), or None when none does."""
    step = 1.0
    while step > 1e-6:
        trial = w + step * d
        if _objective(C, X.matvec(trial), y, trial) <= f0 + 1e-4 * step * slope:
            return trial
        step *= 0.5
    return None


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
    """The Poly2 LR with C chosen by cross-validation of rows in time order: the Cs of `config.cs` are tried in
    ascending order (each fold from its weights at the C before) until one's log loss over the left-out rows is
    above the best so far (the loss over C has one minimum in every fit measured, and the large Cs are the slow
    fits); the best C is then refit on every row, from the mean of its folds' weights.

    `config.cv` cuts the rows: `blocks` into `folds` blocks, each scored by a fit of the others, so every row is
    left out once and the choice rests on all the rows, not on a last fifth (on a lineage's first small day that
    fifth is a few hundred rows, and its choice was the noisiest of the chain's); `forward` into `folds` + 1
    blocks, each but the first scored by a fit of the blocks before it, as the companion is used: fit on the past,
    scored on what comes after.  `forward` is the default: at every origin of the rolling benchmark both chose
    the same C on both real samples (AUC the same to 2e-5, paired sd 2e-5), in 9-11 % less fit time (its folds fit
    fewer rows), and no fold is fit on rows later than those it scores (`bench/results/companion_folds.json`).

    The buckets are numbered once for all the rows; each fold is its fit rows on the buckets they use (`_Fold`), and
    scores its block by the same numbers.  The folds' designs (twice the rows' design in all, with 3 blocks) are
    freed before the refit's is built.

    Returns:
        (the refit model, its `convergence` set, {C: left-out log loss} of the Cs fit).
    """
    n, forward = len(labels), config.cv == "forward"
    blocks = config.folds + 1 if forward else config.folds
    if n < blocks:
        raise ValueError(f"poly2 cross-validation needs at least {blocks} rows ({config.cv} folds), got {n}")
    cols, buckets = _numbered(ids, log_dense, labels)
    dense, y = np.asarray(log_dense, dtype=np.float64), np.asarray(labels, dtype=np.float64)
    edges = np.linspace(0, n, blocks + 1).astype(np.int64)
    scored = (
        list(zip(edges[1:-1], edges[2:], strict=True)) if forward else list(zip(edges[:-1], edges[1:], strict=True))
    )
    folds = [_Fold(cols, buckets, dense, y, int(lo), int(hi), forward=forward) for lo, hi in scored]
    weights = [f.rows.start(None) for f in folds]
    left_out = slice(int(scored[0][0]), n)  # the rows some fold scores: every row, or all but the first block
    losses: dict[float, float] = {}
    best: tuple[float, list[np.ndarray]] | None = None
    for C in sorted(config.cs):
        z = np.empty(n)
        for j, fold in enumerate(folds):
            weights[j], _ = _minimise(fold.rows, C, weights[j], config, f"(fold {j + 1} of {len(folds)})")
            z[fold.lo : fold.hi] = fold.block_logits(weights[j])
        losses[C] = logloss(y[left_out], _sigmoid(z[left_out]))
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
    w, done = _minimise(rows, C, start, config, "(the refit on every row)")
    return rows.model(w, C, done), losses
