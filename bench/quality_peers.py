"""The peers `bench.quality` compares the product with, fit on the rows the product was given.

- sklearn-lr: scikit-learn LogisticRegression on hashed one-hot `field=value` features (FeatureHasher,
  2^20; fit on the columns the train rows use, `_lr_probs`) plus the log1p dense values; C chosen by blocked K-fold
  cross-validation over the train rows
  only (`cv_folds`, log loss; over the last CV_ROWS of them on a larger day, where 30 fits of every
  row take hours on 2 cores), then refit on all of them;
- sklearn-lr (time split), for `bench.quality_rolling`: the same model, C chosen on the last fifth of the
  train rows (in time order) after fitting on the rest;
- sklearn-poly2 (time split), for `bench.quality_rolling`: the same, with every pair of a row's tokens
  hashed in as a feature of its own (degree-2 polynomial LR, "Poly2"; the cross-product features of Wide &
  Deep's wide part): the tokens are the `field=value` ones and each dense value's bucket (`_dense_bucket`),
  741 pairs on a Criteo row; C from POLY2_CS, since so many features need a stronger L2;
- deepctr-deepfm: DeepCTR-Torch's DeepFM with its default arguments (embedding_dim 4, dnn (256, 128),
  l2_reg_embedding 1e-5, Adam 1e-3, 1 epoch), batch 256; categorical values label-encoded on the train
  rows (unseen -> 0), dense values log1p then min-max scaled on the train rows;
- deepctr-deepfm (time split), for `bench.quality_rolling`: the same model and inputs, its number of epochs
  (one of DEEPFM_EPOCHS) chosen on the last fifth of the train rows (in time order) after fitting on the
  rest, then refit from scratch on all of them: 1 epoch over a few thousand rows leaves DeepFM near chance.

Each returns the click probabilities of the later rows, so the caller can pair them with the
product's predictions on the same rows (`bench.quality_stats`).  Benchmark-only dependencies:
`make bench-peers`.
"""

from __future__ import annotations

import contextlib
import io
import itertools
from typing import Any

import numpy as np
import pandas as pd
import torch

from pipeline.schema import LogSchema
from trainer.companion.key_counts import KeyCounts
from trainer.eval.metrics import logloss

LR_CS = (0.01, 0.03, 0.1, 0.3, 1.0, 3.0)
"""The inverse L2 strengths the logistic regression chooses from."""
CV_FOLDS = 5
CV_ROWS = 100_000
"""Train rows the C is chosen on (the most recent ones); the refit uses every train row."""
POLY2_CS = (0.001, 0.003, 0.01, 0.03, 0.1)
"""The inverse L2 strengths the Poly2 LR chooses from (on the shared samples' days it chose 0.003-0.03)."""
POLY2_FEATURES = 2**22
"""Hashed columns of the Poly2 LR: its pairs' tokens are ~200x the one-hot ones."""
DEEPFM_EPOCHS = (1, 2, 4, 8, 16)
"""The numbers of epochs the time-split DeepFM chooses from."""


def cv_folds(train: pd.DataFrame, folds: int = CV_FOLDS) -> list[tuple[pd.DataFrame, pd.DataFrame]]:
    """Blocked K-fold over `train` in row order: fold i validates on the i-th of `folds` contiguous blocks
    and trains on the other blocks (kept in row order).

    Raises:
        ValueError: fewer than 2 folds, or fewer rows than folds.
    """
    if folds < 2 or len(train) < folds:
        raise ValueError(f"cv_folds needs folds >= 2 and at least `folds` rows, got {folds} folds of {len(train)} rows")
    edges = np.linspace(0, len(train), folds + 1).astype(int)
    out = []
    for lo, hi in zip(edges[:-1], edges[1:], strict=True):
        rest = pd.concat([train.iloc[:lo], train.iloc[hi:]], ignore_index=True)
        out.append((rest, train.iloc[lo:hi].reset_index(drop=True)))
    return out


def _dense_log(events: pd.DataFrame, schema: LogSchema) -> np.ndarray:
    cols = [np.log1p(np.maximum(events[c].to_numpy(np.float64, na_value=0.0), 0.0)) for c in schema.dense]
    return np.stack(cols, axis=1) if cols else np.zeros((len(events), 0))


