"""`ctrpipe evaluate`: score a registry model on a raw log file, encoded with the model's own vocabulary."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from flows.config import RunConfig, check_format


@dataclass(frozen=True)
class EncodedLog:
    """A raw log file encoded with a registry model's own vocabulary."""

    version: str
    url: str
    """The model's files."""
    features: pd.DataFrame
    lines: np.ndarray
    """The 1-based line number in the input file of each row of `features`."""
    rows_quarantined: int


def encode_log(cfg: RunConfig, model: str, input_url: str, fmt: str, *, format_key: str = "input.format") -> EncodedLog:
    """Parse `input_url` and encode it with the vocabulary model `model` was trained with.

    Args:
        model: `latest`, `previous` or a version id.
        fmt: `criteo`, `avazu` or a schema file; `format_key` is the option or key it came from (for messages).

    Raises:
        FileNotFoundError: no published model.
        ValueError: the model was trained on other fields than `fmt` has, or the file has no valid rows
            (the message says why the rows were quarantined and what to check).
    """
    import pyarrow as pa

    from pipeline.encode.stage import encode_frame
    from pipeline.ingest import bad_rows
    from pipeline.ingest.parse import ORDER_FILE_SHIFT, read_log_file
    from pipeline.vocab.stage import load_admitted
    from storage.io.registry import ModelRegistry
    from trainer.model_dir import read_meta

    schema = check_format(fmt, key=format_key)
    layout = cfg.layout()
    reg = ModelRegistry(layout)
    version = reg.info(reg.resolve(model)).version  # info: an unknown version fails naming it
    url = reg.url(version)
    meta = read_meta(url, cfg.storage_options)
    if list(meta.fields) != list(schema.categorical):
        raise ValueError(
            f"model {version} was trained on fields {list(meta.fields)} but {format_key} {fmt} has "
            f"{list(schema.categorical)}; pass the format of the model's logs with --format"
        )
    events, quarantine = read_log_file(input_url, fmt, storage_options=cfg.input.storage_options)
    if len(events) == 0:
        if len(quarantine) == 0:
            raise ValueError(f"{input_url}: the file is empty: nothing to score")
        counts: Counter = Counter()
        samples: dict[str, dict] = {}
        bad_rows.tally(pa.Table.from_pandas(quarantine, preserve_index=False), counts, samples)
        reasons = "; ".join(bad_rows.describe_reasons(counts, samples))
        todo = bad_rows.advice(counts, samples, share=1.0, schema=schema, format_key=format_key, fmt=fmt)
        raise ValueError(f"{input_url}: no valid rows to score, all {len(quarantine)} quarantined: {reasons}\n  {todo}")
    if meta.vocab_date is None:
        raise ValueError(f"model {version} records no vocab_date: its admitted keys are unknown")
    features = encode_frame(events, schema, load_admitted(layout, meta.vocab_date))
    lines = events["order"].to_numpy() & ((1 << ORDER_FILE_SHIFT) - 1)
    return EncodedLog(version, url, features, lines, int(len(quarantine)))


def evaluate_log(
    cfg: RunConfig, model: str, input_url: str, fmt: str, *, format_key: str = "input.format",
    predictions_url: str | None = None,
) -> dict[str, Any]:
    """AUC/logloss/rows of model `model` on `input_url` (see `encode_log`).

    Args:
        predictions_url: also write every scored row's `line` (1-based line number in the input file),
            `label` and `score` there as one Parquet file: what the online scorer's answers are compared
            with (`tests/flows/serving/test_parity.py`).
    """
    from trainer.scoring import evaluate_model, load_model, score

    log = encode_log(cfg, model, input_url, fmt, format_key=format_key)
    loaded = load_model(log.url, cfg.storage_options)
    metrics = evaluate_model(loaded, log.features, storage_options=cfg.storage_options)
    if predictions_url:
        import pyarrow as pa
        import pyarrow.parquet as pq

        from storage.io import fsio

        table = pa.table({"line": log.lines, "label": log.features["label"].to_numpy(),
                          "score": score(loaded, log.features)})
        fs, path = fsio.get_fs(predictions_url, cfg.storage_options)
        with fs.open(path, "wb") as f:
            pq.write_table(table, f)
    return {
        "auc": metrics["auc"],
        "logloss": metrics["logloss"],
        "rows": metrics["rows"],
        "rows_quarantined": log.rows_quarantined,
        "model": log.version,
    }


def score_log(cfg: RunConfig, model: str, input_url: str, fmt: str) -> tuple[np.ndarray, np.ndarray]:
    """(labels, click probabilities) of the valid rows of `input_url`, in file order, scored as `evaluate_log` does."""
    from trainer.scoring import load_model, score

    log = encode_log(cfg, model, input_url, fmt)
    probs = score(load_model(log.url, cfg.storage_options), log.features)
    return log.features["label"].to_numpy(np.float64), probs
