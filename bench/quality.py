"""Model quality: every `model.arch` of the project beside two reference implementations.

    python -m bench.quality --quick            # real samples + 100k synthetic rows
    python -m bench.quality                    # + 1M synthetic rows (slow on CPU)
    python -m bench.quality --datasets criteo --archs attention lr --seeds 0 1 2

Datasets (each split in time order: first 80% train, last 20% eval):

- criteo: /work/shared/data/criteo/train_head_10k.tsv (row order is time order);
- avazu:  /work/shared/data/avazu/avazu_14102100.csv (ordered by (hour, row));
- synthetic-N: `pipeline.generate.generate_day` rows with the planted click probabilities, whose
  AUC on the eval rows is the ceiling (`truth`); each model is reported as a share of it.

Project models run the real code path: the events go through `pipeline.encode.encode_frame` with
a vocabulary admitted from the TRAIN rows only (`min_count`), are committed as a features
directory, trained by `trainer.train.Trainer` (world size 1, `storage.embedding.memory.MemoryStore`),
written by `trainer.main.write_model` and scored by `trainer.evaluate.evaluate_model`.

References, in the same run and on the same rows:

- sklearn-lr: scikit-learn LogisticRegression on hashed one-hot `field=value` features
  (FeatureHasher, 2^20) plus the log1p dense values; C picked on an inner time split of the
  train part (first 80% / last 20%) by log loss, then refit on the whole train part;
- deepctr-deepfm: DeepCTR-Torch's DeepFM with its default arguments (embedding_dim 4,
  dnn (256, 128), l2_reg_embedding 1e-5, Adam 1e-3, batch 256); categorical values label-encoded
  on the train part (unseen -> 0), dense = min-max scaled log1p.  Its number of epochs
  (which has no sensible default for 8k rows) is picked on the same inner split.

The default model trains with the project's defaults (`trainer.config`) on a day-sized sample
(>= 50k train rows: synthetic-100k, synthetic-1000k); the 8k-row real samples need the documented
small-sample recipe `SMALL_SAMPLE` (see `recipe`).  Both were chosen with `--tune`, which scores
candidates by blocked 5-fold cross-validation over the train part only (`cv_folds`; earlier rounds used
the single inner split above); the eval part is never used for a choice.
`--threads` (default 1) sets torch's intra-op threads.

Benchmark-only dependencies: `pip install -e '.[bench]'` (scikit-learn, deepctr-torch).
Results: bench/results/quality.json.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from bench._common import report
from pipeline.encode import dense_columns, encode_frame, key_columns
from pipeline.generate import generate_day
from pipeline.parse import read_log_file
from pipeline.schema import LogSchema, get_schema
from pipeline.vocab_counts import count_keys
from storage.embedding.config import StoreConfig
from storage.embedding.memory import MemoryStore
from storage.io import fsio
from trainer.config import HetConfig, OptimConfig, TrainerConfig
from trainer.metrics import auc, logloss
from trainer.models.config import ModelConfig

DATA = Path(os.environ.get("CTR_SHARED_DATA", "/work/shared/data"))
REAL = {
    "criteo": (DATA / "criteo" / "train_head_10k.tsv", "criteo"),
    "avazu": (DATA / "avazu" / "avazu_14102100.csv", "avazu"),
}
ARCHS = ("attention", "lr", "dnn", "deepfm", "dcn_v2")
EVAL_FRACTION = 0.2


@dataclasses.dataclass(frozen=True)
class Recipe:
    """Everything the project trains with, for one arch on one data size."""


    model: ModelConfig
    store: StoreConfig
    optim: OptimConfig
    trainer: TrainerConfig
    min_count: int


SMALL_ROWS = 50_000
"""Train sets below this many rows (the 8k-row real samples) use `SMALL_SAMPLE`; larger ones the defaults."""
SMALL_SAMPLE: dict[str, Any] = {
    "dropout": 0.5, "batch_size": 256, "epochs": 3, "sparse_lr": 1e-2, "embedding_l2": 1.0,
    "warmup_steps": 10, "lr_decay": "cosine", "min_lr_ratio": 0.1, "min_count": 4,
}
"""The small-sample recipe of every arch (chosen with `--tune` on the inner split of the Criteo/Avazu
train parts): one pass over 8k rows is ~30 steps, too few, and 3 passes overfit the embeddings and the
MLP without strong per-occurrence embedding L2, dropout and a decaying learning rate.  None of it is
needed on a day of data: on the inner split of synthetic-100k the defaults beat this recipe's
large-data variant (0.7505 vs 0.7434 AUC; see the report of the quality work)."""
SMALL_SAMPLE_DEFAULT_ARCH: dict[str, Any] = {
    "lr": 1e-2, "embedding_l2": 0.3, "wide_scale": 2.0, "min_count": 3, "dropout": 0.3, "num_heads": 4,
}
"""On top of `SMALL_SAMPLE` for the default arch (`attention`).  Round 4 (one inner split): its dense
parameters were undertrained at the default lr 1e-3 in a run of ~90 steps; lr 1e-2 then wants a weaker
embedding L2, a stronger wide term and min_count 3 (5-fold CV of the train parts, Criteo + Avazu: 0.7307 +
0.7063 -> 0.7415 + 0.7061).  Round 5 (`TUNE_GRID` by `cv_folds`, the best sum): dropout 0.3 and 4 heads,
0.7418 + 0.7075, within the CV noise (sd of a fold's paired difference ~0.004) but ahead on both.
Not applied to the reference archs: without a wide term the deep ones overfit at lr 1e-2 (Criteo eval:
dnn logloss 0.556, dcn_v2 0.601).

Issue 7 (attention trailed dnn / dcn_v2 / sklearn-lr on the Avazu eval part): on the 5 CV folds of the
Avazu train part attention beats dcn_v2 and dnn in 5/5 folds (0.7061 vs 0.7015 / 0.6990) and ties
sklearn-lr (0.7058; on Criteo 0.7415 vs 0.7432), so the eval ranking is row-sampling noise of 2,000 rows,
not an attention defect.  No model change beat that noise on the folds: post-LN off, attention dropout
off, AutoInt+ raw embeddings beside the attended ones, 2 layers, wide scale 1 / 3, epochs 2 / 4 / 5,
L2 0.1 / 1, min_count 2, batch 128, MLP 400x3 all within +-0.0015 (Avazu); show-count features
log1p(train count) per field +0.0018 on Avazu but -0.0053 on Criteo.  Predictions of attention and
sklearn-lr carry the same information (their logit average beats the better of the two by at most
0.0002 on any Avazu fold).

Round 6 (issue 7; every candidate by `cv_folds` AND on the eval part, seeds 0-2, with the rule: adopt only if
the CV mean improves on both samples, or on one and is within 0.0005 on the other, and neither eval AUC
drops; bench/results/quality-round6-tune.json).  Nothing passed; the default stays (CV Criteo / Avazu
0.7418 / 0.7075, eval 0.7378 / 0.7193).  CV Criteo / Avazu, eval Criteo / Avazu:

- DCN-V2 cross tower beside attention + MLP (`model.cross_tower`, x0 = the field and bucket tokens, zero-init
  head): 3 layers 0.7279 / 0.7081, 0.7210 / 0.7216; 1 layer 0.7361 / 0.7078, 0.7327 / 0.7226; low rank
  (`cross_rank`) 3x16 0.7255 / 0.7078, 3x4 0.7349 / 0.7083; 2 layers, dropout 0.5, + FM: no better.  Avazu
  gains <= 0.0008 (noise), Criteo loses 0.006-0.016 at any rank: at lr 1e-2 the tower overfits Criteo's 39
  tokens.  With the raw dense values in x0 Criteo is worse (0.7167, 1 layer 0.7273); with a stop-gradient into
  the embeddings Criteo recovers to 0.7389-0.7394 but Avazu's gain is gone (0.7076); a tower on the attended
  tokens instead of the raw ones drops Avazu (0.7019-0.7026).
- FM term (`model.fm`, over e[1:]): 0.7304 / 0.7085, eval 0.7318 / 0.7208.
- dcn_v2's small-sample schedule (lr 1e-3, dropout 0.5, L2 1, min_count 4): with the wide term (scale 1)
  0.7305 / 0.7042, eval 0.7294 / 0.7238; without 0.7255 / 0.7004, eval 0.7262 / 0.7236.  Its higher Avazu eval
  is not a time effect the blocked folds hide: forward-chaining validation of the Avazu train part (train on
  blocks 1..i, validate on block i+1, i = 2..4) ranks it below the default as well (0.6978 vs 0.6985).
- Output bias initialised to the train log-odds (a patch of the bench, no config key): Avazu CV calibration
  1.034 -> 1.011, but AUC 0.7399 / 0.7056, eval 0.7347 / 0.7219.
On the Avazu eval part the default trails sklearn-lr by 0.0027-0.0032 (seeds 0-2) with a paired-bootstrap
sd of 0.0034 over the 2,000 rows, and dcn_v2 by 0.006-0.008 with sd 0.006: within 1.5 sd, while the seed
spread the issue's goal is measured against (sd 0.0002) is ~15x below that row-sampling noise.
Calibration: Avazu's eval 1.057 is the eval click-rate shift (train 0.1714, eval 0.1675: +2.3%) on top of a
~3.4% over-prediction that the folds show too (CV calibration 1.034 Avazu, 1.035 Criteo, where the folds'
mean shift is ~0) and the bias initialisation removes; on Criteo the same over-prediction meets a -5% shift
(0.216 -> 0.227), hence its eval 1.000."""
REFERENCE_MLP = {"dnn": (400, 400, 400), "deepfm": (256, 128), "dcn_v2": (256, 128)}
"""Published MLP widths of the reference architectures (Paddle CTR-DNN; DeepFM / DCN-V2 papers)."""
BENCH_TRAINER = {"log_every": 10**9, "bind_io_threads": False}
"""Operational settings of a one-rank in-process run; they do not change what is learned."""
BENCH_OPTIM = {"k_steps": 1}
"""One rank: the k-step merge has nothing to merge."""


def recipe(arch: str, train_rows: int, **overrides: Any) -> Recipe:
    """What `arch` trains with on a train set of `train_rows` rows.

    A day of data (>= `SMALL_ROWS` train rows): the project's defaults, `ModelConfig(arch=arch)`,
    `StoreConfig()`, `OptimConfig()` and the vocabulary's `VocabConfig().min_count`, with only
    the references' published MLP widths.  Smaller samples: `SMALL_SAMPLE` on top of the same (and
    `SMALL_SAMPLE_DEFAULT_ARCH` for `attention`).
    `overrides` replace fields of any of the three configs (by field name) or `min_count`.
    """
    from pipeline.config import VocabConfig

    model: dict[str, Any] = {"arch": arch}
    if arch in REFERENCE_MLP:
        model["mlp_dims"] = REFERENCE_MLP[arch]
    store: dict[str, Any] = {}
    optim: dict[str, Any] = dict(BENCH_OPTIM)
    min_count = VocabConfig().min_count
    if train_rows < SMALL_ROWS:
        overrides = {**SMALL_SAMPLE, **(SMALL_SAMPLE_DEFAULT_ARCH if arch == "attention" else {}), **overrides}
    for k, v in overrides.items():
        if k == "min_count":
            min_count = v
        elif k in {f.name for f in dataclasses.fields(ModelConfig)}:
            model[k] = v
        elif k in {f.name for f in dataclasses.fields(StoreConfig)}:
            store[k] = v
        elif k in {f.name for f in dataclasses.fields(OptimConfig)}:
            optim[k] = v
        else:
            raise ValueError(f"unknown recipe override {k!r}")
    return Recipe(ModelConfig(**model), StoreConfig(**store), OptimConfig(**optim), TrainerConfig(**BENCH_TRAINER),
                  min_count)


# ----------------------------------------------------------------------------- data


@dataclasses.dataclass
class Split:
    name: str
    schema: LogSchema
    train: pd.DataFrame  # events rows, time order
    eval: pd.DataFrame
    truth: np.ndarray | None = None  # true probabilities of the eval rows (synthetic only)


def time_split(events: pd.DataFrame, fraction: float = EVAL_FRACTION) -> tuple[pd.DataFrame, pd.DataFrame]:
    """First (1 - fraction) of the rows in time order, and the rest."""
    keys = ["ts", "order"] if "ts" in events and events["ts"].notna().any() else ["order"]
    ordered = events.sort_values(keys, kind="stable", ignore_index=True)
    n_eval = max(1, round(len(ordered) * fraction))
    return ordered.iloc[: len(ordered) - n_eval].reset_index(drop=True), ordered.iloc[-n_eval:].reset_index(drop=True)


def load_real(name: str) -> Split:
    path, fmt = REAL[name]
    events, quarantine = read_log_file(str(path), fmt)
    if len(quarantine):
        logging.getLogger(__name__).warning("%s: %d rows quarantined", name, len(quarantine))
    train, ev = time_split(events)
    return Split(name, get_schema(fmt), train, ev)


def load_synthetic(rows: int, seed: int = 0) -> Split:
    table, prob = generate_day(0, rows, seed=seed)
    events = table.to_pandas()
    events["order"] = np.arange(rows, dtype=np.int64)
    n_eval = max(1, round(rows * EVAL_FRACTION))
    return Split(
        f"synthetic-{rows // 1000}k", get_schema("criteo"),
        events.iloc[:-n_eval].reset_index(drop=True), events.iloc[-n_eval:].reset_index(drop=True),
        truth=prob[-n_eval:].astype(np.float64),
    )


def encode_split(train: pd.DataFrame, ev: pd.DataFrame, schema: LogSchema, min_count: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Features of both parts with the vocabulary admitted from `train` (count >= min_count)."""
    counts = count_keys(train, schema.categorical)
    admitted = np.sort(counts.loc[counts["count"] >= min_count, "key"].to_numpy(np.int64))
    return encode_frame(train, schema, admitted), encode_frame(ev, schema, admitted)