def _categorical_text(events: pd.DataFrame, column: str) -> pd.Series:
    return events[column].astype(object).where(events[column].notna(), "<na>").astype(str)


def _tokens(events: pd.DataFrame, schema: LogSchema) -> list[list[str]]:
    """Each row's `field=value` tokens."""
    text = {c: _categorical_text(events, c) for c in schema.categorical}
    return [
        [f"{c}={v}" for c, v in zip(schema.categorical, row, strict=True)] for row in zip(*text.values(), strict=True)
    ]


def _dense_bucket(events: pd.DataFrame, schema: LogSchema) -> list[list[str]]:
    """Each row's dense values as tokens `column#b`, b = floor(2 log1p(value)) (a missing or negative value: 0)."""
    buckets = np.floor(2 * _dense_log(events, schema)).astype(np.int64)
    return [[f"{c}#{b}" for c, b in zip(schema.dense, row, strict=True)] for row in buckets]


def _pairs(tokens: list[str]) -> list[str]:
    """The tokens and every unordered pair of them, as `a&b`."""
    return tokens + [f"{a}&{b}" for a, b in itertools.combinations(tokens, 2)]


def _hashed(events: pd.DataFrame, schema: LogSchema, *, pairs: bool = False):
    """The LR's design matrix: the hashed one-hot tokens and the log1p dense values; with `pairs`, the dense
    buckets join the tokens and every pair of tokens is hashed in too (Poly2, POLY2_FEATURES columns)."""
    import scipy.sparse as sp
    from sklearn.feature_extraction import FeatureHasher

    tokens = _tokens(events, schema)
    if pairs:
        tokens = [_pairs(t + d) for t, d in zip(tokens, _dense_bucket(events, schema), strict=True)]
    width = POLY2_FEATURES if pairs else 2**20
    cat = FeatureHasher(n_features=width, input_type="string", alternate_sign=False).transform(tokens)
    return sp.hstack([cat, sp.csr_matrix(_dense_log(events, schema))]).tocsr()


def _lr(C: float):
    from sklearn.linear_model import LogisticRegression

    return LogisticRegression(C=C, max_iter=2000, solver="liblinear")


def _lr_probs(C: float, X: Any, y: np.ndarray, later: Any) -> np.ndarray:
    """The click probabilities of the rows of `later` by the logistic regression `_lr(C)` fit on (X, y).

    It is fit on the hashed columns some row of X uses: the L2 penalty gives every other column a weight of 0
    (its gradient is its own weight), so that is the same model (to liblinear's tolerance) without the
    solver's work over all 2^20 columns at every iteration (about 50x faster on a few thousand rows).
    """
    used = np.unique(X.indices)
    return _lr(C).fit(X[:, used], y).predict_proba(later[:, used])[:, 1]


def sklearn_lr(
    train: pd.DataFrame, later: pd.DataFrame, schema: LogSchema, *, folds: int = CV_FOLDS, cv_rows: int = CV_ROWS
) -> tuple[np.ndarray, dict]:
    """Hashed one-hot logistic regression; returns (probabilities of `later`, {"C": chosen C, "cv_rows": n}).

    liblinear is deterministic, so one fit serves every seed.
    """
    scores = dict.fromkeys(LR_CS, 0.0)
    tail = train.iloc[-cv_rows:].reset_index(drop=True) if len(train) > cv_rows else train
    for tr, va in cv_folds(tail, folds):
        Xa, Xb, ya = _hashed(tr, schema), _hashed(va, schema), tr["label"].to_numpy()
        for C in LR_CS:
            scores[C] += logloss(va["label"].to_numpy(), _lr_probs(C, Xa, ya, Xb))
    C = min(scores, key=scores.__getitem__)
    probs = _lr_probs(C, _hashed(train, schema), train["label"].to_numpy(), _hashed(later, schema))
    return probs, {"C": C, "cv_rows": len(tail)}


