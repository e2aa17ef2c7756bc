"""`ctrpipe evaluate`: score a registry model on a raw log file, encoded with the model's own vocabulary."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from flows.config import RunConfig, check_format
from pipeline.schema import LogSchema


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


def encode_log(
    cfg: RunConfig,
    model: str,
    input_url: str,
    fmt: str,
    *,
    format_key: str = "input.format",
    max_bad_fraction: float | None = None,
) -> EncodedLog:
    """Parse `input_url` and encode it with the vocabulary model `model` was trained with.

    Args:
        model: `latest`, `previous` or a version id.
        fmt: `criteo`, `avazu` or a schema file; `format_key` is the option or key it came from (for messages).
        max_bad_fraction: refuse a file with a larger share of quarantined lines (None: any share with a valid row).

    Raises:
        RegistryError: no such version (or none published).
        ValueError: the file has no labels (`check_labelled`), no valid rows, or more bad rows than
            `max_bad_fraction` (the message says why the rows were quarantined and what to check), or the model
            was trained on other fields than `fmt` has.
    """
    from pipeline.encode.frame import encode_frame
    from pipeline.ingest.parse import ORDER_FILE_SHIFT, read_log_file
    from pipeline.vocab.stage import load_admitted
    from storage.io.registry import ModelRegistry
    from trainer.model_dir import read_meta

    schema = check_format(fmt, key=format_key)
    layout = cfg.layout()
    reg = ModelRegistry(layout)
    version = reg.info(reg.resolve(model)).version  # info: an unknown version fails naming it
    # the file before the model's files: what is wrong with it needs no model to say
    events, quarantine = read_log_file(input_url, fmt, storage_options=cfg.input.storage_options)
    if len(events) == 0 and len(quarantine) == 0:
        raise ValueError(f"{input_url}: the file is empty: nothing to score")
    check_labelled(input_url, len(events), quarantine, schema)
    share = len(quarantine) / (len(events) + len(quarantine))
    if len(events) == 0 or (max_bad_fraction is not None and share > max_bad_fraction):
        what = (
            f"no valid rows to score, all {len(quarantine)} quarantined"
            if len(events) == 0
            else f"{len(quarantine)} of {len(events) + len(quarantine)} lines quarantined ({share:.1%}), more than "
            f"ingest.max_bad_fraction ({max_bad_fraction})"
        )
        tolerance = f"pass --set ingest.max_bad_fraction={min(1.0, round(share + 0.005, 3))}" if len(events) else ""
        raise ValueError(f"{input_url}: {what}: {_why(quarantine, schema, share, format_key, fmt, tolerance)}")
    url = reg.url(version)
    meta = read_meta(url, cfg.storage_options)
    if list(meta.fields) != list(schema.categorical):
        raise ValueError(
            f"model {version} was trained on fields {list(meta.fields)} but {format_key} {fmt} has "
            f"{list(schema.categorical)}; pass the format of the model's logs with --format"
        )
    if meta.vocab_date is None:
        raise ValueError(f"model {version} records no vocab_date: its admitted keys are unknown")
    features = encode_frame(events, schema, load_admitted(layout, meta.vocab_date), raw_keys=bool(meta.companion))
    lines = events["order"].to_numpy() & ((1 << ORDER_FILE_SHIFT) - 1)
    return EncodedLog(version, url, features, lines, int(len(quarantine)))


def _why(quarantine: pd.DataFrame, schema: LogSchema, share: float, format_key: str, fmt: str, tolerance: str) -> str:
    """The top reasons of the quarantined lines and what to do (`pipeline.ingest.bad_rows`)."""
    import pyarrow as pa

    from pipeline.ingest import bad_rows

    counts: Counter = Counter()
    samples: dict[str, dict] = {}
    bad_rows.tally(pa.Table.from_pandas(quarantine, preserve_index=False), counts, samples)
    reasons = "; ".join(bad_rows.describe_reasons(counts, samples))
    todo = bad_rows.advice(
        counts, samples, share=share, schema=schema, format_key=format_key, fmt=fmt, tolerance=tolerance
    )
    return f"{reasons}\n  {todo}"


def check_labelled(input_url: str, valid_rows: int, quarantine: pd.DataFrame, schema: LogSchema) -> None:
    """Raise when most lines of the file carry no label: feature-only rows (a test split, request logs).

    A line lacks its label when its label column is not one of the schema's label values, or when it has
    exactly one field fewer than the schema's columns (the label left out, each field one place early).

    Raises:
        ValueError: more than half of the lines lack a label; the message says what to use instead.
    """
    from pipeline.ingest.bad_rows import MOSTLY_BAD
    from pipeline.ingest.parse import reason_category

    lines = valid_rows + len(quarantine)
    if not lines or len(quarantine) <= MOSTLY_BAD * lines:
        return
    fields = quarantine["raw"].fillna("").str.count(schema.separator) + 1
    one_short = fields == len(schema.columns) - 1
    bad_label = quarantine["reason"].map(reason_category) == "bad label"
    unlabelled = one_short | bad_label
    if unlabelled.sum() <= MOSTLY_BAD * lines:
        return
    first = quarantine[unlabelled].iloc[0]
    n_first = int(fields[unlabelled].iloc[0])
    labels = "/".join((*schema.label_positive, *schema.label_negative))
    raise ValueError(
        f"{input_url}: no labels: {int(unlabelled.sum())} of {lines} lines carry no {labels} in the label column "
        f"{schema.label!r} (e.g. line {first['line']}: {n_first} fields, the {schema.name} schema has "
        f"{len(schema.columns)}; {first['reason']}).  `ctrpipe evaluate` measures a model on labelled rows; "
        "score feature-only rows with `ctrpipe score-server`, or pass the format of a labelled file with --format"
    )


def evaluate_log(
    cfg: RunConfig,
    model: str,
    input_url: str,
    fmt: str,
    *,
    format_key: str = "input.format",
    predictions_url: str | None = None,
) -> dict[str, Any]:
    """AUC/logloss/rows of model `model` on `input_url` (see `encode_log`): a file with no labels, or with
    more quarantined lines than a day's ingest allows (`ingest.max_bad_fraction`), is refused.

    Args:
        predictions_url: also write every scored row's `line` (1-based line number in the input file),
            `label` and `score` there as one Parquet file: what the online scorer's answers are compared
            with (`tests/flows/serving/test_parity.py`).
    """
    from trainer.eval.scoring import evaluate_model, load_model, score

    log = encode_log(cfg, model, input_url, fmt, format_key=format_key, max_bad_fraction=cfg.ingest.max_bad_fraction)
    loaded = load_model(log.url, cfg.storage_options)
    metrics = evaluate_model(loaded, log.features, storage_options=cfg.storage_options)
    if predictions_url:
        import pyarrow as pa
        import pyarrow.parquet as pq

        from storage.io import fsio

        table = pa.table(
            {"line": log.lines, "label": log.features["label"].to_numpy(), "score": score(loaded, log.features)}
        )
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
    from trainer.eval.scoring import load_model, score

    log = encode_log(cfg, model, input_url, fmt)
    probs = score(load_model(log.url, cfg.storage_options), log.features)
    return log.features["label"].to_numpy(np.float64), probs
