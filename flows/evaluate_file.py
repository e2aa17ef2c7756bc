"""`ctrpipe evaluate`: score a registry model on any raw log file."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from flows.config import RunConfig


@dataclass(frozen=True)
class EncodedLog:
    """A raw log file encoded with a registry model's own vocabulary."""

    version: str
    url: str
    """The model's files."""
    features: pd.DataFrame
    rows_quarantined: int


def encode_log(cfg: RunConfig, model: str, input_url: str, fmt: str) -> EncodedLog:
    """Parse `input_url` and encode it with the vocabulary model `model` (`latest` or a version) was trained with.

    Raises:
        FileNotFoundError: no published model.
        ValueError: the model was trained on other fields than `fmt` has, or the file has no valid rows.
    """
    from pipeline.encode import encode_frame
    from pipeline.parse import read_log_file
    from pipeline.schema import get_schema
    from pipeline.vocab_stage import load_admitted
    from storage.io.registry import ModelRegistry
    from trainer.model_dir import read_meta

    layout = cfg.layout()
    reg = ModelRegistry(layout)
    version = reg.latest() if model == "latest" else model
    if version is None:
        raise FileNotFoundError(f"no published model {cfg.model_name} under {layout.models()}; run a daily retrain first")
    url = reg.url(version)
    meta = read_meta(url, cfg.storage_options)
    schema = get_schema(fmt)
    if list(meta.fields) != list(schema.categorical):
        raise ValueError(
            f"model {version} was trained on fields {list(meta.fields)} but --format {fmt} has {list(schema.categorical)}"
        )
    events, quarantine = read_log_file(input_url, fmt, storage_options=cfg.input.storage_options)
    if len(events) == 0:
        raise ValueError(f"{input_url}: no valid rows to score ({len(quarantine)} quarantined)")
    features = encode_frame(events, schema, load_admitted(layout, meta.vocab_date))
    return EncodedLog(version, url, features, int(len(quarantine)))


def evaluate_log(cfg: RunConfig, model: str, input_url: str, fmt: str) -> dict[str, Any]:
    """Parse `input_url`, encode it with the model's own vocabulary, and return AUC/logloss/rows."""
    from trainer.evaluate import evaluate_model

    log = encode_log(cfg, model, input_url, fmt)
    metrics = evaluate_model(log.url, log.features, storage_options=cfg.storage_options)
    return {
        "auc": metrics["auc"],
        "logloss": metrics["logloss"],
        "rows": metrics["rows"],
        "rows_quarantined": log.rows_quarantined,
        "model": log.version,
    }


def score_log(cfg: RunConfig, model: str, input_url: str, fmt: str) -> tuple[np.ndarray, np.ndarray]:
    """(labels, click probabilities) of the valid rows of `input_url`, in file order, scored as `evaluate_log` does."""
    from trainer.evaluate import load_model, score

    log = encode_log(cfg, model, input_url, fmt)
    probs = score(load_model(log.url, cfg.storage_options), log.features)
    return log.features["label"].to_numpy(np.float64), probs
