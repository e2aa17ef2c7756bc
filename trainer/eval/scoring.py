"""Load a committed model directory and score / evaluate it on feature rows.

Single process, no torch.distributed: the sparse parts of every rank are read
into one read-only sorted table; keys the model never trained get their
deterministic initial rows (`storage.embedding.rows.initial.init_rows`), exactly what a store
would return for them.  The dense network runs on the training device when there is one
(`device="auto"`: CUDA when available); the table stays on the host (a searchsorted over
its keys) and each batch's rows go to the device; only the probabilities come back.

A model trained with bags of keys (model.json `bag_columns`, pooled with
`model_config.bag_pooling`) is scored with the same bags pooled the same way
(`trainer.bags`), so the rows it is evaluated on need those columns.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from storage.embedding.rows.initial import init_rows
from storage.embedding.rows.transfer import host_to_device
from storage.embedding.snapshot import read_snapshot, snapshot_files
from storage.features_manifest import raw_columns
from storage.io import fsio
from trainer import model_dir
from trainer.bags import FieldBags, Jagged, expand_cells, pool_rows
from trainer.companion.file import FILE as COMPANION_FILE
from trainer.companion.file import load as load_companion
from trainer.companion.model import Companion
from trainer.data import FeatureSchema, list_parts
from trainer.eval.group_metrics import group_auc
from trainer.eval.metrics import PROB_EPS, StreamingMetrics, clip_probabilities, slice_metrics
from trainer.model_dir import ModelMeta
from trainer.models.ctr_model import CTRModel


class FrozenEmbeddings:
    """Read-only key -> embedding lookup over the rows of a model's sparse snapshot (or a serving bundle).

    Args:
        keys: int64 (N,), distinct.
        emb: float32 or float16 (N, D), kept in its dtype; rows are returned as float32.
        init_std: std of the initial rows returned for unknown keys.
    """

    def __init__(self, keys: np.ndarray, emb: np.ndarray, *, dim: int, init_std: float) -> None:
        dtype = np.float16 if emb.dtype == np.float16 else np.float32
        if keys.size > 1 and not (keys[1:] > keys[:-1]).all():  # sorted already (a bundle): no copy
            order = np.argsort(keys, kind="stable")
            keys, emb = keys[order], emb[order]
        self.keys = np.ascontiguousarray(keys, dtype=np.int64)
        self.emb = torch.from_numpy(np.ascontiguousarray(emb, dtype=dtype).reshape(-1, dim))
        self.dim, self.init_std = dim, init_std

    def __len__(self) -> int:
        return int(self.keys.size)

    def lookup(self, keys: torch.Tensor) -> torch.Tensor:
        """Rows of `keys` (N,) as float32 (N, D); unknown keys get `init_rows`."""
        k = np.array(keys.detach().cpu().numpy(), dtype=np.int64)
        if self.keys.size == 0:
            return init_rows(torch.from_numpy(k), self.dim, self.init_std)
        pos = np.minimum(np.searchsorted(self.keys, k), self.keys.size - 1)
        found = self.keys[pos] == k
        return fill_rows(k, found, self.emb[torch.from_numpy(pos[found])], self.init_std)


def fill_rows(keys: np.ndarray, found: np.ndarray, rows: torch.Tensor, init_std: float) -> torch.Tensor:
    """(N, D) float32: `rows` (float32 or float16) where `found`, the keys' initial rows elsewhere.

    Only the unknown keys' initial rows are computed (they cost more than a gather).
    """
    out = torch.empty(keys.size, rows.shape[1], dtype=torch.float32)
    out[torch.from_numpy(np.flatnonzero(found))] = rows.float()
    if not found.all():
        missing = np.flatnonzero(~found)
        out[torch.from_numpy(missing)] = init_rows(torch.from_numpy(keys[missing]), rows.shape[1], init_std)
    return out


@dataclass
class LoadedModel:
    """A model directory in memory: the dense model (eval mode), the embeddings and the column layout."""

    model: CTRModel
    embeddings: FrozenEmbeddings
    schema: FeatureSchema
    meta: ModelMeta
    device: torch.device = torch.device("cpu")
    """Where the dense network scores."""
    companion: Companion | None = None
    """The second learner blended into every score (`trainer.companion`), or None."""

    @property
    def input_columns(self) -> tuple[str, ...]:
        """The feature columns `score` reads: the network's, and the own keys `r_<j>` when it has a companion."""
        s = self.schema
        raw = raw_columns(s.key_columns) if self.companion is not None else ()
        return (*s.dense_columns, *s.key_columns, *s.bag_columns, *raw)