def sklearn_lr_time_split(
    train: pd.DataFrame,
    later: pd.DataFrame,
    schema: LogSchema,
    *,
    holdout: float = 0.2,
    pairs: bool = False,
    cs: tuple[float, ...] | None = None,
) -> tuple[np.ndarray, dict]:
    """The hashed one-hot logistic regression (with `pairs`, Poly2: `_hashed`) with C chosen by an inner time
    split of the train rows: each C of `cs` (default LR_CS, with `pairs` POLY2_CS) fit on the first 1 - `holdout`
    of them (row order is time order), the C of the lowest log loss on the rest, refit on every train row.
    Returns (probabilities of `later`, {"C": chosen C, "holdout_rows": n})."""
    cut = len(train) - max(1, int(len(train) * holdout))
    fit, check = train.iloc[:cut], train.iloc[cut:]
    Xa, Xb, ya = _hashed(fit, schema, pairs=pairs), _hashed(check, schema, pairs=pairs), fit["label"].to_numpy()
    tried = cs or (POLY2_CS if pairs else LR_CS)
    losses = {C: logloss(check["label"].to_numpy(), _lr_probs(C, Xa, ya, Xb)) for C in tried}
    C = min(losses, key=losses.__getitem__)
    probs = _lr_probs(
        C, _hashed(train, schema, pairs=pairs), train["label"].to_numpy(), _hashed(later, schema, pairs=pairs)
    )
    return probs, {"C": C, "holdout_rows": len(check)}


def poly2_keys(events: pd.DataFrame, schema: LogSchema) -> np.ndarray:
    """(N, F) int64: the product's keys of raw rows' values (`pipeline.encode.keys.feature_keys`)."""
    from pipeline.encode.keys import feature_keys

    return np.stack([feature_keys(j, events[c].to_numpy(object)) for j, c in enumerate(schema.categorical)], axis=1)