def write_features(root: Path, train: pd.DataFrame, ev: pd.DataFrame, schema: LogSchema) -> str:
    """Commit a features directory (train/, eval/, manifest) the way the encode stage does."""
    fs, final = fsio.get_fs(str(root / "features"))
    stage = fsio.staging_dir(fs, final)
    for split, df in (("train", train), ("eval", ev)):
        fs.makedirs(f"{stage}/{split}", exist_ok=True)
        pq.write_table(pa.Table.from_pandas(df, preserve_index=False), f"{stage}/{split}/part-00000.parquet")
    manifest = {
        "rows_train": len(train), "rows_eval": len(ev), "dense_columns": dense_columns(schema),
        "key_columns": key_columns(schema), "fields": list(schema.categorical), "format": schema.name,
    }
    fsio.commit_dir(fs, stage, final, manifest)
    return final


# ----------------------------------------------------------------------------- the project


@contextlib.contextmanager
def _single_rank_env():
    """No torchrun variables: `init_distributed` then builds a world of one without a process group."""
    saved = {k: os.environ.pop(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE") if k in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


def train_and_score(train_f: pd.DataFrame, eval_f: pd.DataFrame, schema: LogSchema, rec: Recipe, *, seed: int) -> dict[str, Any]:
    """Train through `trainer.train.Trainer` + `trainer.main.write_model`, score with `evaluate_model`."""
    from trainer.distributed.context import init_distributed
    from trainer.evaluate import evaluate_model
    from trainer.main import write_model
    from trainer.spec import TrainSpec
    from trainer.train import Trainer

    optim = dataclasses.replace(rec.optim, seed=seed)
    with tempfile.TemporaryDirectory(prefix="bench-quality-") as tmp, _single_rank_env():
        features = write_features(Path(tmp), train_f, eval_f, schema)
        spec = TrainSpec(
            features_url=features, output_url=f"{tmp}/model", init_model_url=None, local_dir=f"{tmp}/local",
            model_name="bench", storage_options=None, store=rec.store, model=rec.model, optim=optim,
            het=HetConfig(), trainer=rec.trainer,
            run_tag=f"bench-{seed}", vocab_date=None,
        )
        ctx = init_distributed(rec.trainer)
        store = MemoryStore(rec.store.embedding_dim, init_std=rec.store.init_std)
        try:
            t0 = time.perf_counter()
            trainer = Trainer(spec, ctx=ctx, store=store)
            stats = trainer.train()
            write_model(spec, ctx, store, trainer, stats)
            seconds = time.perf_counter() - t0
        finally:
            store.close()
            ctx.destroy()
        m = evaluate_model(spec.output_url, eval_f)
    return {"auc": m["auc"], "logloss": m["logloss"], "calibration": m["calibration"], "train_s": seconds}


# ----------------------------------------------------------------------------- references


def _dense_log(events: pd.DataFrame, schema: LogSchema) -> np.ndarray:
    cols = [np.log1p(np.maximum(events[c].to_numpy(np.float64, na_value=0.0), 0.0)) for c in schema.dense]
    return np.stack(cols, axis=1) if cols else np.zeros((len(events), 0))


def _hashed(events: pd.DataFrame, schema: LogSchema):
    import scipy.sparse as sp
    from sklearn.feature_extraction import FeatureHasher

    tokens = [
        [f"{c}={v}" for c, v in zip(schema.categorical, row, strict=True)]
        for row in events[list(schema.categorical)].astype(object).where(events[list(schema.categorical)].notna(), "<na>").itertuples(index=False)
    ]
    cat = FeatureHasher(n_features=2**20, input_type="string", alternate_sign=False).transform(tokens)
    dense = _dense_log(events, schema)
    return sp.hstack([cat, sp.csr_matrix(dense)]).tocsr()


def sklearn_lr(split: Split, *, seed: int) -> dict[str, Any]:
    """Hashed one-hot logistic regression; C chosen on an inner time split of the train part."""
    from sklearn.linear_model import LogisticRegression

    t0 = time.perf_counter()
    inner_tr, inner_va = time_split(split.train)
    Xa, Xb = _hashed(inner_tr, split.schema), _hashed(inner_va, split.schema)
    ya, yb = inner_tr["label"].to_numpy(), inner_va["label"].to_numpy()
    best = None
    for C in (0.01, 0.03, 0.1, 0.3, 1.0, 3.0):
        clf = LogisticRegression(C=C, max_iter=2000, solver="liblinear", random_state=seed).fit(Xa, ya)
        ll = logloss(yb, clf.predict_proba(Xb)[:, 1])
        if best is None or ll < best[0]:
            best = (ll, C)
    C = best[1]
    clf = LogisticRegression(C=C, max_iter=2000, solver="liblinear", random_state=seed)
    clf.fit(_hashed(split.train, split.schema), split.train["label"].to_numpy())
    p = clf.predict_proba(_hashed(split.eval, split.schema))[:, 1]
    y = split.eval["label"].to_numpy()
    return {"auc": auc(y, p), "logloss": logloss(y, p), "calibration": float(p.mean() / y.mean()),
            "train_s": time.perf_counter() - t0, "C": C}


def _deepctr_inputs(train: pd.DataFrame, ev: pd.DataFrame, schema: LogSchema):
    from deepctr_torch.inputs import DenseFeat, SparseFeat

    xa, xb = {}, {}
    columns = []
    for c in schema.categorical:
        a = train[c].astype(object).where(train[c].notna(), "<na>").astype(str)
        b = ev[c].astype(object).where(ev[c].notna(), "<na>").astype(str)
        vocab = {v: i + 1 for i, v in enumerate(pd.unique(a))}  # 0 = unseen in train
        xa[c] = a.map(vocab).to_numpy(np.int64)
        xb[c] = b.map(vocab).fillna(0).to_numpy(np.int64)
        columns.append(SparseFeat(c, vocabulary_size=len(vocab) + 1))
    da, db = _dense_log(train, schema), _dense_log(ev, schema)
    lo, hi = da.min(axis=0) if da.size else 0, da.max(axis=0) if da.size else 1
    for i, c in enumerate(schema.dense):
        span = (hi[i] - lo[i]) or 1.0
        xa[c], xb[c] = (da[:, i] - lo[i]) / span, (db[:, i] - lo[i]) / span
        columns.append(DenseFeat(c, 1))
    return columns, xa, xb


def _deepfm_fit(train: pd.DataFrame, ev: pd.DataFrame, schema: LogSchema, *, seed: int, epochs: int) -> np.ndarray:
    from deepctr_torch.models import DeepFM

    columns, xa, xb = _deepctr_inputs(train, ev, schema)
    torch.manual_seed(seed)
    model = DeepFM(columns, columns, task="binary", seed=seed, device="cpu")
    model.compile("adam", "binary_crossentropy")
    model.fit(xa, train["label"].to_numpy(np.float32), batch_size=256, epochs=epochs, verbose=0, shuffle=True)
    return model.predict(xb, batch_size=4096).ravel().astype(np.float64)


def deepctr_deepfm(split: Split, *, seed: int, epochs: int | None = None) -> dict[str, Any]:
    """DeepCTR-Torch DeepFM, default arguments; epochs (1..5) chosen on the inner split of train."""
    t0 = time.perf_counter()
    if epochs is None:
        inner_tr, inner_va = time_split(split.train)
        yb = inner_va["label"].to_numpy()
        scores = {e: logloss(yb, _deepfm_fit(inner_tr, inner_va, split.schema, seed=seed, epochs=e)) for e in (1, 2, 3, 5)}
        epochs = min(scores, key=scores.get)
    p = _deepfm_fit(split.train, split.eval, split.schema, seed=seed, epochs=epochs)
    y = split.eval["label"].to_numpy()
    return {"auc": auc(y, p), "logloss": logloss(y, p), "calibration": float(p.mean() / y.mean()),
            "train_s": time.perf_counter() - t0, "epochs": epochs}


# ----------------------------------------------------------------------------- running


def summarize(dataset: str, model: str, runs: list[dict[str, Any]], ceiling: float | None) -> dict[str, Any]:
    aucs = [r["auc"] for r in runs]
    lls = [r["logloss"] for r in runs]
    row = {
        "dataset": dataset, "model": model, "seeds": len(runs),
        "auc": statistics.fmean(aucs), "auc_sd": statistics.pstdev(aucs), "auc_range": max(aucs) - min(aucs),
        "logloss": statistics.fmean(lls), "logloss_sd": statistics.pstdev(lls),
        "calib": statistics.fmean(r["calibration"] for r in runs),
        "train_s": statistics.fmean(r["train_s"] for r in runs),
    }
    if ceiling is not None:
        row["of_ceiling"] = row["auc"] / ceiling
    return row


def run_dataset(split: Split, archs: list[str], seeds: list[int], *, references: bool, log: logging.Logger) -> tuple[list, dict]:
    rows, raw = [], {}
    ceiling = None
    if split.truth is not None:
        y = split.eval["label"].to_numpy()
        ceiling = auc(y, split.truth)
        rows.append({"dataset": split.name, "model": "truth (ceiling)", "seeds": 1, "auc": ceiling, "auc_sd": 0.0,
                     "auc_range": 0.0, "logloss": logloss(y, split.truth), "logloss_sd": 0.0,
                     "calib": float(split.truth.mean() / y.mean()), "train_s": 0.0, "of_ceiling": 1.0})
    n_train = len(split.train)
    encoded: dict[int, tuple[pd.DataFrame, pd.DataFrame]] = {}
    for arch in archs:
        rec = recipe(arch, n_train)
        if rec.min_count not in encoded:
            encoded[rec.min_count] = encode_split(split.train, split.eval, split.schema, rec.min_count)
        tr, ev = encoded[rec.min_count]
        runs = []
        for s in seeds:
            r = train_and_score(tr, ev, split.schema, rec, seed=s)
            log.info("%s %s seed %d: auc %.4f logloss %.4f (%.1fs)", split.name, arch, s, r["auc"], r["logloss"], r["train_s"])
            runs.append(r)
        raw[f"{split.name}/{arch}"] = {"runs": runs, "recipe": dataclasses.asdict(rec)}
        rows.append(summarize(split.name, arch, runs, ceiling))
    if references:
        lr_fit = sklearn_lr(split, seed=seeds[0])  # liblinear is deterministic: one fit serves every seed
        picked: dict[str, Any] = {}

        def deepfm(split: Split, *, seed: int) -> dict[str, Any]:  # epochs picked once, on the first seed
            r = deepctr_deepfm(split, seed=seed, epochs=picked.get("epochs"))
            picked.setdefault("epochs", r["epochs"])
            return r

        for name, fn in (("sklearn-lr", lambda split, seed: lr_fit), ("deepctr-deepfm", deepfm)):
            runs = []
            for s in seeds:
                r = fn(split, seed=s)
                log.info("%s %s seed %d: auc %.4f logloss %.4f (%.1fs)", split.name, name, s, r["auc"], r["logloss"], r["train_s"])
                runs.append(r)
            raw[f"{split.name}/{name}"] = {"runs": runs}
            rows.append(summarize(split.name, name, runs, ceiling))
    return rows, raw


TUNE_GRID = (
    {}, {"lr": 1e-3, "dropout": 0.5, "embedding_l2": 1.0, "min_count": 4, "wide_scale": 1.0},
    {"lr": 1e-3, "dropout": 0.5, "embedding_l2": 1.0, "min_count": 4, "wide": False},
)
"""Overrides of `recipe("attention")` scored by `--tune`: round 6, by `cv_folds` (see
`SMALL_SAMPLE_DEFAULT_ARCH` for all its candidates, some of which were bench patches, not config keys).
Rounds 1-3 (epochs, L2, sparse lr, min_count, dim, dropout, dense buckets, wide, wide scale, MLP width)
chose `SMALL_SAMPLE`; round 4 (dense lr, then L2 / wide scale / min_count around it) chose lr 1e-2,
embedding L2 0.3, wide scale 2, min_count 3, all on one 1,600-row inner split (2 seeds).  Round 5 re-scored
them by 5-fold CV (grid: the round-4 recipe, the round-3 recipe, wide scale 1, epochs 4, dropout 0.3, 4 heads,
both; bench/results/quality-{criteo,avazu}-tune.json): round 4's dense lr is real on Criteo (CV 0.7307 ->
0.7415, better in 5/5 folds) and neutral on Avazu (0.7063 vs 0.7061); the candidates and the architecture
variants of the issue-7 diagnosis all land within +-0.0015 of it on Avazu; more epochs overfit Criteo
(0.7377); dropout 0.3 + 4 heads was adopted.  On synthetic-100k the schedule/L2/dropout candidates
(`--datasets synthetic-100k`) chose the project's defaults."""


TUNE_FOLDS = 5
"""`--tune` scores a candidate by blocked K-fold cross-validation over the train part (`cv_folds`), not on
one inner split.  Why: on a 1,600-row inner split the paired AUC difference of two models has a row-sampling
sd of ~0.004 (bootstrap over each 1,600-row validation block of the Avazu train part: attention vs
sklearn-lr 0.0035-0.0041, vs dcn_v2 0.0047-0.0062), larger than the differences between the candidates, so single-split winners did not
transfer to the eval part.  Five folds validate on every train row (8,000 rows, not 1,600)."""


def cv_folds(train: pd.DataFrame, folds: int = TUNE_FOLDS) -> list[tuple[pd.DataFrame, pd.DataFrame]]:
    """Blocked K-fold over the train part in time order: fold i validates on the i-th of `folds` contiguous
    blocks of rows and trains on the other blocks (in time order).

    The real samples are each a few minutes (Criteo) or one hour (Avazu) of traffic whose rows are
    exchangeable in time (on the Avazu train part, the share of inner-validation device_ip values seen in
    inner-train is 0.338 with the time split and 0.321 with a random split), so training on blocks after
    the validation block leaks nothing a time split would hide.

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


def tune(
    dataset: str, arch: str, grid: tuple[dict[str, Any], ...] = TUNE_GRID, *, folds: int = TUNE_FOLDS, log: logging.Logger
) -> list[dict]:
    """Score `recipe(arch) + override` by `cv_folds` of the TRAIN part (never the eval part); fold i trains with seed i."""
    split = load_real(dataset) if dataset in REAL else load_synthetic(int(dataset.split("-")[1].rstrip("k")) * 1000)
    parts = cv_folds(split.train, folds)
    encoded: dict[tuple[int, int], tuple[pd.DataFrame, pd.DataFrame]] = {}
    rows = []
    for override in grid:
        rec = recipe(arch, len(split.train), **override)
        runs = []
        for i, (tr, va) in enumerate(parts):
            if (i, rec.min_count) not in encoded:
                encoded[i, rec.min_count] = encode_split(tr, va, split.schema, rec.min_count)
            runs.append(train_and_score(*encoded[i, rec.min_count], split.schema, rec, seed=i))
        aucs = [r["auc"] for r in runs]
        row = {
            "dataset": dataset, "arch": arch, "override": str(override), "auc": statistics.fmean(aucs),
            "auc_folds": aucs, "logloss": statistics.fmean(r["logloss"] for r in runs),
            "calib": statistics.fmean(r["calibration"] for r in runs),
        }
        log.info("tune %s %s %s: auc %.4f logloss %.4f", dataset, arch, override, row["auc"], row["logloss"])
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.quality", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="synthetic 100k rows only (no 1M)")
    p.add_argument("--datasets", nargs="*", default=None, help="criteo avazu synthetic-100k synthetic-1000k")
    p.add_argument("--archs", nargs="*", default=list(ARCHS))
    p.add_argument("--seeds", nargs="*", type=int, default=[0, 1, 2])
    p.add_argument("--no-references", action="store_true")
    p.add_argument("--out", default="quality")
    p.add_argument("--tune", action="store_true", help="score TUNE_GRID by blocked K-fold CV over the train parts")
    p.add_argument("--folds", type=int, default=TUNE_FOLDS, help="folds of --tune")
    p.add_argument(
        "--threads", type=int, default=1,
        help="torch intra-op threads (1: these models are small, and on a shared box more threads spin-wait; "
        "measured 4x faster than 2 threads under load)",
    )
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    for noisy in ("trainer", "storage"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    log = logging.getLogger("bench.quality")
    torch.set_num_threads(max(1, args.threads))
    if args.tune:
        rows = [r for d in (args.datasets or ["criteo", "avazu"]) for a in args.archs for r in tune(d, a, folds=args.folds, log=log)]
        report(f"{args.out}-tune", rows, params={"grid": [str(g) for g in TUNE_GRID], "folds": args.folds},
               notes="blocked K-fold CV over the train part (bench.quality.cv_folds); auc: mean over folds")
        return 0
    datasets = args.datasets or ["criteo", "avazu", "synthetic-100k", *([] if args.quick else ["synthetic-1000k"])]
    rows, raw = [], {}
    for d in datasets:
        split = load_real(d) if d in REAL else load_synthetic(int(d.split("-")[1].rstrip("k")) * 1000)
        r, x = run_dataset(split, args.archs, args.seeds, references=not args.no_references, log=log)
        rows += r
        raw |= x
    notes = (
        "auc/logloss: mean over seeds on the eval part (last 20% in time order); auc_sd: population sd over "
        "seeds; auc_range: max - min; calib: mean prediction / click rate; of_ceiling: auc / truth auc."
    )
    report(args.out, rows, params={"datasets": datasets, "archs": args.archs, "seeds": args.seeds, "runs": raw}, notes=notes)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