def scoring_device(device: str | torch.device = "auto") -> torch.device:
    """`auto`: the training device when there is one (CUDA), else the CPU."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def load_model(
    model_url: str, storage_options: dict | None = None, *, device: str | torch.device = "auto"
) -> LoadedModel:
    """Read a committed model directory (dense from safetensors, sparse from `sparse/part-*.parquet`).

    Args:
        device: where the dense network scores (`scoring_device`).

    Raises:
        FileNotFoundError: not a committed model directory.
    """
    model_url = fsio.data_url(model_url, storage_options)  # its files (an object store's data prefix)
    meta = model_dir.read_meta(model_url, storage_options)
    cfg, dim = meta.model_cfg(), meta.dim
    model = model_dir.load_network(model_url, meta, storage_options)
    sparse_url = fsio.join(model_url, model_dir.SPARSE)
    _, files = snapshot_files(sparse_url, storage_options)
    if files:
        snap = read_snapshot(sparse_url, storage_options=storage_options)
        keys, emb = snap.keys, snap.emb
    else:
        keys, emb = np.zeros(0, np.int64), np.zeros((0, dim), np.float32)
    schema = FeatureSchema(
        dense_columns=meta.dense_columns,
        key_columns=meta.key_columns,
        fields=meta.fields,
        bag_columns=meta.bag_columns,
    ).for_pooling(cfg.bag_pooling)
    emb_table = FrozenEmbeddings(keys, emb, dim=dim, init_std=meta.init_std)
    dev = scoring_device(device)
    second = (
        load_companion(fsio.join(model_url, COMPANION_FILE), storage_options, blend_weight=meta.companion_blend_weight)
        if meta.companion
        else None
    )
    return LoadedModel(
        model=model.to(dev), embeddings=emb_table, schema=schema, meta=meta, device=dev, companion=second
    )


@torch.inference_mode()
def score(loaded: LoadedModel, features: pd.DataFrame, *, batch_size: int = 8192) -> np.ndarray:
    """Click probabilities (N,) float64 of feature rows (columns `d_*`, `k_*`, `bag_*` as in the model's schema).

    Bag columns may hold lists or arrays of keys, or be Arrow-backed (`pd.ArrowDtype`, no per-row conversion).

    Raises:
        KeyError: a column the model needs is missing.
    """
    return score_features(
        loaded.model,
        loaded.embeddings.lookup,
        loaded.schema,
        loaded.model.config.bag_pooling,
        features,
        batch_size=batch_size,
        device=loaded.device,
        companion=loaded.companion,
        eps=loaded.meta.score_eps,
        keep_rate=loaded.meta.negative_sampling,
    )


@torch.no_grad()
def score_features(
    net: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    lookup: Callable[[torch.Tensor], torch.Tensor],
    schema: FeatureSchema,
    pooling: str,
    features: pd.DataFrame,
    *,
    batch_size: int = 8192,
    device: torch.device = torch.device("cpu"),
    companion: Companion | None = None,
    eps: float = PROB_EPS,
    keep_rate: float = 1.0,
) -> np.ndarray:
    """`score` with any network (the trained module or an exported program) and any row lookup.

    The one path from feature rows to probabilities: evaluation and the online scorer
    (`flows.serving`) both come through here, so they pool bags and batch rows alike.

    Args:
        net: (dense (B, n) float32, emb (B, F, D) float32) -> logits (B,).
        lookup: keys (N,) int64 -> rows (N, D) float32 (unknown keys get their initial rows).
        schema: the model's columns (`FeatureSchema.for_pooling` applied).
        pooling: `model.bag_pooling`.
        device: where `net` scores (the rows and dense features are copied there).
        companion: a second learner whose logit is blended with the network's at its weight
            (`trainer.companion.model.Companion.blend`); it reads the values' own keys, the `r_<j>` columns
            (`encode.raw_keys`).
        eps: every probability is clipped to [eps, 1 - eps] (`clip_probabilities`; model.json `score_eps`).
        keep_rate: the network trained on this share of the negatives (model.json `negative_sampling`): its
            logit gets + log(keep_rate) before the blend and the clip (`trainer.sampling`).
    """
    s = schema
    raw = raw_columns(s.key_columns) if companion is not None else ()
    missing = [c for c in (*s.dense_columns, *s.key_columns, *s.bag_columns, *raw) if c not in features.columns]
    if missing:
        what = (
            " (a model with a companion reads the r_<j> columns: encode with encode.raw_keys=true)"
            if set(missing) & set(raw)
            else ""
        )
        raise KeyError(f"feature rows lack columns {missing} the model was trained with{what}")
    # C order: a frame's columns come out column-major, and the network's bucketize wants contiguous rows
    dense_all = np.ascontiguousarray(features[list(s.dense_columns)].to_numpy(np.float32)) if s.dense_columns else None
    keys_all = features[list(s.key_columns)].to_numpy(np.int64)
    bags_all = [
        Jagged.from_arrow(pa.array(features[c], type=pa.list_(pa.int64()), from_pandas=True)) for c in s.bag_columns
    ]
    raw_all = features[list(raw)].to_numpy(np.int64) if raw else None
    return score_arrays(
        net,
        lookup,
        schema,
        pooling,
        dense_all,
        keys_all,
        bags_all,
        batch_size=batch_size,
        device=device,
        companion=companion,
        raw_all=raw_all,
        eps=eps,
        keep_rate=keep_rate,
    )


@torch.no_grad()
def score_arrays(
    net: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    lookup: Callable[[torch.Tensor], torch.Tensor],
    schema: FeatureSchema,
    pooling: str,
    dense_all: np.ndarray | None,
    keys_all: np.ndarray,
    bags_all: list[Jagged],
    *,
    batch_size: int = 8192,
    device: torch.device = torch.device("cpu"),
    companion: Companion | None = None,
    raw_all: np.ndarray | None = None,
    eps: float = PROB_EPS,
    keep_rate: float = 1.0,
) -> np.ndarray:
    """`score_features` on the columns as arrays: dense (N, n) float32 (None without dense columns), keys (N, F)
    int64, one `Jagged` per bag column.  The online scorer's small batches come here without a frame.  With a
    `companion`, a row's logit is w * the network's + (1 - w) * the companion's, w its recorded weight
    (`trainer.companion.model.Companion.blend`); it reads the values' own keys `raw_all` (N, F) int64.  Every
    probability is clipped to [eps, 1 - eps].

    Raises:
        ValueError: a companion without `raw_all`.
    """
    if companion is not None and raw_all is None:
        raise ValueError("a model with a companion scores rows with their own keys (r_<j>): none were given")
    s = schema
    n = len(keys_all)
    out = np.empty(n, dtype=np.float64)
    for lo in range(0, n, batch_size):
        hi = min(n, lo + batch_size)
        keys = torch.tensor(keys_all[lo:hi])  # (B, F)
        B = keys.shape[0]
        bags = [FieldBags.from_jagged(f, b.slice(lo, hi)) for f, b in zip(s.bag_fields, bags_all, strict=True)]
        cells = expand_cells(keys, bags)  # the keys of every (example, field) cell, as in training
        emb = pool_rows(host_to_device(lookup(cells.keys), device), cells, pooling)  # (B, F, D)
        dense = torch.tensor(dense_all[lo:hi]) if dense_all is not None else torch.zeros(B, 0)
        z = net(host_to_device(dense, device), emb)
        if keep_rate != 1.0:  # trained on a share of the negatives: its odds are 1/keep_rate too high
            z = z + math.log(keep_rate)
        if companion is None:
            out[lo:hi] = torch.sigmoid(z).double().cpu().numpy()
        else:
            assert raw_all is not None  # noqa: S101 - an invariant, for mypy
            second = companion.logits(raw_all[lo:hi], dense_all[lo:hi] if dense_all is not None else None)
            out[lo:hi] = torch.sigmoid(torch.from_numpy(companion.blend(z.double().cpu().numpy(), second))).numpy()
    return clip_probabilities(out, eps)


def evaluate_model(
    model: str | LoadedModel,
    features: str | pd.DataFrame,
    storage_options: dict | None = None,
    *,
    batch_size: int = 8192,
    bins: int = 10,
    slices: tuple[str, ...] = (),
    groups: tuple[str, ...] = (),
) -> dict[str, Any]:
    """AUC, log loss, calibration and reliability of a model on feature rows, one Parquet part at a time.

    Metrics are accumulated with `trainer.eval.metrics.StreamingMetrics` (exact AUC by distinct score),
    so only one part's rows are in memory at once; the same accumulator merges across processes.

    Args:
        model: a committed model directory, or one already loaded (`load_model`) to score it on
            several sets without reading it again.
        features: a DataFrame, a directory of feature Parquet parts (e.g. `features/date=D/eval`), or a
            features/date=D directory (its `eval` split, the day's hold-out, is used).
        storage_options: fsspec options for both URLs.
        bins: reliability-table bins.
        slices: key columns (e.g. `("k_0",)`) to report per-value metrics for (top 10 values); a plus,
            computed in memory, so leave empty for huge sets.
        groups: key columns to compute the AUC of every value of (`trainer.eval.group_metrics.GroupAUC`:
            slice AUCs and GAUC for the publish gate); in memory too.

    Returns:
        {auc, logloss, rows, mean_prediction, click_rate, calibration, ece, reliability[, slices][, groups]}.

    Raises:
        ValueError: no rows, or a single class (AUC undefined).
    """
    loaded = model if isinstance(model, LoadedModel) else load_model(model, storage_options)
    metrics = StreamingMetrics(bins=bins)
    kept: list[tuple[np.ndarray, np.ndarray, pd.DataFrame]] = []
    extra = tuple(dict.fromkeys((*slices, *groups)))
    for df in _feature_frames(features, loaded, storage_options, extra=extra):
        labels, probs = df["label"].to_numpy(np.float64), score(loaded, df, batch_size=batch_size)
        metrics.update(labels, probs)
        if extra:
            kept.append((labels, probs, df[list(extra)]))
    if metrics.rows == 0:
        raise ValueError(
            "no feature rows to evaluate the model on"
            f" (features: {features if isinstance(features, str) else 'a frame'})"
        )
    out = metrics.result()
    if extra:
        y = np.concatenate([k[0] for k in kept])
        p = np.concatenate([k[1] for k in kept])
        cols = pd.concat([k[2] for k in kept], ignore_index=True)
        if slices:
            out["slices"] = {c: slice_metrics(y, p, cols[c].to_numpy()) for c in slices}
        if groups:
            out["groups"] = {c: group_auc(y, p, cols[c].to_numpy()) for c in groups}
    return out


def _feature_frames(
    features: str | pd.DataFrame, loaded: LoadedModel, storage_options: dict | None, *, extra: tuple[str, ...] = ()
):
    """Yield feature DataFrames: the frame itself, or one per Parquet part of the URL."""
    if isinstance(features, pd.DataFrame):
        yield features
        return
    features = fsio.data_url(features, storage_options)  # a features/date=D directory: its files
    fs, path = fsio.get_fs(features, storage_options)
    cols = list(dict.fromkeys(["label", *loaded.input_columns, *extra]))
    if fs.isdir(path) and any(p.endswith(".parquet") for p in fs.ls(path, detail=False)):
        files = list_parts(features, storage_options)
    else:
        files = list_parts(fsio.join(features, "eval"), storage_options)
    for f in files:
        with fs.open(f, "rb") as fh:
            # list columns (bags) stay Arrow-backed: `score` reads their buffers without a loop per row
            yield pq.read_table(fh, columns=cols).to_pandas(types_mapper=_arrow_lists)


def _arrow_lists(arrow_type: pa.DataType) -> pd.ArrowDtype | None:
    return pd.ArrowDtype(arrow_type) if pa.types.is_list(arrow_type) else None