def poly2_inputs(
    events: pd.DataFrame, schema: LogSchema, bits: int, counts: KeyCounts | None = None, *, fit_rows: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """The product Poly2's inputs of raw rows, as the companion makes them (`trainer.companion.model.inputs`): the
    product's keys of the raw values, their count classes in `counts` (`trainer.companion.key_counts.KeyCounts`,
    or none), and the log1p dense values."""
    from trainer.companion.model import inputs

    return inputs(poly2_keys(events, schema), _dense_log(events, schema), bits, counts, fit_rows=fit_rows)


def poly2_fit(
    train: pd.DataFrame, later: pd.DataFrame, schema: LogSchema, *, cs: tuple[float, ...] | None = None
) -> tuple[np.ndarray, dict]:
    """The product's Poly2 LR (`trainer.companion.poly2`, no scikit-learn) on the companion's inputs (the train
    rows' key counts too), C chosen from `cs` (default POLY2_CS) as the companion chooses it
    (`trainer.companion.poly2.fit_cv`); returns (probabilities of `later`, {"C": chosen C})."""
    from trainer.companion.poly2 import Poly2Config, fit_cv

    config = Poly2Config(cs=cs or POLY2_CS)
    counts = KeyCounts.of(poly2_keys(train, schema))
    ids, dense = poly2_inputs(train, schema, config.bits, counts, fit_rows=True)
    model, _ = fit_cv(ids, dense, train["label"].to_numpy(np.float64), config=config)
    later_ids, later_dense = poly2_inputs(later, schema, config.bits, counts)
    return 1.0 / (1.0 + np.exp(-model.logits(later_ids, later_dense))), {"C": model.C}


def _deepctr_inputs(train: pd.DataFrame, later: pd.DataFrame, schema: LogSchema):
    from deepctr_torch.inputs import DenseFeat, SparseFeat

    xa, xb, columns = {}, {}, []
    for c in schema.categorical:
        a, b = _categorical_text(train, c), _categorical_text(later, c)
        vocab = {v: i + 1 for i, v in enumerate(pd.unique(a))}  # 0 = unseen in train
        xa[c] = a.map(vocab).to_numpy(np.int64)
        xb[c] = b.map(vocab).fillna(0).to_numpy(np.int64)
        columns.append(SparseFeat(c, vocabulary_size=len(vocab) + 1))
    da, db = _dense_log(train, schema), _dense_log(later, schema)
    if da.size:
        lo, span = da.min(axis=0), np.where(np.ptp(da, axis=0) > 0, np.ptp(da, axis=0), 1.0)
        for i, c in enumerate(schema.dense):
            xa[c], xb[c] = (da[:, i] - lo[i]) / span[i], (db[:, i] - lo[i]) / span[i]
            columns.append(DenseFeat(c, 1))
    return columns, xa, xb


def _deepfm(columns: list, seed: int) -> Any:
    """DeepCTR-Torch's DeepFM with its default arguments, seeded."""
    from deepctr_torch.models import DeepFM

    torch.manual_seed(seed)
    model = DeepFM(columns, columns, task="binary", seed=seed, device="cpu")
    model.compile("adam", "binary_crossentropy")
    return model


def _deepfm_train(model: Any, x: dict, y: np.ndarray, *, done: int, epochs: int) -> None:
    """Train `model` from epoch `done` to epoch `epochs` (DeepCTR-Torch's `initial_epoch`: its model and
    optimizer carry over from one `fit` to the next), batch 256, quietly (its `fit` prints every call)."""
    with contextlib.redirect_stdout(io.StringIO()):
        model.fit(x, y.astype(np.float32), batch_size=256, epochs=epochs, initial_epoch=done, verbose=0, shuffle=True)


def _deepfm_probs(model: Any, x: dict) -> np.ndarray:
    # predict draws a seed from torch's global generator for its DataLoader: keep the generator where it
    # was, so that training on after a prediction shuffles as one longer fit would.
    with torch.random.fork_rng(devices=[]):
        return model.predict(x, batch_size=4096).ravel().astype(np.float64)


def deepctr_deepfm(
    train: pd.DataFrame, later: pd.DataFrame, schema: LogSchema, *, seed: int
) -> tuple[np.ndarray, dict]:
    """DeepCTR-Torch DeepFM with its defaults (1 epoch); returns (probabilities of `later`, {})."""
    columns, xa, xb = _deepctr_inputs(train, later, schema)
    model = _deepfm(columns, seed)
    _deepfm_train(model, xa, train["label"].to_numpy(), done=0, epochs=1)
    return _deepfm_probs(model, xb), {}


def deepctr_deepfm_time_split(
    train: pd.DataFrame,
    later: pd.DataFrame,
    schema: LogSchema,
    *,
    seed: int,
    epochs: tuple[int, ...] = DEEPFM_EPOCHS,
    holdout: float = 0.2,
) -> tuple[np.ndarray, dict]:
    """DeepFM (DeepCTR-Torch's defaults but the number of epochs) with its epochs chosen by an inner time split
    of the train rows: one model trained on the first 1 - `holdout` of them (row order is time order), its log
    loss on the rest measured after each count in `epochs`, the count of the lowest loss (the fewest on a
    tie), then a model refit from scratch on every train row for that many epochs.  Inputs are prepared
    (`_deepctr_inputs`) on the rows each model is fit on.

    Returns:
        (probabilities of `later`, {"epochs": the chosen count, "val_logloss": {count: log loss},
        "holdout_rows": n}).

    Raises:
        ValueError: no epoch counts, or one below 1.
    """
    if not epochs or min(epochs) < 1:
        raise ValueError(f"deepctr_deepfm_time_split needs epoch counts >= 1, got {epochs}")
    cut = len(train) - max(1, int(len(train) * holdout))
    fit, check = train.iloc[:cut], train.iloc[cut:]
    columns, xa, xb = _deepctr_inputs(fit, check, schema)
    model = _deepfm(columns, seed)
    losses: dict[int, float] = {}
    done = 0
    for n in sorted(set(epochs)):  # one run to the most epochs, measured on the way
        _deepfm_train(model, xa, fit["label"].to_numpy(), done=done, epochs=n)
        losses[n], done = logloss(check["label"].to_numpy(), _deepfm_probs(model, xb)), n
    chosen = min(losses, key=losses.__getitem__)  # counts ascending: a tie goes to the fewer epochs
    columns, xa, xb = _deepctr_inputs(train, later, schema)
    model = _deepfm(columns, seed)
    _deepfm_train(model, xa, train["label"].to_numpy(), done=0, epochs=chosen)
    return _deepfm_probs(model, xb), {"epochs": chosen, "val_logloss": losses, "holdout_rows": len(check)}
